"""The learner's inputs never contain its answer (hir.model.task, DESIGN.md "Train as it is tested").

For target pairs (u, e) of the training task, every tensor the network reads (all but the
``tgt_*`` labels) is identical, given the same random draws, whether the pair is in the snapshot
or removed from it before anything is built. The same holds for the validation path (a val pair)
and the export path (a test pair). The seed's training batches (every node's row of the
base fit on all train pairs, the target's included) fail this check: the last test shows it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from hydra.utils import instantiate

from hir.data.snapshot import load_snapshot
from hir.data.steps import aggregate_edges
from hir.model import ContextSampler, EmbedBatches, load_graph, to_tensors
from hir.model.task import TaskConfig, task_snapshot
from hir.train.datamodule import HirDataModule, TrainBatches
from tests.train.fixtures import TINY_MODEL, compose, tiny_snapshot

# one filter candidate: the base's hyper-parameters are fixed, so only the fit itself could leak
FIXED_BASE = ["spectral.rank=16", "spectral.stage_base=4.0", "spectral.betas=[0.5]", "spectral.responses=[linear]",
              "spectral.ideal_weights=[1.0]", "spectral.trend_days=[28.0]", "spectral.trend_powers=[0.0]"]
# the labels, and the cold catalogue entities a batch ranks by their knowledge view: its users'
# cold targets are always among them (hir.train.datamodule.TrainBatches.cold_draw); their contexts
# hold no engagement (test_cold_candidates_hold_no_engagement)
COLD = ("cold.node", "cold.content", "cold.type", "cold.relation", "cold.hop", "cold.stage", "cold.recency",
        "cold.count", "cold.age", "cold.exposure", "cold.mask", "cold.row", "cold_cols", "cold_bias")
LABELS = ("tgt_rows", "tgt_cols", "tgt_weight", *COLD)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("task"))


def _without(run: Path, out: Path, pairs: list[tuple[int, int]], splits: tuple[str, ...]) -> Path:
    """A copy of ``run`` whose product engagement (edges and events) lacks ``pairs`` (global user
    id, product node id) in ``splits``."""
    shutil.copytree(run, out)
    snap = load_snapshot(out / "graph")
    path = snap.edge_path("user__engages__product")
    drop = pl.DataFrame({"src_id": [u for u, _ in pairs], "dst_id": [e for _, e in pairs]},
                        schema={"src_id": pl.Int64, "dst_id": pl.Int64})
    edges = pl.read_parquet(path)
    dtypes = {c: edges.schema[c] for c in ("src_id", "dst_id")}
    hit = edges.join(drop.cast(dtypes), on=["src_id", "dst_id"], how="semi").filter(pl.col("split").is_in(splits))
    assert hit.height > 0, "the pairs to remove are not in the snapshot"
    edges.join(hit.select("src_id", "dst_id", "stage", "split"), on=["src_id", "dst_id", "stage", "split"],
               how="anti").write_parquet(path)
    events = snap.events
    gone = ((pl.col("entity_type") == "product") & pl.col("split").is_in(splits)
            & pl.struct("user_id", "entity_id").is_in(
                drop.rename({"src_id": "user_id", "dst_id": "entity_id"}).cast(
                    {c: events.schema[c] for c in ("user_id", "entity_id")}).to_struct().implode()))
    assert events.filter(gone).height > 0
    events.filter(~gone).write_parquet(snap.events_path)
    return out


def _after_cut_removed(run: Path, out: Path, cut: datetime) -> Path:
    """A copy of ``run`` without the train events after ``cut`` (events.parquet and the engagement
    edges, rebuilt from the remaining events as prepare aggregates them)."""
    shutil.copytree(run, out)
    snap = load_snapshot(out / "graph")
    events = snap.events
    keep = events.filter(~((pl.col("split") == "train") & (pl.col("timestamp") > cut)))
    assert keep.height < events.height, "no train event after the cut to remove"
    keep.write_parquet(snap.events_path)
    for etype in snap.engaged_types():
        path = snap.edge_path(f"user__engages__{etype}")
        schema = pl.read_parquet_schema(path)
        edges = (aggregate_edges(keep.lazy().filter(pl.col("entity_type") == etype)).collect()
                 .rename({"user_id": "src_id", "entity_id": "dst_id"}).select(list(schema))
                 .cast(dict(schema)).sort("src_id", "dst_id", "stage", "split"))
        edges.write_parquet(path)
    return out


def _datamodule(run: Path, kind: str, spectral: Path | None = None) -> HirDataModule:
    """The datamodule of ``run``; with ``spectral``, that basis reloaded (the base's choice held fixed)."""
    cfg = compose(run, *TINY_MODEL, *FIXED_BASE, f"datamodule.task.kind={kind}", "datamodule.task.min_targets=1",
                  f"paths.graph_dir={run / 'graph'}", f"paths.content_dir={run / 'content'}")
    if spectral is not None:
        shutil.copy(spectral, run / "spectral.npz")
    dm = instantiate(cfg.datamodule, spectral_file=str(run / "spectral.npz"), reuse_spectral=spectral is not None)
    dm.setup("fit")
    return dm


def _inputs(dm: HirDataModule, users: np.ndarray, seeds: np.ndarray) -> dict[str, torch.Tensor]:
    ds = TrainBatches(dm.task_store, dm.task_base, dm.task_sampler, dm.targets, 32, len(users), 128, 3,
                      catalogue=dm.catalogue)
    return _flat(ds.build(users, seeds, np.random.default_rng(5)))


def _flat(batch: dict) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in batch.items():
        if isinstance(v, dict):
            out |= {f"{k}.{kk}": vv for kk, vv in v.items()}
        else:
            out[k] = v
    return out


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if k not in skip:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def _target_pairs(dm: HirDataModule, n: int) -> list[tuple[int, int]]:
    """``n`` target pairs (global user, product node id) of distinct users, seeded."""
    t, lo = dm.targets, dm.store.offsets[dm.store.types.index("product")]
    rng = np.random.default_rng(0)
    out = []
    for i in rng.permutation(len(t))[:n]:
        e = int(t.cands[t.positives[i][0]])
        out.append((int(t.users[i]), e - int(lo)))
    return out


@pytest.mark.parametrize("kind", ["next_period", "denoise"])
def test_training_inputs_do_not_see_the_target(tiny: Path, tmp_path: Path, kind: str):
    dm = _datamodule(tiny, kind)
    assert dm.task_report["kind"] == kind and len(dm.targets) >= 2
    pairs = _target_pairs(dm, 4)
    ulo = dm.store.offsets[0]
    cut = _datamodule(_without(tiny, tmp_path / "cut", [(u - ulo, e) for u, e in pairs], ("train",)), kind)
    users = np.array([u for u, _ in pairs], np.int64)
    seeds = np.random.default_rng(1).choice(dm.store.n_nodes, 24, replace=False)
    a, b = _inputs(dm, users, seeds), _inputs(cut, users, seeds)
    _assert_same(a, b, skip=LABELS)
    # the labels do change: the removed pairs were the users' targets
    assert not (len(a["tgt_cols"]) == len(b["tgt_cols"]) and torch.equal(a["tgt_cols"], b["tgt_cols"]))
    # what training reads of the graph and the base is the same too (not only the sampled rows)
    np.testing.assert_array_equal(dm.task_store.eng.dst, cut.task_store.eng.dst)
    np.testing.assert_array_equal(dm.task_base.vectors, cut.task_base.vectors)
    # and the removal was real: the train split itself did change
    assert len(dm.store.eng.dst) != len(cut.store.eng.dst)


def test_training_inputs_do_not_see_the_target_window(tiny: Path, tmp_path: Path):
    """next_period's view holds what happened up to the cut and nothing after it: removing every
    train event after the cut (the target window's repeats, stage upgrades and counts of view
    pairs included) changes no input the network reads, nor the view's store and base."""
    dm = _datamodule(tiny, "next_period")
    cut = datetime.fromisoformat(dm.task_report["cut"])
    # the window does hold events of pairs the view sees (what an edge-row relabelling leaked)
    ev = load_snapshot(tiny / "graph").events.filter(pl.col("split") == "train")
    before = ev.filter(pl.col("timestamp") <= cut).select("user_id", "entity_id").unique()
    after = ev.filter(pl.col("timestamp") > cut).join(before, on=["user_id", "entity_id"], how="semi")
    assert after.height > 0
    cut_dm = _datamodule(_after_cut_removed(tiny, tmp_path / "cut", cut), "next_period",
                         spectral=tiny / "spectral.npz")
    users = np.random.default_rng(2).choice(dm.task_store.type_range("user")[1], 16, replace=False).astype(np.int64)
    seeds = np.random.default_rng(1).choice(dm.store.n_nodes, 24, replace=False)
    _assert_same(_inputs(dm, users, seeds), _inputs(cut_dm, users, seeds), skip=LABELS)
    a, b = dm.task_store, cut_dm.task_store
    for name in ("dst", "weight", "stage", "recency", "count", "age"):
        np.testing.assert_array_equal(getattr(a.eng, name), getattr(b.eng, name), err_msg=name)
    np.testing.assert_array_equal(a.exposure, b.exposure)
    np.testing.assert_array_equal(a.warm, b.warm)
    np.testing.assert_array_equal(dm.task_base.vectors, cut_dm.task_base.vectors)
    np.testing.assert_array_equal(dm.task_base.logit, cut_dm.task_base.logit)
    # and the removal was real: the train split itself did change, and the targets went with it
    assert len(dm.store.eng.dst) != len(cut_dm.store.eng.dst)
    assert len(cut_dm.targets) == 0 < len(dm.targets)


def test_seed_training_batches_would_fail_this_check(tiny: Path, tmp_path: Path):
    """The seed's batches gave every node its row of the base fit on the whole train split: the
    user's row moves when its target pair is removed (the leak this module exists to close)."""
    dm = _datamodule(tiny, "denoise")
    pairs = _target_pairs(dm, 4)
    ulo = dm.store.offsets[0]
    cut = _datamodule(_without(tiny, tmp_path / "cut", [(u - ulo, e) for u, e in pairs], ("train",)), "denoise")
    users = np.array([u for u, _ in pairs], np.int64)

    def seed_batch(m: HirDataModule) -> dict[str, torch.Tensor]:
        views = {"eng": m.sampler.engagement(users, np.random.default_rng(5))}
        return _flat(to_tensors(m.store, m.base, views))

    with pytest.raises(AssertionError):
        _assert_same(seed_batch(dm), seed_batch(cut))


def _val_pair(dm: HirDataModule, split: str) -> tuple[int, int]:
    snap = load_snapshot(dm.graph_dir)
    e = pl.read_parquet(snap.edge_path("user__engages__product")).filter(
        (pl.col("split") == split) & (pl.col("stage") == snap.deep_stage)).row(0, named=True)
    return int(e["src_id"]), int(e["dst_id"])


def test_validation_and_export_inputs_do_not_see_their_positives(tiny: Path, tmp_path: Path):
    dm = _datamodule(tiny, "denoise")
    # validation: a val pair removed leaves the train store, the base and every val input alone
    u, e = _val_pair(dm, "val")
    cut = _datamodule(_without(tiny, tmp_path / "val", [(u, e)], ("val",)), "denoise")
    nodes = np.concatenate([dm.val.users[:8], dm.val.cands[:8]])
    a = _flat(EmbedBatches(dm.store, dm.base, dm.sampler, nodes, 64, 0)[0])
    b = _flat(EmbedBatches(cut.store, cut.base, cut.sampler, nodes, 64, 0)[0])
    _assert_same(a, b)
    # export: a test pair removed leaves the train + val store and its base alone
    u, e = _val_pair(dm, "test")
    other = _without(tiny, tmp_path / "test", [(u, e)], ("test",))
    graph = dict(dm.graph)
    sa = load_graph(tiny / "graph", tiny / "content", ("train", "val"), **graph)
    sb = load_graph(other / "graph", other / "content", ("train", "val"), **graph)
    np.testing.assert_array_equal(dm.basis.base_for(sa).vectors, dm.basis.base_for(sb).vectors)
    ids = np.arange(min(40, sa.n_nodes))
    ca = ContextSampler(sa, **dm.context).engagement(ids, np.random.default_rng(2))
    cb = ContextSampler(sb, **dm.context).engagement(ids, np.random.default_rng(2))
    for k in ca:
        np.testing.assert_array_equal(ca[k], cb[k], err_msg=k)


def test_task_kinds_and_errors(tiny: Path):
    snap = load_snapshot(tiny / "graph")
    _, report = task_snapshot(snap, TaskConfig(kind="auto", min_targets=1), 0)
    mode = snap.meta["split"]["mode"]
    assert report["kind"] == ("next_period" if mode.startswith("temporal") else "denoise")
    # too few next-period targets: auto falls back to denoising, and says why
    _, report = task_snapshot(snap, TaskConfig(kind="auto", min_targets=10**9), 0)
    assert report["kind"] == "denoise" and "min_targets" in report["why"]
    assert report["targets"] > 0
    with pytest.raises(Exception, match=r"datamodule\.task\.kind"):
        TaskConfig(kind="nope")
    with pytest.raises(Exception, match=r"datamodule\.task\.drop"):
        TaskConfig(drop=1.5)


def test_cold_candidates_hold_no_engagement(tiny: Path):
    """What of a batch may follow its labels beyond ``tgt_*``: the cold candidates, whose contexts
    are the knowledge view's (the seed and its metadata), never an engagement token."""
    from hir.nn.buckets import ENGAGEMENT

    dm = _datamodule(tiny, "next_period")
    users = dm.targets.users[:8]
    batch = _flat(TrainBatches(dm.task_store, dm.task_base, dm.task_sampler, dm.targets, 32, len(users), 128, 3,
                               catalogue=dm.catalogue).build(users, np.zeros(0, np.int64), np.random.default_rng(5)))
    assert {k for k in batch if k.startswith("cold")} <= set(COLD)
    assert len(batch["cold_cols"]) and not (batch["cold.relation"] == ENGAGEMENT).any()
    assert not (batch["cold.stage"] > 0).any()


def test_a_dataset_caps_the_planned_steps(compose: Callable) -> None:
    # completejourney's `make run` trains half an epoch, 50 steps (conf/data/completejourney.yaml
    # says why; hir/train/trainer.py trains a plan shorter than an epoch as that many batches); the
    # other datasets keep the default bounds
    cj = instantiate(compose("data=completejourney").datamodule.task)
    assert cj.planned_steps(2053) == 50 and cj.planned_steps(50) == 50  # the cap wins over min_steps
    other = instantiate(compose("data=online_retail").datamodule.task)
    assert other.max_steps == 2000 and other.planned_steps(2053) == 200
