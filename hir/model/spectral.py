"""Spectral base of the engagement view: every node's collaborative starting vector.

A truncated SVD of the degree-normalised, stage-weighted user x entity matrix, filtered as the
best published training-free recommenders filter it (GF-CF, Shen et al. 2021; BSPM, Choi et al.
2023; ChebyCF, Kim et al. 2025), in a form that serves as embeddings::

    R[u, e]  = stage_base ** (r_ue - S)       deepest funnel stage r_ue of the pair, S the deepest
    R~       = D_u^-1/2 R D_e^-1/2  ~  U_K diag(s_K) V_K^T          (randomised SVD)
    entity:  b_e = t_e d_e^b V_K[e]                                 (t_e: trend factor, default 1)
    user:    b_u = (r~_u D_e^-b V_K) diag(g(s_K))                   (fold-in of the user's history)

with ``r~_u = r_u 2^(-age / H)``: the user's own pairs decayed by their age (days from the pair's
last event to the end of the visible window) at the user-side half-life H (H = 0: none, r~ = r).

``b_u . b_e = t_e r_u D^-b V g(s) V^T D^b [:, e]``: the filter ``g(s) = a + h(s^2)`` (the ideal
low-pass at weight ``a`` plus a polynomial of the item-item graph, :mod:`hir.model.filters`) with
the item-degree re-weighting of BSPM/ChebyCF (input x D^-b, output x D^b; b = 1/2 is GF-CF's).
The trend factor ``t_e = ((users of e in the last W days + 1) / (users of e + 1)) ** p`` lifts
what is engaged now on data with time (p = 0: none); the half-life H weighs what *this user*
engaged lately above what it engaged long ago (the entity side and the SVD are unchanged). Users are folded in from their history, so
a user's vector follows whatever engagement is visible (export can see more than training did)
and users unseen at fit time get one too. Entities engaged in the visible window but absent at
fit time are folded in through U (``V[e] = R~[:, e]^T U_K / s_K``); entities nobody engages
with (categories, advertisers) get the mean vector of their members (a category's products);
the rest (cold start) get none and are embedded by the knowledge view.

Every choice (rank, b, the response h, a, the trend window and power, the user half-life and the
stage weighting)
is made on the validation split from one SVD per stage weighting (:func:`select_filter`): a
prefix of the SVD is the lower-rank solution, and the filter only rescales its columns.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from hir.model.filters import trend_factor, user_filter
from hir.model.metrics import beats, masked_recall, recall_per_user, row_norms
from hir.model.served import below as served_below
from hir.model.served import cap as served_cap
from hir.model.served import choose_served_dim
from hir.model.store import GraphStore
from hir.model.usersample import refine_on_all, resolve_cap, stratified_users
from hir.model.valset import ValSet, validation_set

log = logging.getLogger(__name__)

# the basis file `hir train` writes beside its checkpoints (export reads it)
SPECTRAL_FILE = "spectral.npz"
# the step-0 checkpoint `hir train` writes (the base before any correction; export can refit it)
INIT_CHECKPOINT = "init.ckpt"

# a scale logit is log(r / (1 - r)) of the entity's base norm relative to the largest of its
# type, r <= R_MAX: the largest entity keeps a little headroom to grow during training
R_MAX = 0.95
# floor of r: an entity whose base is (almost) zero still gets a finite logit
R_MIN = 1e-4


@dataclass(frozen=True)
class Filter:
    """The filter of the base (see the module doc): ``beta`` = b, the item-degree exponent;
    ``response`` = h and ``ideal_weight`` = a of ``g(s) = a + h(s^2)``; ``trend_days`` = W and
    ``trend_power`` = p of the entity trend factor (p = 0: none); ``user_half_life`` = H, days, of
    the decay of a user's own pairs in its fold-in (0: none)."""

    beta: float = 0.5
    response: str = "linear"
    ideal_weight: float = 1.0
    trend_days: float = 28.0
    trend_power: float = 0.0
    user_half_life: float = 0.0

    def label(self) -> str:
        trend = f", trend {self.trend_power:g} over {self.trend_days:g} d" if self.trend_power else ""
        decay = f", user half-life {self.user_half_life:g} d" if self.user_half_life else ""
        return f"{self.response} + {self.ideal_weight:g} ideal, degree {self.beta:g}{trend}{decay}"


@dataclass
class SpectralConfig:
    """How `hir train` fits the base (conf/spectral).

    rank: an int, or ``"auto"`` = the best of ``ranks`` on the val split; stage_base: a pair r
    stages short of the deepest weighs ``stage_base ** -r``, or ``"auto"`` = the best of
    ``stage_bases`` (one SVD each; single-stage data skips it); betas, responses, ideal_weights,
    trend_days, trend_powers, user_half_lives: the filter candidates (:class:`Filter`; ``filter`` is the starting
    point of the search and what a one-candidate list leaves); published: filter settings of the
    published family members, tried last; select_users: val users the choice is scored on (a
    seeded sample, null = all); select_pairs: at most this many (val user x candidate) scores
    per candidate filter, fewer users where the catalogue is larger (null = no budget;
    :meth:`ValSet.scored_users`); max_svd_gib: ranks whose SVD working set passes this many GiB
    are not fitted (:func:`largest_rank`; null = no cap); noise_z, min_gain: a step must beat the current choice by more
    than ``noise_z`` paired standard errors over those users and by ``min_gain`` (relative);
    n_iter: randomised-SVD power iterations; sample_users: the users the basis is fit on (null =
    all; a fraction in (0, 1] or a count: a seeded sample stratified by activity,
    :mod:`hir.model.usersample`; every user is still folded in from its own row); served_dims:
    the served dimensions ``export.dim=auto`` chooses among on val (:mod:`hir.model.served`);
    svd_dtype: the randomised SVD's float type (:func:`svd_dtype`: ``auto`` = float32 only for a
    fit whose float64 working set would pass ``SVD_FLOAT32_ABOVE_GIB``; export's refit uses ``auto``);
    joint_filter_step: one search step over every (beta, response, ideal_weight) together instead of
    a step over beta and then one over (response, ideal_weight).
    """

    rank: int | str
    ranks: list[int]
    stage_base: float | str
    n_iter: int
    stage_bases: list[float] = field(default_factory=lambda: [4.0])
    filter: dict[str, Any] = field(default_factory=dict)
    betas: list[float] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    ideal_weights: list[float] = field(default_factory=list)
    trend_days: list[float] = field(default_factory=list)
    trend_powers: list[float] = field(default_factory=list)
    user_half_lives: list[float] = field(default_factory=list)
    select_users: int | None = None
    select_pairs: float | None = None
    max_svd_gib: float | None = None
    min_gain: float = 0.0
    probe_rank: int = 256
    noise_z: float = 1.96
    published: list[dict[str, Any]] = field(default_factory=list)
    sample_users: int | float | None = None
    served_dims: list[int] = field(default_factory=list)
    svd_dtype: str = "auto"
    joint_filter_step: bool = False

    def __post_init__(self) -> None:
        svd_dtype(1, 1, 1, self.svd_dtype)  # a bad value names the key now, not after the data loads

    @property
    def candidate_ranks(self) -> list[int]:
        """The ranks tried: ``ranks`` with ``rank: auto``, else ``[rank]``."""
        return sorted(int(r) for r in self.ranks) if self.rank == "auto" else [int(self.rank)]

    @property
    def candidate_stage_bases(self) -> list[float]:
        """The stage weightings tried: ``stage_bases`` with ``stage_base: auto``, else ``[stage_base]``."""
        return [float(x) for x in self.stage_bases] if self.stage_base == "auto" else [float(self.stage_base)]

    @property
    def start(self) -> Filter:
        """The filter the search starts from (``filter``)."""
        return Filter(**self.filter)


