"""LightningDataModule: training batches of contexts (sharded by rank) and embedding batches.

A training batch is a pure function of (seed, epoch, global batch index): the epoch's seed order
is a permutation drawn from (seed, epoch), and each batch draws its contexts from its own
``numpy.random.Generator`` seeded by (seed, epoch, global index). Workers, their count and
resuming therefore never change what a batch holds. Rank r of a world of W takes global batches
r, r + W, r + 2W, ... (every rank the same number of batches).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, is_dataclass, replace
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hir.data.snapshot import load_snapshot
from hir.errors import HirError
from hir.model import (
    ContextSampler,
    EmbedBatches,
    GraphStore,
    SpectralBase,
    SpectralConfig,
    ValSet,
    catalogue,
    fit_base,
    load_graph,
    to_tensors,
    validation_set,
)
from hir.model.batches import catalogue_cold
from hir.model.mapped import load_mapped, mapped_ready, save_mapped
from hir.model.spectral import SpectralBasis, fit_spectral, procrustes
from hir.model.stats import input_stats
from hir.model.task import TaskConfig, task_snapshot

log = logging.getLogger(__name__)


class TrainBatches(Dataset):
    """Map-style dataset indexed by ``(epoch, batch_index)`` (see :class:`EpochBatchSampler`), over
    the training task's view (:mod:`hir.model.task`): every array a batch holds comes from the
    view's store and base, which never saw a target pair.

    Each batch: ``users`` target users (a uniform draw: the epoch's permutation of the task's
    users, as the test averages per user) followed by ``batch_size`` seeds of every entity type
    from the epoch's seed order (cross-view distillation, prototypes). The users' labels, over the
    catalogue (:func:`hir.model.catalogue` of the view): ``tgt_rows``/``tgt_cols`` (T,) the (user
    row, catalogue row) of each target, ``tgt_weight`` (T,) ``1 / |targets of the user|``, and
    ``mask_rows``/``mask_cols`` the user's deep-stage view entities, which the loss masks (the
    test's masked new-to-user ranking).

    A catalogue entity without a base in the view (cold: e.g. an item first sold in the target
    window, which val and test rank too) is ranked by its knowledge view, so its targets are kept
    and train the content placement. With target users, the batch carries ``cold`` (the knowledge
    contexts of the batch's cold catalogue entities, with their own ``content`` rows),
    ``cold_cols`` (C,) their catalogue rows and ``cold_bias`` (C,) the log-weight of each in the
    softmax: the cold targets of the batch's users (weight 1, bias 0) and the other cold entities,
    all of them when they fit in ``batch_size`` contexts (bias 0: the exact softmax), else a
    uniform sample of ``batch_size`` standing for all (bias ``log(n_other / batch_size)``, the
    sampled softmax's correction; a catalogue of 25k cold items must not cost 25k contexts a step).
    The loss leaves the cold entities outside the batch out. Which cold entities are drawn depends
    on the labels (a target is always in); their contexts hold no engagement.
    """

    def __init__(self, store: GraphStore, base: SpectralBase | None, sampler: ContextSampler, targets: ValSet,
                 batch_size: int, users: int, seeds_per_epoch: int | None, seed: int, rank: int = 0, world: int = 1,
                 catalogue: np.ndarray | None = None) -> None:
        self.store, self.base, self.sampler, self.targets = store, base, sampler, targets
        self.catalogue_row = np.full(store.n_nodes, -1, np.int64)
        self.catalogue = np.zeros(0, np.int64) if catalogue is None else np.asarray(catalogue, np.int64)
        self.catalogue_row[self.catalogue] = np.arange(len(self.catalogue))
        # catalogue rows of the entities without a base (ranked by their knowledge view)
        self.cold_cols = (np.flatnonzero(catalogue_cold(base, self.catalogue)) if base is not None and len(self.catalogue)
                          else np.zeros(0, np.int64))
        self.target_of = {int(u): i for i, u in enumerate(targets.users)}
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        # at most every target user once a batch (a tiny task must not repeat a user within one)
        self.users = min(int(users), len(targets)) if catalogue is not None and len(catalogue) else 0
        self.n_seeds = min(seeds_per_epoch or store.n_nodes, store.n_nodes)
        self._order: tuple[int, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        """Batches per rank and epoch."""
        return max(1, -(-self.n_seeds // self.batch_size) // self.world)

    def order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's (seed order, target-user order), cached per process."""
        if self._order is None or self._order[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            perm = rng.permutation(self.store.n_nodes)[: self.n_seeds]
            self._order = (epoch, perm, rng.permutation(self.targets.users))
        return self._order[1], self._order[2]

    def __getitem__(self, key: tuple[int, int]) -> dict[str, Any]:
        epoch, index = key
        g = index * self.world + self.rank  # global batch index
        rng = np.random.default_rng([self.seed, epoch, g])
        seeds, user_order = self.order(epoch)
        seeds = seeds[g * self.batch_size:(g + 1) * self.batch_size]
        users = np.zeros(0, np.int64)
        if self.users:
            # the target users cycle through their permutation (an epoch is sized by the seeds)
            users = user_order[(g * self.users + np.arange(self.users)) % len(user_order)]
        return self.build(users, seeds, rng)

    def build(self, users: np.ndarray, seeds: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
        """The batch of ``users`` (U,) target users and ``seeds`` (S,) other seeds, contexts drawn
        from ``rng``. Public so a test can hold the draws fixed: every tensor but the ``tgt_*``
        labels depends on the view alone."""
        all_seeds = np.concatenate([users, seeds]).astype(np.int64)
        views = {"eng": self.sampler.engagement(all_seeds, rng), "kno": self.sampler.knowledge(all_seeds, rng)}
        extra = self._labels(users) if len(users) else {}
        out = to_tensors(self.store, self.base, views, seeds=all_seeds, n_users=np.asarray(len(users)), **extra)
        if len(users) and len(self.cold_cols):
            # the batch's cold catalogue entities through the knowledge view, with their own content
            # rows (the other views' tensors stay those of the view alone)
            cols, bias = self.cold_draw(extra["tgt_cols"], rng)
            cold = to_tensors(self.store, None, {"cold": self.sampler.knowledge(self.catalogue[cols], rng)})
            out |= {"cold": {**cold["cold"], "content": cold["content"]}, "cold_cols": torch.from_numpy(cols),
                    "cold_bias": torch.from_numpy(bias)}
        return out

    def cold_draw(self, tgt_cols: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The batch's cold catalogue rows (C,) and their softmax log-weights (C,) float32: the cold
        targets (bias 0), then the other cold rows, all of them when they fit in ``batch_size``
        (bias 0), else a uniform sample of ``batch_size`` (bias ``log(others / batch_size)``)."""
        forced = np.intersect1d(tgt_cols, self.cold_cols)
        rest = np.setdiff1d(self.cold_cols, forced)
        n = min(len(rest), int(self.batch_size))
        pick = rest if n == len(rest) else np.sort(rng.choice(rest, n, replace=False))
        bias = np.concatenate([np.zeros(len(forced)), np.full(n, np.log(len(rest) / n) if n else 0.0)])
        return np.concatenate([forced, pick]).astype(np.int64), bias.astype(np.float32)

    def _labels(self, users: np.ndarray) -> dict[str, np.ndarray]:
        t = self.targets
        rows, cols, weight, m_rows, m_cols = [], [], [], [], []
        for i, u in enumerate(users):
            j = self.target_of.get(int(u))
            if j is not None:
                c = self.catalogue_row[t.cands[t.positives[j]]]
                c = c[c >= 0]  # (every target is of a catalogue type; cold ones are ranked by their knowledge view)
                rows.append(np.full(len(c), i)), cols.append(c), weight.append(np.full(len(c), 1.0 / max(len(c), 1)))
            # the user's deep-stage view entities: masked, as the test masks its history
            a, b = self.store.eng.indptr[u], self.store.eng.indptr[u + 1]
            deep = self.store.eng.dst[a:b][self.store.eng.stage[a:b] == len(self.store.stage_order)]
            mc = self.catalogue_row[deep]
            m_rows.append(np.full(int((mc >= 0).sum()), i)), m_cols.append(mc[mc >= 0])
        cat = lambda parts, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)  # noqa: E731
        return {"tgt_rows": cat(rows, np.int64), "tgt_cols": cat(cols, np.int64), "tgt_weight": cat(weight, np.float32),
                "mask_rows": cat(m_rows, np.int64), "mask_cols": cat(m_cols, np.int64)}


class EpochBatchSampler(Sampler):
    """Yields ``(epoch, i)`` for the rank's batches.

    The epoch is read from ``epoch_fn`` when the iterator is created. Lightning creates the
    first iterator of a resumed run before it updates its epoch counter (and calls ``set_epoch``
    after that), so the datamodule derives the epoch from the restored global step instead: a
    resumed run then sees exactly the batches of an uninterrupted one.
    """

    def __init__(self, n_batches: int, epoch_fn: Callable[[], int] | None = None) -> None:
        self.n_batches, self.epoch, self.epoch_fn = n_batches, 0, epoch_fn

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch_fn() if self.epoch_fn is not None else self.epoch
        return iter([(epoch, i) for i in range(self.n_batches)])

    def __len__(self) -> int:
        return self.n_batches


class HirDataModule(L.LightningDataModule):
    """The training data of `hir train`: the snapshot's train-visible graph, its spectral base,
    the validation task, and context batches (training seeds sharded by rank).

    :meth:`setup` builds them once per process; `hir train` calls it before building the
    network, whose sizes come from the snapshot and the base's rank (:attr:`net_sizes`).

    Args (conf/datamodule/default.yaml is the constructor call; `hir train` adds ``spectral_file``
    and ``reuse_spectral``):
        graph_dir, content_dir: the snapshot (prepare's ``graph/``, enrich's ``content/``).
        graph: keyword arguments of :func:`hir.model.load_graph` (edge sampling weights).
        context: :class:`hir.model.ContextSampler` sizes.
        spectral: how the base is fitted (:class:`hir.model.SpectralConfig`).
        val_protocol: ``masked_new`` or ``all`` (see :mod:`hir.model.valset`).
        val_candidates: cap on recall@K candidates (None = all).
        task: how the training task is cut (:class:`hir.model.task.TaskConfig`: next-period or
            denoising targets, users per batch, the planned schedule).
        batch_size: seeds per batch (distillation, prototypes).
        seeds_per_epoch: seeds per epoch (None = all nodes).
        embed_batch_size: nodes per validation batch.
        num_workers, pin_memory, persistent_workers: DataLoader settings.
        seed: base of every random draw.
        spectral_file: where the fitted basis is saved (export reads it beside the checkpoints).
        reuse_spectral: reload the basis from ``spectral_file`` (a resumed run) instead of fitting it.
        mapped_dir: lay the data out once under this directory as memory-mapped files and map it
            (every rank of a machine shares one copy; :func:`shared_state`); None = build it in
            this process. `hir train` sets it under DDP.
        task_view: cut the training task (its view's store, base, frame and targets). `hir train`
            passes False when nothing trains (``model.train_parts`` resolves to ``none``): no batch
            reads the task, so it is not built, and the task's attributes are the train store's
            (the prototypes' initial sample is drawn there).
    """

    def __init__(self, graph_dir: str | Path, content_dir: str | Path, graph: dict[str, Any], context: dict[str, int],
                 spectral: SpectralConfig, val_protocol: str, val_candidates: int | None, batch_size: int,
                 task: TaskConfig | dict[str, Any],
                 seeds_per_epoch: int | None, embed_batch_size: int, num_workers: int, pin_memory: bool,
                 persistent_workers: bool, seed: int, spectral_file: str | Path, reuse_spectral: bool = False,
                 mapped_dir: str | Path | None = None, task_view: bool = True) -> None:
        super().__init__()
        self.graph_dir, self.content_dir = Path(graph_dir), Path(content_dir)
        self.graph, self.context, self.spectral = dict(graph), dict(context), spectral
        self.spectral_file, self.reuse_spectral = Path(spectral_file), bool(reuse_spectral)
        self.val_protocol, self.val_candidates = val_protocol, val_candidates
        self.batch_size, self.seeds_per_epoch = batch_size, seeds_per_epoch
        self.task = task if isinstance(task, TaskConfig) else TaskConfig(**dict(task))
        self.embed_batch_size = embed_batch_size
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.seed = seed
        self.mapped_dir = None if mapped_dir is None else Path(mapped_dir)
        self.task_view = bool(task_view)
        self.store: GraphStore | None = None

    def setup(self, stage: str | None = None) -> None:
        """Load the train-visible graph, build the validation set, fit (or reload) the spectral
        basis and take its base, and cut the training task (:func:`build_state`); a second call
        does nothing. With ``mapped_dir`` (DDP: `hir train` sets it), that state is laid out once
        per machine as memory-mapped files and every rank maps it (:func:`shared_state`)."""
        if self.store is not None:
            return
        args = self.state_args()
        state = build_state(**args) if self.mapped_dir is None else shared_state(self.mapped_dir, args)
        for key in STATE:
            setattr(self, key, state[key])
        log.info("training task: %s", {k: v for k, v in self.task_report.items() if k != "inputs"})

    def state_args(self) -> dict[str, Any]:
        """The keyword arguments of :func:`build_state` this datamodule was configured with."""
        return {"graph_dir": self.graph_dir, "content_dir": self.content_dir, "graph": self.graph,
                "context": self.context, "spectral": self.spectral, "val_protocol": self.val_protocol,
                "val_candidates": self.val_candidates, "task": self.task, "seed": self.seed,
                "spectral_file": self.spectral_file, "reuse_spectral": self.reuse_spectral, "task_view": self.task_view}

    @property
    def net_sizes(self) -> dict[str, int]:
        """The network's sizes this data fixes: types, stages, content width, recency buckets, base rank."""
        sizes = {k: int(self.store.spec[k]) for k in ("n_types", "n_stages", "content_dim", "n_recency")}
        return sizes | {"base_dim": self.base.rank}

    @property
    def recipe(self) -> dict[str, dict[str, Any]]:
        """How contexts were built (``graph`` options, ``context`` sizes): kept in checkpoints, so
        export rebuilds the same inputs."""
        return {"graph": dict(self.graph), "context": self.sampler.sizes, "task": dict(self.task_report)}

    def batches_per_epoch(self, world: int = 1) -> int:
        """Training batches per epoch and rank (:meth:`TrainBatches.__len__`)."""
        n_seeds = min(self.seeds_per_epoch or self.task_store.n_nodes, self.task_store.n_nodes)
        return max(1, -(-n_seeds // self.batch_size) // max(int(world), 1))

    @property
    def catalogue(self) -> np.ndarray:
        """The training loss's catalogue (:func:`hir.model.catalogue` of the task's view)."""
        return catalogue(self.task_store, self.task_base)

    def _loader(self, dataset: Dataset, sampler: Sampler | list[int] | None = None) -> DataLoader:
        return DataLoader(dataset, batch_size=None, sampler=sampler, shuffle=False, num_workers=self.num_workers,
                          pin_memory=self.pin_memory, persistent_workers=self.persistent_workers)

    def train_dataloader(self) -> DataLoader:
        rank = self.trainer.global_rank if self.trainer else 0
        world = self.trainer.world_size if self.trainer else 1
        ds = TrainBatches(self.task_store, self.task_base, self.task_sampler, self.targets, self.batch_size,
                          self.task.users, self.seeds_per_epoch, self.seed, rank, world, self.catalogue)
        log.info("train: %d batches per epoch per rank (rank %d of %d), %d target users + %d seeds per batch",
                 len(ds), rank, world, ds.users, self.batch_size)
        n = len(ds)

        def epoch() -> int:
            # batches taken so far / batches per epoch (optimizer steps x accumulation)
            t = self.trainer
            return t.global_step * t.accumulate_grad_batches // n

        return self._loader(ds, EpochBatchSampler(n, epoch_fn=epoch))

    def init_dataloader(self, n: int) -> DataLoader:
        """A seeded random sample of ``n`` nodes to embed (prototype initialisation)."""
        rng = np.random.default_rng([self.seed, 3])
        nodes = np.sort(rng.choice(self.store.n_nodes, min(n, self.store.n_nodes), replace=False))
        return DataLoader(EmbedBatches(self.task_store, self.task_base, self.task_sampler, nodes, self.embed_batch_size,
                                       self.seed), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        # rank r of w embeds batches r, r + w, ... (a batch's contexts depend on its index alone, so
        # the shards together are the one-process embedding); rank 0 gathers them for recall@K
        # (HirModule._sharded_metrics)
        nodes = np.concatenate([self.val.users, self.val.cands])
        rank = self.trainer.global_rank if self.trainer else 0
        world = max(int(self.trainer.world_size if self.trainer else 1), 1)
        # Lightning wants a batch on every rank: a val set smaller than world batches is cut finer
        size = max(1, min(self.embed_batch_size, -(-len(nodes) // world)))
        ds = EmbedBatches(self.store, self.base, self.sampler, nodes, size, self.seed)
        return self._loader(ds, list(range(rank, len(ds), world)))


# what :func:`build_state` returns and :class:`HirDataModule` keeps (one per process, or mapped)
STATE = ("store", "val", "basis", "spectral_report", "task_store", "task_report", "targets", "task_base", "base",
         "sampler", "task_sampler")


def build_state(graph_dir: Path, content_dir: Path, graph: dict[str, Any], context: dict[str, int],
                spectral: SpectralConfig, val_protocol: str, val_candidates: int | None, task: TaskConfig, seed: int,
                spectral_file: Path, reuse_spectral: bool, task_view: bool = True) -> dict[str, Any]:
    """Everything :meth:`HirDataModule.setup` keeps (the keys of ``STATE``), built in this process.

    The train-visible store and its val set; the spectral basis, fitted (or reloaded) and chosen on
    val (saved to ``spectral_file``); the training task (:mod:`hir.model.task`): the view's store,
    its base (the chosen filter fit on the view alone, in its own frame: nothing of it depends on
    a target), its context sampler and its targets. The train basis is then turned into the view's
    frame (:attr:`SpectralBasis.frame`, saved), so validation and export read the coordinates the
    network was trained in. Without ``task_view`` (nothing trains) no task is cut: the task's keys
    are the train store, its base and sampler, no targets, and the basis keeps the SVD's frame.
    """
    snap = load_snapshot(graph_dir)
    store = load_graph(snap, content_dir, ("train",), **graph)
    val = validation_set(store, val_candidates, seed, val_protocol)
    if not len(val):
        raise HirError(
            f"{graph_dir}: the val split of dataset {snap.dataset!r} has no deep-stage "
            f"({store.deep_stage!r}) pairs {'new to their user ' if val_protocol == 'masked_new' else ''}"
            "to validate on; give the val split more data (data.split.val_fraction, or data.split.val_start) "
            "or use datamodule.val_protocol=all"
        )
    # the base's filter is chosen on the ranking the test uses: every candidate entity
    select = val if val_candidates is None else validation_set(store, None, seed, val_protocol)
    basis, spectral_report = fit_base(store, select, spectral, seed, spectral_file, reuse_spectral)
    del select
    if not task_view:
        return _without_task(store, val, basis, spectral_report, context, seed)

    t0 = time.perf_counter()
    task_snap, task_report = task_snapshot(snap, task, seed)
    task_store = load_graph(task_snap, content_dir, ("train",), **graph)
    targets = validation_set(task_store, None, seed, "masked_new")
    task_basis = fit_spectral(task_store, basis.rank, basis.stage_base, int(spectral.n_iter), seed, basis.filter,
                              basis.sample_cap, dtype=spectral.svd_dtype)
    task_base = task_basis.base_for(task_store)
    parts = basis.parts(store)  # the chosen base on train, in the SVD's frame: computed once for both uses
    if basis.frame is None:  # (a resumed run reloads the basis with its frame)
        q = procrustes(store, parts[0], task_basis.base_for(store).vectors)
        basis = replace(basis, frame=q)
        basis.save(spectral_file)
    del task_basis
    task_sampler = ContextSampler(task_store, **context)
    task_report |= {"target_users": len(targets), "target_pairs": int(sum(map(len, targets.positives))),
                    "planned_steps": task.planned_steps(len(targets)), "seconds": round(time.perf_counter() - t0, 2)}

    base = basis.base_for(store, parts)
    del parts
    sampler = ContextSampler(store, **context)
    task_report["inputs"] = {
        "train (task view)": input_stats(task_store, task_base, task_sampler, targets, seed),
        "val (train split)": input_stats(store, base, sampler, val, seed)}
    return {"store": store, "val": val, "basis": basis, "spectral_report": spectral_report, "task_store": task_store,
            "task_report": task_report, "targets": targets, "task_base": task_base, "base": base, "sampler": sampler,
            "task_sampler": task_sampler}


def _without_task(store: GraphStore, val: ValSet, basis: SpectralBasis, spectral_report: dict[str, Any],
                  context: dict[str, int], seed: int) -> dict[str, Any]:
    """:func:`build_state`'s keys when nothing trains: no task view, its second store and spectral
    fit, nor the frame (a second SVD's rotation nobody trains in); on completejourney that is
    19 s of `make run` and a second copy of the graph in memory."""
    base = basis.base_for(store)
    sampler = ContextSampler(store, **context)
    none = ValSet(np.zeros(0, np.int64), np.zeros(0, np.int64), [], [], "masked_new")
    report = {"kind": "none", "why": "model.train_parts=none: nothing trains, so no task is cut",
              "target_users": 0, "target_pairs": 0, "planned_steps": 0, "seconds": 0.0,
              "inputs": {"val (train split)": input_stats(store, base, sampler, val, seed)}}
    return {"store": store, "val": val, "basis": basis, "spectral_report": spectral_report, "task_store": store,
            "task_report": report, "targets": none, "task_base": base, "base": base, "sampler": sampler,
            "task_sampler": sampler}


def _fingerprint(args: dict[str, Any]) -> dict[str, Any]:
    """What a layout was built from: the arguments, and the size and time of every input file (a
    re-prepared snapshot or re-enriched content is laid out again)."""
    files = {}
    for key in ("graph_dir", "content_dir"):
        for f in sorted(Path(args[key]).rglob("*")):
            if f.is_file():
                st = f.stat()
                files[str(f)] = [st.st_size, st.st_mtime_ns]
    plain = {k: (asdict(v) if is_dataclass(v) else v) for k, v in args.items()}
    return json.loads(json.dumps({"args": plain, "files": files}, default=str))


def _lay_out(directory: str, args: dict[str, Any], fingerprint: dict[str, Any]) -> dict[str, Any]:
    """(In a child process) :func:`build_state`, written under ``directory`` as mapped files."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] (layout) %(message)s")
    return save_mapped(build_state(**args), directory, fingerprint)


def shared_state(directory: Path, args: dict[str, Any], wait_s: float = 3600.0) -> dict[str, Any]:
    """:func:`build_state`'s result, laid out once per machine under ``directory`` and mapped.

    Local rank 0 (``LOCAL_RANK`` unset or 0) builds it in a child process, which writes every
    array as a ``.npy`` file (:func:`hir.model.mapped.save_mapped`) and exits, so the build's
    transient memory (the snapshot's frames, the spectral fits' working sets) is returned before
    training starts and is paid once, not once per rank. Every rank then maps the files
    read-only: the page cache holds one copy for all of them. Lightning's DDP launcher starts the
    other ranks after rank 0's set-up, so they find the layout done; under a launcher that starts
    every rank at once (torchrun), the others wait up to ``wait_s`` for it. A layout of the same
    inputs (:func:`_fingerprint`: arguments, input files' sizes and times) is reused (a resumed
    run), so long as its ``spectral_file`` exists.
    """
    fingerprint = _fingerprint(args)
    ready = lambda: mapped_ready(directory, fingerprint) and Path(args["spectral_file"]).exists()  # noqa: E731
    t0 = time.perf_counter()
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        if ready():
            log.info("data layout %s: reusing it (same inputs)", directory)
        else:
            # spawn, not fork: the child starts clean (no copy of this process's torch state)
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                done = pool.submit(_lay_out, str(directory), args, fingerprint).result()
            log.info("data layout %s: %d files, %.3f GiB, laid out in %.1fs by a child process", directory,
                     done["files"], done["array_bytes"] / 2**30, time.perf_counter() - t0)
    else:
        while not ready():
            if time.perf_counter() - t0 > wait_s:
                raise HirError(f"{directory}: local rank 0 did not finish the data layout within {wait_s:.0f}s; "
                               "check its log (a failed or killed set-up), delete the directory and start again")
            time.sleep(1.0)
    state = load_mapped(directory)
    missing = set(STATE) - set(state)
    if missing:
        raise HirError(f"{directory}: the layout lacks {sorted(missing)} (written by another hir version?); "
                       "delete the directory and start again")
    return state
