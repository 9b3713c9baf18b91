"""The one attention entry point the model calls: Triton on CUDA, PyTorch on CPU."""

from __future__ import annotations

import logging

from torch import Tensor

from hir_kernels.reference import biased_attention_reference

log = logging.getLogger(__name__)

BACKENDS = ("auto", "reference")


def attention_backend(device_type: str, backend: str = "auto") -> str:
    """Resolve which implementation runs for ``device_type`` ('cpu' / 'cuda') and a config choice."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; expected one of {BACKENDS}")
    return "reference"


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
    """Bias-aware attention; shapes and maths as in :func:`biased_attention_reference`."""
    attention_backend(q.device.type, backend)
    return biased_attention_reference(q, k, v, table, qb, kb, exposure, lam, key_mask, scale)
