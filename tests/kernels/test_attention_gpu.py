"""The compiled kernels on a CUDA device: every dtype and head dim at sizes the interpreter can't reach."""

from __future__ import annotations

import pytest
import torch

from hir_kernels import attention_reference, backend_fn

from .cases import DTYPES, Case, assert_matches, dtype_id, make_inputs, run, upstream

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for the compiled Triton kernels"),
]


def _check(case: Case, dtype, atol, rtol) -> dict:
    x = make_inputs(case, dtype, torch.device("cuda"))
    do = upstream(case, dtype, torch.device("cuda"))
    out, grads = run(backend_fn("triton"), x, do)
    assert_matches(out, grads, *run(attention_reference, x, do, upcast=True), atol, rtol)
    return {"out": out, **grads}


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("shape", [(2, 4, 300, 300), (1, 2, 1000, 777)], ids=["n300", "n1000x777"])
def test_gpu_forward_and_grads_match_reference(shape, d: int, dtype, atol, rtol) -> None:
    b, h, nq, nk = shape
    out = _check(Case(b=b, h=h, nq=nq, nk=nk, d=d, tables=((26, 216),), mask="dead"), dtype, atol, rtol)["out"]
    assert (out[-1] == 0).all()


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("tables", [((100, 64),), ((20, 64), (8, 5)), ((26, 216), (30, 7))], ids=["atomics", "two_onehot", "two_atomics"])
def test_gpu_table_modes(tables, dtype, atol, rtol) -> None:
    _check(Case(b=2, h=4, nq=513, nk=513, d=64, tables=tables, columns=("lam", "shared")), dtype, atol, rtol)
