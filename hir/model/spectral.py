"""Spectral base of the engagement view: every node's collaborative starting vector.

A truncated SVD of the degree-normalised, stage-weighted user x entity matrix (the *ideal
low-pass filter* of GF-CF, Shen et al. 2021, and SVD-GCN, Peng et al. 2022)::

    R[u, e]  = stage_base ** (r_ue - S)       deepest funnel stage r_ue of the pair, S the deepest
    R~       = D_u^-1/2 R D_e^-1/2  ~  U_K diag(s_K) V_K^T          (randomised SVD)
    entity:  b_e = d_e^1/2 V_K[e]                                   (norm grows with popularity)
    user:    b_u = (r_u D_e^-1/2 V_K) diag(1 + c s_K^2)             (fold-in of the user's history)

``b_u . b_e`` ranks like the ideal low-pass filter plus a truncated linear filter (the ``c s^2``
term). Users are folded in from their history, so a user's vector follows whatever engagement
is visible (export can see more than training did) and users unseen at fit time get one too.
Entities engaged in the visible window but absent at fit time are folded in through U
(``V[e] = R~[:, e]^T U_K / s_K``); entities nobody engages with (categories, advertisers) get
the mean vector of their members (a category's products); the rest (cold start) get none and
are embedded by the knowledge view.

Measured on the Gowalla LightGCN split (train items masked, full ranking): recall@20 0.1867 at
K = 512 without any training, against 0.1830 published for LightGCN. The rank is chosen on the
validation split among ``ranks`` (:func:`select_rank`), so a small catalogue is not given 512
noisy directions.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from hir.model.metrics import masked_recall
from hir.model.store import GraphStore
from hir.model.valset import ValSet

log = logging.getLogger(__name__)

# the basis file `hir train` writes beside its checkpoints (export reads it)
SPECTRAL_FILE = "spectral.npz"

# a scale logit is log(r / (1 - r)) of the entity's base norm relative to the largest of its
# type, r <= R_MAX: the largest entity keeps a little headroom to grow during training
R_MAX = 0.95
# floor of r: an entity whose base is (almost) zero still gets a finite logit
R_MIN = 1e-4


@dataclass
class SpectralConfig:
    """How `hir train` fits the base (conf/spectral).

    rank: an int, or ``"auto"`` = the best of ``ranks`` on the val split (the base alone);
    stage_base: a pair r stages short of the deepest weighs ``stage_base ** -r``; sigma_weight:
    c of the users' filter ``1 + c s^2``; n_iter: randomised-SVD power iterations.
    """

    rank: int | str
    ranks: list[int]
    stage_base: float
    sigma_weight: float
    n_iter: int

    @property
    def candidate_ranks(self) -> list[int]:
        """The ranks tried: ``ranks`` with ``rank: auto``, else ``[rank]``."""
        return sorted(int(r) for r in self.ranks) if self.rank == "auto" else [int(self.rank)]


@dataclass
class SpectralBase:
    """The base of one store's visible engagement (:meth:`SpectralBasis.base_for`).

    vectors: (n, K) float32 per node (zero rows: none, cold start); logit: (n,) float32 scale
    logit of each node's base norm (:func:`scale_logits`); degree: (n,) float32 column degree
    (entities); filter: (K,) float32 the users' spectral filter ``1 + c s^2``.
    """

    vectors: np.ndarray
    logit: np.ndarray
    degree: np.ndarray
    filter: np.ndarray

    @property
    def rank(self) -> int:
        return int(self.vectors.shape[1])

    def leave_one_out(self, users: np.ndarray, entities: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """Users' base vectors without one engaged entity each: (P,) users, (P,) entities, (P,)
        the pair's weight in ``R`` -> (P, K) ``b_u - w d_e^-1 b_e (1 + c s^2)`` (exact: removes the
        entity's term of the user's fold-in). Training targets a held-out entity with the user's
        base computed as if the pair were unseen, as at test time, where the positives are new."""
        d = np.maximum(self.degree[entities], 1e-12)[:, None]
        return self.vectors[users] - (weight[:, None] / d) * self.vectors[entities] * self.filter[None, :]


def engagement_matrix(store: GraphStore, stage_base: float) -> sp.csr_matrix:
    """(n_users, n_nodes) CSR of visible user -> entity pairs, weighted by their deepest stage."""
    lo, hi = store.type_range("user")
    eng = store.eng
    rows = np.repeat(np.arange(store.n_nodes), np.diff(eng.indptr))
    keep = (rows >= lo) & (rows < hi)
    deepest = len(store.stage_order)
    w = np.power(float(stage_base), eng.stage[keep].astype(np.float64) - deepest)
    m = sp.csr_matrix((w, (rows[keep] - lo, eng.dst[keep])), shape=(hi - lo, store.n_nodes))
    m.sum_duplicates()
    return m


@dataclass
class SpectralBasis:
    """The fitted SVD: enough to compute :func:`base_vectors` for any visible window.

    cols: (E,) global ids of the entity columns at fit time; v: (E, K) their right singular
    vectors; u: (n_users, K) left singular vectors; sigma: (K,) singular values (descending);
    col_degree: (E,) the columns' weighted degree at fit time; scale_ref: per type id, the
    largest base norm at fit time (the scale logits' reference); sigma_weight: c of the filter;
    stage_base: the stage weighting of ``R``.
    """

    cols: np.ndarray
    v: np.ndarray
    u: np.ndarray
    sigma: np.ndarray
    col_degree: np.ndarray
    scale_ref: np.ndarray
    sigma_weight: float
    stage_base: float

    @property
    def rank(self) -> int:
        return len(self.sigma)

    def truncate(self, k: int) -> SpectralBasis:
        """The first ``k`` components (the SVD is nested: a prefix is the rank-k solution)."""
        return SpectralBasis(self.cols, self.v[:, :k], self.u[:, :k], self.sigma[:k], self.col_degree,
                             self.scale_ref, self.sigma_weight, self.stage_base)

    def save(self, path: str | Path) -> None:
        np.savez(path, cols=self.cols, v=self.v, u=self.u, sigma=self.sigma, col_degree=self.col_degree,
                 scale_ref=self.scale_ref, sigma_weight=self.sigma_weight, stage_base=self.stage_base)

    def base_for(self, store: GraphStore) -> SpectralBase:
        """The :class:`SpectralBase` of ``store``'s visible engagement (users folded in from it)."""
        vectors, degree, filt = _base(store, self)
        return SpectralBase(vectors, scale_logits(store, self, vectors), degree, filt)

    @classmethod
    def load(cls, path: str | Path) -> SpectralBasis:
        # (bases written while a `holdout` option existed carry a `heldout` array; it is not read)
        with np.load(path) as f:
            return cls(f["cols"], f["v"], f["u"], f["sigma"], f["col_degree"], f["scale_ref"],
                       float(f["sigma_weight"]), float(f["stage_base"]))


def fit_spectral(store: GraphStore, rank: int, stage_base: float, sigma_weight: float, n_iter: int,
                 seed: int) -> SpectralBasis:
    """Randomised truncated SVD of the store's normalised engagement matrix.

    Args:
        store: the training snapshot (train-visible engagement).
        rank: components K (capped below the matrix's smaller side).
        stage_base: a pair whose deepest stage is r stages short of the deepest weighs stage_base^-r.
        sigma_weight: c in the user filter ``1 + c s^2``.
        n_iter: power iterations of the randomised SVD (accuracy of the trailing components).
        seed: its random state.
    """
    from sklearn.utils.extmath import randomized_svd

    r = engagement_matrix(store, stage_base)
    col_deg = np.asarray(r.sum(0)).ravel()
    cols = np.flatnonzero(col_deg > 0)
    if len(cols) == 0:
        raise ValueError("the snapshot has no visible user engagement: nothing to factorise")
    r = r[:, cols].tocsr()
    du = np.asarray(r.sum(1)).ravel()
    dc = col_deg[cols]
    rn = sp.diags(1.0 / np.sqrt(np.maximum(du, 1e-12))) @ r @ sp.diags(1.0 / np.sqrt(dc))
    k = max(1, min(int(rank), min(rn.shape) - 1))
    u, s, vt = randomized_svd(rn, k, n_iter=n_iter, random_state=seed)
    basis = SpectralBasis(cols.astype(np.int64), vt.T.astype(np.float32), u.astype(np.float32), s.astype(np.float32),
                          dc.astype(np.float32), np.ones(len(store.types), np.float32), float(sigma_weight),
                          float(stage_base))
    base = base_vectors(store, basis)
    norms = np.linalg.norm(base, axis=1)
    ref = np.ones(len(store.types), np.float32)
    for t in range(len(store.types)):
        sel = (store.node_type == t) & (norms > 0)
        if sel.any():
            ref[t] = float(norms[sel].max())
    basis.scale_ref = ref
    log.info("spectral base: rank %d of a %d x %d matrix (%d pairs), singular values %.3f .. %.3f",
             k, r.shape[0], r.shape[1], r.nnz, float(s[0]), float(s[-1]))
    return basis


def base_vectors(store: GraphStore, basis: SpectralBasis) -> np.ndarray:
    """(n_nodes, K) float32 base vector of every node of ``store`` (zeros: no base, cold start).

    Entities: ``d^1/2 V`` (fit-time columns) or their fold-in through U (columns new in the
    visible window); users: fold-in of their visible history; entities without engagement: the
    mean of their members' vectors (``store.down``). See the module doc.
    """
    return _base(store, basis)[0]


def _base(store: GraphStore, basis: SpectralBasis) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`base_vectors`, plus each node's column degree d (n,) and the user filter (K,)."""
    n, k = store.n_nodes, basis.rank
    out = np.zeros((n, k), np.float32)
    r = engagement_matrix(store, basis.stage_base)  # (n_users, n_nodes) visible pairs
    deg = np.asarray(r.sum(0)).ravel()
    # entity columns known at fit time keep their fit-time vector and degree
    item_v = np.zeros((n, k), np.float32)
    item_v[basis.cols] = basis.v
    known = np.zeros(n, bool)
    known[basis.cols] = True
    deg_fit = np.zeros(n, np.float64)
    deg_fit[basis.cols] = basis.col_degree
    new = np.flatnonzero(~known & (deg > 0))
    if len(new):
        # fold-in: V[e] = (D_u^-1/2 R[:, e] d_e^-1/2)^T U / s
        du = np.asarray(r.sum(1)).ravel()
        rc = sp.diags(1.0 / np.sqrt(np.maximum(du, 1e-12))) @ r[:, new]
        vn = (rc.T @ basis.u) / np.sqrt(deg[new])[:, None] / np.maximum(basis.sigma, 1e-12)[None, :]
        item_v[new] = vn.astype(np.float32)
        deg_fit[new] = deg[new]
    ent = known | (deg > 0)
    out[ent] = item_v[ent] * np.sqrt(deg_fit[ent])[:, None].astype(np.float32)
    # users: r_u D^-1/2 V (1 + c s^2), over every visible entity column with a vector
    inv = np.where(ent, 1.0 / np.sqrt(np.maximum(deg_fit, 1e-12)), 0.0)
    lo, hi = store.type_range("user")
    filt = (1.0 + basis.sigma_weight * basis.sigma.astype(np.float64) ** 2).astype(np.float32)
    out[lo:hi] = np.asarray(r @ sp.diags(inv) @ item_v) * filt[None, :]
    # entities nobody engages with: the mean of their members' vectors (a category's products)
    down = store.down
    rows = np.repeat(np.arange(n), np.diff(down.indptr))
    member_has = np.linalg.norm(out[down.dst], axis=1) > 0 if len(down.dst) else np.zeros(0, bool)
    empty = np.linalg.norm(out, axis=1) == 0
    pick = empty[rows] & member_has
    if pick.any():
        sums = np.zeros((n, k), np.float64)
        np.add.at(sums, rows[pick], out[down.dst[pick]])
        cnt = np.bincount(rows[pick], minlength=n)
        filled = cnt > 0
        out[filled] = (sums[filled] / cnt[filled, None]).astype(np.float32)
    return out, deg_fit.astype(np.float32), filt


def scale_logits(store: GraphStore, basis: SpectralBasis, base: np.ndarray) -> np.ndarray:
    """(n_nodes,) float32 logit of each node's base scale: ``log(r / (1 - r))`` with r its base
    norm over the largest of its type at fit time (clipped to [R_MIN, R_MAX])."""
    ratio = np.linalg.norm(base, axis=1) / basis.scale_ref[store.node_type] * R_MAX
    ratio = np.clip(ratio, R_MIN, R_MAX)
    return np.log(ratio / (1 - ratio)).astype(np.float32)


def select_rank(store: GraphStore, basis: SpectralBasis, val: ValSet, ranks: list[int],
                k: int = 20) -> tuple[int, dict[int, float]]:
    """The rank among ``ranks`` (prefixes of ``basis``) with the best validation recall@k of the
    base alone; ties go to the smaller rank. Returns (rank, {rank: recall})."""
    table: dict[int, float] = {}
    for r in sorted({min(int(x), basis.rank) for x in ranks}):
        b = base_vectors(store, basis.truncate(r))
        users = b[val.users]
        users = users / np.maximum(np.linalg.norm(users, axis=1, keepdims=True), 1e-12)
        table[r] = round(float(masked_recall(users, b[val.cands], val.positives, val.masked, k)), 5)
    best = max(table, key=lambda r: (table[r], -r))
    return best, table


def fit_base(store: GraphStore, val: ValSet | None, config: SpectralConfig, seed: int, path: Path,
             reuse: bool) -> tuple[SpectralBasis, dict[str, Any]]:
    """Fit the basis (or, with ``reuse``, reload it from ``path``), choose its rank on ``val``
    when ``config.rank`` is ``auto``, and save it to ``path``.

    Returns the (truncated) basis and a report: the rank, the val recall@20 of each rank tried,
    seconds.
    """
    t0 = time.perf_counter()
    report: dict[str, Any] = {}
    if reuse and path.exists():
        basis = SpectralBasis.load(path)
        report["reused"] = str(path)
    else:
        ranks = config.candidate_ranks
        basis = fit_spectral(store, max(ranks), float(config.stage_base), float(config.sigma_weight),
                             int(config.n_iter), seed)
        if len(ranks) > 1:
            best, table = select_rank(store, basis, val, ranks)
            report["val_recall@20_by_rank"] = table
            basis = basis.truncate(best)
        path.parent.mkdir(parents=True, exist_ok=True)
        basis.save(path)
    report |= {"rank": basis.rank, "seconds": round(time.perf_counter() - t0, 2)}
    log.info("spectral base: rank %d%s in %.1fs", basis.rank,
             f" (val recall@20 by rank {report['val_recall@20_by_rank']})" if "val_recall@20_by_rank" in report else "",
             report["seconds"])
    return basis, report
