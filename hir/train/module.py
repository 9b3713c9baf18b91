"""HirModule: the student/teacher training step, schedules, validation recall and prototype stats."""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor, nn

from hir.errors import HirError
from hir.model import catalogue_vectors, embed_batch, usage_stats, views
from hir.model.gate import CLOSED, choose_gate, compact, gate_line, gate_users, gated
from hir.model.metrics import paired_gain, recall_of_top, top_k_rows
from hir.nn import AlignLoss, BalanceLoss, CatalogueLoss, DistillLoss, HirNet
from hir.nn.net import USER_TYPE

log = logging.getLogger(__name__)

# the loss parts a step computes; `objective.weights` names a weight for each
LOSS_PARTS = ("distill", "align", "catalogue", "anchor", "balance", "scale")
# what `objective` and `optim` hold (conf/model/hir.yaml explains each)
OBJECTIVE_KEYS = ("weights", "student_temp", "teacher_temp_start", "teacher_temp", "teacher_temp_warmup",
                  "center_momentum", "catalogue_temp", "learn_temperature", "cross_view", "momentum",
                  "prototype_decay", "init_nodes")
OPTIM_KEYS = ("lr", "weight_decay", "warmup", "min_lr_ratio")
# what `train_parts` trains: everything, the user correction alone (hir.nn.HirNet: the head, its
# gate and the tokens' base projection, which only the engagement view's correction reads), or
# nothing (the step-0 model: the spectral base, the knowledge view as initialised, the prototypes
# by hierarchical k-means)
TRAIN_PARTS = ("auto", "all", "correction", "none")
TOKEN_CHUNK = 8192  # val nodes tokenised at a time (val_metrics' prototype usage)
CORRECTION_PARAMS = ("head.", "gate", "encoder.base.")


def resolve_train_parts(train_parts: str, transformer: bool) -> str:
    """``model.train_parts`` as trained: ``auto`` is ``all`` with the transformer and ``none``
    without it (conf/model/hir.yaml: without the correction, training the knowledge view, the
    scale heads and the prototypes helped no slice on test beyond the noise)."""
    if train_parts not in TRAIN_PARTS:
        raise HirError(f"model.train_parts={train_parts!r}; expected one of {list(TRAIN_PARTS)}")
    if train_parts == "auto":
        return "all" if transformer else "none"
    return train_parts


def _check_keys(what: str, given: dict[str, Any], expected: tuple[str, ...]) -> None:
    missing, unknown = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
    if missing or unknown:
        raise HirError(f"{what} has unknown keys {unknown} and lacks {missing}; expected exactly {list(expected)} "
                       "(conf/model/hir.yaml)")


def teacher_temp_schedule(total: int, start: float, end: float, warmup: float) -> np.ndarray:
    """(total + 1,) teacher temperature per step: linear start -> end over ``warmup`` of training."""
    n_warm = max(round(warmup * total), 1)
    return np.concatenate([np.linspace(start, end, n_warm), np.full(max(total + 1 - n_warm, 0), end)])[: total + 1]


def momentum_schedule(total: int, base: float) -> np.ndarray:
    """(total + 1,) EMA momentum per step: cosine from ``base`` to 1."""
    t = np.arange(total + 1) / max(total, 1)
    return 1 - (1 - base) * (np.cos(np.pi * t) + 1) / 2


