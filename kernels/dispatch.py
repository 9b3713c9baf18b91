"""The attention entry point the model calls: fused Triton on CUDA, SDPA with a materialised bias on CPU.

Backends (the model's config passes one through as ``backend``); each takes the same
(q, k, v, :class:`hir_kernels.Bias`, scale):
  ``auto``      -> ``triton`` on CUDA, ``sdpa`` elsewhere
  ``triton``    -> the fused kernel (O(N) memory); on CPU only under ``TRITON_INTERPRET=1`` (tests)
  ``sdpa``      -> ``F.scaled_dot_product_attention`` with the bias materialised (O(N^2) memory)
  ``reference`` -> the fp32 pure-PyTorch maths
  ``flex``      -> FlexAttention with the bias as a ``score_mod`` (compiled on CUDA; CPU: forward only)
Which one runs is logged once per (device, requested, resolved) combination.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable

from torch import Tensor

from hir_kernels.bias import Bias
from hir_kernels.reference import attention_flex, attention_reference, attention_sdpa

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


def backend_fn(name: str) -> Callable[..., Tensor]:
    """The function of a resolved backend name; the Triton module is imported on first use, so that
    ``TRITON_INTERPRET`` may be set any time before."""
    if name == "triton":
        return importlib.import_module("hir_kernels.attention_triton").attention_triton
    return {"sdpa": attention_sdpa, "reference": attention_reference, "flex": attention_flex}[name]


def attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Bias | None = None, scale: float | None = None, backend: str = "auto"
) -> Tensor:
    """Bias-aware attention through the chosen backend.

    Args:
        q: (B, H, Nq, D) queries.
        k, v: (B, H, Nk, D) keys and values.
        bias: the additive :class:`hir_kernels.Bias` (tables, column parts, key mask); None = plain
            attention.
        scale: score scale, default 1/sqrt(D).
        backend: one of ``BACKENDS`` (module docstring).

    Returns:
        (B, H, Nq, D) in q's dtype; a query row with no real key gives 0.
    """
    chosen = attention_backend(q.device.type, backend)
    key = (q.device.type, backend, chosen)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info("attention backend: %s (requested %r on %s)", chosen, backend, q.device.type)
    return backend_fn(chosen)(q, k, v, Bias() if bias is None else bias, scale)
