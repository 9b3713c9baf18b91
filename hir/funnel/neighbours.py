"""What the user's nearest neighbour users buy: TIFU-KNN's neighbour component as a scorer input.

The open funnel's features say what *this* user did; the next-basket literature's strongest simple
model (TIFU-KNN, Hu et al., SIGIR 2020; the next-basket reality check, TOIS 2023) adds what users
with the same time-decayed habits buy. From the open-funnel rows of one view (every figure reads
only events before its as-of time, hir/funnel/source.py)::

    x_u[e]     = trip_decay_r(u, e) / user_decay_r(u)    the user's time-decayed item frequency
                 (``trip_share_r``: each trip's weight r ** (later trips of u), r = ``decay``);
                 where the times are synthesized (``use_time`` false) the plain conversion counts
                 n_target(u, e) / sum_e n_target(u, e)
    cos(u, v)  = x_u . x_v / (|x_u| |x_v|)               over every user v != u of the view
    N_u        = the ``k`` users with the largest cosine (> 0) to u
    nbr_share(u, c) = sum_{v in N_u} cos(u, v) x_v[c] / sum_{v in N_u} cos(u, v)     (0: no neighbour)

Only converted pairs enter ``x`` (a basket is a conversion). The scorer also reads the candidate's
within-user rank by it (:data:`hir.funnel.candidates.FEATURES`: ``nbr_inv_rank``). The user x user
cosines are computed ``cells`` at a time (a block of users against every user), so memory stays
bounded whatever the number of users; the vectors are sparse. Every input is a row of the view's
own source, so nothing after its as-of time reaches the feature (tests/funnel/test_source.py).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import scipy.sparse as sp

from hir.funnel.cycle import DECAYS

COLUMNS = ("nbr_share",)


def decay_name(decay: float) -> str:
    """The :data:`hir.funnel.cycle.DECAYS` key of ``decay`` (the source stores those decays only)."""
    for name, r in DECAYS.items():
        if abs(r - decay) < 1e-9:
            return name
    raise ValueError(f"funnel.config.neighbour_decay={decay}; expected one of {sorted(DECAYS.values())} "
                     "(the open funnel's stored trip decays, hir/funnel/cycle.py)")


def user_vectors(source: pl.DataFrame, n_users: int, n_entities: int, decay: float, use_time: bool) -> sp.csr_matrix:
    """(n_users, n_entities) CSR of ``x_u`` (module doc) from the open-funnel rows ``source``."""
    conv = source.filter(pl.col("converted"))
    if use_time:
        name = decay_name(decay)
        value = (pl.col(f"trip_decay_{name}") / pl.col(f"user_decay_{name}")).fill_null(0.0)
    else:
        value = pl.col("n_target") / pl.col("n_target").sum().over("user_id")
    conv = conv.select("user_id", "entity_id", value.cast(pl.Float32).alias("x")).filter(pl.col("x") > 0)
    return sp.csr_matrix((conv["x"].to_numpy(), (conv["user_id"].to_numpy(), conv["entity_id"].to_numpy())),
                         shape=(n_users, n_entities), dtype=np.float32)


def unit_rows(x: sp.csr_matrix) -> tuple[sp.csr_matrix, sp.csc_matrix]:
    """``x``'s rows scaled to unit norm (zero rows stay 0) and their transpose, (n, m) and (m, n)."""
    norm = np.sqrt(np.asarray(x.multiply(x).sum(axis=1))).ravel()
    z = sp.diags(1.0 / np.maximum(norm, 1e-12)).astype(np.float32) @ x
    return z, z.T.tocsc()


def neighbour_weights(x: sp.csr_matrix, users: np.ndarray, k: int, cells: int = 20_000_000,
                      unit: tuple[sp.csr_matrix, sp.csc_matrix] | None = None) -> sp.csr_matrix:
    """(len(users), n_users) CSR: row i holds the cosines of ``users[i]``'s ``k`` nearest users
    (cosine > 0, never itself; a tie at the k-th is broken by the partition, the same for the
    same input), computed ``cells`` cosines at a time; ``unit``: :func:`unit_rows` of ``x``, when
    a caller asks for several batches of users."""
    z, zt = unit if unit is not None else unit_rows(x)
    n = x.shape[0]
    block = max(1, cells // max(n, 1))
    rows, cols, vals = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
    for lo in range(0, len(users), block):
        batch = users[lo:lo + block]
        sim = np.asarray((z[batch] @ zt).todense(), dtype=np.float32)     # (B, n_users)
        sim[np.arange(len(batch)), batch] = 0.0                           # never the user itself
        kk = min(k, n)
        # the k largest (a partition, not a sort of every user: the order within them is not used)
        top = np.argpartition(-sim, kk - 1, axis=1)[:, :kk] if kk < n else np.broadcast_to(np.arange(n), sim.shape)
        w = np.take_along_axis(sim, top, axis=1)                          # (B, kk)
        ok = w > 0
        rows.append(np.repeat(np.arange(lo, lo + len(batch)), kk)[ok.ravel()])
        cols.append(top.ravel()[ok.ravel()])
        vals.append(w.ravel()[ok.ravel()])
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(users), n))


def neighbour_share(rows: pl.DataFrame, source: pl.DataFrame, n_users: int, n_entities: int, k: int, decay: float,
                    use_time: bool, cells: int = 20_000_000) -> pl.DataFrame:
    """``nbr_share`` (module doc) of every candidate row.

    Args:
        rows: candidates (``user_id, entity_id``), sorted by (user_id, entity_id).
        source: the open-funnel rows of the same view (:func:`hir.funnel.source.open_funnel`).
        n_users, n_entities: the id spaces.
        k: neighbours per user; decay: TIFU's per-trip decay (one of the stored ones).
        use_time: False where the times are synthesized (plain conversion counts instead).
        cells: user x user cosines (and neighbour x entity products) per block.
    Returns:
        ``rows``' order, column ``nbr_share`` (float32).
    """
    x = user_vectors(source, n_users, n_entities, decay, use_time)
    ru, re = rows["user_id"].to_numpy(), rows["entity_id"].to_numpy()
    users = np.unique(ru)
    out = np.zeros(len(ru), np.float32)
    # a block's cosines (B x n_users) and its neighbours' items (B x k x items per user) within ``cells``
    per_user = x.nnz / max(int((np.diff(x.indptr) > 0).sum()), 1)
    block = max(1, min(cells // max(n_users, 1), int(cells // max(k * per_user, 1))))
    unit = unit_rows(x)
    for lo in range(0, len(users), block):
        batch = users[lo:lo + block]
        w = neighbour_weights(x, batch, k, cells, unit)                    # (B, n_users)
        total = np.asarray(w.sum(axis=1)).ravel()
        share = (sp.diags(1.0 / np.maximum(total, 1e-12)).astype(np.float32) @ w @ x).tocsr()  # (B, n_entities)
        share.sort_indices()
        keys = np.repeat(np.arange(len(batch), dtype=np.int64), np.diff(share.indptr)) * n_entities + share.indices
        a, b = np.searchsorted(ru, batch[0], "left"), np.searchsorted(ru, batch[-1], "right")
        want = np.searchsorted(batch, ru[a:b]).astype(np.int64) * n_entities + re[a:b]
        at = np.clip(np.searchsorted(keys, want), 0, max(len(keys) - 1, 0))
        hit = (keys[at] == want) if len(keys) else np.zeros(len(want), bool)
        out[a:b][hit] = share.data[at[hit]]
    return pl.DataFrame({"nbr_share": out})