@dataclass
class SpectralBase:
    """The base of one store's visible engagement (:meth:`SpectralBasis.base_for`).

    vectors: (n, K) float32 per node (zero rows: none, cold start); logit: (n,) float32 scale
    logit of each node's base norm (:func:`scale_logits`); degree: (n,) float32 column degree
    (entities); filter: (K,) float32 the users' spectral filter g(s); beta: the degree exponent b.
    """

    vectors: np.ndarray
    logit: np.ndarray
    degree: np.ndarray
    filter: np.ndarray
    beta: float = 0.5
    trend: np.ndarray | None = None  # (n,) float32 the entities' trend factor t_e (None: 1)

    @property
    def rank(self) -> int:
        return int(self.vectors.shape[1])

    def leave_one_out(self, users: np.ndarray, entities: np.ndarray, weight: np.ndarray,
                      remaining: np.ndarray | None = None) -> np.ndarray:
        """Users' base vectors without one engaged entity each: (P,) users, (P,) entities, (P,)
        the pair's weight in the user's row ``r~`` (stage weight, times its decay under a user
        half-life) -> (P, K) ``b_u - w d_e^-b V[e] g`` with ``V[e] = b_e / (t_e
        d_e^b)`` (the trend factor included: exactly the entity's term of the user's fold-in).
        ``remaining`` (P,) bool, False where the pair was the user's only visible engagement:
        those users get a zero row (no base: the network's fallback), not a unit vector of
        rounding residue. The learner's training task does not use this (its base never saw its
        targets, :mod:`hir.model.task`); it is the exact held-out base of one pair."""
        d = np.power(np.maximum(self.degree[entities], 1e-12), 2 * self.beta)
        t = np.ones(len(entities), np.float64) if self.trend is None else self.trend[entities].astype(np.float64)
        coef = (weight / (d * np.maximum(t, 1e-12)))[:, None]
        out = self.vectors[users] - (coef * self.vectors[entities] * self.filter[None, :]).astype(np.float32)
        if remaining is not None:
            out[~np.asarray(remaining, bool)] = 0.0
        return out


def engagement_matrix(store: GraphStore, stage_base: float, user_half_life: float = 0.0) -> sp.csr_matrix:
    """(n_users, n_nodes) CSR of visible user -> entity pairs, weighted by their deepest stage and,
    with ``user_half_life`` H > 0 (days), by ``2^(-age / H)`` of the pair's age at the end of the
    visible window: the users' decayed rows ``r~`` of their fold-in (the SVD and the entity side
    read H = 0)."""
    lo, hi = store.type_range("user")
    eng = store.eng
    rows = np.repeat(np.arange(store.n_nodes), np.diff(eng.indptr))
    keep = (rows >= lo) & (rows < hi)
    deepest = len(store.stage_order)
    w = np.power(float(stage_base), eng.stage[keep].astype(np.float64) - deepest)
    if user_half_life > 0:
        w = w * np.exp2(-eng.age[keep].astype(np.float64) * store.span_days / float(user_half_life))
    m = sp.csr_matrix((w, (rows[keep] - lo, eng.dst[keep])), shape=(hi - lo, store.n_nodes))
    m.sum_duplicates()
    return m


def engaged_users(store: GraphStore, days: float, deep_only: bool = False) -> tuple[np.ndarray, np.ndarray, bool]:
    """Per node (n,): distinct visible users engaging it in the last ``days`` of the visible
    window, and ever; and whether the window has time at all (False when every visible pair has
    the same age, or prepare synthesized the timestamps (``store.real_time``): data without time,
    where a trend means nothing). ``deep_only``: only the pairs that reached the deep stage
    (hir/export/cold_users.py's recent demand)."""
    lo, hi = store.type_range("user")
    eng = store.eng
    rows = np.repeat(np.arange(store.n_nodes), np.diff(eng.indptr))
    keep = (rows >= lo) & (rows < hi)
    if deep_only:
        keep &= eng.stage == len(store.stage_order)
    age = eng.age[keep].astype(np.float64) * store.span_days
    dst = eng.dst[keep]
    total = np.bincount(dst, minlength=store.n_nodes).astype(np.float64)
    recent = np.bincount(dst[age <= days], minlength=store.n_nodes).astype(np.float64)
    # synthesized times are random within each split's window: a "recent" user there is a coin
    # flip, and the trend factor then only penalises popular entities (beibei: new-to-user recall
    # +4%, deep-funnel recall -5% with a trend of 0.5)
    timed = store.real_time and bool(len(age)) and float(age.max() - age.min()) > 1e-9
    return recent, total, timed


