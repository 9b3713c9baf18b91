"""Bias terms of BiasedSelfAttention on a hand-built 4-token context."""

from __future__ import annotations

import pytest
import torch

from hir.nn.attention import BiasedSelfAttention

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
