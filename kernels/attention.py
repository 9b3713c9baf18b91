"""Fused bias-aware attention: autograd.Function and public functions over the Triton kernels.

Score for head h, query i, key j:

    s_h(i, j) = q_i·k_j * scale + T[h, qb_i, kb_j] - lam[h] * log1p(exposure_j)   (+ dense[b, h, i, j])

keys where ``key_mask`` is False get -inf; rows with no unmasked key return 0 and get zero
gradients. Memory is O(N): the bias is gathered inside the kernels, only the per-row log-sum-exp is
kept for backward. The kernels and launchers (parts 1-2) are in ``attention_triton.py``, imported on
first use so that ``TRITON_INTERPRET`` can be set before ``@triton.jit`` runs; the pure-PyTorch
references are in ``reference.py`` and re-exported here.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from hir_kernels.reference import biased_attention_reference, dense_bias_attention_reference


def _triton() -> ModuleType:
    return importlib.import_module("hir_kernels.attention_triton")


def column_bias(
    exposure: Tensor | None, lam: Tensor | None, key_mask: Tensor | None, b: int, h: int, nk: int,
    device: torch.device,
) -> Tensor:
    """Per-key additive term ``-lam[h] * log1p(exposure_j)``, -inf on masked keys.

    Returns (B, H, Nk) fp32 when ``lam`` is given, else (B, 1, Nk); differentiable in lam and exposure.
    """
    if lam is not None:
        if exposure is None:
            raise ValueError("lam needs exposure (B, Nk); got None (pass lam=None to switch the term off)")
        if lam.shape != (h,) or exposure.shape != (b, nk):
            raise ValueError(
                f"lam must be (H,) = ({h},) and exposure (B, Nk) = ({b}, {nk}); "
                f"got {tuple(lam.shape)} and {tuple(exposure.shape)}"
            )
        col = -lam.float()[None, :, None] * torch.log1p(exposure.float())[:, None, :]  # (B, H, Nk)
    else:
        col = torch.zeros(b, 1, nk, device=device)  # (B, 1, Nk)
    if key_mask is not None:
        if key_mask.shape != (b, nk) or key_mask.dtype != torch.bool:
            raise ValueError(f"key_mask must be bool (B, Nk) = ({b}, {nk}); got {key_mask.dtype} {tuple(key_mask.shape)}")
        col = col.masked_fill(~key_mask[:, None, :], float("-inf"))
    return col


def _sum_to(grad: Tensor, shape: torch.Size) -> Tensor:
    """Reduce a (B, H, Nq, Nk) gradient to the broadcast shape the bias came in."""
    lead = grad.dim() - len(shape)
    grad = grad.sum(dim=tuple(range(lead))) if lead else grad
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(dim=dims, keepdim=True) if dims else grad


class BiasedAttentionFn(torch.autograd.Function):
    """softmax(q k^T * scale + T[qb, kb] + col + dense) v, fused; saves the inputs, O and the row LSE
    (plus O's rounding residual when T or col need gradients and O is 16-bit): O(N) memory."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, table: Tensor | None, col: Tensor,
        dense: Tensor | None, qb: Tensor | None, kb: Tensor | None, scale: float | None,
        grad_enabled: bool = True,
    ) -> Tensor:
        # o's rounding residual takes o's final 16-bit rounding out of backward's delta: about half
        # the dT / dlam error for 16-bit inputs (those sums cancel row by row) for O(N D) memory
        need = ctx.needs_input_grad  # True under no_grad too, hence the grad-mode flag
        residual = grad_enabled and bool(need[3] or need[4])
        o, lse, res = _triton().attention_forward(q, k, v, table, qb, kb, col, dense, scale, residual)
        ctx.save_for_backward(q, k, v, o, lse, res, table, col, dense, qb, kb)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx: Any, do: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, o, lse, res, table, col, dense, qb, kb = ctx.saved_tensors
        need = ctx.needs_input_grad  # q, k, v, table, col, dense, qb, kb, scale
        dq, dk, dv, dtable, dcol, ddense = _triton().attention_backward(
            do, q, k, v, o, lse, res, table, qb, kb, col, dense, ctx.scale,
            need_dtable=need[3], need_dcol=need[4], need_ddense=need[5],
        )
        if dtable is not None:
            dtable = dtable.to(table.dtype)
        if dcol is not None and col.shape[1] == 1:
            dcol = dcol.sum(dim=1, keepdim=True)  # (B, 1, Nk): col was shared by all heads
        if ddense is not None:
            ddense = _sum_to(ddense, dense.shape).to(dense.dtype)
        return dq, dk, dv, dtable, dcol, ddense, None, None, None, None


def biased_attention(
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
    """Fused (Triton) bias-aware attention; O(N) memory, gradients for q, k, v, table, lam, exposure.

    Args:
        q: (B, H, Nq, D) queries, fp16/bf16/fp32 (accumulation is fp32). D <= 128; other D than
            16/32/64/128 are zero-padded to the next power of two.
        k, v: (B, H, Nk, D) keys and values, same dtype as q.
        table: (H, QB, KB) bias table T, or None. With QB <= 32 query buckets (any KB) the bias and
            its gradient go through one-hot tensor-core dots and dT is deterministic; larger QB
            gathers per (i, j) and accumulates dT with fp32 atomics.
        qb: (B, Nq) int query bucket ids in [0, QB); kb: (B, Nk) int key bucket ids in [0, KB).
        exposure: (B, Nk) non-negative exposure of each key, or None.
        lam: (H,) exposure-correction strength per head, or None.
        key_mask: (B, Nk) bool, True for real keys, or None.
        scale: score scale, default 1/sqrt(D).

    Returns:
        (B, H, Nq, D) in q's dtype: softmax_j(s_h(i, j)) @ v with
        ``s_h(i, j) = q_i·k_j * scale + T[h, qb_i, kb_j] - lam[h] * log1p(exposure_j)``.
    """
    b, h, _, _ = q.shape
    col = column_bias(exposure, lam, key_mask, b, h, k.shape[2], q.device)  # (B, H|1, Nk)
    return BiasedAttentionFn.apply(q, k, v, table, col, None, qb, kb, scale, torch.is_grad_enabled())


def dense_bias_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, key_mask: Tensor | None = None, scale: float | None = None
) -> Tensor:
    """Fused (Triton) attention with an explicit pairwise bias, e.g. shortest-path distances.

    ``softmax_j(q_i·k_j * scale + bias[b, h, i, j]) @ v``; ``bias`` broadcastable to (B, H, Nq, Nk)
    (e.g. (B, 1, Nq, Nk) shared by heads), any float dtype, -inf allowed; its gradient has bias's
    shape and dtype. q, k, v and key_mask as in :func:`biased_attention`. Returns (B, H, Nq, D).
    """
    b, h, _, _ = q.shape
    col = column_bias(None, None, key_mask, b, h, k.shape[2], q.device)  # (B, 1, Nk)
    return BiasedAttentionFn.apply(q, k, v, None, col, bias, None, None, scale, torch.is_grad_enabled())


__all__ = [
    "BiasedAttentionFn",
    "biased_attention",
    "biased_attention_reference",
    "column_bias",
    "dense_bias_attention",
    "dense_bias_attention_reference",
]
