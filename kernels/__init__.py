"""hir_kernels: bias-aware attention, fused in Triton, with its PyTorch reference, SDPA and FlexAttention
paths.

Installed under the import name ``hir_kernels`` (the folder is ``kernels/``) so that it never
clashes with an unrelated package called ``kernels``.

Importing this package never defines or launches a Triton kernel: the kernels are built on first
use (``hir_kernels.attention_triton``), so ``TRITON_INTERPRET`` may be set any time before that.
"""

from hir_kernels.bias import Bias, Table
from hir_kernels.dispatch import BACKENDS, attention, attention_backend, backend_fn
from hir_kernels.reference import attention_flex, attention_reference, attention_sdpa

__all__ = [
    "BACKENDS",
    "Bias",
    "Table",
    "attention",
    "attention_backend",
    "attention_flex",
    "attention_reference",
    "attention_sdpa",
    "backend_fn",
]
