"""Kernel tests run the Triton kernels through the interpreter on CPU (STACK.md §2).

TRITON_INTERPRET is read when ``@triton.jit`` runs, i.e. when ``hir_kernels.attention_triton`` is
first imported (lazily, on the first Triton launch), so setting it here, before any test runs, is
enough. On a machine with CUDA the same tests run the compiled kernels on the GPU instead.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
