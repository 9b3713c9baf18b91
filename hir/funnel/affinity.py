"""How a candidate fits the rest of the user's engagement: its affinity to the user's OTHER items.

The open funnel's own features say how deep and how often a user engaged a candidate; they cannot
say which of a user's 17 open carts belongs with what the user buys. That is an item-to-item
question, answered here from the view base's entity vectors (hir/funnel/discovery.py; their
cosine is the low-rank co-engagement of two entities)::

    z_e       = b_e / |b_e|                         (K,) unit entity vector of the view base
    J_u       = the user's first ``max_context`` open-funnel pairs in the plain order
    cos(c, j) = z_c . z_j                           for j in J_u, j != c (never the candidate itself)
    aff_max   = max_j cos(c, j)     aff_mean = mean_j cos(c, j)        over every j
    aff_conv_max, aff_conv_mean     over the converted j (what the user bought)
    aff_open_max, aff_open_mean     over the not-yet-converted j (the other open carts, views)
    aff_recent = sum_j w_j cos(c, j) / sum_j w_j,   w_j = 1 / (1 + age_days_j)   (0 without time)

An empty group gives 0 (with ``ctx_conv`` / ``ctx_open``, the group sizes, beside it). Every input is
a row of the same view's source and base, so the features read nothing after its as-of time
(tests/funnel/test_source.py).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from hir.funnel.source import plain_order

COLUMNS = ("aff_max", "aff_mean", "aff_conv_max", "aff_conv_mean", "aff_open_max", "aff_open_mean", "aff_recent",
           "ctx_conv", "ctx_open")


def _padded(owner: np.ndarray, users: np.ndarray, values: np.ndarray, fill: float) -> tuple[np.ndarray, np.ndarray]:
    """(B, M) ``values`` of each of ``users`` (rows of ``owner`` sorted by user, M = the largest
    count) and the (B, M) validity mask."""
    lo = np.searchsorted(owner, users, side="left")
    hi = np.searchsorted(owner, users, side="right")
    sizes = hi - lo
    m = max(int(sizes.max()) if len(sizes) else 0, 1)
    out = np.full((len(users), m), fill, dtype=values.dtype)
    valid = np.arange(m)[None, :] < sizes[:, None]
    rows = np.repeat(np.arange(len(users)), sizes)
    cols = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    out[rows, cols] = values[np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)])
                             if len(users) else np.zeros(0, int)]
    return out, valid


def user_context(source: pl.DataFrame, users: np.ndarray, max_context: int) -> pl.DataFrame:
    """The context ``J_u`` of each of ``users``: its open-funnel rows, the plain order's first
    ``max_context``, sorted by (user_id, pos)."""
    return plain_order(source.join(pl.DataFrame({"user_id": users.astype(np.int64)}), on="user_id", how="semi"),
                       include_converted=True).filter(pl.col("pos") < max_context).sort("user_id", "pos")


def context_affinity(rows: pl.DataFrame, source: pl.DataFrame, entities: np.ndarray, max_context: int,
                     use_time: bool, cells: int = 16_000_000) -> pl.DataFrame:
    """The module's features of every candidate row.

    Args:
        rows: candidates (``user_id, entity_id``), sorted by (user_id, entity_id).
        source: the open-funnel rows of the same view (:func:`hir.funnel.source.open_funnel`).
        entities: (E, K) the view base's entity vectors.
        max_context: context pairs per user (the plain order's first).
        use_time: weight ``aff_recent`` by recency (False: it is 0).
        cells: candidates x context cells per chunk (memory bound).
    Returns:
        ``rows``' order, columns :data:`COLUMNS` (float32).
    """
    users = np.unique(rows["user_id"].to_numpy())
    ctx = user_context(source, users, max_context)
    z = torch.from_numpy(np.ascontiguousarray(entities, dtype=np.float32))
    z = z / z.norm(dim=1, keepdim=True).clamp(min=1e-12)  # (E, K)
    cu, ce = ctx["user_id"].to_numpy(), ctx["entity_id"].to_numpy()
    conv = ctx["converted"].to_numpy().astype(bool)
    age = ctx["age_days"].fill_null(0.0).to_numpy().astype(np.float32)
    w_recent = 1.0 / (1.0 + np.clip(age, 0.0, None)) if use_time else np.zeros(len(age), np.float32)
    ru, re = rows["user_id"].to_numpy(), rows["entity_id"].to_numpy()
    out = np.zeros((len(re), len(COLUMNS)), np.float32)
    n_cand = np.searchsorted(ru, users, side="right") - np.searchsorted(ru, users, side="left")
    n_ctx = np.searchsorted(cu, users, side="right") - np.searchsorted(cu, users, side="left")
    start = 0
    while start < len(users):
        # as many users as fit ``cells`` at the chunk's padded sizes (running maxima)
        stop, mc, mj = start + 1, n_cand[start], max(n_ctx[start], 1)
        while stop < len(users):
            mc2, mj2 = max(mc, n_cand[stop]), max(mj, n_ctx[stop])
            if (stop + 1 - start) * mc2 * mj2 > cells:
                break
            stop, mc, mj = stop + 1, mc2, mj2
        batch = users[start:stop]
        c_ent, c_ok = _padded(ru, batch, re, 0)            # (B, C)
        j_ent, j_ok = _padded(cu, batch, ce, 0)            # (B, J)
        j_conv, _ = _padded(cu, batch, conv, False)        # (B, J)
        j_w, _ = _padded(cu, batch, w_recent, 0.0)         # (B, J)
        ct, jt = torch.from_numpy(c_ent), torch.from_numpy(j_ent)
        sim = torch.bmm(z[ct], z[jt].transpose(1, 2))      # (B, C, J) cosines
        ok = torch.from_numpy(j_ok)[:, None, :] & (ct[:, :, None] != jt[:, None, :])  # never the candidate itself
        conv_t = torch.from_numpy(j_conv)[:, None, :]
        cols = []
        for group in (ok, ok & conv_t, ok & ~conv_t):
            n = group.sum(2)
            mx = sim.masked_fill(~group, -torch.inf).amax(2)
            cols += [torch.where(n > 0, mx, 0.0), (sim * group).sum(2) / n.clamp(min=1)]
        w = torch.from_numpy(j_w)[:, None, :] * ok          # (B, C, J)
        cols.append((sim * w).sum(2) / w.sum(2).clamp(min=1e-12))
        cols += [(ok & conv_t).sum(2).float(), (ok & ~conv_t).sum(2).float()]
        feats = torch.stack(cols, dim=2).numpy()           # (B, C, 9)
        lo = np.searchsorted(ru, batch[0], side="left")
        out[lo:lo + c_ok.sum()] = feats[c_ok]
        start = stop
    return pl.DataFrame({name: out[:, i] for i, name in enumerate(COLUMNS)})
