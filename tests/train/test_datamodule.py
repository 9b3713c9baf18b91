"""Training batches are a pure function of (seed, epoch, batch index): workers, resume, ranks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from hir.model import ContextSampler, catalogue, load_graph, validation_set
from hir.model.spectral import fit_spectral
from hir.train.datamodule import EpochBatchSampler, TrainBatches
from tests.train.fixtures import graph_options, spectral_fit


def _flat(batch) -> dict[str, torch.Tensor]:
    out = {"content": batch["content"], "seeds": batch["seeds"]}
    for view in ("eng", "kno"):
        out.update({f"{view}.{k}": v for k, v in batch[view].items()})
    return out


def _same(a, b) -> None:
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        torch.testing.assert_close(fa[k], fb[k], rtol=0, atol=0, msg=k)


def _dataset(run: Path, protocol: str = "all", **kw) -> TrainBatches:
    """8 target users (the val split's positives stand in for a task's targets) + 32 seeds a batch."""
    store = load_graph(run / "graph", run / "content", ("train",), **graph_options())
    base = fit_spectral(store, 8, **spectral_fit()).base_for(store)
    targets = validation_set(store, None, 0, protocol)
    return TrainBatches(store, base, ContextSampler(store, 4, 2, 2, 2, 2), targets, batch_size=32, users=8,
                        seeds_per_epoch=128, seed=3, catalogue=catalogue(store, base), **kw)


def test_batches_do_not_depend_on_workers_or_instance(tiny_run: Path):
    ds = _dataset(tiny_run)
    sampler = EpochBatchSampler(len(ds))
    sampler.set_epoch(1)
    serial = list(DataLoader(ds, batch_size=None, sampler=sampler, num_workers=0))
    parallel = list(DataLoader(ds, batch_size=None, sampler=sampler, num_workers=2))
    assert len(serial) == len(parallel) == 4
    for a, b in zip(serial, parallel):
        _same(a, b)
    # a fresh process resuming at epoch 1, batch 2 sees exactly the same batch
    _same(_dataset(tiny_run)[(1, 2)], serial[2])
    assert not torch.equal(_dataset(tiny_run)[(0, 2)]["seeds"], serial[2]["seeds"])  # epochs differ


def test_ranks_get_disjoint_shards_of_one_order(tiny_run: Path):
    single = _dataset(tiny_run)
    r0, r1 = _dataset(tiny_run, rank=0, world=2), _dataset(tiny_run, rank=1, world=2)
    assert len(r0) == len(r1) == 2
    seeds = lambda ds, i: ds[(0, i)]["seeds"][ds.users:].numpy()  # noqa: E731 - the seeds after the target users
    got = [seeds(r0, 0), seeds(r1, 0), seeds(r0, 1), seeds(r1, 1)]
    for g, i in zip(got, range(4)):
        np.testing.assert_array_equal(g, seeds(single, i))  # global batch g*W + r
    assert len(np.unique(np.concatenate(got))) == 128


def test_target_users_lead_each_batch_uniformly_over_users(tiny_run: Path):
    ds = _dataset(tiny_run)
    b = ds[(0, 0)]
    n = int(b["n_users"])
    seeds, users = ds.order(0)
    # min(8, target users): a tiny task never repeats a user within a batch
    assert n == min(8, len(ds.targets)) >= 2 and sorted(users.tolist()) == sorted(ds.targets.users.tolist())
    np.testing.assert_array_equal(b["seeds"][:n].numpy(), users[:n])
    np.testing.assert_array_equal(b["seeds"][n:].numpy(), seeds[:32])
    # the next batch takes the next users of the permutation, cycling through it
    np.testing.assert_array_equal(ds[(0, 1)]["seeds"][:n].numpy(), users[(n + np.arange(n)) % len(users)])


def test_validation_candidates_keep_every_positive_and_mask_the_history(tiny_run: Path):
    store = load_graph(tiny_run / "graph", tiny_run / "content", ("train",), **graph_options())
    full = validation_set(store, max_candidates=20, seed=0, protocol="all")
    assert set(np.unique(store.val_pairs[:, 0])) == set(full.users.tolist())
    assert set(store.val_pairs[:, 1].tolist()) <= set(full.cands.tolist())
    assert all(len(m) == 0 for m in full.masked)
    new = validation_set(store, max_candidates=None, seed=0, protocol="masked_new")
    visible = {(int(u), int(e)) for u in range(*store.type_range("user"))
               for e in store.eng.dst[store.eng.indptr[u]:store.eng.indptr[u + 1]]}
    deep = len(store.stage_order)
    for u, pos, masked in zip(new.users, new.positives, new.masked):
        ents = new.cands[pos]
        # positives are new to the user: no visible engagement of any stage
        assert not any((int(u), int(e)) in visible for e in ents)
        # the masked candidates are exactly the user's visible deep-stage entities
        a, b = store.eng.indptr[u], store.eng.indptr[u + 1]
        want = set(store.eng.dst[a:b][store.eng.stage[a:b] == deep].tolist()) & set(new.cands.tolist())
        assert set(new.cands[masked].tolist()) == want
    assert len(new) < len(full) or sum(map(len, new.positives)) < sum(map(len, full.positives))


def test_labels_are_the_users_targets_and_the_mask_their_view_entities(tiny_run: Path):
    ds = _dataset(tiny_run, "masked_new")
    store, cat, t = ds.store, catalogue(ds.store, ds.base), ds.targets
    b = ds[(0, 0)]
    users = b["seeds"][: int(b["n_users"])].numpy()
    deep = len(store.stage_order)
    for r, u in enumerate(users):
        i = int(np.flatnonzero(t.users == u)[0])
        want = set(t.cands[t.positives[i]].tolist()) & set(cat.tolist())
        rows = b["tgt_rows"] == r
        assert set(cat[b["tgt_cols"][rows].numpy()].tolist()) == want
        torch.testing.assert_close(b["tgt_weight"][rows].sum(), torch.tensor(1.0))  # every user weighs one
        a, e = store.eng.indptr[u], store.eng.indptr[u + 1]
        view = set(store.eng.dst[a:e][store.eng.stage[a:e] == deep].tolist()) & set(cat.tolist())
        assert set(cat[b["mask_cols"][b["mask_rows"] == r].numpy()].tolist()) == view
        assert not want & view  # targets are new to the user
