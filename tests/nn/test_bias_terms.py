"""The bias-term registry: a new term is one function plus one config entry, and every attention
backend computes it (reference, SDPA, Triton under the interpreter, FlexAttention forward on CPU)."""

from __future__ import annotations

import pytest
import torch

from hir.nn.attention import BiasedSelfAttention
from hir.nn.bias_terms import BIAS_TERMS, bias_term
from hir_kernels import Table

NO_FLEX_BACKWARD = "PyTorch has no FlexAttention backward on CPU; its forward is compared here, gradients on CUDA"


@pytest.fixture
def toy_terms():
    """Two toy terms, registered the way a new term is: a column and a table over a new bucket."""

    @bias_term("toy_column", toy_w=lambda heads: torch.linspace(0.5, -0.5, heads))
    def toy_column(params, feats):
        """w_h * sqrt(exposure_j): a learned per-head scalar times a key feature, (B, H, N)."""
        return params["toy_w"][None, :, None] * feats["exposure"].float().sqrt()[:, None, :]

    @bias_term("toy_table", toy_t=lambda heads: torch.zeros(heads, 2, 3))
    def toy_table(params, feats):
        """U_h[qb_i mod 2, kb_j mod 3]: a second table, over a bucket of its own."""
        return Table(params["toy_t"], feats["qb"] % 2, feats["kb"] % 3)

    yield
    del BIAS_TERMS["toy_column"], BIAS_TERMS["toy_table"]


def _inputs(b: int = 2, n: int = 19, dim: int = 32) -> tuple[torch.Tensor, ...]:
    """A context of n = 19 tokens: not a power of two, two key blocks of the interpreter's tiles."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, n, dim, generator=g)
    qb, kb = torch.randint(0, 5, (b, n), generator=g), torch.randint(0, 7, (b, n), generator=g)
    exposure = torch.rand(b, n, generator=g) * 30
    mask = torch.rand(b, n, generator=g) > 0.25
    mask[:, 0] = True
    return x, qb, kb, exposure, mask


def _layer(backend: str, bias: dict) -> BiasedSelfAttention:
    layer = BiasedSelfAttention(32, heads=2, n_query_buckets=5, n_key_buckets=7, bias=bias, backend=backend)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():  # every term non-zero, the same in every layer
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return layer


def _close(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    """fp32 tolerance, atol relative to the reference's largest magnitude (as in tests/kernels)."""
    atol = 2e-5 * max(1.0, ref.abs().max().item())
    torch.testing.assert_close(got, ref, atol=atol, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def _run(layer: BiasedSelfAttention, grads: bool = True) -> tuple[torch.Tensor, dict]:
    x, qb, kb, exposure, mask = _inputs()
    out = layer(x, qb, kb, exposure, mask)
    if not grads:
        return out, {}
    out.pow(2).sum().backward()
    return out, {n: p.grad for n, p in layer.named_parameters()}


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_registered_term_is_one_config_entry_and_every_backend_agrees(toy_terms, monkeypatch) -> None:
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when the Triton kernels are first built
    bias = {"table": True, "exposure": True, "lam_init": 0.1, "toy_column": True, "toy_table": True}
    ref, ref_grads = _run(_layer("reference", bias))
    assert {"toy_w", "toy_t"} <= set(ref_grads)
    assert ref_grads["toy_w"].abs().sum() > 0 and ref_grads["toy_t"].abs().sum() > 0  # the terms reach the loss
    without, _ = _run(_layer("reference", {k: v for k, v in bias.items() if not k.startswith("toy")}))
    assert not torch.allclose(ref, without, atol=1e-3)  # ... and change the output
    for backend in ("sdpa", "triton"):
        out, grads = _run(_layer(backend, bias))
        _close(f"{backend} out", out, ref)
        for name, g in grads.items():
            _close(f"{backend} d{name}", g, ref_grads[name])
    with torch.no_grad():  # NO_FLEX_BACKWARD: forward only on CPU
        flex = _layer("flex", bias)(*_inputs())
    _close("flex out", flex, ref)


def test_a_term_switched_off_has_no_parameter(toy_terms) -> None:
    layer = BiasedSelfAttention(8, heads=2, bias={"toy_column": True})
    assert layer.toy_t is None and layer.table is None and layer.lam is None
    torch.testing.assert_close(layer.toy_w.detach(), torch.tensor([0.5, -0.5]))


def test_registering_a_taken_name_fails(toy_terms) -> None:
    with pytest.raises(ValueError, match="bias term 'table' clashes"):
        bias_term("table", other=lambda heads: torch.zeros(heads))(lambda params, feats: None)
    with pytest.raises(ValueError, match=r"parameters already owned \{'lam': 'exposure'\}"):
        bias_term("popularity", lam=lambda heads: torch.zeros(heads))(lambda params, feats: None)
