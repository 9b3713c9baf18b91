"""BiasedSelfAttention: its bias terms on a hand-built 4-token context, and the term registry (a new
term is one function plus one config entry, and every attention backend computes it)."""

from __future__ import annotations

import pytest
import torch

from hir.nn.attention import BIAS_TERMS, BiasedSelfAttention, bias_term
from hir_kernels import Table

N = 4
BIAS = {"table": True, "exposure": True, "lam_init": 0.1}  # conf/model/hir.yaml's terms


def _probe(**bias) -> BiasedSelfAttention:
    """A layer whose output row i is exactly the attention distribution of query i.

    q = k = 0 (so q·k adds nothing), v = the one-hot input, proj = identity. ``bias`` overrides
    entries of the default bias config.
    """
    layer = BiasedSelfAttention(N, heads=1, n_query_buckets=2, n_key_buckets=3, bias=BIAS | bias)
    with torch.no_grad():
        layer.qkv.weight.zero_()
        layer.qkv.weight[2 * N:].copy_(torch.eye(N))
        layer.proj.weight.copy_(torch.eye(N))
        layer.proj.bias.zero_()
    return layer


def _run(layer, exposure=(0.0, 0.0, 0.0, 0.0), mask=(True,) * N):
    x = torch.eye(N)[None]  # (1, 4, 4) one-hot tokens
    qb = torch.tensor([[0, 1, 1, 1]])
    kb = torch.tensor([[0, 1, 2, 1]])
    return layer(x, qb, kb, torch.tensor([exposure]), torch.tensor([mask]))[0]  # (4, 4) = attention rows


def test_plain_attention_is_uniform():
    layer = _probe()
    with torch.no_grad():
        layer.lam.zero_()
    p = _run(layer, exposure=(0, 0, 100.0, 0))
    torch.testing.assert_close(p, torch.full((N, N), 0.25))


def test_table_entry_raises_that_keys_weight_for_that_query_bucket_only():
    layer = _probe()
    with torch.no_grad():
        layer.table[0, 0, 2] = 5.0  # query bucket 0 (token 0) -> key bucket 2 (token 2)
    p = _run(layer)
    assert p[0, 2] > 0.9, p[0]
    torch.testing.assert_close(p[1:], torch.full((N - 1, N), 0.25))  # other queries are in bucket 1
    # a negative entry lowers it instead
    with torch.no_grad():
        layer.table[0, 0, 2] = -5.0
    assert _run(layer)[0, 2] < 0.01


def test_exposure_lowers_attention_when_lambda_positive():
    layer = _probe(lam_init=1.0)
    p = _run(layer, exposure=(0, 0, 100.0, 0))
    assert (p[:, 2] < 0.05).all(), p[:, 2]
    # softmax(-log(101)) over one key vs three zeros: 1 / (1 + 3 * 101)
    torch.testing.assert_close(p[:, 2], torch.full((N,), 1 / (1 + 3 * 101)))
    # lambda < 0 would favour popular keys instead
    with torch.no_grad():
        layer.lam.fill_(-1.0)
    assert (_run(layer, exposure=(0, 0, 100.0, 0))[:, 2] > 0.9).all()


def test_switching_a_term_off_removes_its_effect():
    no_table = _probe(table=False)
    assert no_table.table is None
    no_exposure = _probe(exposure=False)
    assert no_exposure.lam is None
    with torch.no_grad():
        no_exposure.table[0, 0, 2] = 5.0
    p = _run(no_exposure, exposure=(0, 0, 1e6, 0))
    assert p[0, 2] > 0.9  # exposure ignored, table still active
    with torch.no_grad():
        no_table.lam.zero_()
    torch.testing.assert_close(_run(no_table), torch.full((N, N), 0.25))


def test_masked_keys_get_no_weight():
    p = _run(_probe(), mask=(True, True, False, True))
    assert (p[:, 2] == 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(N))


def test_gradients_reach_table_and_lambda():
    layer = _probe()
    p = _run(layer, exposure=(1.0, 2.0, 30.0, 4.0))
    # pull token 0's attention towards key 2
    (-torch.log(p[0, 2])).backward()
    assert layer.table.grad is not None and layer.lam.grad is not None
    assert layer.table.grad[0, 0, 2] < 0  # gradient descent raises T[0, 0, 2]
    assert layer.lam.grad[0] > 0  # ... and lowers lambda (key 2 is the most exposed)
    assert layer.table.grad[0, 1].abs().sum() == 0  # query bucket 1 was not in the loss


def test_parameters_keep_their_names_and_the_repr_lists_the_terms():
    layer = _probe()
    assert list(layer.state_dict()) == [
        "table", "lam", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias",
    ]  # the names (and order) checkpoints were written with
    assert "bias=[table 1x2x3, exposure 1]" in repr(layer)
    assert "bias=[]" in repr(BiasedSelfAttention(N, heads=1))  # no bias config: plain attention


def test_bad_bias_config_names_the_entry():
    with pytest.raises(ValueError, match=r"unknown bias entries \['tabel'\]"):
        _probe(tabel=True)
    with pytest.raises(ValueError, match=r"bias term 'exposure' needs \['lam_init'\]"):
        BiasedSelfAttention(N, heads=1, bias={"exposure": True})


# -- the registry: a toy term through every backend ---------------------------------------------

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


def _run_backend(layer: BiasedSelfAttention, grads: bool = True) -> tuple[torch.Tensor, dict]:
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
    ref, ref_grads = _run_backend(_layer("reference", bias))
    assert {"toy_w", "toy_t"} <= set(ref_grads)
    assert ref_grads["toy_w"].abs().sum() > 0 and ref_grads["toy_t"].abs().sum() > 0  # the terms reach the loss
    without, _ = _run_backend(_layer("reference", {k: v for k, v in bias.items() if not k.startswith("toy")}))
    assert not torch.allclose(ref, without, atol=1e-3)  # ... and change the output
    for backend in ("sdpa", "triton"):
        out, grads = _run_backend(_layer(backend, bias))
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
