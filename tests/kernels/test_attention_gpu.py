"""The compiled kernels on a CUDA device: every dtype and head dim at sizes the interpreter can't reach."""

from __future__ import annotations

import pytest
import torch

from hir_kernels import biased_attention, biased_attention_reference, dense_bias_attention
from hir_kernels.reference import dense_bias_attention_reference

from .test_attention import DTYPES, Case, assert_close, make_inputs, run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for the compiled Triton kernels"),
]


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("shape", [(2, 4, 300, 300), (1, 2, 1000, 777)], ids=["n300", "n1000x777"])
def test_gpu_forward_and_grads_match_reference(shape, d: int, dtype, atol, rtol) -> None:
    b, h, nq, nk = shape
    case = Case(b=b, h=h, nq=nq, nk=nk, d=d, qb=26, kb=256, mask="dead")  # the model's table size
    x = make_inputs(case, dtype, torch.device("cuda"))
    do = torch.randn(b, h, nq, d, device="cuda").to(dtype).float()
    out, grads = run(biased_attention, x, do)
    ref, ref_grads = run(biased_attention_reference, x, do, upcast=True)
    assert_close("out", out, ref, atol, rtol)
    for name in grads:
        assert_close(f"d{name}", grads[name], ref_grads[name], atol, rtol)
    assert (out[-1] == 0).all()


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES, ids=lambda v: str(v).replace("torch.", ""))
def test_gpu_big_table_and_dense_bias(dtype, atol, rtol) -> None:
    case = Case(b=2, h=4, nq=513, nk=513, d=64, qb=100, kb=64, mask="some")
    x = make_inputs(case, dtype, torch.device("cuda"))
    do = torch.randn(2, 4, 513, 64, device="cuda").to(dtype).float()
    out, grads = run(biased_attention, x, do)
    ref, ref_grads = run(biased_attention_reference, x, do, upcast=True)
    assert_close("out", out, ref, atol, rtol)
    for name in grads:
        assert_close(f"d{name}", grads[name], ref_grads[name], atol, rtol)

    q, k, v = (x[n].detach().requires_grad_() for n in ("q", "k", "v"))
    bias = torch.randn(2, 1, 513, 513, device="cuda", requires_grad=True)
    o = dense_bias_attention(q, k, v, bias, key_mask=x["key_mask"])
    g = torch.autograd.grad(o, (q, k, v, bias), do.to(o.dtype))
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    bf = bias.detach().clone().requires_grad_()
    o_ref = dense_bias_attention_reference(qf, kf, vf, bf, key_mask=x["key_mask"])
    g_ref = torch.autograd.grad(o_ref, (qf, kf, vf, bf), do)
    for name, a, r in zip(("out", "dq", "dk", "dv", "dbias"), (o, *g), (o_ref, *g_ref)):
        assert_close(name, a, r, atol, rtol)
