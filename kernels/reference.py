"""The PyTorch backends of bias-aware attention: the fp32 reference every fast path must match, SDPA with
the bias materialised (the CPU default for the model's short contexts), and FlexAttention with the
bias as a ``score_mod``.

All three take q (B, H, Nq, D), k and v (B, H, Nk, D), a :class:`hir_kernels.Bias` and the score
scale (default 1/sqrt(D)), and return (B, H, Nq, D) in q's dtype; the maths is in ``bias.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hir_kernels.bias import Bias

_COMPILED_FLEX: Any = None


def attention_reference(q: Tensor, k: Tensor, v: Tensor, bias: Bias, scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + bias) v in fp32, the scores materialised: O(N^2) memory, differentiable
    in every input. A query row whose keys are all masked returns 0."""
    b, h, nq, d = q.shape
    bias.check(b, h, nq, k.shape[2])
    scale = d**-0.5 if scale is None else scale
    s = torch.einsum("bhid,bhjd->bhij", q.float(), k.float()) * scale  # (B, H, Nq, Nk)
    dense = bias.dense()
    if dense is not None:
        s = s + dense
    if bias.key_mask is not None:
        s = s.masked_fill(~bias.key_mask[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    # a row with every key masked is all -inf -> NaN after softmax; it attends to nothing
    p = torch.nan_to_num(p, nan=0.0)
    return torch.einsum("bhij,bhjd->bhid", p, v.float()).to(q.dtype)


def attention_sdpa(q: Tensor, k: Tensor, v: Tensor, bias: Bias, scale: float | None = None) -> Tensor:
    """``F.scaled_dot_product_attention`` with the bias materialised as a (B, H, Nq, Nk) mask in q's
    dtype: O(N^2) memory, fast on CPU for short contexts, differentiable in every input. A batch with
    no real key attends to everything (finite) and is zeroed afterwards: no NaN anywhere."""
    b, h, nq, _ = q.shape
    bias.check(b, h, nq, k.shape[2])
    mask, alive = bias.dense(), None
    if bias.key_mask is not None:
        alive = bias.key_mask.any(dim=-1)  # (B,)
        km = bias.key_mask | ~alive[:, None]
        neg = torch.zeros(km.shape, device=q.device).masked_fill(~km, float("-inf"))[:, None, None, :]  # (B,1,1,Nk)
        mask = neg if mask is None else mask + neg
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(q.dtype), scale=scale)
    if alive is not None:
        out = out * alive[:, None, None, None].to(out.dtype)
    return out


def flex_attention_fn(compiled: bool) -> Callable[..., Tensor]:
    """``flex_attention``, or the (cached) ``torch.compile``d one: the fused Triton template on CUDA."""
    from torch.nn.attention.flex_attention import flex_attention

    global _COMPILED_FLEX
    if not compiled:
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX


def attention_flex(
    q: Tensor, k: Tensor, v: Tensor, bias: Bias, scale: float | None = None, compiled: bool | None = None
) -> Tensor:
    """FlexAttention with :meth:`Bias.score_mod`; compiled on CUDA by default (gradients for q, k, v,
    the tables and the column parts), eager elsewhere. PyTorch has no FlexAttention backward on CPU:
    there it is a forward-only path."""
    b, h, nq, _ = q.shape
    nk = k.shape[2]
    bias.check(b, h, nq, nk)
    compiled = q.device.type == "cuda" if compiled is None else compiled
    return flex_attention_fn(compiled)(q, k, v, score_mod=bias.score_mod(b, nk, q.device), scale=scale)


__all__ = ["attention_flex", "attention_reference", "attention_sdpa", "flex_attention_fn"]
