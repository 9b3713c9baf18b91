"""The content-blended token space (``export.token_content``).

The Bag-of-Meaning tokens are read from a vector by the nearest prototypes of the tree
(:class:`hir.nn.HierarchicalTokenizer`). By default that vector is the entity's collaborative
direction alone: what its users engage with. With ``export.token_content = w > 0`` it is

    x = normalise([ s ; w t ])

with ``s`` the unit collaborative direction (the export's token vector without its slack) and ``t``
the unit text vector of the entity (zero without text, and for users, who have none), so the tree
is fitted, and every row is tokenised, on what an entity *is about* as well as on who engages with
it. A token then groups entities that are near in both; at w = 1 the two views weigh the same.

Why. The held-out measures of issue 34 (docs/hierarchy.md) showed that on completejourney a
household's next purchases concentrate in content classes far more than in collaborative
clusters: the commodity taxonomy held 0.874 at 64 tokens where every engagement fit held 0.93-0.94,
and settled as prototypes in the collaborative space those classes dissolved (0.15 of products
kept theirs). Blending the text into the space the tokens are read in keeps such classes without
reading any taxonomy, and a new entity (`hir refresh`) gets its tokens from the same blend of its
placed vector and its own text.

The blend only changes the tokens and the tree: the served embeddings are untouched.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hir.export.cold import unit_text
from hir.nn import HierarchicalTokenizer

# rows (m,) int64 -> (m, T) their unit text vectors, zero rows without text
TextOf = Callable[[np.ndarray], np.ndarray]


def blend_block(z: np.ndarray, text: np.ndarray, weight: float) -> np.ndarray:
    """Token vectors (m, w) and their unit text (m, T) -> (m, w - 1 + T + 1) blended rows.

    Row i is ``[unit(z_i[:-1]) ; weight * t_i ; 0]``: the tokenizer's :func:`hir.export.embed.direction`
    drops the last coordinate (the slack) and normalises the rest, so it reads
    ``normalise([s ; w t])`` (module doc); ``weight`` > 0, checked by :class:`Blended`."""
    if text.ndim != 2 or len(text) != len(z):
        raise ValueError(f"token_content: {len(z)} token vectors but text of shape {text.shape}; expected "
                         f"({len(z)}, T)")
    m, w = z.shape
    out = np.zeros((m, w - 1 + text.shape[1] + 1), np.float32)
    s = np.asarray(z[:, :-1], np.float32)
    out[:, :w - 1] = s / np.maximum(np.linalg.norm(s, axis=1, keepdims=True), 1e-12)
    out[:, w - 1:-1] = weight * text
    return out


class Blended:
    """The blended token vectors of every row of ``z`` (n, w), computed only for the rows read.

    Reads as an (n, w - 1 + T + 1) float32 array does where the export reads token vectors
    (``len``, ``shape``, ``x[lo:hi]``, ``x[rows]``), without holding it: at 10M synthetic events
    the whole blend would be n_nodes x (K + T) floats beside the (n, K + 1) it comes from
    (540k nodes x 1,409 x 4 bytes, 3 GB at rank 1024)."""

    def __init__(self, z: np.ndarray, text: TextOf, text_dim: int, weight: float) -> None:
        if weight <= 0:
            raise ValueError(f"export.token_content={weight}: the blend needs a weight > 0 (0 means no blend)")
        self.z, self.text, self.weight = z, text, float(weight)
        self.shape = (len(z), z.shape[1] - 1 + int(text_dim) + 1)
        self.dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: slice | np.ndarray) -> np.ndarray:
        if isinstance(index, slice):
            lo, hi, step = index.indices(len(self))
            if step != 1:
                raise IndexError("Blended rows are read in contiguous slices or by row ids")
            rows = np.arange(lo, hi, dtype=np.int64)
        else:
            rows = np.asarray(index, np.int64)
            if rows.ndim != 1:
                raise IndexError(f"Blended rows are read by a 1-d array of row ids, not shape {rows.shape}")
        return blend_block(np.asarray(self.z[rows]), self.text(rows), self.weight)


def blend(z: np.ndarray, text: TextOf, text_dim: int, weight: float, block: int = 16384) -> np.ndarray:
    """Token vectors (n, w) -> all their blended rows (n, w - 1 + text_dim + 1) at once
    (:func:`blend_block`, a block of rows at a time): for the few rows `hir refresh` embeds."""
    rows = Blended(z, text, text_dim, weight)
    out = np.empty(rows.shape, np.float32)
    for lo in range(0, len(z), block):
        out[lo:lo + block] = rows[lo:lo + block]
    return out


def store_text(store: object) -> TextOf:
    """:data:`TextOf` a :class:`hir.model.store.GraphStore`'s nodes (global ids): the unit text
    block of each node's content row (as :func:`hir.export.cold.text_vectors`), zero without text."""
    dim = int(store.layout["text_dim"])

    def text(rows: np.ndarray) -> np.ndarray:
        content = store.content[rows]
        return unit_text(content[:, :dim].astype(np.float32), content[:, -1] > 0)[0]

    return text


def array_text(text_vec: np.ndarray | None, has_text: np.ndarray, text_dim: int) -> TextOf:
    """:data:`TextOf` new entities' text vectors (n, T) as enrich writes them (`hir refresh`), by
    their row in ``text_vec``.

    They are rounded through float16 first, as the graph store keeps content
    (:mod:`hir.model.store`), so a refreshed entity reads the blend its export row would have."""
    n = len(has_text)
    if text_vec is None:
        text_vec = np.zeros((n, text_dim), np.float32)
    unit, _ = unit_text(np.asarray(text_vec).astype(np.float16).astype(np.float32).reshape(n, text_dim), has_text)
    return lambda rows: unit[rows]


def widened(tokenizer: HierarchicalTokenizer, dim: int) -> HierarchicalTokenizer:
    """A fresh tokenizer of width ``dim`` with ``tokenizer``'s levels, top-k, temperature, residual
    bound and free levels, for a tree refitted in the blended space (its prototypes are set by the fit)."""
    return HierarchicalTokenizer(dim, tokenizer.levels, tokenizer.top_k, tokenizer.tau, tokenizer.radius,
                                 tokenizer.free_levels)
