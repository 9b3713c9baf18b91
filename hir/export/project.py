"""The served dimension (``export.dim``): the exported embedding projected onto d leading directions.

The network's universal embedding has K + 1 coordinates, K the spectral rank the base's val
search chose (hir/nn/net.py, :class:`~hir.nn.HirNet`):

    entity:  z = [x, sqrt(1 - |x|^2)],  x = a s        user:  z = [s, 0],  |s| = 1

and a cosine search ranks entities for a user by ``s_u·x_e``. The served dimension is a product
choice (storage, Feast, Milvus, every ranker), not the base's, so the export keeps K free
inside and serves

    entity:  z' = [P^T x, sqrt(1 - |P^T x|^2)]        user:  z' = [P^T s / |P^T s|, 0]

with P (K, d) orthonormal columns shared by every type: one space, so a user searches entities,
an entity finds its neighbours and the tokenizer groups directions there, as before. ``|P^T x| <=
|x| <= 1``, so the slack stays real and every row stays unit-norm; a user's vector is rescaled by a
positive constant, so a cosine search still ranks each user's entities by the projected dot
product ``s_u^T P P^T x_e``.

Why these directions. With Q = I - P P^T, a pair's dot-product error is ``s_u^T Q x_e`` and its
mean square over users and entities is ``tr(Q C_u Q C_e)`` (C_u, C_e the uncentered second
moments of the user directions and of the entity vectors). That has no closed-form minimiser over
projections, but it is at most ``tr(Q C_u) tr(Q C_e) <= (tr(Q C_u) + tr(Q C_e))^2 / 4`` (Q C_e Q is
positive semidefinite with eigenvalues <= its trace), and the sum is minimised, over rank-d P, by
the top-d eigenvectors of ``C_u + C_e``: the classic PCA result. Each moment is normalised to unit
trace first, so users and entities weigh equally whatever their counts and scales (entities' x
has norm a < 1). Entities enter with their scale: a popular entity (large a) takes a large share
of every user's top list, so its direction matters more. Only warm rows fit P: cold rows are
knowledge-view guesses that the export then places by their content neighbours in the served space
(:mod:`hir.export.cold`). When the two moments share eigenvectors (the spectral base's
coordinates are the SVD's, close to that), those are exactly the optimum's directions.

The weighting was checked on online_retail's val split (masked new-to-user recall@20 of the
full-rank export projected afterwards, 1,125 val users, rank 256, full rank 0.1108;
w C_u + (1 - w) C_e): at d = 64 users alone (w = 1) 0.1127, the equal sum 0.1107, entities alone
0.1057, the first 64 coordinates 0.0961; at d = 128 0.1113 / 0.1118 / 0.1131, the first 128
coordinates 0.1051. No weighting wins at both sizes; the equal sum is never far from the best,
and every fitted basis beats truncation by far.

``hir refresh`` embeds new entities at K + 1 and projects them with the P the export saved
(``embeddings/projection.npz``, stamped with the model version), so a refreshed row is the row
the export would have written.

Where the tokens live (``export.token_space``). ``full`` (the default) fits the Bag-of-Meaning
tree on the warm entities' rank-K directions and tokenises every row there: a row the export
placed in the served space (cold entities, cold users) is lifted back with P (:func:`lift`,
:func:`token_vectors`), so it sees the served part of the tree. ``served`` fits and tokenises
the served directions (the tree projected by :func:`served_tokenizer`, then refitted). Measured
on completejourney (docs/results.md, "export.dim = 128 on the default rank"; 3 seeds, rank 256,
d = 128): the hir_tokens ranking arm's NE lift is +1.97 / +1.58 / +1.92 % with the tokens at the
full rank, +1.43 / +1.42 / +1.63 % with them in the served space, and +1.68 / +1.60 / +2.01 % for
the unprojected 257-d export: the tree needs the directions the projection drops, the served
vectors do not.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hir.atomic import atomic_path
from hir.errors import InputError
from hir.model.served import Rows, fit_basis
from hir.nn import HierarchicalTokenizer

log = logging.getLogger(__name__)

PROJECTION_FILE = "projection.npz"  # embeddings/: the served basis (refresh projects with it)
FULL = ("full", "none")  # export.dim values that mean no projection (as does null)
AUTO = "auto"  # export.dim: the served dimension `hir train` chose on val (hir/model/served.py)


def served_rank(dim: int | str | None) -> int | str | None:
    """``export.dim`` -> the served direction count d (the embedding has d + 1 coordinates), None
    for the full rank (null, ``full``), or ``auto`` (the d `hir train` chose on val,
    :mod:`hir.model.served`; :func:`resolve_dim`)."""
    if dim is None or (isinstance(dim, str) and dim.lower() in FULL):
        return None
    if isinstance(dim, str) and dim.lower() == AUTO:
        return AUTO
    try:
        d = int(dim)
    except (TypeError, ValueError):
        raise ValueError(f"export.dim={dim!r}; expected a positive int (served directions), auto, or null/full") from None
    if d < 1:
        raise ValueError(f"export.dim={d}; expected a positive int (served directions), auto, or null/full")
    return d


def resolve_dim(dim: int | str | None, chosen: int | None, fallback: int) -> int | None:
    """The served directions an export takes: ``dim`` itself, or at ``auto`` the d `hir train`
    chose on val (``chosen``, from the basis file: 0 = the full rank), and ``fallback`` for a
    basis trained before that choice existed (None: it has none)."""
    d = served_rank(dim)
    if d != AUTO:
        return d
    if chosen is None:
        log.warning("export.dim=auto: the checkpoint's spectral basis records no served dimension chosen on val "
                    "(trained before export.dim=auto); serving export.dim_fallback=%d", fallback)
        return int(fallback)
    return None if int(chosen) == 0 else int(chosen)


def project(z: np.ndarray, basis: np.ndarray, is_user: np.ndarray) -> np.ndarray:
    """(n, K + 1) universal embeddings -> (n, d + 1) served ones (module doc), P = ``basis`` (K, d).

    ``is_user`` (n,) bool marks the user rows (unit direction, zero slack); every other row keeps
    its projected vector and takes the slack that makes it unit-norm. A user whose direction is
    orthogonal to every served direction (|P^T s| < 1e-6: nothing left to rank with) takes the
    leading direction, so its row stays a valid unit vector; the count is logged.
    """
    k, d = basis.shape
    if z.shape[1] != k + 1:
        raise InputError(f"embeddings of width {z.shape[1]} cannot take a projection fitted on rank {k} (width "
                         f"{k + 1}); project the K + 1 embeddings of the model that export saved it with")
    is_user = np.asarray(is_user, bool)
    v = np.asarray(z[:, :-1], np.float32) @ basis  # (n, d)
    out = np.zeros((len(z), d + 1), np.float32)
    norm = np.linalg.norm(v, axis=1)
    lost = is_user & (norm < 1e-6)
    if lost.any():
        log.warning("served dimension %d: %d user directions have no component in it; they take the leading "
                    "direction", d, int(lost.sum()))
        v[lost] = 0.0
        v[lost, 0] = 1.0
        norm[lost] = 1.0
    out[is_user, :d] = v[is_user] / norm[is_user, None]
    ent = ~is_user
    # |P^T x| <= |x| <= 1 in exact arithmetic; the clip absorbs float round-off
    out[ent, :d] = v[ent]
    out[ent, d] = np.sqrt(np.clip(1.0 - norm[ent] ** 2, 0.0, 1.0))
    return out


@dataclass
class Projection:
    """The served basis of one export: ``basis`` (K, d), the ``model_version`` it was fitted for
    and what it kept (``report``)."""

    basis: np.ndarray
    model_version: str
    report: dict[str, Any]

    @property
    def rank(self) -> int:
        return int(self.basis.shape[0])

    @property
    def served(self) -> int:
        return int(self.basis.shape[1])

    def apply(self, z: np.ndarray, is_user: np.ndarray) -> np.ndarray:
        """(n, K + 1) -> (n, d + 1); see :func:`project`."""
        return project(z, self.basis, is_user)

    def save(self, path: str | Path) -> None:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, basis=self.basis, model_version=np.array(self.model_version))

    @classmethod
    def load(cls, path: str | Path, model_version: str) -> Projection:
        """The basis an export of model ``model_version`` saved; another model's raises."""
        with np.load(Path(path)) as f:
            basis, version = f["basis"], str(f["model_version"])
        if version != model_version:
            raise InputError(f"{path} was saved by the export of model {version!r}, not {model_version!r}; use the "
                             "embeddings/ of the run that exported the live version")
        return cls(basis.astype(np.float32), version, {})