class HirModule(L.LightningModule):
    """Cross-view self-distillation of :class:`HirNet` with an EMA teacher.

    Args (conf/model/hir.yaml is the constructor call):
        net: the student network (the teacher is an EMA copy of it); its ``config`` is stored in
            the checkpoint so export rebuilds the network without Hydra.
        objective: loss weights (one per :data:`LOSS_PARTS`), temperatures, momenta (:data:`OBJECTIVE_KEYS`).
        optim: AdamW ``lr``, ``weight_decay``; warm-up share ``warmup``; cosine floor ``min_lr_ratio``.
        val_k: cut-offs of the validation recall.
        monitor_k: the cut-off early stopping and the best checkpoint follow (:attr:`monitor`).
        seed: base of the per-epoch torch seed (dropout), so a resumed run repeats an uninterrupted one.
        data: how contexts were built (``graph`` options, ``context`` sizes), kept for export.
        train_parts: ``auto`` (:func:`resolve_train_parts`: ``all`` with the transformer, else
            ``none``), ``all``, or ``correction``: only the user correction learns (:data:`CORRECTION_PARAMS`;
            needs the transformer). Every other weight, the prototypes and the teacher's copy of them
            stay as loaded (``model.warm_start``, a ``transformer=false`` run's checkpoint): what the
            evidence gate closes on is then exactly that run's model, knowledge view included.
            ``none``: no step is taken (the trainer runs no batch, hir.train.trainer.build_trainer);
            the prototypes are initialised and the step-0 point is validated and saved as
            ``init.ckpt``, which export takes (without the transformer only).
        warm_start: the checkpoint `hir train` loaded before fitting (hir/train/warm.py), recorded.
    """

    def __init__(self, net: HirNet, objective: dict[str, Any], optim: dict[str, Any], val_k: list[int], monitor_k: int,
                 seed: int, data: dict[str, Any] | None = None, train_parts: str = "all",
                 warm_start: str | None = None) -> None:
        super().__init__()
        train_parts = resolve_train_parts(train_parts, net.use_transformer)
        if train_parts == "correction" and not net.use_transformer:
            raise HirError("model.train_parts=correction trains the user correction, which needs "
                           "model.net.transformer=true")
        if train_parts == "none" and net.use_transformer:
            raise HirError("model.train_parts=none trains nothing, so the transformer's correction would stay "
                           "zero: set model.net.transformer=false, or train it (model.train_parts=all|correction)")
        objective, optim = dict(objective), dict(optim)
        _check_keys("model.objective", objective, OBJECTIVE_KEYS)
        _check_keys("model.objective.weights", objective["weights"], LOSS_PARTS)
        _check_keys("model.optim", optim, OPTIM_KEYS)
        if int(monitor_k) not in [int(k) for k in val_k]:
            raise HirError(f"model.monitor_k={monitor_k} is not one of model.val_k={list(val_k)}")
        # plain dicts/lists only, so `torch.load(ckpt, weights_only=True)` can read the checkpoint
        self.save_hyperparameters({"net_config": net.config, "objective": objective, "optim": optim,
                                   "val_k": [int(k) for k in val_k], "monitor_k": int(monitor_k), "seed": int(seed),
                                   "data": dict(data or {}), "train_parts": train_parts,
                                   "warm_start": None if warm_start is None else str(warm_start)})
        self.net = net
        self.train_parts = train_parts
        if train_parts == "correction":
            for name, p in net.named_parameters():
                p.requires_grad_(name.startswith(CORRECTION_PARAMS))
        # prototypes are fitted by online k-means on the teacher's embeddings (see
        # HierarchicalTokenizer.ema_update), not by gradient
        for p in (net.tokenizer.root, *net.tokenizer.residuals):
            p.requires_grad_(False)
        # The teacher is an exponential moving average of the student, never trained by gradients:
        # frozen (no grad, never in the optimizer) and in eval mode (no dropout, full ids).
        self.teacher = copy.deepcopy(net).requires_grad_(False)
        self.train(self.training)
        levels = net.tokenizer.levels
        teaching = {"eng_to_know": ((0, 1),), "both": ((0, 1), (1, 0))}
        if objective["cross_view"] not in teaching:
            raise HirError(f"model.objective.cross_view={objective['cross_view']!r}; expected one of {sorted(teaching)}")
        directions = teaching[objective["cross_view"]]
        self.students = sorted({y for _, y in directions})
        self.distill = DistillLoss(levels, objective["student_temp"], objective["center_momentum"], directions)
        self.align = AlignLoss(net.base_dim, directions=directions)
        self.catalogue_loss = CatalogueLoss(objective["catalogue_temp"], bool(objective["learn_temperature"]))
        # a part that is off must not leave trainable parameters DDP would wait for
        if not float(objective["weights"]["catalogue"]):
            self.catalogue_loss.requires_grad_(False)
        # (M, C) packed base embeddings of the catalogue (fixed; built at fit start, not saved)
        self._catalogue: Tensor | None = None
        self.balance = BalanceLoss(levels, objective["student_temp"])
        self.weights = objective["weights"]
        self.objective, self.optim = objective, optim
        self.val_k = tuple(int(k) for k in val_k)
        self.monitor = f"val/recall@{int(monitor_k)}"
        self.seed = int(seed)
        # per-step schedules, filled by on_fit_start (the final values until then)
        self.teacher_temp = np.array([objective["teacher_temp"]])
        self.momentum = np.array([objective["momentum"]])
        self._val: list[tuple[Tensor, Tensor]] = []
        # per val user, recall@monitor_k of the step-0 point (the base): what every epoch is
        # compared with, paired over users (kept in checkpoints for a resumed run)
        self.base_recall: np.ndarray | None = None
        # the evidence gate of the user correction fit by the last validation (hir.model.gate):
        # saved in every checkpoint (``hir_gate``), export applies it
        self.evidence_gate: dict[str, Any] = {"max_events": CLOSED}
        # set once the prototypes got their data-dependent init; saved, so a resumed run skips it
        self.register_buffer("prototypes_ready", torch.zeros((), dtype=torch.bool))
        # per-epoch validation metrics (kept in checkpoints, so a resumed run has the full history)
        self.history: list[dict[str, float]] = []
        # seed contexts trained on by this process since it started (throughput)
        self.contexts_seen = 0

    def train(self, mode: bool = True) -> HirModule:
        super().train(mode)
        self.teacher.eval()
        return self

    # -- schedules ---------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        total = int(self.trainer.estimated_stepping_batches)
        o = self.objective
        self.teacher_temp = teacher_temp_schedule(total, o["teacher_temp_start"], o["teacher_temp"], o["teacher_temp_warmup"])
        self.momentum = momentum_schedule(total, o["momentum"])
        if not bool(self.prototypes_ready):
            self._init_prototypes()
        self._catalogue = self.catalogue_matrix()

    @torch.no_grad()
    def catalogue_matrix(self) -> Tensor:
        """(M, C) packed base embeddings of the training task's catalogue (the view's base,
        :func:`hir.model.catalogue_vectors`; the cold rows are filled per batch)."""
        dm = self.trainer.datamodule
        return catalogue_vectors(dm.task_store, dm.task_base).to(self.device)

    @torch.no_grad()
    def _init_prototypes(self) -> None:
        """Hierarchical k-means of the initial embeddings of a sample of nodes -> prototypes.

        Run in train mode (batch statistics, which also initialises the output normalisation),
        identical on every rank (same seeded sample), then copied to the teacher.
        """
        from lightning.fabric.utilities.apply_func import move_data_to_device

        dm = self.trainer.datamodule
        n = int(self.objective["init_nodes"])
        loader = dm.init_dataloader(n)
        zs = [self.embed(move_data_to_device(b, self.device), net=self.net)[1] for b in loader]
        z = torch.cat(zs).float().cpu()
        gen = torch.Generator().manual_seed(self.seed)
        self.net.tokenizer.init_from_data(self.net.semantic(z), generator=gen)
        state = self.trainer.strategy.broadcast({k: v.cpu() for k, v in self.net.state_dict().items()}, src=0)
        self.net.load_state_dict(state)
        self.teacher.load_state_dict(self.net.state_dict())
        self.prototypes_ready.fill_(True)
        log.info("prototypes initialised by hierarchical k-means on %d node embeddings", len(z))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # random draws (id dropout) depend only on (seed, step, rank): a resumed run repeats an
        # uninterrupted one, whatever hooks Lightning replays on restart
        torch.manual_seed(self.seed * 1_000_003 + self.global_step * 101 + self.global_rank)

    # -- training ----------------------------------------------------------------------------
    def loss_parts(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """The named, unweighted loss parts of one batch (raises on a non-finite part)."""
        eng, kno = views(batch)
        z_eng = self.net(eng, use_ids=True)  # (B, C)
        correction = self.net.last_correction  # (B, K) or None (no transformer)
        full = [z_eng, self.net(kno, use_ids=False)]  # 2 x (B, C)
        with torch.no_grad():
            t_full = [self.teacher(eng, use_ids=True), self.teacher(kno, use_ids=False)]  # 2 x (B, C)
        # the hierarchy and the cross-view objectives work on the direction; the scale
        # coordinate is matched across views below
        student = [self.net.semantic(z) for z in full]  # 2 x (B, C')
        teacher = [self.teacher.semantic(z) for z in t_full]  # 2 x (B, C')
        t_scores = [self.teacher.tokenizer.scores(t) for t in teacher]  # 2 x (B, K)
        # the codebook's online k-means step runs after the optimizer step (on_train_batch_end):
        # the student's forward above still needs the current prototypes for backward
        self._teacher_z = torch.cat(teacher)
        s_scores = [self.net.tokenizer.scores(s) for s in student]  # 2 x (B, K)
        step = min(self.global_step, len(self.teacher_temp) - 1)
        parts = {
            "distill": self.distill(s_scores, t_scores, float(self.teacher_temp[step])),
            "align": self.align(student, teacher),
            "balance": self.balance([s_scores[y] for y in self.students]),
        }
        # cold-start entities are embedded by the knowledge view: its scale (popularity) must sit
        # on the engagement view's, or content-only entities would flood (or vanish from)
        # retrieval. The knowledge view regresses the teacher's engagement-view scale, in logs.
        seed_type = eng["type"][:, 0]
        keys = seed_type != USER_TYPE
        if keys.any():
            gap = torch.log(self.net.scale_of(full[1][keys]).clamp_min(1e-4)) - torch.log(
                self.teacher.scale_of(t_full[0][keys]).clamp_min(1e-4))
            parts["scale"] = gap.pow(2).mean()
        else:
            parts["scale"] = full[1].sum() * 0.0
        n = int(batch["n_users"])
        zero = full[0].sum() * 0.0
        parts["catalogue"], parts["anchor"] = zero, zero
        if n and len(batch.get("tgt_rows", ())) and self._catalogue is not None and len(self._catalogue):
            catalogue = self._catalogue  # (M, C) the warm entities' base; zero rows: cold entities
            # a cold entity outside the batch is left out of the softmax; the batch's cold entities
            # (no base in the view) are ranked by the student's knowledge view: their targets
            # train the content placement export gives cold entities (TrainBatches, `cold`)
            bias = torch.zeros(len(catalogue), device=catalogue.device)  # (M,)
            bias = bias.masked_fill(catalogue.norm(dim=-1) == 0, float("-inf"))
            cols = z_cold = None
            if "cold" in batch:
                z_cold = self.net(batch["cold"], use_ids=False).to(catalogue.dtype)  # (C_cold, C)
                cols = batch["cold_cols"]
                bias = bias.index_copy(0, cols, batch["cold_bias"].to(bias.dtype))
            parts["catalogue"] = self.catalogue_loss(full[0][:n], catalogue, batch["tgt_rows"], batch["tgt_cols"],
                                                     batch["tgt_weight"], batch["mask_rows"], batch["mask_cols"], bias,
                                                     cols, z_cold)
        if correction is not None and n:
            # the user correction's squared size: it stays at the base unless the targets pay for it
            parts["anchor"] = correction[:n].pow(2).sum(-1).mean()
        for name, value in parts.items():
            if not torch.isfinite(value):
                raise HirError(
                    f"loss part {name!r} is {value.item()} at step {self.global_step} (epoch {self.current_epoch}); "
                    "lower model.optim.lr or that part's weight in model.objective.weights"
                )
        return parts

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        parts = self.loss_parts(batch)
        loss = sum(self.weights[name] * value for name, value in parts.items())
        bs = int(batch["seeds"].shape[0])
        self.contexts_seen += bs * self.trainer.world_size
        step = min(self.global_step, len(self.teacher_temp) - 1)
        self.log_dict({f"train/{name}": value.detach() for name, value in parts.items()}, batch_size=bs)
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=bs)
        self.log_dict({"train/teacher_temp": float(self.teacher_temp[step]), "train/momentum": float(self.momentum[step])},
                      batch_size=bs)
        return loss

    @torch.no_grad()
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # EMA: teacher <- m * teacher + (1 - m) * student, after the optimizer step; the codebook
        # is not trained by gradient, the teacher uses the student's directly
        frozen = self.train_parts == "correction"  # the prototypes and every frozen weight stay as loaded
        if not frozen:
            gen = torch.Generator().manual_seed(self.seed * 7919 + self.global_step)
            self.net.tokenizer.ema_update(self._teacher_z, self.objective["prototype_decay"], generator=gen)
        m = float(self.momentum[min(self.global_step, len(self.momentum) - 1)])
        for (name, t), s in zip(self.teacher.named_parameters(), self.net.parameters()):
            if frozen and not s.requires_grad:
                continue  # the teacher keeps its loaded copy of what does not learn
            if name.startswith("tokenizer."):
                t.copy_(s)
            else:
                t.mul_(m).add_(s.detach(), alpha=1 - m)

    # -- validation --------------------------------------------------------------------------
    @torch.no_grad()
    def embed(self, batch: dict[str, Any], net: HirNet | None = None) -> tuple[Tensor, Tensor]:
        """An embedding batch -> (nodes, (n, C)) with the teacher (default); see :func:`hir.model.embed_batch`."""
        return embed_batch(net or self.teacher, batch)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        nodes, z = self.embed(batch)
        self._val.append((nodes.cpu(), z.float().cpu()))

    def on_validation_epoch_end(self) -> None:
        if not self._val and not self._distributed():
            return
        parts, self._val = self._val, []
        metrics = self._sharded_metrics(parts)
        self.history.append({"epoch": self.current_epoch, "step": self.global_step, **metrics,
                             "gate": self.evidence_gate})
        # rank 0 computed them and every rank holds them (:meth:`_sharded_metrics`); the mean of
        # equal values is logged
        self.log_dict(metrics, prog_bar=False, sync_dist=True)
        log.info("epoch %d: %s; evidence gate: %s", self.current_epoch, {k: round(v, 4) for k, v in metrics.items()},
                 gate_line(self.evidence_gate))

    def _distributed(self) -> bool:
        return (self._trainer is not None and self.trainer.world_size > 1 and torch.distributed.is_available()
                and torch.distributed.is_initialized())

    def _sharded_metrics(self, parts: list[tuple[Tensor, Tensor]]) -> dict[str, float]:
        """This rank's embedded val shard (the datamodule gives rank r every world-th batch) ->
        :meth:`val_metrics`, the same on every rank.

        Under DDP the shards are gathered on rank 0 alone, which computes the metrics and the
        evidence gate and broadcasts both: the other ranks never hold the whole val embedding
        (every val user and candidate, ``(n, C)`` floats), which set their peak memory when every
        rank embedded everything."""
        nodes = torch.cat([n for n, _ in parts]).numpy() if parts else np.zeros(0, np.int64)
        z = torch.cat([e for _, e in parts]).numpy() if parts else np.zeros((0, 0), np.float32)
        del parts
        if not self._distributed():
            return self.val_metrics(nodes, torch.from_numpy(z))
        dist = torch.distributed
        root = self.global_rank == 0
        shards: list[Any] | None = [None] * self.trainer.world_size if root else None
        dist.gather_object((nodes, z), shards, dst=0)
        del nodes, z
        payload: list[Any] = [None]
        if root:
            kept = [s for s in shards if len(s[0])]
            nodes = np.concatenate([s[0] for s in kept])
            z_all = torch.from_numpy(np.concatenate([s[1] for s in kept]))
            del shards, kept
            payload = [(self.val_metrics(nodes, z_all), self.evidence_gate)]
        dist.broadcast_object_list(payload, src=0)
        metrics, self.evidence_gate = payload[0]
        return metrics

    @torch.no_grad()
    def val_metrics(self, nodes: np.ndarray, z: Tensor) -> dict[str, float]:
        """Embedded validation nodes (n,) and their (n, C) embeddings -> recall@K under the
        datamodule's protocol (:mod:`hir.model.valset`) and per-level prototype usage.

        With a correction (:attr:`HirNet.corrects`), ``val/recall@K`` is the *gated* model's, the
        one export ships: the evidence gate (:mod:`hir.model.gate`) is fit here on the monitor's
        cut-off, from each val user's recall with the correction and with it closed (the same
        epoch's entities, the user's base direction), and :attr:`evidence_gate` holds it;
        ``val/full_recall@K`` is the correction given to everybody. The gain over the step-0 base
        (``val/gain_over_base``, ``val/gain_lo``/``hi``) is the gated model's, so early stopping,
        :class:`~hir.train.callbacks.StopBelowBase` and the best checkpoint follow what export ships."""
        val = self.trainer.datamodule.val
        index = np.full(int(nodes.max()) + 1 if len(nodes) else 0, -1, np.int64)
        index[nodes] = np.arange(len(nodes))
        zu = z[index[val.users]].numpy()
        zc = z[index[val.cands]].numpy()
        closed = self._closed_users(zu, val.users) if self.teacher.corrects else None
        evidence = self.trainer.datamodule.store.exposure[val.users]  # (U,) events in the train split
        # one ranking per embedding serves every k
        top = top_k_rows(zu, zc, val.masked, max(self.val_k))
        per_k = {k: recall_of_top(top, val.positives, k) for k in self.val_k}
        closed_k = {}
        if closed is not None:
            top_closed = top_k_rows(closed, zc, val.masked, max(self.val_k))
            closed_k = {k: recall_of_top(top_closed, val.positives, k) for k in self.val_k}
        # no open correction: at step 0 the gate is closed; without a transformer there is nothing
        # to gate (None: export leaves every user as the network embeds it, i.e. its base)
        self.evidence_gate = {"max_events": CLOSED if self.teacher.use_transformer else None}
        if closed is not None:
            k = int(self.monitor.rsplit("@", 1)[1])
            self.evidence_gate = choose_gate(per_k[k], closed_k[k], evidence, seed=self.seed)
        metrics: dict[str, float] = {}
        for k in self.val_k:
            per_user = per_k[k]
            if closed is not None:
                metrics[f"val/full_recall@{k}"] = float(np.nanmean(per_user)) if len(per_user) else 0.0
                per_user = gated(per_user, closed_k[k], evidence, self.evidence_gate["max_events"])
            metrics[f"val/recall@{k}"] = float(np.nanmean(per_user)) if len(per_user) else 0.0
            if f"val/recall@{k}" == self.monitor:
                if self.base_recall is None or len(self.base_recall) != len(per_user):
                    self.base_recall = per_user  # the first validation: the step-0 base
                gain = paired_gain(per_user, self.base_recall, seed=self.seed)
                metrics |= {"val/gain_over_base": gain["gain"], "val/gain_lo": gain["lo"], "val/gain_hi": gain["hi"]}
        # the tokens a chunk of rows at a time, as export reads them (Embedder.tokens): the float64
        # scores of every val node at once were (nodes, K) x 16 bytes (5 GB at 10M events)
        chunks = [self.teacher.tokens(z[lo:lo + TOKEN_CHUNK].to(self.device))[0] for lo in range(0, len(z), TOKEN_CHUNK)]
        codes = [torch.cat([c[lvl] for c in chunks]) for lvl in range(len(self.teacher.tokenizer.levels))] \
            if chunks else self.teacher.tokens(z.to(self.device))[0]
        for lvl, c in enumerate(codes):
            usage, entropy = usage_stats(c[:, 0], self.teacher.tokenizer.levels[lvl])
            metrics[f"proto/usage_l{lvl}"] = usage
            metrics[f"proto/entropy_l{lvl}"] = entropy
        return metrics

    def _closed_users(self, zu: np.ndarray, users: np.ndarray) -> np.ndarray:
        """(U, C) the val users' embeddings with the correction closed: ``[normalize(b_u), 0]``
        where the user has a base (the train split's), its embedding ``zu`` (U, C) otherwise."""
        base = self.trainer.datamodule.base.vectors[users]  # (U, K)
        return gate_users(zu, base, np.ones(len(users), bool), np.full(len(users), np.inf), CLOSED)

    @torch.no_grad()
    def validate_now(self) -> dict[str, float]:
        """Validation metrics of the current teacher, outside Lightning's loop (the step-0 point:
        the spectral base before any correction is learned)."""
        from lightning.fabric.utilities.apply_func import move_data_to_device

        was = self.training
        self.eval()
        out = []
        for b in self.trainer.datamodule.val_dataloader():  # this rank's shard
            nodes, z = self.embed(move_data_to_device(b, self.device))
            out.append((nodes.cpu(), z.float().cpu()))
        self.train(was)
        return self._sharded_metrics(out)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["hir_history"] = list(self.history)
        checkpoint["hir_gate"] = compact(self.evidence_gate)
        if self.base_recall is not None:
            checkpoint["hir_base_recall"] = torch.from_numpy(self.base_recall)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.history = list(checkpoint.get("hir_history", []))
        self.evidence_gate = dict(checkpoint.get("hir_gate", {"max_events": CLOSED}))
        if "hir_base_recall" in checkpoint:
            self.base_recall = checkpoint["hir_base_recall"].numpy()

    # -- optimisation ------------------------------------------------------------------------
    def configure_optimizers(self) -> dict[str, Any]:
        decay = {id(m.weight) for m in self.modules() if isinstance(m, nn.Linear)}
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if id(p) in decay], "weight_decay": self.optim["weight_decay"]},
            {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=self.optim["lr"])
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warm = max(int(self.optim["warmup"] * total), 1)
        floor = self.optim["min_lr_ratio"]

        def factor(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            t = min((step - warm) / max(total - warm, 1), 1.0)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
