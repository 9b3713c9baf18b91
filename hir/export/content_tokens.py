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

from hir.nn import HierarchicalTokenizer

# (lo, hi) -> (hi - lo, T) unit text vectors of rows lo:hi (zero rows without text) and has (hi - lo,)
TextRows = Callable[[int, int], tuple[np.ndarray, np.ndarray]]


def blend(z: np.ndarray, text: TextRows, text_dim: int, weight: float, block: int = 16384) -> np.ndarray:
    """Token vectors (n, w) -> blended token vectors (n, w - 1 + text_dim + 1).

    Row i is ``[unit(z_i[:-1]) ; weight * t_i ; 0]``: the tokenizer's :func:`hir.export.embed.direction`
    drops the last coordinate (the slack) and normalises the rest, so it reads ``normalise([s ; w t])``
    (module doc). Filled a block of rows at a time: no (n, w) float copy of ``z`` beside the output.

    Args:
        z: (n, w) the vectors the tokens would read without the blend (K + 1, or d + 1 when served).
        text: :data:`TextRows` of the same rows.
        text_dim: T, the width of the text vectors.
        weight: w > 0, the text's weight beside the unit collaborative direction.
    """
    if weight <= 0:
        raise ValueError(f"export.token_content={weight}: the blend needs a weight > 0 (0 means no blend)")
    n, w = z.shape
    out = np.zeros((n, w - 1 + text_dim + 1), np.float32)
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        s = np.asarray(z[lo:hi, :-1], np.float32)
        out[lo:hi, :w - 1] = s / np.maximum(np.linalg.norm(s, axis=1, keepdims=True), 1e-12)
        t, _ = text(lo, hi)
        if t.shape != (hi - lo, text_dim):
            raise ValueError(f"token_content: text rows {lo}:{hi} have shape {t.shape}, expected {(hi - lo, text_dim)}")
        out[lo:hi, w - 1:w - 1 + text_dim] = weight * t
    return out


def store_text(store: object) -> TextRows:
    """:data:`TextRows` of a :class:`hir.model.store.GraphStore`'s nodes (global ids): the unit text
    block of each node's content row (:func:`hir.export.cold.text_vectors`), zero without text."""
    from hir.export.cold import text_vectors

    return lambda lo, hi: text_vectors(store, lo, hi)


def array_text(text_vec: np.ndarray | None, has_text: np.ndarray, text_dim: int) -> TextRows:
    """:data:`TextRows` of new entities' text vectors (n, T) as enrich writes them (`hir refresh`).

    They are rounded through float16 first, as the graph store keeps content
    (:mod:`hir.model.store`), so a refreshed entity reads the blend its export row would have."""
    n = len(has_text)
    if text_vec is None:
        text_vec = np.zeros((n, text_dim), np.float32)
    t = np.asarray(text_vec).astype(np.float16).astype(np.float32).reshape(n, text_dim)
    norms = np.linalg.norm(t, axis=1, keepdims=True)
    has = np.asarray(has_text, bool) & (norms[:, 0] > 0)
    unit = np.where(has[:, None], t / np.maximum(norms, 1e-12), 0.0).astype(np.float32)
    return lambda lo, hi: (unit[lo:hi], has[lo:hi])


def widened(tokenizer: HierarchicalTokenizer, dim: int) -> HierarchicalTokenizer:
    """A fresh tokenizer of width ``dim`` with ``tokenizer``'s levels, top-k, temperature and
    residual bound, for a tree refitted in the blended space (its prototypes are set by the fit)."""
    return HierarchicalTokenizer(dim, tokenizer.levels, tokenizer.top_k, tokenizer.tau, tokenizer.radius)
