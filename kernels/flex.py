"""The attention bias as a FlexAttention ``score_mod``: the spec the fused kernel is checked against.

    score_mod(score, b, h, i, j) = score + T[h, qb[b, i], kb[b, j]] + col[b, h, j]

with ``col = -lam[h] * log1p(exposure_j)`` and -inf on masked keys (FlexAttention returns 0 for
rows with no finite score). On CPU FlexAttention runs forward only (eager or compiled); on CUDA
``compiled=True`` gives the fused Triton template with gradients for the captured table and lam.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hir_kernels.attention import column_bias

_COMPILED: Any = None


def biased_score_mod(table: Tensor | None, qb: Tensor | None, kb: Tensor | None, col: Tensor) -> Callable:
    """score_mod adding ``T[h, qb[b, i], kb[b, j]]`` (if table) and ``col[b, h or 0, j]``.

    Args:
        table: (H, QB, KB) bias table or None; qb (B, Nq), kb (B, Nk) bucket ids.
        col: (B, H, Nk) or (B, 1, Nk) per-key term from :func:`column_bias`.
    """
    per_head = col.shape[1] != 1
    if table is None:

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + (col[b, h, kv_idx] if per_head else col[b, 0, kv_idx])

        return score_mod

    def score_mod_t(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        c = col[b, h, kv_idx] if per_head else col[b, 0, kv_idx]
        return score + table[h, qb[b, q_idx], kb[b, kv_idx]] + c

    return score_mod_t


def flex_attention_fn(compiled: bool) -> Callable:
    """``flex_attention``, or the (cached) ``torch.compile``d one."""
    from torch.nn.attention.flex_attention import flex_attention

    global _COMPILED
    if not compiled:
        return flex_attention
    if _COMPILED is None:
        _COMPILED = torch.compile(flex_attention, dynamic=False)
    return _COMPILED


def biased_attention_flex(
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
    compiled: bool = False,
) -> Tensor:
    """FlexAttention with :func:`biased_score_mod`; arguments and maths as in
    :func:`hir_kernels.biased_attention_reference`. Returns (B, H, Nq, D) in q's dtype."""
    b, h, _, _ = q.shape
    col = column_bias(exposure, lam, key_mask, b, h, k.shape[2], q.device)  # (B, H|1, Nk)
    if table is not None and (qb is None or kb is None):
        raise ValueError("a bias table needs qb (B, Nq) and kb (B, Nk) bucket ids; got None")
    qb_, kb_ = (qb.long(), kb.long()) if table is not None else (qb, kb)
    tab = table.float() if table is not None else None
    return flex_attention_fn(compiled)(q, k, v, score_mod=biased_score_mod(tab, qb_, kb_, col), scale=scale)