def load_projection(emb_dir: str | Path, meta: dict[str, Any], model_version: str) -> Projection | None:
    """The export's projection (None when it served the full rank), as its meta.json records it."""
    if not meta.get("projection"):
        return None
    path = Path(emb_dir) / PROJECTION_FILE
    if not path.exists():
        raise InputError(f"{Path(emb_dir) / 'meta.json'} records a served dimension {meta['dim']} but {path} is "
                         "missing; re-export (hir export force=true) or restore the file")
    return Projection.load(path, model_version)


def fit_projection(z: np.ndarray, is_user: np.ndarray, warm: np.ndarray, dim: int | str | None,
                   model_version: str) -> Projection | None:
    """The export's served basis for embeddings ``z`` (n, K + 1): fitted on the warm rows
    (``warm`` (n,) bool; all rows when none is warm), or None when ``dim`` asks for the full rank
    or for at least K directions (nothing to project: the export is the network's own)."""
    d = served_rank(dim)
    if d == AUTO:
        raise ValueError("export.dim=auto must be resolved to the chosen dimension first (resolve_dim)")
    k = z.shape[1] - 1
    if d is None or d >= k:
        return None
    rows = np.asarray(warm, bool) if np.asarray(warm, bool).any() else np.ones(len(z), bool)
    is_user = np.asarray(is_user, bool)
    # the fitted rows are read a chunk at a time (Rows), not copied whole: an (n, K) copy at 10M events
    users, ents = (Rows(z, np.flatnonzero(rows & sel), k) for sel in (is_user, ~is_user))
    basis, kept = fit_basis(users, ents, d)
    report = {"rank": k, "served": d, "dim": d + 1, "fit_users": len(users), "fit_entities": len(ents),
              **{n: round(v, 4) for n, v in kept.items()}}
    return Projection(basis, model_version, report)


