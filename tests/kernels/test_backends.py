"""Every backend of ``hir_kernels.attention`` (SDPA, FlexAttention, reference, Triton) on the same Bias,
and the dispatching entry point (resolution, logging)."""

from __future__ import annotations

import logging

import pytest
import torch

from hir_kernels import BACKENDS, Bias, attention, attention_backend, attention_flex, attention_reference
from hir_kernels import dispatch as dispatch_mod

from .cases import CASES, FP32, Case, assert_close, assert_matches, bias_of, make_inputs, run, upstream

NO_FLEX_BACKWARD = "PyTorch has no FlexAttention backward on CPU (NotImplementedError); it runs on CUDA"


def through(backend: str):
    return lambda q, k, v, bias: attention(q, k, v, bias, backend=backend)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_sdpa_matches_reference(case: str, device) -> None:
    c = CASES[case]
    x = make_inputs(c, torch.float32, device)
    do = upstream(c, torch.float32, device)
    out, grads = run(through("sdpa"), x, do)
    assert_matches(out, grads, *run(attention_reference, x, do), 1e-5, 1e-4)
    if c.mask == "dead":
        assert (out[-1] == 0).all() and (grads["q"][-1] == 0).all()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("case", ["n1", "odd_lengths", "dead_batch", "two_tables_and_columns", "no_bias", "table_only"])
def test_flex_score_mod_forward_matches_reference(case: str, device) -> None:
    """FlexAttention with Bias.score_mod: the spec form of the bias (eager on CPU, compiled on CUDA)."""
    c = CASES[case]
    x = make_inputs(c, torch.float32, device)
    out = attention(x["q"], x["k"], x["v"], bias_of(x), backend="flex")
    assert_close("out", out, attention_reference(x["q"], x["k"], x["v"], bias_of(x)), 1e-5, 1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_FLEX_BACKWARD)
@pytest.mark.parametrize("case", ["odd_lengths", "dead_batch", "two_tables_and_columns"])
def test_flex_gradients_match_reference(case: str, device) -> None:
    c = CASES[case]
    x = make_inputs(c, torch.float32, device)
    do = upstream(c, torch.float32, device)
    assert_matches(*run(attention_flex, x, do), *run(attention_reference, x, do), *FP32[1:])


def test_flex_backward_on_cpu_is_refused_by_pytorch() -> None:
    """What the skip above stands on: if PyTorch gains a CPU backward this fails, and the skip can go."""
    x = make_inputs(CASES["no_bias"], torch.float32, torch.device("cpu"))
    q = x["q"].requires_grad_()
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        attention_flex(q, x["k"], x["v"], Bias())


def test_auto_backend_resolution() -> None:
    assert attention_backend("cuda") == "triton"
    assert attention_backend("cpu") == "sdpa"
    assert attention_backend("cpu", "reference") == "reference"
    with pytest.raises(ValueError, match="unknown attention backend 'cudnn'"):
        attention_backend("cpu", "cudnn")


def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        attention_backend("cpu", "triton")


def test_backend_is_logged_once(caplog) -> None:
    dispatch_mod._LOGGED.clear()
    x = make_inputs(Case(b=1, h=1, nq=4, nk=4, d=16), torch.float32, torch.device("cpu"))
    with caplog.at_level(logging.INFO, logger="hir_kernels.dispatch"):
        attention(x["q"], x["k"], x["v"], bias_of(x), backend="reference")
        attention(x["q"], x["k"], x["v"], bias_of(x), backend="reference")
    lines = [r.getMessage() for r in caplog.records if "attention backend" in r.getMessage()]
    assert lines == ["attention backend: reference (requested 'reference' on cpu)"]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_runs_plain_attention(backend: str, device) -> None:
    """bias=None (no part, no mask) must work everywhere and match F.softmax(q k^T / sqrt(d)) v."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, n, 16, generator=g).to(device) for n in (9, 11, 11))
    expected = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
    assert_close("out", attention(q, k, v, backend=backend), expected, 1e-5, 1e-4)
