"""LightningDataModule: training batches of contexts (sharded by rank) and embedding batches.

A training batch is a pure function of (seed, epoch, global batch index): the epoch's seed order
is a permutation drawn from (seed, epoch), and each batch draws its contexts from its own
``numpy.random.Generator`` seeded by (seed, epoch, global index). Workers, their count and
resuming therefore never change what a batch holds. Rank r of a world of W takes global batches
r, r + W, r + 2W, ... (every rank the same number of batches).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, Dataset, Sampler

from hir.data.snapshot import load_snapshot
from hir.errors import HirError
from hir.model import (
    ContextSampler,
    EmbedBatches,
    GraphStore,
    SpectralBase,
    SpectralBasis,
    SpectralConfig,
    ValSet,
    catalogue,
    fit_base,
    load_graph,
    to_tensors,
    validation_set,
)

log = logging.getLogger(__name__)


class TrainBatches(Dataset):
    """Map-style dataset indexed by ``(epoch, batch_index)`` (see :class:`EpochBatchSampler`).

    Each batch: the users of ``pairs`` deep-funnel (user, entity) train edges (the first P seeds,
    each with its pair's entity hidden from its context) followed by ``batch_size`` seeds of every
    entity type from the epoch's seed order. With a ``catalogue`` (:func:`hir.model.catalogue`):
    ``cat_target`` (P,) the positives' catalogue rows and ``cat_mask_rows``/``cat_mask_cols`` the
    (pair, catalogue row) entries of each pair user's other deep-stage entities, which the
    catalogue loss masks; with a ``base``, ``seed_base`` gives the pair users' base without their
    positive.
    """

    def __init__(self, store: GraphStore, base: SpectralBase | None, sampler: ContextSampler, batch_size: int,
                 pairs: int, seeds_per_epoch: int | None, seed: int, rank: int = 0, world: int = 1,
                 catalogue: np.ndarray | None = None) -> None:
        self.store, self.base, self.sampler = store, base, sampler
        self.catalogue_row = None
        if catalogue is not None:
            self.catalogue_row = np.full(store.n_nodes, -1, np.int64)
            self.catalogue_row[catalogue] = np.arange(len(catalogue))
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        self.pairs = pairs if len(store.deep_pairs) else 0
        self.n_seeds = min(seeds_per_epoch or store.n_nodes, store.n_nodes)
        self._order: tuple[int, np.ndarray] | None = None
        # pairs are drawn ~ their deep-stage weight (inverse CDF)
        self._cum = np.cumsum(store.deep_weight)
        self._total = float(self._cum[-1]) if len(self._cum) else 1.0

    def draw_pairs(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` deep-funnel (user, entity) pairs drawn ~ their weight, with replacement: (n, 2)."""
        if n == 0:
            return np.zeros((0, 2), np.int64)
        idx = np.searchsorted(self._cum, rng.random(n) * self._total, side="right")
        return self.store.deep_pairs[np.minimum(idx, len(self._cum) - 1)]

    def __len__(self) -> int:
        """Batches per rank and epoch."""
        return max(1, -(-self.n_seeds // self.batch_size) // self.world)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's seed order (cached per process)."""
        if self._order is None or self._order[0] != epoch:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.store.n_nodes)[: self.n_seeds]
            self._order = (epoch, perm)
        return self._order[1]

    def __getitem__(self, key: tuple[int, int]) -> dict[str, Any]:
        epoch, index = key
        g = index * self.world + self.rank  # global batch index
        rng = np.random.default_rng([self.seed, epoch, g])
        seeds = self.order(epoch)[g * self.batch_size:(g + 1) * self.batch_size]
        pairs = self.draw_pairs(rng, self.pairs)
        all_seeds = np.concatenate([pairs[:, 0], seeds]).astype(np.int64)
        exclude = np.concatenate([pairs[:, 1], np.full(len(seeds), -1)]).astype(np.int64)
        views = {"eng": self.sampler.engagement(all_seeds, rng, exclude), "kno": self.sampler.knowledge(all_seeds, rng)}
        p = len(pairs)
        extra = {}
        if self.base is not None:
            # the pairs' users see their base without the held-out entity (a deep pair: weight 1)
            seed_base = self.base.vectors[all_seeds].copy()
            if p:
                seed_base[:p] = self.base.leave_one_out(pairs[:, 0], pairs[:, 1], np.ones(p))
            extra["seed_base"] = seed_base
        if self.catalogue_row is not None and p:
            extra |= self._catalogue_targets(pairs)
        return to_tensors(self.store, self.base, views, seeds=all_seeds, n_pairs=np.asarray(p), **extra)

    def _catalogue_targets(self, pairs: np.ndarray) -> dict[str, np.ndarray]:
        eng, deepest = self.store.eng, len(self.store.stage_order)
        start, end = eng.indptr[pairs[:, 0]], eng.indptr[pairs[:, 0] + 1]
        deg = end - start
        row_of = np.repeat(np.arange(len(pairs)), deg)
        e = np.repeat(start - np.cumsum(deg) + deg, deg) + np.arange(int(deg.sum()))
        keep = (eng.stage[e] == deepest) & (eng.dst[e] != pairs[row_of, 1])
        cols = self.catalogue_row[eng.dst[e[keep]]]
        ok = cols >= 0
        return {"cat_target": self.catalogue_row[pairs[:, 1]], "cat_mask_rows": row_of[keep][ok], "cat_mask_cols": cols[ok]}


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
        batch_size: seeds per batch.
        pairs: deep-funnel (user, entity) pairs per batch (the catalogue loss).
        seeds_per_epoch: seeds per epoch (None = all nodes).
        embed_batch_size: nodes per validation batch.
        num_workers, pin_memory, persistent_workers: DataLoader settings.
        seed: base of every random draw.
        spectral_file: where the fitted basis is saved (export reads it beside the checkpoints).
        reuse_spectral: reload the basis from ``spectral_file`` (a resumed run) instead of fitting it.
    """

    def __init__(self, graph_dir: str | Path, content_dir: str | Path, graph: dict[str, Any], context: dict[str, int],
                 spectral: SpectralConfig, val_protocol: str, val_candidates: int | None, batch_size: int, pairs: int,
                 seeds_per_epoch: int | None, embed_batch_size: int, num_workers: int, pin_memory: bool,
                 persistent_workers: bool, seed: int, spectral_file: str | Path, reuse_spectral: bool = False) -> None:
        super().__init__()
        self.graph_dir, self.content_dir = Path(graph_dir), Path(content_dir)
        self.graph, self.context, self.spectral = dict(graph), dict(context), spectral
        self.spectral_file, self.reuse_spectral = Path(spectral_file), bool(reuse_spectral)
        self.val_protocol, self.val_candidates = val_protocol, val_candidates
        self.batch_size, self.pairs, self.seeds_per_epoch = batch_size, pairs, seeds_per_epoch
        self.embed_batch_size = embed_batch_size
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.seed = seed
        self.store: GraphStore | None = None

    def setup(self, stage: str | None = None) -> None:
        """Load the train-visible graph, build the validation set, fit (or reload) the spectral
        basis and take its base; a second call does nothing."""
        if self.store is not None:
            return
        snap = load_snapshot(self.graph_dir)
        self.store = load_graph(snap, self.content_dir, ("train",), **self.graph)
        self.val: ValSet = validation_set(self.store, self.val_candidates, self.seed, self.val_protocol)
        if not len(self.val):
            raise HirError(
                f"{self.graph_dir}: the val split of dataset {snap.dataset!r} has no deep-stage "
                f"({self.store.deep_stage!r}) pairs {'new to their user ' if self.val_protocol == 'masked_new' else ''}"
                "to validate on; give the val split more data (data.split.val_fraction, or data.split.val_start) "
                "or use datamodule.val_protocol=all"
            )
        self.basis: SpectralBasis
        # the base's filter is chosen on the ranking the test uses: every candidate entity
        select = self.val if self.val_candidates is None else validation_set(self.store, None, self.seed,
                                                                              self.val_protocol)
        self.basis, self.spectral_report = fit_base(self.store, select, self.spectral, self.seed, self.spectral_file,
                                                    self.reuse_spectral)
        self.base: SpectralBase = self.basis.base_for(self.store)
        self.sampler = ContextSampler(self.store, **self.context)

    @property
    def net_sizes(self) -> dict[str, int]:
        """The network's sizes this data fixes: types, stages, content width, recency buckets, base rank."""
        sizes = {k: int(self.store.spec[k]) for k in ("n_types", "n_stages", "content_dim", "n_recency")}
        return sizes | {"base_dim": self.base.rank}

    @property
    def recipe(self) -> dict[str, dict[str, Any]]:
        """How contexts were built (``graph`` options, ``context`` sizes): kept in checkpoints, so
        export rebuilds the same inputs."""
        return {"graph": dict(self.graph), "context": self.sampler.sizes}

    @property
    def catalogue(self) -> np.ndarray:
        """The user-side loss's catalogue (:func:`hir.model.catalogue`)."""
        return catalogue(self.store, self.base)

    def _loader(self, dataset: Dataset, sampler: Sampler | None = None) -> DataLoader:
        return DataLoader(dataset, batch_size=None, sampler=sampler, shuffle=False, num_workers=self.num_workers,
                          pin_memory=self.pin_memory, persistent_workers=self.persistent_workers)

    def train_dataloader(self) -> DataLoader:
        rank = self.trainer.global_rank if self.trainer else 0
        world = self.trainer.world_size if self.trainer else 1
        ds = TrainBatches(self.store, self.base, self.sampler, self.batch_size, self.pairs, self.seeds_per_epoch,
                          self.seed, rank, world, self.catalogue)
        log.info("train: %d batches per epoch per rank (rank %d of %d), %d seeds + %d pairs per batch",
                 len(ds), rank, world, self.batch_size, ds.pairs)
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
        return DataLoader(EmbedBatches(self.store, self.base, self.sampler, nodes, self.embed_batch_size, self.seed),
                          batch_size=None)

    def val_dataloader(self) -> DataLoader:
        # every rank embeds everything (no sharding): recall@K needs all candidates on one rank
        nodes = np.concatenate([self.val.users, self.val.cands])
        return self._loader(EmbedBatches(self.store, self.base, self.sampler, nodes, self.embed_batch_size, self.seed))
