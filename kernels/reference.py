"""Pure-PyTorch paths of bias-aware attention: the reference every fast path must match, and an SDPA
path with a materialised bias (the CPU default for the short contexts the model uses).

Score for head h, query i, key j:

    s_h(i, j) = q_i·k_j * scale + T[h, qb_i, kb_j] - lam[h] * log1p(exposure_j)   (+ dense[b, h, i, j])

keys where ``key_mask`` is False get -inf; a query row whose keys are all masked returns 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def materialize_bias(
    table: Tensor | None,
    qb: Tensor | None,
    kb: Tensor | None,
    exposure: Tensor | None,
    lam: Tensor | None,
) -> Tensor | None:
    """The additive bias as a dense fp32 tensor: (B, H, Nq, Nk), (B, H, 1, Nk) if only lam, or None.

    ``T[h, qb_i, kb_j] - lam[h] * log1p(exposure_j)``; differentiable in ``table`` and ``lam``.
    """
    bias = None
    if table is not None:
        if qb is None or kb is None:
            raise ValueError("a bias table needs qb (B, Nq) and kb (B, Nk) bucket ids; got None")
        bias = table.float()[:, qb[:, :, None], kb[:, None, :]].permute(1, 0, 2, 3)  # (B, H, Nq, Nk)
    if lam is not None:
        if exposure is None:
            raise ValueError("lam needs exposure (B, Nk); got None (pass lam=None to switch the term off)")
        pen = -lam.float()[None, :, None, None] * torch.log1p(exposure.float())[:, None, None, :]  # (B, H, 1, Nk)
        bias = pen if bias is None else bias + pen
    return bias


def _masked_softmax_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
                              key_mask: Tensor | None, scale: float | None) -> Tensor:
    d = q.shape[-1]
    scale = d**-0.5 if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q.float(), k.float()) * scale  # (B, H, Nq, Nk)
    if bias is not None:
        s = s + bias.float()
    if key_mask is not None:
        s = s.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    # a row with every key masked is all -inf -> NaN after softmax; it attends to nothing
    p = torch.nan_to_num(p, nan=0.0)
    return torch.einsum("bhij,bhjd->bhid", p, v.float()).to(q.dtype)


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
    bias = materialize_bias(table, qb, kb, exposure, lam)
    return _masked_softmax_attention(q, k, v, bias, key_mask, scale)


def dense_bias_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, key_mask: Tensor | None = None, scale: float | None = None
) -> Tensor:
    """softmax(q k^T * scale + bias) v in fp32; bias broadcastable to (B, H, Nq, Nk), -inf allowed.

    Rows with no finite score return 0. Returns (B, H, Nq, D) in q's dtype.
    """
    return _masked_softmax_attention(q, k, v, bias, key_mask, scale)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, key_mask: Tensor | None,
          scale: float | None) -> Tensor:
    """SDPA with an additive float mask; all-masked batches get output 0 without NaN."""
    alive = None
    if key_mask is not None:
        alive = key_mask.any(dim=-1)  # (B,)
        # a batch with no real key attends to everything (finite) and is zeroed below: no NaN anywhere
        km = key_mask | ~alive[:, None]
        neg = torch.zeros(km.shape, device=q.device).masked_fill(~km, float("-inf"))[:, None, None, :]  # (B,1,1,Nk)
        bias = neg if bias is None else bias + neg
    mask = None if bias is None else bias.to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if alive is not None:
        out = out * alive[:, None, None, None].to(out.dtype)
    return out


def biased_attention_sdpa(
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
    """Same maths and arguments as :func:`biased_attention_reference`, through
    ``F.scaled_dot_product_attention`` with the bias materialised as a (B, H, Nq, Nk) mask in q's
    dtype. O(N^2) memory; fast on CPU for short contexts; differentiable in every input."""
    bias = materialize_bias(table, qb, kb, exposure, lam)
    return _sdpa(q, k, v, bias, key_mask, scale)


def dense_bias_attention_sdpa(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, key_mask: Tensor | None = None, scale: float | None = None
) -> Tensor:
    """:func:`dense_bias_attention_reference` through SDPA. Rows whose bias is -inf everywhere give
    NaN here (SDPA semantics); use the reference or Triton path for such biases."""
    return _sdpa(q, k, v, bias, key_mask, scale)
