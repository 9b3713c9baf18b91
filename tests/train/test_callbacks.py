"""Which checkpoint export takes (hir.train.callbacks.best_checkpoint): a rejected correction
closes the correction's gate and keeps everything else that was trained."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from hir.export.embed import Embedder, load_checkpoint
from hir.nn import HirNet
from hir.train.callbacks import CLOSED_CHECKPOINT, best_checkpoint
from tests.nn.config import net_kwargs, tokenizer_kwargs

MONITOR = "val/recall@20"


def _net(seed: int, gate: float) -> HirNet:
    torch.manual_seed(seed)
    net = HirNet(**net_kwargs(n_types=5, n_stages=2, content_dim=7, base_dim=8, n_recency=4, width=16, depth=1,
                              heads=2, hierarchy=tokenizer_kwargs(levels=[2, 4])))
    with torch.no_grad():
        net.gate.fill_(gate)
    return net


def _save(path: Path, net: HirNet) -> Path:
    """A checkpoint as `hir train` writes it: the student and the EMA teacher (here the same)."""
    state = {f"{p}.{k}": v for p in ("net", "teacher") for k, v in net.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": {"net_config": net.config, "data": {}}}, path)
    return path


def _history(gain_lo: float) -> list[dict[str, float]]:
    return [{"epoch": -1, "step": 0, MONITOR: 0.10},
            {"epoch": 0, "step": 4, MONITOR: 0.11, "val/gain_over_base": 0.01, "val/gain_lo": gain_lo,
             "val/gain_hi": 0.02}]


def test_a_rejected_correction_keeps_the_trained_knowledge_view(tmp_path: Path):
    init = _save(tmp_path / "init.ckpt", _net(0, gate=0.0))  # step 0: the knowledge view untrained
    trained = _net(1, gate=0.7)  # a trained epoch: other weights, an open gate
    best = _save(tmp_path / "best.ckpt", trained)
    cb = SimpleNamespace(best_model_path=str(best))

    # the correction does not beat the base beyond the noise: it is rejected, and only it
    out = best_checkpoint(_history(gain_lo=-0.01), MONITOR, tmp_path, cb)
    net, _ = load_checkpoint(out["checkpoint"])
    # the knowledge view, its scale head, the prototypes and the encoder are the trained epoch's
    assert not torch.equal(net.know_head.weight, load_checkpoint(init)[0].know_head.weight), "init.ckpt exported"
    want = {k: v for k, v in trained.state_dict().items() if k != "gate"}
    for k, v in want.items():
        torch.testing.assert_close(net.state_dict()[k], v, rtol=0, atol=0, msg=k)
    # and the correction is closed: the engagement view is the base
    assert float(net.gate.detach()) == 0.0 and not net.corrects
    assert out["epoch"] == -1 and out["closed_from"]["epoch"] == 0
    assert Path(out["checkpoint"]).name == CLOSED_CHECKPOINT
    # export treats it as the base (refit on the visible splits), as it did init.ckpt
    emb = SimpleNamespace(net=net, hp={"data": {}}, checkpoint=Path(out["checkpoint"]))
    assert Embedder.refit_report(emb, True, ("train", "val"))["done"]

    # a correction that beats the base is exported as trained, gate open
    out = best_checkpoint(_history(gain_lo=0.001), MONITOR, tmp_path, cb)
    assert out["checkpoint"] == str(best) and out["epoch"] == 0 and "closed_from" not in out
    assert load_checkpoint(out["checkpoint"])[0].corrects


def test_without_a_trained_epoch_the_step_zero_point_is_taken(tmp_path: Path):
    _save(tmp_path / "init.ckpt", _net(0, gate=0.0))
    cb = SimpleNamespace(best_model_path="")
    out = best_checkpoint(_history(gain_lo=-0.01)[:1], MONITOR, tmp_path, cb)
    assert Path(out["checkpoint"]).name == "init.ckpt" and "closed_from" not in out


def test_a_correction_whose_evidence_gate_is_closed_is_rejected_and_an_open_one_is_recorded(tmp_path: Path):
    """The best epoch's gain can come from the trained knowledge view alone (its evidence gate
    closed: the correction helps no val users): export then takes the closed checkpoint. With the
    gate open for sparse users, the epoch is exported and its gate recorded for export."""
    _save(tmp_path / "init.ckpt", _net(0, gate=0.0))
    best = _save(tmp_path / "best.ckpt", _net(1, gate=0.7))
    cb = SimpleNamespace(best_model_path=str(best))
    history = _history(gain_lo=0.001)
    history[1]["gate"] = {"max_events": 0.0}
    out = best_checkpoint(history, MONITOR, tmp_path, cb)
    assert Path(out["checkpoint"]).name == CLOSED_CHECKPOINT and out["gate"] == {"max_events": 0.0}
    assert "evidence gate is closed" in out["why"]
    history[1]["gate"] = {"max_events": 5, "users_reached": 40, "candidates": [{"max_events": 5}]}
    out = best_checkpoint(history, MONITOR, tmp_path, cb)
    assert out["checkpoint"] == str(best) and out["gate"] == {"max_events": 5, "users_reached": 40}
