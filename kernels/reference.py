"""Pure-PyTorch reference of bias-aware attention: the maths every fast path must match.

Score for head h, query i, key j:

    s_h(i, j) = q_i·k_j * scale + T[h, qb_i, kb_j] - lam[h] * log1p(exposure_j)

keys where ``key_mask`` is False get -inf; a query row whose keys are all masked returns 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def biased_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table: Tensor | None,
    qb: Tensor | None,
    kb: Tensor | None,
    exposure: Tensor | None,
    lam: Tensor | None,
    key_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Materialises the (B, H, Nq, Nk) scores; O(N^2) memory, differentiable in every input.

    Args:
        q: (B, H, Nq, D) queries.
        k, v: (B, H, Nk, D) keys and values.
        table: (H, QB, KB) learned bias table, or None to switch the bucket bias off.
        qb: (B, Nq) int64 query bucket ids in [0, QB). Required with ``table``.
        kb: (B, Nk) int64 key bucket ids in [0, KB). Required with ``table``.
        exposure: (B, Nk) non-negative exposure counts of the keys, or None.
        lam: (H,) per-head exposure correction strength, or None to switch it off.
        key_mask: (B, Nk) bool, True for real keys; None means all keys are real.
        scale: score scale, default 1/sqrt(D).

    Returns:
        (B, H, Nq, D) attention output in q's dtype (computed in fp32).
    """
    d = q.shape[-1]
    scale = d**-0.5 if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q.float(), k.float()) * scale  # (B, H, Nq, Nk)
    if table is not None:
        assert qb is not None and kb is not None, "table needs qb and kb"
        bias = table.float()[:, qb[:, :, None], kb[:, None, :]]  # (H, B, Nq, Nk)
        s = s + bias.permute(1, 0, 2, 3)
    if lam is not None:
        assert exposure is not None, "lam needs exposure"
        s = s - lam.float()[None, :, None, None] * torch.log1p(exposure.float())[:, None, None, :]
    if key_mask is not None:
        s = s.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    # a row with every key masked is all -inf -> NaN after softmax; it attends to nothing
    p = torch.nan_to_num(p, nan=0.0)
    return torch.einsum("bhij,bhjd->bhid", p, v.float()).to(q.dtype)
