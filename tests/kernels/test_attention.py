"""Fused bias-aware attention against the pure-PyTorch reference: forward and every gradient.

On CPU the Triton kernels run in the interpreter (tests/kernels/conftest.py), so shapes are small
but awkward: length 1, lengths that are not powers of two or block multiples, several blocks (the
interpreter tiles are 32x16 / 16x32), masked keys and batches whose keys are all masked.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hir_kernels import (
    biased_attention,
    biased_attention_reference,
    dense_bias_attention,
    dense_bias_attention_reference,
)

# (dtype, atol, rtol); atol is relative to the largest reference magnitude of each tensor
DTYPES = [
    (torch.float32, 2e-5, 1e-4),
    (torch.float16, 3e-3, 1e-2),
    (torch.bfloat16, 2e-2, 2e-2),
]


@dataclasses.dataclass
class Case:
    b: int = 2
    h: int = 2
    nq: int = 37
    nk: int = 45
    d: int = 32
    qb: int = 5  # table size (QB, KB); QB > 32 takes the gather + atomics path
    kb: int = 7
    table: bool = True
    lam: bool = True
    mask: str = "some"  # none | some | dead (batch 1 has no real key)


CASES = {
    "n1": Case(b=1, h=1, nq=1, nk=1, d=16, mask="none"),
    "odd_lengths": Case(),
    "dead_batch": Case(nq=20, nk=33, mask="dead"),
    "model_like_table": Case(nq=30, nk=41, qb=26, kb=256),  # the model's QB x KB is ~26 x 256
    "big_table_atomics": Case(nq=21, nk=40, qb=40, kb=36),
    "no_bias": Case(nq=33, nk=17, table=False, lam=False),
    "lam_only_mask": Case(nq=16, nk=50, table=False),
    "table_only": Case(b=1, h=3, nq=48, nk=48, d=64, lam=False, mask="none"),
    "head_dim_24_padded": Case(b=1, nq=19, nk=23, d=24, mask="dead"),
}


def make_inputs(c: Case, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    x = {
        "q": randn(c.b, c.h, c.nq, c.d).to(device, dtype),
        "k": randn(c.b, c.h, c.nk, c.d).to(device, dtype),
        "v": randn(c.b, c.h, c.nk, c.d).to(device, dtype),
        "table": randn(c.h, c.qb, c.kb).to(device) if c.table else None,
        "qb": torch.randint(0, c.qb, (c.b, c.nq), generator=g).to(device),
        "kb": torch.randint(0, c.kb, (c.b, c.nk), generator=g).to(device),
        "exposure": (torch.rand(c.b, c.nk, generator=g) * 20).to(device),
        "lam": (torch.rand(c.h, generator=g) + 0.1).to(device) if c.lam else None,
        "key_mask": None,
    }
    if c.mask != "none":
        km = torch.rand(c.b, c.nk, generator=g) > 0.3
        km[:, 0] = True
        if c.mask == "dead":
            km[-1] = False
        x["key_mask"] = km.to(device)
    return x


GRAD_NAMES = ("q", "k", "v", "table", "lam")


def run(fn, x: dict, do: torch.Tensor, upcast: bool = False) -> tuple[torch.Tensor, dict]:
    """Forward + backward of ``fn``; returns the output and the gradient of every float input."""
    leaves = {}
    args = dict(x)
    for name in GRAD_NAMES:
        if args[name] is not None:
            t = args[name].detach()
            leaves[name] = (t.float() if upcast else t).requires_grad_()
            args[name] = leaves[name]
    out = fn(**args)
    grads = torch.autograd.grad(out, list(leaves.values()), do.to(out.dtype))
    return out, dict(zip(leaves, grads))


def assert_close(name: str, got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> None:
    got, ref = got.float().cpu(), ref.float().cpu()
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    scale = max(1.0, ref.abs().max().item())
    torch.testing.assert_close(got, ref, atol=atol * scale, rtol=rtol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_forward_and_grads_match_reference(case: Case, dtype, atol, rtol, device) -> None:
    x = make_inputs(case, dtype, device)
    do = torch.randn(case.b, case.h, case.nq, case.d, generator=torch.Generator().manual_seed(1))
    do = do.to(device, dtype).float()  # both paths see the same (rounded) upstream gradient
    out, grads = run(biased_attention, x, do)
    ref, ref_grads = run(biased_attention_reference, x, do, upcast=True)  # fp32 maths on the same inputs
    assert out.dtype == dtype and out.shape == ref.shape
    assert_close("out", out, ref, atol, rtol)
    assert set(grads) == set(ref_grads)
    for name in grads:
        assert grads[name].dtype == x[name].dtype, name
        assert_close(f"d{name}", grads[name], ref_grads[name], atol, rtol)


def test_all_masked_rows_give_zero_output_and_zero_grads(device) -> None:
    case = CASES["dead_batch"]
    x = make_inputs(case, torch.float32, device)
    do = torch.randn(case.b, case.h, case.nq, case.d).to(device)
    out, grads = run(biased_attention, x, do)
    assert torch.isfinite(out).all()
    assert (out[-1] == 0).all()  # batch with no real key attends to nothing
    for name in ("q", "k", "v"):
        assert torch.isfinite(grads[name]).all()
        assert (grads[name][-1] == 0).all(), name
    assert (grads["k"][0][:, ~x["key_mask"][0]] == 0).all()  # masked keys get no gradient


def test_table_gradient_is_deterministic(device) -> None:
    case = CASES["odd_lengths"]
    x = make_inputs(case, torch.float32, device)
    do = torch.randn(case.b, case.h, case.nq, case.d).to(device)
    first = run(biased_attention, x, do)[1]["table"]
    second = run(biased_attention, x, do)[1]["table"]
    assert torch.equal(first, second)


def test_many_pairs_hitting_one_table_entry_accumulate(device) -> None:
    """Every (i, j) pair shares bucket (0, 0): dT[h, 0, 0] is the sum over all of them."""
    case = Case(nq=40, nk=40, qb=3, kb=3, mask="none")
    x = make_inputs(case, torch.float32, device)
    x["qb"].zero_()
    x["kb"].zero_()
    do = torch.randn(case.b, case.h, case.nq, case.d).to(device)
    dt = run(biased_attention, x, do)[1]["table"]
    dt_ref = run(biased_attention_reference, x, do)[1]["table"]
    assert_close("dT", dt, dt_ref, 2e-5, 1e-4)
    assert (dt[:, 1:, :] == 0).all() and (dt[:, :, 1:] == 0).all()


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("bias_shape", ["full", "shared_heads"])
def test_dense_bias_matches_reference(bias_shape: str, dtype, atol, rtol, device) -> None:
    b, h, nq, nk, d = 2, 2, 35, 18, 32
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(device, dtype) for n in (nq, nk, nk))
    bias = torch.randn(b, h if bias_shape == "full" else 1, nq, nk, generator=g)
    bias[0, 0, 3, :5] = float("-inf")  # unreachable pairs, e.g. no path in the graph
    bias = bias.to(device)
    key_mask = (torch.rand(b, nk, generator=g) > 0.2).to(device)
    key_mask[-1] = False
    do = torch.randn(b, h, nq, d, generator=g).to(device, dtype).float()

    def grads(fn, upcast: bool) -> list[torch.Tensor]:
        leaves = [t.detach().float() if upcast else t.detach() for t in (q, k, v)]
        leaves = [t.requires_grad_() for t in [*leaves, bias.detach().clone()]]
        out = fn(*leaves, key_mask=key_mask)
        return [out, *torch.autograd.grad(out, leaves, do.to(out.dtype))]

    got = grads(dense_bias_attention, upcast=False)
    ref = grads(dense_bias_attention_reference, upcast=True)
    assert got[4].shape == bias.shape and got[4].dtype == bias.dtype
    for name, a, r in zip(("out", "dq", "dk", "dv", "dbias"), got, ref):
        assert_close(name, a, r, atol, rtol)
    assert (got[0][-1] == 0).all()


def test_strided_layout_without_copies(device) -> None:
    """q, k, v as (B, N, H, D).transpose(1, 2) views, the layout a fused QKV projection gives."""
    case = CASES["odd_lengths"]
    x = make_inputs(case, torch.float32, device)
    for name in ("q", "k", "v"):
        x[name] = x[name].transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, N, D) view of (B, N, H, D)
        assert not x[name].is_contiguous()
    do = torch.randn(case.b, case.h, case.nq, case.d).to(device)
    out, grads = run(biased_attention, x, do)
    ref, ref_grads = run(biased_attention_reference, x, do)
    assert_close("out", out, ref, 2e-5, 1e-4)
    for name in grads:
        assert_close(f"d{name}", grads[name], ref_grads[name], 2e-5, 1e-4)


def test_errors_name_the_bad_value(device) -> None:
    x = make_inputs(CASES["odd_lengths"], torch.float32, device)
    with pytest.raises(ValueError, match="table must be"):
        biased_attention(**{**x, "table": x["table"][:1]})
    with pytest.raises(ValueError, match="needs qb"):
        biased_attention(**{**x, "qb": None})
    with pytest.raises(TypeError, match="share one dtype"):
        biased_attention(**{**x, "k": x["k"].half()})
    with pytest.raises(ValueError, match="head dim 160"):
        big = torch.zeros(1, 1, 4, 160, device=device)
        biased_attention(big, big, big, None, None, None, None, None)
    with pytest.raises(ValueError, match="lam needs exposure"):
        biased_attention(**{**x, "exposure": None})
    if device.type == "cpu":  # on CUDA the same check is a device-side assert (no host sync)
        with pytest.raises(RuntimeError, match=r"qb bucket ids must lie in \[0, 5\)"):
            biased_attention(**{**x, "qb": x["qb"] + 5})


def test_sum_by_bucket_matches_index_add() -> None:
    """The deterministic grouped sum behind dT (sort + fp64 prefix sums), empty buckets included."""
    from hir_kernels.attention_triton import _sum_by_bucket

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 9, (500,), generator=g)  # buckets 0 and 9..11 stay empty
    rows = torch.randn(500, 6, generator=g)
    expected = torch.zeros(12, 6, dtype=torch.float64).index_add_(0, ids, rows.double())
    torch.testing.assert_close(_sum_by_bucket(rows, ids, 12), expected.float())
