"""hir_kernels: fused bias-aware attention (Triton) and its pure-PyTorch reference.

Installed under the import name ``hir_kernels`` (the folder is ``kernels/``) so that it never
clashes with an unrelated package called ``kernels``.

Importing this package never defines or launches a Triton kernel: the kernels are built on first
use (``hir_kernels.attention_triton``), so ``TRITON_INTERPRET`` may be set any time before that.
"""

from hir_kernels.attention import (
    BiasedAttentionFn,
    biased_attention,
    column_bias,
    dense_bias_attention,
)
from hir_kernels.dispatch import BACKENDS, attention, attention_backend, attention_dense_bias
from hir_kernels.reference import (
    biased_attention_reference,
    biased_attention_sdpa,
    dense_bias_attention_reference,
    dense_bias_attention_sdpa,
    materialize_bias,
)

__all__ = [
    "BACKENDS",
    "BiasedAttentionFn",
    "attention",
    "attention_backend",
    "attention_dense_bias",
    "biased_attention",
    "biased_attention_reference",
    "biased_attention_sdpa",
    "column_bias",
    "dense_bias_attention",
    "dense_bias_attention_reference",
    "dense_bias_attention_sdpa",
    "materialize_bias",
]
