"""The fused Triton attention against the pure-PyTorch reference: forward and every gradient (q, k, v,
each table, each column part through lam), over the awkward shapes and dtypes of cases.py."""

from __future__ import annotations

import pytest
import torch

from hir_kernels import Bias, Table, attention_reference, backend_fn

from .cases import (
    CASES,
    DTYPES,
    FP32,
    Case,
    assert_close,
    assert_matches,
    dtype_id,
    make_inputs,
    run,
    upstream,
)


def triton_fn():
    return backend_fn("triton")


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_forward_and_grads_match_reference(case: Case, dtype, atol, rtol, device) -> None:
    x = make_inputs(case, dtype, device)
    do = upstream(case, dtype, device)
    out, grads = run(triton_fn(), x, do)
    ref, ref_grads = run(attention_reference, x, do, upcast=True)  # fp32 maths on the same inputs
    assert out.dtype == dtype
    assert all(grads[n].dtype == x[n].dtype for n in grads)
    assert_matches(out, grads, ref, ref_grads, atol, rtol)


def test_all_masked_rows_give_zero_output_and_zero_grads(device) -> None:
    case = CASES["dead_batch"]
    x = make_inputs(case, torch.float32, device)
    out, grads = run(triton_fn(), x, upstream(case, torch.float32, device))
    assert torch.isfinite(out).all()
    assert (out[-1] == 0).all()  # the batch with no real key attends to nothing
    for name in ("q", "k", "v"):
        assert torch.isfinite(grads[name]).all()
        assert (grads[name][-1] == 0).all(), name
    assert (grads["k"][0][:, ~x["key_mask"][0]] == 0).all()  # masked keys get no gradient


def test_table_gradients_are_deterministic(device) -> None:
    case = CASES["two_tables_and_columns"]
    x = make_inputs(case, torch.float32, device)
    do = upstream(case, torch.float32, device)
    first, second = run(triton_fn(), x, do)[1], run(triton_fn(), x, do)[1]
    for name in ("table0", "table1"):
        assert torch.equal(first[name], second[name]), name


def test_many_pairs_hitting_one_table_entry_accumulate(device) -> None:
    """Every (i, j) pair shares bucket (0, 0): dT[h, 0, 0] is the sum over all of them."""
    case = Case(nq=40, nk=40, tables=((3, 3),), mask="none")
    x = make_inputs(case, torch.float32, device)
    x["qb0"].zero_()
    x["kb0"].zero_()
    do = upstream(case, torch.float32, device)
    dt = run(triton_fn(), x, do)[1]["table0"]
    assert_close("dT", dt, run(attention_reference, x, do)[1]["table0"], *FP32[1:])
    assert (dt[:, 1:, :] == 0).all() and (dt[:, :, 1:] == 0).all()


def test_strided_layout_without_copies(device) -> None:
    """q, k, v as (B, N, H, D).transpose(1, 2) views, the layout a fused QKV projection gives."""
    case = CASES["odd_lengths"]
    x = make_inputs(case, torch.float32, device)
    for name in ("q", "k", "v"):
        x[name] = x[name].transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, N, D) view of (B, N, H, D)
        assert not x[name].is_contiguous()
    do = upstream(case, torch.float32, device)
    assert_matches(*run(triton_fn(), x, do), *run(attention_reference, x, do), *FP32[1:])


def test_errors_name_the_bad_value(device) -> None:
    x = make_inputs(CASES["odd_lengths"], torch.float32, device)
    q, k, v, table, qb, kb = (x[n] for n in ("q", "k", "v", "table0", "qb0", "kb0"))
    fn = triton_fn()
    with pytest.raises(ValueError, match=r"table 0 must be float \(H=2, QB, KB\)"):
        fn(q, k, v, Bias((Table(table[:1], qb, kb),)))
    with pytest.raises(ValueError, match="table 0 needs qb as int ids of shape"):
        fn(q, k, v, Bias((Table(table, None, kb),)))
    with pytest.raises(ValueError, match=r"column 0 must be \(B, H or 1, Nk\)"):
        fn(q, k, v, Bias(columns=(torch.zeros(2, 3, 45, device=device),)))
    with pytest.raises(ValueError, match="key_mask must be bool"):
        fn(q, k, v, Bias(key_mask=torch.ones(2, 45, device=device)))
    with pytest.raises(TypeError, match="share one dtype"):
        fn(q, k.half(), v, Bias())
    with pytest.raises(ValueError, match="head dim 160"):
        big = torch.zeros(1, 1, 4, 160, device=device)
        fn(big, big, big, Bias())
    if device.type == "cpu":  # on CUDA the same check is a device-side assert (no host sync)
        with pytest.raises(RuntimeError, match=r"table 0: qb bucket ids must lie in \[0, 5\)"):
            fn(q, k, v, Bias((Table(table, qb + 5, kb),)))


def test_sum_by_bucket_matches_index_add() -> None:
    """The deterministic grouped sum behind dT (sort + fp64 prefix sums), empty buckets included."""
    from hir_kernels.attention_triton import _sum_by_bucket

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 9, (500,), generator=g)  # buckets 0 and 9..11 stay empty
    rows = torch.randn(500, 6, generator=g)
    expected = torch.zeros(12, 6, dtype=torch.float64).index_add_(0, ids, rows.double())
    torch.testing.assert_close(_sum_by_bucket(rows, ids, 12), expected.float())
