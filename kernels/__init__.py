"""hir_kernels: fused bias-aware attention (Triton) and its pure-PyTorch reference.

Installed under the import name ``hir_kernels`` (the folder is ``kernels/``) so that it never
clashes with an unrelated package called ``kernels``.
"""

from hir_kernels.dispatch import attention, attention_backend

__all__ = ["attention", "attention_backend"]