TOKEN_SPACES = ("full", "served")  # export.token_space: where the Bag-of-Meaning tokens are fitted and read


LIFT_BLOCK = 16384  # rows lifted per product: no (n, K) product beside the output


def row_blocks(n: int, block: int = LIFT_BLOCK) -> list[tuple[int, int]]:
    """[lo, hi) blocks of ``block`` rows covering n, the remainder joined to the last full block:
    a product of a handful of rows may take another BLAS path than the same rows inside a large
    product (MKL does so below 16 rows, hir/model/metrics.py), and a lifted row must not depend
    on how many rows were lifted with it."""
    edges = [*range(0, n, block), n]
    if len(edges) > 2 and edges[-1] - edges[-2] < block:
        edges.pop(-2)
    return list(itertools.pairwise(edges))


def lift(z: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """(n, d + 1) served embeddings -> (n, K + 1) in the rank-K space, ``[P z[:, :d], z[:, d]]``
    (P = ``basis`` (K, d)): the same direction, with nothing outside the served span. A cosine
    with a rank-K prototype c then reads ``z[:, :d] . P^T c``, so a row that exists only in the
    served space (placed there) is tokenised by the part of the tree it can see. Computed a block
    of rows at a time (:func:`row_blocks`): the whole product beside the output was a second
    (n, K) array, 2.2 GB at 10M events."""
    k, d = basis.shape
    if z.shape[1] != d + 1:
        raise InputError(f"served embeddings of width {z.shape[1]} cannot be lifted by a basis of {d} served "
                         f"directions (width {d + 1})")
    out = np.empty((len(z), k + 1), np.float32)
    for lo, hi in row_blocks(len(z)):
        out[lo:hi, :k] = np.asarray(z[lo:hi, :d], np.float32) @ basis.T
    out[:, k] = z[:, d]
    return out


def token_vectors(full: np.ndarray, projected: np.ndarray, served: np.ndarray,
                  projection: Projection | None) -> np.ndarray:
    """The vectors the tokens read at ``export.token_space=full``: (n, K + 1).

    Args:
        full: (n, K + 1) the network's embeddings, before the projection.
        projected: (n, d + 1) ``projection.apply(full)``, before cold placement.
        served: (n, d + 1) the exported embeddings (placement done).
        projection: the export's; None (full rank) returns ``served`` as it is.

    A row placement left alone takes its own rank-K vector; a row the export placed in the served
    space (a cold entity by its content neighbours, a cold user) has no rank-K vector of its own
    and is lifted back (:func:`lift`). `hir refresh` calls this on its new entities the same way,
    so a refreshed row gets the tokens the export would have given it.
    """
    if projection is None:
        return served
    if full.shape[1] != projection.rank + 1 or projected.shape != served.shape:
        raise ValueError(f"token_vectors: widths {full.shape[1]} / {projected.shape} / {served.shape} do not fit a "
                         f"projection of rank {projection.rank} onto {projection.served}")
    out = lift(served, projection.basis)
    kept = (projected == served).all(axis=1)
    # a block of rows at a time: full[kept] whole is an (n, K + 1) copy (2.2 GB at 10M events)
    block = 16384
    for lo in range(0, len(out), block):
        k = kept[lo:lo + block]
        out[lo:lo + block][k] = full[lo:lo + block][k]
    return out


def served_tokenizer(tokenizer: HierarchicalTokenizer, projection: Projection) -> HierarchicalTokenizer:
    """The tokenizer's tree in the served space: a tokenizer of width d (same levels, top-k,
    temperature, bound) whose prototypes are the projections of ``tokenizer``'s (K wide), each
    kept at its own norm. A child whose projected offset from its parent exceeds the residual
    bound lands on the bound (the parametrisation allows no more). ``export.hierarchy_fit=entities``
    then refits the tree on the served directions anyway."""
    out = HierarchicalTokenizer(projection.served, tokenizer.levels, tokenizer.top_k, tokenizer.tau, tokenizer.radius,
                                tokenizer.free_levels)
    p = torch.from_numpy(projection.basis)
    with torch.no_grad():
        for lvl, v in enumerate(tokenizer.vectors()):
            pv = v.detach().float() @ p  # (K_l, d)
            pv = pv * (v.norm(dim=-1, keepdim=True) / pv.norm(dim=-1, keepdim=True).clamp_min(1e-12))
            out._set_level(lvl, pv, out.vectors())
        for lvl in range(len(tokenizer.levels)):
            getattr(out, f"usage_{lvl}").copy_(getattr(tokenizer, f"usage_{lvl}"))
    return out.eval()


def describe(projection: Projection | None) -> str:
    return "full rank" if projection is None else \
        f"{projection.served} of {projection.rank} directions (width {projection.served + 1})"