@dataclass
class SpectralBasis:
    """The fitted SVD and the chosen filter: enough to compute :func:`base_vectors` for any
    visible window.

    cols: (E,) global ids of the entity columns at fit time; v: (E, K) their right singular
    vectors; u: (n_users, K) left singular vectors; sigma: (K,) singular values (descending);
    col_degree: (E,) the columns' weighted degree at fit time; scale_ref: per type id, the
    largest base norm at fit time (the scale logits' reference); stage_base: the stage weighting
    of ``R``; filter: the :class:`Filter`; frame: (K, K) orthogonal, the coordinates every base of
    this basis is given in (``base @ frame``; None = the SVD's own). `hir train` sets it to the
    training task's frame (:func:`procrustes`), so the network reads one frame in training,
    validation and export. A basis fit on a sample of users (:mod:`hir.model.usersample`) keeps
    ``rows`` (S,) the sampled user rows ``u`` belongs to, ``row_weight`` (S,) their weight in the
    fit, and ``sample_cap`` (what a refit samples again); None: every user, in order.
    ``served_dim``: the served dimension chosen on val (:mod:`hir.model.served`; 0 = the full
    rank; None = not chosen, a basis saved before the choice existed), what ``export.dim=auto``
    serves.
    """

    cols: np.ndarray
    v: np.ndarray
    u: np.ndarray
    sigma: np.ndarray
    col_degree: np.ndarray
    scale_ref: np.ndarray
    stage_base: float
    filter: Filter = Filter()
    frame: np.ndarray | None = None
    rows: np.ndarray | None = None
    row_weight: np.ndarray | None = None
    sample_cap: int | float | None = None
    served_dim: int | None = None

    @property
    def rank(self) -> int:
        return len(self.sigma)

    def truncate(self, k: int) -> SpectralBasis:
        """The first ``k`` components (the SVD is nested: a prefix is the rank-k solution)."""
        return replace(self, v=self.v[:, :k], u=self.u[:, :k], sigma=self.sigma[:k])

    def fit_columns(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fit-time entity side over ``n`` nodes: (n, K) float32 singular vectors (zero rows:
        not a column of the fit), (n,) bool a column of the fit, (n,) float64 its fit-time degree."""
        item_v = np.zeros((n, self.rank), np.float32)
        item_v[self.cols] = self.v
        known = np.zeros(n, bool)
        known[self.cols] = True
        deg_fit = np.zeros(n, np.float64)
        deg_fit[self.cols] = self.col_degree
        return item_v, known, deg_fit

    def with_filter(self, filt: Filter) -> SpectralBasis:
        return replace(self, filter=filt)

    def save(self, path: str | Path) -> None:
        """Complete or absent (a resumed training reloads it): written under a temporary name, then renamed."""
        from hir.atomic import atomic_path

        f = self.filter
        with atomic_path(path) as tmp, tmp.open("wb") as fh:  # a file object: np.savez adds no ".npz"
            np.savez(fh, cols=self.cols, v=self.v, u=self.u, sigma=self.sigma, col_degree=self.col_degree,
                     scale_ref=self.scale_ref, stage_base=self.stage_base, beta=f.beta, response=f.response,
                     ideal_weight=f.ideal_weight, trend_days=f.trend_days, trend_power=f.trend_power,
                     user_half_life=f.user_half_life,
                     **({} if self.frame is None else {"frame": self.frame}),
                     **({} if self.rows is None else {"rows": self.rows, "row_weight": self.row_weight}),
                     **({} if self.sample_cap is None else {"sample_cap": self.sample_cap}),
                     **({} if self.served_dim is None else {"served_dim": self.served_dim}))

    def parts(self, store: GraphStore) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What :meth:`base_for` is computed from: (n, K) float32 base vectors in the SVD's own
        frame (:func:`base_vectors`), (n,) float32 column degrees, (K,) float32 user filter. A
        caller that needs the base of one store both before and after :attr:`frame` is set
        computes this once and passes it to :meth:`base_for`."""
        return _base(store, self)

    def base_for(self, store: GraphStore,
                 parts: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> SpectralBase:
        """The :class:`SpectralBase` of ``store``'s visible engagement (users folded in from it);
        ``parts``: :meth:`parts` of this basis (its frame aside) on ``store``, when already computed."""
        vectors, degree, filt = parts if parts is not None else _base(store, self)
        if self.frame is not None:
            vectors = vectors @ self.frame
        return SpectralBase(vectors, scale_logits(store, self, vectors), degree, filt, self.filter.beta,
                            trend_of(store, self.filter))

    @classmethod
    def load(cls, path: str | Path) -> SpectralBasis:
        with np.load(path) as f:
            if "beta" in f:
                # (a basis written before the user half-life has none: 0)
                filt = Filter(float(f["beta"]), str(f["response"]), float(f["ideal_weight"]), float(f["trend_days"]),
                              float(f["trend_power"]),
                              float(f["user_half_life"]) if "user_half_life" in f else 0.0)
            else:
                # written before the filter family: g = 1 + c s^2 (c = sigma_weight), degree 1/2
                c = float(f["sigma_weight"])
                filt = Filter(0.5, "linear", 1.0 / c) if c > 0 else Filter(0.5, "none", 1.0)
            # (bases written while a `holdout` option existed carry a `heldout` array; it is not read)
            cap = f["sample_cap"].item() if "sample_cap" in f else None
            served = int(f["served_dim"]) if "served_dim" in f else None
            return cls(f["cols"], f["v"], f["u"], f["sigma"], f["col_degree"], f["scale_ref"], float(f["stage_base"]),
                       filt, f.get("frame"), f.get("rows"), f.get("row_weight"), cap, served)


# svd_dtype "auto": float32 once the randomised SVD's dense float64 blocks, (rows + columns) x
# (rank + oversampling) x 8 bytes, would pass this. Below it (every real dataset here: gowalla at
# rank 1024 is 0.58 GB) the fit is float64 and unchanged; the 10M-event synthetic log at rank 1024
# (200,000 users x 247,877 entities) is 3.7 GB, and the range finder, its LU normalisations and the projected SVD hold several such
# blocks at once
SVD_FLOAT32_ABOVE_GIB = 2.0
FOLD_BLOCK = 16384  # users per block of the base's user fold-in (:func:`_base`)
FOLD_COLUMNS = 128  # frame columns per product of a fold-in (:func:`sparse_dense`)
SVD_DTYPES = ("auto", "float64", "float32")


def sparse_dense(m: sp.spmatrix | sp.sparray, x: np.ndarray, out: np.ndarray | None = None,
                 col_scale: np.ndarray | None = None) -> np.ndarray:
    """``(m @ x) * col_scale``, (R, N) sparse times (N, K) dense times (K,), ``FOLD_COLUMNS``
    columns of ``x`` at a time (and a CSR ``m`` ``FOLD_BLOCK`` rows at a time).

    scipy computes ``m @ x`` in the two dtypes' common type, and converts all of ``x`` to it
    first: a float64 ``m`` times the float32 entity frame copied the whole frame to float64,
    (N, K) x 8 bytes (4.4 GB at 540,040 nodes and rank 1024), on every call (the base's fold-in
    called it once per block of users). Here one (N, FOLD_COLUMNS) block is converted at a time,
    once for all rows. Every output element is the same sum, of its row's stored entries in their
    stored order, whichever columns and rows share its product (scipy's ``csr_matvecs`` adds
    ``a * x[j, c]`` to each column ``c`` of the block separately; ``csc_matvecs`` adds each
    stored entry to every column in turn), and ``col_scale`` multiplies it in the common type
    before the cast into ``out``, as ``np.asarray(m @ x) * col_scale`` did: bit-identical. With
    ``FOLD_COLUMNS`` >= 2 no block is one column wide unless K is (one column takes scipy's
    matvec path, as the whole product did).

    out: (R, K) array the result is cast into (default: a new one in the common type).
    """
    dtype = np.result_type(m.dtype, x.dtype)
    if out is None:
        out = np.empty((m.shape[0], x.shape[1]), dtype)
    # a row block of a CSR matrix is its own rows' entries, in order (other formats: whole)
    rows = FOLD_BLOCK if m.format == "csr" else max(m.shape[0], 1)
    k = x.shape[1]
    n_blocks = max(1, -(-k // FOLD_COLUMNS))
    for i in range(n_blocks):  # widths differ by at most one
        lo, hi = k * i // n_blocks, k * (i + 1) // n_blocks
        xb = np.ascontiguousarray(x[:, lo:hi], dtype)  # (N, hi - lo)
        for b in range(0, m.shape[0], rows):
            e = min(b + rows, m.shape[0])
            p = m[b:e] @ xb if rows < m.shape[0] else m @ xb  # (e - b, hi - lo)
            if col_scale is not None:  # a new array, not in place: the product's type, as before
                p = p * col_scale[None, lo:hi]
            out[b:e, lo:hi] = p
    return out


def svd_dtype(n_rows: int, n_cols: int, k: int, setting: str = "auto") -> type:
    """The float type the randomised SVD of an ``n_rows x n_cols`` matrix at rank ``k`` runs in."""
    if setting not in SVD_DTYPES:
        raise ValueError(f"spectral.svd_dtype={setting!r}; expected one of {list(SVD_DTYPES)}")
    if setting == "auto":
        return np.float32 if svd_gib(n_rows, n_cols, k, itemsize=8) > SVD_FLOAT32_ABOVE_GIB else np.float64
    return np.float32 if setting == "float32" else np.float64


def fit_spectral(store: GraphStore, rank: int, stage_base: float, n_iter: int, seed: int,
                 filt: Filter | None = None, sample_users: int | float | None = None,
                 refine_passes: int | None = None, chunk_users: int = 65536,
                 dtype: str = "auto", scale_ref: bool = True) -> SpectralBasis:
    """Randomised truncated SVD of the store's normalised engagement matrix.

    Args:
        store: the snapshot's visible engagement (training: train).
        rank: components K (capped below the matrix's smaller side).
        stage_base: a pair whose deepest stage is r stages short of the deepest weighs stage_base^-r.
        n_iter: power iterations of the randomised SVD (accuracy of the trailing components).
        seed: its random state (and the user sample's).
        filt: the filter the basis carries (default: :class:`Filter`'s defaults).
        sample_users: fit on a seeded sample of users stratified by activity (a fraction or a
            count, :func:`hir.model.usersample.stratified_users`; None or a cap covering every
            user: all of them, exactly today's fit). The rows keep their full-data degree
            normalisation (``D_u`` is the user's own row, ``D_e`` every user's column sums) and a
            weight ``sqrt(n_s / k_s)``, so ``V`` and ``s`` estimate the full matrix's.
        refine_passes: passes over every user that refine a sampled basis
            (:func:`hir.model.usersample.refine_on_all`; None = ``n_iter + 1``, the power
            iterations of the full fit with the sample's subspace as the start instead of a
            random one; 0 = the sample's SVD as it is).
        chunk_users: rows per block of those passes (their user-side memory is one block).
        dtype: the SVD's float type (:func:`svd_dtype`; ``auto``: float32 only where the float64
            working set would pass ``SVD_FLOAT32_ABOVE_GIB``, so small fits are unchanged).
        scale_ref: set the basis's scale reference (:func:`with_scale_ref`: one whole base
            computed); False leaves ones, for a caller that truncates and filters the basis first
            and sets it then (:func:`fit_base`).
    """
    from sklearn.utils.extmath import randomized_svd

    r = engagement_matrix(store, stage_base)
    col_deg = np.asarray(r.sum(0)).ravel()  # full-data entity degrees, whatever rows the SVD sees
    cols = np.flatnonzero(col_deg > 0)
    if len(cols) == 0:
        raise ValueError("the snapshot has no visible user engagement: nothing to factorise")
    du = np.asarray(r.sum(1)).ravel()
    sample = stratified_users(np.diff(r.indptr), sample_users, seed)
    row_scale = 1.0 / np.sqrt(np.maximum(du, 1e-12))
    dc = col_deg[cols]
    full = r
    if sample is not None:
        rows, weight = sample
        r, row_scale = r[rows], row_scale[rows] * weight
    r = r[:, cols].tocsr()
    rn = sp.diags(row_scale) @ r @ sp.diags(1.0 / np.sqrt(dc))
    k = max(1, min(int(rank), min(rn.shape) - 1))
    ftype = svd_dtype(rn.shape[0], rn.shape[1], k, dtype)
    if ftype is np.float32:  # sklearn keeps a float32 input in float32 throughout (half the blocks)
        rn = rn.astype(np.float32)
    t0 = time.perf_counter()
    u, s, vt = randomized_svd(rn, k, n_iter=n_iter, random_state=seed)
    passes = int(n_iter) + 1 if refine_passes is None else int(refine_passes)
    if sample is not None and passes > 0:
        col_scale = sp.diags(1.0 / np.sqrt(dc))
        users_scale = 1.0 / np.sqrt(np.maximum(du, 1e-12))

        def blocks():  # every user's normalised row, a block at a time
            for lo in range(0, full.shape[0], chunk_users):
                hi = min(lo + chunk_users, full.shape[0])
                yield (sp.diags(users_scale[lo:hi]) @ full[lo:hi][:, cols] @ col_scale).tocsr()

        v, s = refine_on_all(blocks, vt.T, passes)
        vt = v.T
        # the sampled users' left vectors in the refined basis (new columns are folded in through them)
        u = (rn @ v) / np.maximum(s, 1e-12)[None, :]
    # copy=False: a float32 SVD's factors are kept as they are, not copied beside themselves
    basis = SpectralBasis(cols.astype(np.int64), vt.T.astype(np.float32, copy=False), u.astype(np.float32, copy=False),
                          s.astype(np.float32),
                          dc.astype(np.float32), np.ones(len(store.types), np.float32), float(stage_base),
                          filt or Filter(), sample_cap=sample_users)
    if sample is not None:
        basis = replace(basis, rows=sample[0], row_weight=sample[1].astype(np.float32))
    log.info("spectral base: rank %d of a %d x %d matrix (%d pairs%s, %s) in %.1fs, singular values %.3f .. %.3f",
             k, r.shape[0], r.shape[1], r.nnz, "" if sample is None else f"; {r.shape[0]} of {len(du)} users sampled",
             np.dtype(ftype).name, time.perf_counter() - t0, float(s[0]), float(s[-1]))
    return with_scale_ref(store, basis) if scale_ref else basis


def with_scale_ref(store: GraphStore, basis: SpectralBasis, vectors: np.ndarray | None = None) -> SpectralBasis:
    """``basis`` with ``scale_ref`` set to the largest base norm of each type on ``store``
    (``vectors``: its :func:`base_vectors` on ``store``, when already computed)."""
    vectors = base_vectors(store, basis) if vectors is None else vectors
    norms = row_norms(vectors)
    ref = np.ones(len(store.types), np.float32)
    for t in range(len(store.types)):
        sel = (store.node_type == t) & (norms > 0)
        if sel.any():
            ref[t] = float(norms[sel].max())
    return replace(basis, scale_ref=ref)


def base_vectors(store: GraphStore, basis: SpectralBasis) -> np.ndarray:
    """(n_nodes, K) float32 base vector of every node of ``store`` (zeros: no base, cold start).

    Entities: ``t d^b V`` (fit-time columns) or their fold-in through U (columns new in the
    visible window); users: fold-in of their visible history; entities without engagement: the
    mean of their members' vectors (``store.down``). See the module doc.
    """
    return _base(store, basis)[0]


def _entity_frame(store: GraphStore, basis: SpectralBasis, r: sp.csr_matrix,
                  rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item_v (n, K) singular vectors of every visible entity column, deg (n,) their degree,
    ent (n,) bool: has a vector). Columns known at fit time keep their fit-time vector and
    degree; new ones are folded in through U. ``rows`` (m,) sorted node ids: item_v holds only
    those rows, (m, K) (:class:`FilterScorer` reads a few; deg and ent stay (n,)). A row's vector
    is the same computation either way (a new column's fold-in is its own sparse row times U)."""
    deg = np.asarray(r.sum(0)).ravel()
    n, k = store.n_nodes, basis.rank
    known = np.zeros(n, bool)
    known[basis.cols] = True
    deg_fit = np.zeros(n, np.float64)
    deg_fit[basis.cols] = basis.col_degree
    if rows is None:
        item_v = np.zeros((n, k), np.float32)
        item_v[basis.cols] = basis.v
        pos = None
    else:
        pos = np.full(n, -1, np.int64)
        pos[rows] = np.arange(len(rows))
        item_v = np.zeros((len(rows), k), np.float32)
        at = pos[basis.cols]
        item_v[at[at >= 0]] = basis.v[at >= 0]
    new = np.flatnonzero(~known & (deg > 0))
    if len(new):
        deg_fit[new] = deg[new]
        if pos is not None:
            new = new[pos[new] >= 0]
    if len(new):
        # fold-in: V[e] = (D_u^-1/2 R[:, e] d_e^-1/2)^T U / s
        du = np.asarray(r.sum(1)).ravel()
        scale = 1.0 / np.sqrt(np.maximum(du, 1e-12))
        rc = r[:, new]
        if basis.rows is not None:  # U has the sampled users' rows, with their fit weight
            rc, scale = rc[basis.rows], scale[basis.rows] * basis.row_weight
        rc = sp.diags(scale) @ rc
        vn = sparse_dense(rc.T, basis.u) / np.sqrt(deg[new])[:, None] / np.maximum(basis.sigma, 1e-12)[None, :]
        item_v[new if pos is None else pos[new]] = vn.astype(np.float32)
    return item_v, deg_fit, known | (deg > 0)


def trend_of(store: GraphStore, filt: Filter) -> np.ndarray:
    """(n,) float32 trend factor of every node on ``store``'s visible window (1 without time)."""
    if not filt.trend_power:
        return np.ones(store.n_nodes, np.float32)
    recent, total, timed = engaged_users(store, filt.trend_days)
    return trend_factor(recent, total, filt.trend_power) if timed else np.ones(store.n_nodes, np.float32)


def _base(store: GraphStore, basis: SpectralBasis) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`base_vectors` (in the SVD's own frame), plus each node's column degree d (n,) and the
    user filter (K,)."""
    n = store.n_nodes
    f = basis.filter
    r = engagement_matrix(store, basis.stage_base)  # (n_users, n_nodes) visible pairs
    item_v, deg_fit, ent = _entity_frame(store, basis, r)
    trend = trend_of(store, f)
    factor = np.zeros(n, np.float32)
    factor[ent] = (np.power(deg_fit[ent], f.beta) * trend[ent]).astype(np.float32)
    # users: r~_u D^-b V g(s), over every visible entity column with a vector
    inv = np.where(ent, np.power(np.maximum(deg_fit, 1e-12), -f.beta), 0.0)
    lo, hi = store.type_range("user")
    filt = user_filter(basis.sigma, f.response, f.ideal_weight)
    if f.user_half_life > 0:
        r = engagement_matrix(store, basis.stage_base, f.user_half_life)
    # the base is item_v itself, filled in place: no second (n, K) array (2.2 GB at 540,040 nodes
    # and rank 1024). The fold reads only the rows of entity columns with a vector (inv is 0
    # elsewhere) and no user row is one (users are no column), so the users' fold is written into
    # the user rows first and the entity rows are scaled after; a store whose users are engaged
    # columns themselves keeps a separate output
    out = item_v if not ent[lo:hi].any() else np.zeros_like(item_v)
    # a block of users and of columns at a time (sparse_dense): the float64 product and its filtered
    # copy are one block each, not the whole user side twice (3.2 GB at 200,000 users and rank
    # 1024), and the frame is converted to float64 a block of columns at a time; a sparse row times
    # item_v is the same sum whichever rows and columns share its block, so the vectors are unchanged
    m = (r @ sp.diags(inv)).tocsr()
    sparse_dense(m, item_v, out[lo:lo + m.shape[0]], filt)
    del m
    # entities: t d^b V, a block of rows at a time (a row without a vector is zero in item_v, so a
    # zero factor keeps it zero); the user rows hold the fold now and are skipped
    for b0, b1 in ((0, lo), (hi, n)):
        for b in range(b0, b1, FOLD_BLOCK):
            e = min(b + FOLD_BLOCK, b1)
            np.multiply(item_v[b:e], factor[b:e, None], out=out[b:e])
    del item_v
    # entities nobody engages with: the mean of their members' vectors (a category's products)
    down = store.down
    rows = np.repeat(np.arange(n), np.diff(down.indptr))
    # a row's sum of squares is 0 exactly when its norm is (no terms cancel), and a member's is its
    # row's: the same tests as norms of out and out[down.dst] without their (pairs, K) copies
    sq = np.einsum("ij,ij->i", out, out)  # (n,)
    member_has = (sq > 0)[down.dst]
    empty = sq == 0
    pick = empty[rows] & member_has
    if pick.any():
        # rows are sorted (CSR order): each filled node's members are one contiguous run, summed
        # by reduceat (np.add.at over (pairs, K) took ~2.3 s a call on completejourney)
        pr = rows[pick]
        starts = np.flatnonzero(np.r_[True, pr[1:] != pr[:-1]])
        sums = _member_sums(out, down.dst[pick], starts)
        cnt = np.diff(np.r_[starts, len(pr)])
        out[pr[starts]] = (sums / cnt[:, None]).astype(np.float32)
    return out, deg_fit.astype(np.float32), filt


def _member_sums(x: np.ndarray, members: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """(S, K) float64 sums of the rows ``x[members]`` over the S runs that start at ``starts``:
    ``np.add.reduceat(x[members].astype(float64), starts, axis=0)`` a group of whole runs of at
    most ``FOLD_BLOCK`` rows at a time (a longer run alone). The whole gather and its float64
    copy were (pairs, K) x 12 bytes: the 1M-event synthetic log has 63,000 member pairs of
    advertisers and categories (an upper bound of those summed), so up to about 7 GB at 10M
    events and rank 1024. A run's sum is the same reduction of the same rows in either form (a
    run is never split), so bit-identical."""
    ends = np.r_[starts[1:], len(members)]
    sums = np.empty((len(starts), x.shape[1]), np.float64)
    s = 0
    while s < len(starts):
        e = max(int(np.searchsorted(ends, starts[s] + FOLD_BLOCK, "right")), s + 1)
        rows = x[members[starts[s]:ends[e - 1]]].astype(np.float64)
        sums[s:e] = np.add.reduceat(rows, starts[s:e] - starts[s], axis=0)
        s = e
    return sums


def scale_logits(store: GraphStore, basis: SpectralBasis, base: np.ndarray) -> np.ndarray:
    """(n_nodes,) float32 logit of each node's base scale: ``log(r / (1 - r))`` with r its base
    norm over the largest of its type at fit time (clipped to [R_MIN, R_MAX])."""
    ratio = row_norms(base) / basis.scale_ref[store.node_type] * R_MAX
    ratio = np.clip(ratio, R_MIN, R_MAX)
    return np.log(ratio / (1 - ratio)).astype(np.float32)


def _candidate(basis: SpectralBasis, recall: float) -> dict[str, Any]:
    return {"stage_base": basis.stage_base, "rank": basis.rank, **asdict(basis.filter), "val_recall@20": round(recall, 5)}


def _candidate_key(c: dict[str, Any]) -> tuple[float, int, Filter]:
    """(stage_base, rank, filter) of a recorded candidate."""
    return c["stage_base"], c["rank"], Filter(**{k: c[k] for k in asdict(Filter())})


class FilterScorer:
    """Val recall@20 of filter candidates on one SVD: the users' fold-in per degree exponent is
    computed once at full rank, and a candidate slices it and rescales its columns.

    users: val users scored (a seeded sample of ``val``'s, at most ``max_users``); every
    candidate entity of ``val`` is ranked (no candidate sampling: the choice is made on the
    ranking the test uses).

    Memory: the entity frame is kept only on the rows a score reads, the candidates and the
    columns the scored users engage (``rows``): item_v (m, K), not (n_nodes, K) (at 10M events
    and rank 1024 the full frame is 2.2 GB). The users' rows are remapped onto those rows in
    order, so every fold-in is the same sum in the same order as over the full frame.
    """

    def __init__(self, store: GraphStore, basis: SpectralBasis, val: ValSet, max_users: int | None, seed: int,
                 max_pairs: float | None = None) -> None:
        self.store, self.basis = store, basis
        scored = val.limited(max_pairs, seed, max_users)
        self.users, self.positives, self.masked = scored.users, scored.positives, scored.masked
        self.cands = val.cands
        r = engagement_matrix(store, basis.stage_base)
        lo, _ = store.type_range("user")
        r_users = r[self.users - lo]
        # the frame's rows a score reads: the candidates and the scored users' engaged columns
        self.rows = np.union1d(self.cands, r_users.indices)  # (m,) sorted node ids
        self._pos = np.full(store.n_nodes, -1, np.int64)
        self._pos[self.rows] = np.arange(len(self.rows))
        self.item_v, deg, ent = _entity_frame(store, basis, r, self.rows)  # (m, K)
        del r
        self.deg, self.ent = deg[self.rows], ent[self.rows]  # (m,)
        self.cand_rows = self._pos[self.cands]  # (C,) the candidates' rows of item_v
        self.r_users = self._on_rows(r_users)
        self._fold: dict[tuple[float, float], np.ndarray] = {}
        self._trend: dict[tuple[float, float], np.ndarray] = {}
        self.timed = engaged_users(store, 0.0)[2]

    def _on_rows(self, m: sp.csr_matrix) -> sp.csr_matrix:
        """(U, n_nodes) user rows -> (U, m) over the kept frame rows: a monotone column renumbering
        of the same stored entries, in the same order."""
        cols = self._pos[m.indices]
        assert (cols >= 0).all(), "a scored user's pair lies outside the kept frame rows"
        return sp.csr_matrix((m.data, cols, m.indptr), shape=(m.shape[0], len(self.rows)))

    def fold(self, beta: float, half_life: float = 0.0) -> np.ndarray:
        """(U, K) users' fold-in ``r~_u D^-b V`` at full rank (``half_life``: the user-side decay)."""
        key = (beta, half_life)
        if key not in self._fold:
            inv = np.where(self.ent, np.power(np.maximum(self.deg, 1e-12), -beta), 0.0)
            rows = self.r_users
            if half_life > 0:
                lo, _ = self.store.type_range("user")
                rows = self._on_rows(engagement_matrix(self.store, self.basis.stage_base, half_life)[self.users - lo])
            m = rows @ sp.diags(inv)  # (U, m)
            self._fold[key] = sparse_dense(m, self.item_v, np.empty((m.shape[0], self.item_v.shape[1]), np.float32))
        return self._fold[key]

    def trend(self, filt: Filter) -> np.ndarray:
        key = (filt.trend_days, filt.trend_power)
        if key not in self._trend:
            self._trend[key] = trend_of(self.store, filt)[self.cands]
        return self._trend[key]

    def __call__(self, rank: int, filt: Filter) -> float:
        return float(np.nanmean(self.per_user(rank, filt)))

    def per_user(self, rank: int, filt: Filter) -> np.ndarray:
        """(U,) val recall@20 of each scored user under the candidate (paired comparisons)."""
        return recall_per_user(*self.vectors(rank, filt), self.positives, self.masked, 20)

    def vectors(self, rank: int, filt: Filter) -> tuple[np.ndarray, np.ndarray]:
        """The candidate's (U, k) unit user vectors and (C, k) candidate entity vectors, k the rank."""
        k = min(int(rank), self.basis.rank)
        g = user_filter(self.basis.sigma[:k], filt.response, filt.ideal_weight)
        users = self.fold(filt.beta, filt.user_half_life)[:, :k] * g[None, :]
        users /= np.maximum(row_norms(users), 1e-12)[:, None]
        deg, ent = self.deg[self.cand_rows], self.ent[self.cand_rows]
        scale = (np.power(np.maximum(deg, 1e-12), filt.beta) * self.trend(filt) * ent).astype(np.float32)
        # one (C, k) array, scaled in place (not a copy and then its product: 2.5 GB at 10M events)
        cands = self.item_v[self.cand_rows, :k]
        np.multiply(cands, scale[:, None], out=cands)
        return users, cands


def select_rank(store: GraphStore, basis: SpectralBasis, val: ValSet, ranks: list[int],
                k: int = 20) -> tuple[int, dict[int, float]]:
    """The rank among ``ranks`` (prefixes of ``basis``, with its filter) with the best validation
    recall@k of the base alone (every val user; ties go to the smaller rank). Returns (rank,
    {rank: recall})."""
    table: dict[int, float] = {}
    for r in sorted({min(int(x), basis.rank) for x in ranks}):
        b = base_vectors(store, basis.truncate(r))
        users = b[val.users]
        users = users / np.maximum(np.linalg.norm(users, axis=1, keepdims=True), 1e-12)
        table[r] = round(float(masked_recall(users, b[val.cands], val.positives, val.masked, k)), 5)
    best = max(table, key=lambda r: (table[r], -r))
    return best, table


def select_filter(store: GraphStore, basis: SpectralBasis, val: ValSet, config: SpectralConfig, seed: int,
                  tried: list[dict[str, Any]], start: Filter | None = None,
                  start_rank: int | None = None) -> tuple[int, Filter]:
    """Coordinate ascent on val over the rank, then the degree exponent, the response and the
    ideal weight, the rank again, then the trend and the user half-life (on data with time), from ``config.start``, and
    last the ``config.published`` settings of the family; a step is taken only when the candidate
    beats the current choice beyond the paired noise over the scored val users (:func:`beats`
    with ``config.noise_z`` and ``config.min_gain``), so noise does not move the choice. Every
    candidate scored is appended to ``tried`` (a candidate already there is not rescored for the
    record); ``start`` replaces ``config.start`` and ``start_rank`` the start rank (when it is a
    candidate; default: the largest candidate rank the basis holds).

    The rank steps try the other ranks from the smallest up, so of two ranks that both beat the
    current one the lower is taken unless the higher beats it too. A second search on a larger
    SVD starts from the first one's choice (``start``, ``start_rank``), so a larger rank, too,
    must beat it beyond the noise: restarting at the largest rank made the noise rule keep
    that rank (the temporal online_retail split: rank 512 kept over 256, test recall -3%; 1024
    -13%)."""
    score = FilterScorer(store, basis, val, config.select_users, seed, config.select_pairs)
    ranks = [r for r in config.candidate_ranks if r <= basis.rank] or [basis.rank]
    # (a start rank that is no candidate, e.g. the probe's rank under a fixed `rank`, is not kept)
    best_k = int(start_rank) if start_rank in ranks else max(ranks)
    best_f = start or config.start
    best: np.ndarray | None = None
    cache: dict[tuple[int, Filter], np.ndarray] = {}
    recorded = {_candidate_key(t) for t in tried}

    def step(cands: list[tuple[int, Filter]]) -> None:
        nonlocal best_k, best_f, best
        for k, f in cands:
            if (k, f) not in cache:
                cache[(k, f)] = score.per_user(k, f)
            got = cache[(k, f)]
            if (basis.stage_base, k, f) not in recorded:
                tried.append(_candidate(replace(basis.truncate(k), filter=f), float(np.nanmean(got))))
                recorded.add((basis.stage_base, k, f))
            if best is None or beats(got, best, config.noise_z, config.min_gain):
                best_k, best_f, best = k, f, got

    step([(best_k, best_f)] + [(k, best_f) for k in sorted(ranks) if k != best_k])
    if config.joint_filter_step:  # one step over every (b, h, a): the path cannot stop between them
        step([(best_k, replace(best_f, beta=float(b), response=str(h), ideal_weight=float(a)))
              for b in config.betas or [best_f.beta] for h in config.responses or [best_f.response]
              for a in config.ideal_weights or [best_f.ideal_weight]])
    else:
        step([(best_k, replace(best_f, beta=float(b))) for b in config.betas])
        step([(best_k, replace(best_f, response=str(h), ideal_weight=float(a)))
              for h in config.responses for a in config.ideal_weights])
    step([(k, best_f) for k in sorted(ranks)])
    if score.timed:
        step([(best_k, replace(best_f, trend_days=float(d), trend_power=float(p)))
              for d in config.trend_days for p in config.trend_powers])
        step([(best_k, replace(best_f, user_half_life=float(h))) for h in config.user_half_lives])
    step([(best_k, replace(best_f, **p)) for p in config.published])
    return best_k, best_f


def still_rises(store: GraphStore, basis: SpectralBasis, val: ValSet, config: SpectralConfig, seed: int,
                k: int, filt: Filter) -> bool:
    """Whether val recall at rank ``k`` (the top of ``basis``) beats the next lower candidate rank
    under ``filt`` beyond the paired noise (:func:`beats`): only then is a larger SVD worth
    fitting. A choice that merely stayed at its start rank is no evidence that the curve rises
    (with the noise rule it stays there whenever the lower ranks are not clearly better)."""
    lower = [r for r in config.candidate_ranks if r < k]
    if not lower:
        return True
    score = FilterScorer(store, basis, val, config.select_users, seed, config.select_pairs)
    return beats(score.per_user(k, filt), score.per_user(max(lower), filt), config.noise_z, config.min_gain)


def svd_gib(n_rows: int, n_cols: int, k: int, itemsize: int = 4) -> float:
    """GiB of the randomised SVD's dense blocks at rank ``k`` ((rows + cols) x (k + 10) of
    ``itemsize`` bytes: 4 in float32): its working set beside the sparse matrix (the range
    finder, the power iterations, ``V``)."""
    return (n_rows + n_cols) * (k + 10) * itemsize / 2**30


def largest_rank(store: GraphStore, ranks: list[int], config: SpectralConfig) -> int:
    """The largest of ``ranks`` whose SVD working set (:func:`svd_gib`, the users the basis is
    fit on: every user, or the ``sample_users`` cap) stays within ``config.max_svd_gib``; the
    smallest rank when none does (None: no cap). The entity side, ``entities x rank``, is the
    part no user sample bounds: at 100M synthetic events (3.4M entities) rank 1024 is 14 GiB."""
    if config.max_svd_gib is None:
        return max(ranks)
    lo, hi = store.type_range("user")
    users = resolve_cap(config.sample_users, hi - lo)
    within = [r for r in ranks if svd_gib(users, store.n_nodes - (hi - lo), r) <= config.max_svd_gib]
    return max(within, default=min(ranks))


def search_start(store: GraphStore, config: SpectralConfig) -> Filter:
    """Where the filter search starts: ``config.start``, without its trend where the store has no
    time (:func:`engaged_users`; the factor is 1 there anyway, and the record then says so)."""
    timed = engaged_users(store, 0.0)[2]
    return config.start if timed else replace(config.start, trend_power=0.0)


def fit_base(store: GraphStore, val: ValSet | None, config: SpectralConfig, seed: int, path: Path,
             reuse: bool) -> tuple[SpectralBasis, dict[str, Any]]:
    """Fit the basis (or, with ``reuse``, reload it from ``path``), choose its stage weighting,
    rank and filter on ``val`` (:func:`select_filter`), and save it to ``path``.

    Returns the (truncated) basis and a report: the chosen ``rank``, ``stage_base`` and
    ``filter``, every candidate scored (``candidates``: its settings and val recall@20 on the
    sampled val users), ``val_recall@20_by_rank`` of the chosen filter, seconds.
    """
    t0 = time.perf_counter()
    report: dict[str, Any] = {}
    if reuse and path.exists():
        basis = SpectralBasis.load(path)
        report["reused"] = str(path)
    else:
        ranks = config.candidate_ranks
        tried: list[dict[str, Any]] = []
        n_iter = int(config.n_iter)
        # a probe SVD per stage weighting at the probe rank; the larger SVD only when the val
        # curve still rises at the probe's top rank (a small catalogue never pays for it)
        top = largest_rank(store, ranks, config)
        if top < max(ranks):
            report["rank_memory_cap"] = {"max_svd_gib": config.max_svd_gib, "largest_rank": top}
            log.info("spectral base: ranks above %d skipped: their SVD working set passes spectral.max_svd_gib=%g",
                     top, config.max_svd_gib)
        probe = min(top, int(config.probe_rank))
        stage_bases = config.candidate_stage_bases
        has_val = val is not None and len(val) > 0
        if not has_val or len(np.unique(store.eng.stage[store.eng.stage > 0])) < 2:
            stage_bases = stage_bases[:1]  # nothing to choose with, or one stage: the weighting is moot
        cap = config.sample_users
        start = search_start(store, config)
        # no scale reference per fit: the search never reads it, and the chosen basis gets its own below
        fit = partial(fit_spectral, store, n_iter=n_iter, seed=seed, sample_users=cap, dtype=config.svd_dtype,
                      scale_ref=False)
        probes = {sb: fit(probe, sb, filt=start) for sb in stage_bases}
        if len(probes) > 1:
            tried.extend(_candidate(b, FilterScorer(store, b, val, config.select_users, seed,
                                                    config.select_pairs)(b.rank, start))
                         for b in probes.values())
            stage_base = max(tried, key=lambda t: t["val_recall@20"])["stage_base"]
        else:
            stage_base = stage_bases[0]
        basis = probes[float(stage_base)]
        del probes  # the other weightings' probes are not read again (each is entities x rank)
        if has_val:
            k, filt = select_filter(store, basis, val, config, seed, tried, start)
            if (k >= basis.rank == probe and top > probe
                    and still_rises(store, basis, val, config, seed, k, filt)):
                log.info("spectral base: val recall still rises at rank %d; fitting rank %d", basis.rank, top)
                basis = fit(top, float(stage_base), filt=filt)
                k, filt = select_filter(store, basis, val, config, seed, tried, filt, k)
            basis = basis.truncate(k).with_filter(filt)
            # the chosen base, computed once for its scale reference and the served dimension's choice
            vectors = base_vectors(store, basis) if served_below(basis.rank, list(config.served_dims)) else None
            basis = with_scale_ref(store, basis, vectors)
            basis, report["served"] = with_served_dim(store, basis, val, config, seed, vectors)
            del vectors
            report["candidates"] = tried
            report["val_recall@20_by_rank"] = {
                str(t["rank"]): t["val_recall@20"] for t in tried
                if (_candidate_key(t)[0], _candidate_key(t)[2]) == (basis.stage_base, filt)}
        elif top > basis.rank:
            basis = fit(top, float(stage_base), filt=start)
        if not has_val:  # nothing to choose the served dimension with: the cap
            basis = replace(with_scale_ref(store, basis), served_dim=served_cap(basis.rank, list(config.served_dims)))
        path.parent.mkdir(parents=True, exist_ok=True)
        basis.save(path)
    report |= {"rank": basis.rank, "stage_base": basis.stage_base, "filter": asdict(basis.filter),
               "seconds": round(time.perf_counter() - t0, 2)}
    log.info("spectral base: rank %d, stage_base %g, %s (%d candidates scored on val) in %.1fs", basis.rank,
             basis.stage_base, basis.filter.label(), len(report.get("candidates", [])), report["seconds"])
    return basis, report


def with_served_dim(store: GraphStore, basis: SpectralBasis, val: ValSet, config: SpectralConfig, seed: int,
                    vectors: np.ndarray | None = None) -> tuple[SpectralBasis, dict[str, Any]]:
    """``basis`` with the served dimension chosen on ``val`` and on the full ranking of the same
    split among ``config.served_dims`` (:func:`hir.model.served.choose_served_dim`: its base as
    export serves it, users' directions and entities at their scale), and the choice's report;
    ``vectors``: the basis's :func:`base_vectors` on ``store``, when already computed."""
    if not served_below(basis.rank, list(config.served_dims)):
        return replace(basis, served_dim=0), {"rank": basis.rank, "served_dim": 0,
                                              "why": "no candidate below the rank"}
    if vectors is None:
        vectors = base_vectors(store, basis)
    scale = 1.0 / (1.0 + np.exp(-scale_logits(store, basis, vectors)))  # a_e: the base's scale, in (0, 1)
    is_user = store.node_type == store.types.index("user")
    full_ranking = validation_set(store, None, seed, "all") if val.protocol != "all" else None
    if full_ranking is not None:
        full_ranking = full_ranking.limited(config.select_pairs, seed)
    d, report = choose_served_dim(vectors, scale, is_user, val.limited(config.select_pairs, seed),
                                  list(config.served_dims), config.noise_z, config.min_gain, full_ranking)
    return replace(basis, served_dim=int(d)), report


def procrustes(store: GraphStore, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """(K, K) float32 orthogonal Q minimising ``|src Q - dst|`` over the entities both (n, K) bases
    embed (users are folded in from the entities, so aligning the entities aligns them too)."""
    both = _aligned_rows(store, src, dst)
    return _procrustes(_rows64(src, both), _rows64(dst, both))


def _aligned_rows(store: GraphStore, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """(m,) the entity rows both (n, K) bases embed (a non-zero row in each)."""
    lo, hi = store.type_range("user")
    ents = np.ones(store.n_nodes, bool)
    ents[lo:hi] = False
    return np.flatnonzero(ents & (np.abs(src).sum(1) > 0) & (np.abs(dst).sum(1) > 0))


def _rows64(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(m, K) float64 copy of ``x[rows]``, filled a block at a time (no float32 (m, K) copy first)."""
    out = np.empty((len(rows), x.shape[1]), np.float64)
    for b in range(0, len(rows), FOLD_BLOCK):
        out[b:b + FOLD_BLOCK] = x[rows[b:b + FOLD_BLOCK]]
    return out


def _procrustes(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """(K, K) float32 Q of :func:`procrustes` from the aligned rows (m, K) float64 of both bases."""
    left, _, right = np.linalg.svd(src.T @ dst)
    return (left @ right).astype(np.float32)


def refit_aligned(store: GraphStore, basis: SpectralBasis, n_iter: int, seed: int) -> tuple[SpectralBasis, SpectralBase]:
    """The chosen filter refit on ``store``'s visible engagement (export: train + val), its base
    rotated into ``basis``'s coordinates.

    A refit SVD spans the same directions in another frame (signs, rotations within close
    singular values), so its base is turned by the orthogonal Q minimising ``|B_new Q - B_old|``
    over the entities both embed (Procrustes): inner products, and so every score, are the
    refit's, while the coordinates stay those the network and the hierarchy were fitted in.
    Returns the refit basis and its rotated base.

    Memory: the old base is dropped once its aligned rows are copied, before the new base's copy
    and the rotation (at 10M events and rank 1024 one (n, K) base is 2.2 GB and the float64 rows
    1.9 GB each); the same numbers as :func:`procrustes` of the two bases.
    """
    new = fit_spectral(store, basis.rank, basis.stage_base, n_iter, seed, basis.filter, basis.sample_cap)
    base_new = new.base_for(store)
    old = basis.base_for(store).vectors
    both = _aligned_rows(store, base_new.vectors, old)
    dst = _rows64(old, both)
    del old
    q = _procrustes(_rows64(base_new.vectors, both), dst)
    del dst
    vectors = base_new.vectors @ q
    return new, SpectralBase(vectors, scale_logits(store, new, vectors), base_new.degree, base_new.filter,
                             basis.filter.beta, base_new.trend)
