"""The attention entry points the model calls: fused Triton on CUDA, SDPA with a materialised bias on CPU.

Backends (the model's config passes one through as ``backend``):
  ``auto``      -> ``triton`` on CUDA, ``sdpa`` elsewhere
  ``triton``    -> the fused kernel (O(N) memory); on CPU only under ``TRITON_INTERPRET=1`` (tests)
  ``sdpa``      -> ``F.scaled_dot_product_attention`` with the bias materialised (O(N^2) memory)
  ``reference`` -> the fp32 pure-PyTorch maths
  ``flex``      -> FlexAttention with the bias as a ``score_mod`` (compiled on CUDA; CPU: forward only)
Which one runs is logged once per (device, requested, resolved) combination.
"""

from __future__ import annotations

import logging
import os

from torch import Tensor

from hir_kernels.attention import biased_attention, dense_bias_attention
from hir_kernels.reference import (
    biased_attention_reference,
    biased_attention_sdpa,
    dense_bias_attention_reference,
    dense_bias_attention_sdpa,
)

log = logging.getLogger(__name__)

BACKENDS = ("auto", "triton", "sdpa", "reference", "flex")
_LOGGED: set[tuple[str, str, str]] = set()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def attention_backend(device_type: str, backend: str = "auto") -> str:
    """Resolve which implementation runs for ``device_type`` ('cpu' / 'cuda') and a config choice.

    Raises ValueError for an unknown name and RuntimeError for 'triton' off CUDA without
    ``TRITON_INTERPRET=1``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; expected one of {BACKENDS}")
    if backend == "auto":
        return "triton" if device_type == "cuda" else "sdpa"
    if backend == "triton" and device_type != "cuda" and not _interpreting():
        raise RuntimeError(
            f"attention backend 'triton' needs CUDA tensors, got device {device_type!r}; use backend='auto' "
            "(SDPA on CPU), 'sdpa' or 'reference', or set TRITON_INTERPRET=1 before the first call to run the "
            "Triton interpreter (slow; for tests)"
        )
    return backend


def _resolve(device_type: str, backend: str) -> str:
    chosen = attention_backend(device_type, backend)
    key = (device_type, backend, chosen)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info("attention backend: %s (requested %r on %s)", chosen, backend, device_type)
    return chosen


def attention(
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
    backend: str = "auto",
) -> Tensor:
    """Bias-aware attention through the chosen backend.

    ``s_h(i, j) = q_i·k_j * scale + T[h, qb_i, kb_j] - lam[h] * log1p(exposure_j)``, masked keys -inf,
    rows with no real key give 0. Shapes: q (B, H, Nq, D); k, v (B, H, Nk, D); table (H, QB, KB) or
    None; qb (B, Nq), kb (B, Nk) int; exposure (B, Nk) or None; lam (H,) or None; key_mask (B, Nk)
    bool (True = real key) or None. Returns (B, H, Nq, D) in q's dtype.
    """
    chosen = _resolve(q.device.type, backend)
    args = (q, k, v, table, qb, kb, exposure, lam, key_mask, scale)
    if chosen == "triton":
        return biased_attention(*args)
    if chosen == "sdpa":
        return biased_attention_sdpa(*args)
    if chosen == "flex":
        from hir_kernels.flex import biased_attention_flex

        return biased_attention_flex(*args, compiled=q.device.type == "cuda")
    return biased_attention_reference(*args)


def attention_dense_bias(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor,
    key_mask: Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> Tensor:
    """Attention with an explicit pairwise bias (e.g. shortest-path distances), gradient to ``bias``.

    ``softmax_j(q_i·k_j * scale + bias[b, h, i, j]) @ v``; bias broadcastable to (B, H, Nq, Nk).
    Backends as for :func:`attention` ('flex' is not offered here). Returns (B, H, Nq, D).
    """
    chosen = _resolve(q.device.type, backend)
    if chosen == "triton":
        return dense_bias_attention(q, k, v, bias, key_mask, scale)
    if chosen == "sdpa":
        return dense_bias_attention_sdpa(q, k, v, bias, key_mask, scale)
    if chosen == "flex":
        raise ValueError("backend 'flex' is not offered for a dense bias; use 'auto', 'triton', 'sdpa' or 'reference'")
    return dense_bias_attention_reference(q, k, v, bias, key_mask, scale)
