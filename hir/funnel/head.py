"""The target-aware head: a candidate attends to the user's context items with bias-aware attention.

The graph transformer biases attention by each token's stage, recency and count (hir/nn/net.py).
Here the same kind of bias scores a *candidate* against the user's context (the user's other
engaged entities, hir/funnel/affinity.py's ``J_u``), so the scorer can learn which of a user's
items speak for a candidate: the purchases, the other carts, the recent ones. For head h::

    s_h(c, j) = alpha_h * cos(c, j) + S_h[stage_j] + R_h[recency_j] + N_h[count_j]     j in J_u, j != c
    a_h(c, .) = softmax over {j} and a sink of score 0 (an empty context attends to the sink)
    o_h(c)    = sum_j a_h(c, j) cos(c, j)          m_h(c) = sum_j a_h(c, j)

``cos`` is the cosine of the view base's entity vectors (rotation-invariant, so one head serves
every training view's base and the served one). The head returns ``(o_h, m_h)`` per head, which
the scorer's MLP reads beside the candidate's own features (hir/funnel/scorer.py), trained
listwise end to end. alpha large makes ``o_h`` the max affinity, alpha 0 the bias-weighted mean.

Buckets of a context pair (:func:`context_buckets`): stage 0 converted, 1..3 gap to the target
(3 = three or more); recency ``min(floor(log2(1 + age_days)), 7)`` (0 without time); count
``min(floor(log2(n_events)), 4)``.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch
from torch import nn

STAGES, RECENCY, COUNTS = 4, 8, 5


def context_buckets(ctx: pl.DataFrame, use_time: bool) -> np.ndarray:
    """(m, 3) int64 stage, recency and count buckets of open-funnel rows ``ctx`` (module doc)."""
    stage = np.where(ctx["converted"].to_numpy(), 0, np.clip(ctx["gap"].to_numpy().astype(np.int64), 1, STAGES - 1))
    if use_time:
        age = np.clip(ctx["age_days"].fill_null(0.0).to_numpy().astype(np.float64), 0.0, None)
        rec = np.minimum(np.floor(np.log2(1.0 + age)), RECENCY - 1).astype(np.int64)
    else:
        rec = np.zeros(ctx.height, np.int64)
    n = np.maximum(ctx["n_events"].to_numpy().astype(np.float64), 1.0)
    cnt = np.minimum(np.floor(np.log2(n)), COUNTS - 1).astype(np.int64)
    return np.stack([stage, rec, cnt], axis=1)


class ContextHead(nn.Module):
    """(B, C, J) cosines, (B, J, 3) buckets, (B, C, J) validity -> (B, C, 2H) features (module doc).

    Args:
        heads: H, each with its own alpha and bias tables.
    """

    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.empty(heads))
        self.stage = nn.Parameter(torch.empty(heads, STAGES))
        self.recency = nn.Parameter(torch.empty(heads, RECENCY))
        self.count = nn.Parameter(torch.empty(heads, COUNTS))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # heads start apart: from a near-mean (alpha 0) to a near-max (alpha 12) pooling
        with torch.no_grad():
            self.alpha.copy_(torch.linspace(0.0, 12.0, len(self.alpha)))
        for t in (self.stage, self.recency, self.count):
            nn.init.zeros_(t)

    def __repr__(self) -> str:
        return f"ContextHead(heads={len(self.alpha)}, stages={STAGES}, recency={RECENCY}, counts={COUNTS})"

    @property
    def width(self) -> int:
        return 2 * len(self.alpha)

    def forward(self, cos: torch.Tensor, buckets: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
        bias = self.stage[:, buckets[..., 0]] + self.recency[:, buckets[..., 1]] + self.count[:, buckets[..., 2]]  # (H, B, J)
        s = self.alpha[:, None, None, None] * cos[None] + bias[:, :, None, :]  # (H, B, C, J)
        s = s.masked_fill(~ok[None], -torch.inf)
        # the sink (score 0) joins the softmax's normaliser
        norm = torch.logsumexp(torch.cat([s, torch.zeros_like(s[..., :1])], dim=-1), dim=-1, keepdim=True)  # (H, B, C, 1)
        a = torch.exp(s - norm)  # (H, B, C, J); 0 where not ok
        out = torch.stack([(a * cos[None]).sum(-1), a.sum(-1)], dim=-1)  # (H, B, C, 2)
        return out.permute(1, 2, 0, 3).reshape(cos.shape[0], cos.shape[1], -1)  # (B, C, 2H)


class Context:
    """The head's inputs of one view's candidates: ``vectors`` (E, K) unit entity vectors,
    ``cand`` (n,) the entity of each candidate row, ``offsets`` (U + 1,) the candidate rows of each
    user, ``ctx_offsets`` (U + 1,), ``ctx`` (m,) and ``buckets`` (m, 3): each user's context."""

    def __init__(self, vectors: np.ndarray, cand: np.ndarray, offsets: np.ndarray, ctx_offsets: np.ndarray,
                 ctx: np.ndarray, buckets: np.ndarray) -> None:
        norm = np.linalg.norm(vectors, axis=1, keepdims=True)
        self.vectors = (vectors / np.maximum(norm, 1e-12)).astype(np.float32)
        self.cand, self.offsets, self.ctx_offsets, self.ctx, self.buckets = cand, offsets, ctx_offsets, ctx, buckets

    @classmethod
    def of(cls, rows: pl.DataFrame, offsets: np.ndarray, users: np.ndarray, ctx: pl.DataFrame, vectors: np.ndarray,
           use_time: bool) -> Context:
        """From sorted candidate ``rows`` of ``users`` and their context rows ``ctx`` (open-funnel
        rows sorted by user, at most the plain order's first few per user)."""
        cu = ctx["user_id"].to_numpy()
        hi = np.searchsorted(cu, users, side="right")
        if len(cu) and (hi[-1] != len(cu) or not np.isin(cu, users).all()):
            raise ValueError("the context holds a user without candidates; build it from the candidates' users")
        ctx_offsets = np.concatenate([[0], hi]).astype(np.int64)
        return cls(vectors, rows["entity_id"].to_numpy(), offsets, ctx_offsets, ctx["entity_id"].to_numpy(),
                   context_buckets(ctx, use_time))

    @classmethod
    def concat(cls, parts: list[Context]) -> Context:
        """One context over several views' groups, in order: each view's entity ids are shifted
        past the previous views' vectors, so every group keeps its own view's base."""
        shift, rows, ctx = 0, 0, 0
        cand, ctx_ids, offsets, ctx_offsets = [], [], [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
        for p in parts:
            cand.append(p.cand + shift)
            ctx_ids.append(p.ctx + shift)
            offsets.append(p.offsets[1:] + rows)
            ctx_offsets.append(p.ctx_offsets[1:] + ctx)
            shift, rows, ctx = shift + len(p.vectors), rows + p.offsets[-1], ctx + p.ctx_offsets[-1]
        return cls(np.concatenate([p.vectors for p in parts]), np.concatenate(cand), np.concatenate(offsets),
                   np.concatenate(ctx_offsets), np.concatenate(ctx_ids), np.concatenate([p.buckets for p in parts]))

    def subset(self, users: np.ndarray) -> Context:
        """The context of the groups ``users`` (indices into ``offsets``), renumbered 0..len-1."""
        rows = np.concatenate([np.arange(self.offsets[r], self.offsets[r + 1]) for r in users]) if len(users) else np.zeros(0, int)
        ctx = np.concatenate([np.arange(self.ctx_offsets[r], self.ctx_offsets[r + 1]) for r in users]) \
            if len(users) else np.zeros(0, int)
        offsets = np.concatenate([[0], np.cumsum(self.offsets[users + 1] - self.offsets[users])])
        ctx_offsets = np.concatenate([[0], np.cumsum(self.ctx_offsets[users + 1] - self.ctx_offsets[users])])
        out = object.__new__(Context)
        out.vectors, out.cand, out.offsets = self.vectors, self.cand[rows], offsets.astype(np.int64)
        out.ctx_offsets, out.ctx, out.buckets = ctx_offsets.astype(np.int64), self.ctx[ctx], self.buckets[ctx]
        return out

    def batch(self, users: np.ndarray, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, C, J) cosines, (B, J, 3) buckets and (B, C, J) validity of the users ``users``
        (indices into ``offsets``), candidates padded to ``width`` as the scorer pads them."""
        sizes = self.ctx_offsets[users + 1] - self.ctx_offsets[users]
        j = max(int(sizes.max()), 1) if len(users) else 1
        cos = np.zeros((len(users), width, j), np.float32)
        buckets = np.zeros((len(users), j, 3), np.int64)
        ok = np.zeros((len(users), width, j), bool)
        for i, r in enumerate(users):
            c = self.cand[self.offsets[r]:self.offsets[r + 1]]
            x = self.ctx[self.ctx_offsets[r]:self.ctx_offsets[r + 1]]
            cos[i, : len(c), : len(x)] = self.vectors[c] @ self.vectors[x].T
            buckets[i, : len(x)] = self.buckets[self.ctx_offsets[r]:self.ctx_offsets[r + 1]]
            ok[i, : len(c), : len(x)] = c[:, None] != x[None, :]  # never the candidate itself
        return torch.from_numpy(cos), torch.from_numpy(buckets), torch.from_numpy(ok)
