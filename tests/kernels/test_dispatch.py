"""The other paths of the same maths (SDPA, FlexAttention score_mod) and the dispatching entry point."""

from __future__ import annotations

import logging

import pytest
import torch

from hir_kernels import (
    BACKENDS,
    attention,
    attention_backend,
    attention_dense_bias,
    biased_attention_reference,
    biased_attention_sdpa,
    dense_bias_attention_reference,
)
from hir_kernels import dispatch as dispatch_mod
from hir_kernels.flex import biased_attention_flex

from .test_attention import CASES, Case, assert_close, make_inputs, run


@pytest.mark.parametrize("case", ["odd_lengths", "dead_batch", "no_bias", "lam_only_mask"])
def test_sdpa_path_matches_reference(case: str) -> None:
    c = CASES[case]
    x = make_inputs(c, torch.float32, torch.device("cpu"))
    do = torch.randn(c.b, c.h, c.nq, c.d)
    out, grads = run(biased_attention_sdpa, x, do)
    ref, ref_grads = run(biased_attention_reference, x, do)
    assert_close("out", out, ref, 1e-5, 1e-4)
    for name in grads:
        assert_close(f"d{name}", grads[name], ref_grads[name], 1e-5, 1e-4)
    if c.mask == "dead":
        assert (out[-1] == 0).all() and (grads["q"][-1] == 0).all()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("case", ["odd_lengths", "dead_batch", "no_bias", "lam_only_mask", "table_only"])
def test_flex_score_mod_matches_reference(case: str) -> None:
    """Eager FlexAttention forward on CPU (it has no CPU backward) with the bias as a score_mod."""
    c = CASES[case]
    x = make_inputs(c, torch.float32, torch.device("cpu"))
    out = biased_attention_flex(**x)
    ref = biased_attention_reference(**x)
    assert_close("out", out, ref, 1e-5, 1e-4)


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
        attention(**x, backend="reference")
        attention(**x, backend="reference")
    lines = [r.getMessage() for r in caplog.records if "attention backend" in r.getMessage()]
    assert lines == ["attention backend: reference (requested 'reference' on cpu)"]


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "auto"])
def test_every_backend_runs_with_bias_terms_switched_off(backend: str, device) -> None:
    """table=None and lam=None (plain attention) must work everywhere; flex on CPU is forward-only."""
    c = Case(b=2, h=2, nq=9, nk=11, d=16, table=False, lam=False)
    x = make_inputs(c, torch.float32, device)
    x.update(qb=None, kb=None, exposure=None)
    ref = biased_attention_reference(**x)
    if backend == "flex" and device.type == "cpu":
        assert_close("out", attention(**x, backend=backend), ref, 1e-5, 1e-4)
        return
    do = torch.randn_like(ref)
    out, grads = run(lambda **a: attention(**a, backend=backend), x, do)
    ref, ref_grads = run(biased_attention_reference, x, do)
    assert_close("out", out, ref, 1e-5, 1e-4)
    for name in grads:
        assert_close(f"d{name}", grads[name], ref_grads[name], 1e-5, 1e-4)


@pytest.mark.parametrize("backend", ["auto", "triton", "sdpa", "reference"])
def test_dense_bias_entry_point(backend: str, device) -> None:
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 13, 16, generator=g).to(device) for _ in range(3))
    bias = torch.randn(1, 1, 13, 13, generator=g).to(device)
    out = attention_dense_bias(q, k, v, bias, backend=backend)
    assert_close("out", out, dense_bias_attention_reference(q, k, v, bias), 1e-5, 1e-4)
