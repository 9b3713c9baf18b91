"""A trained model + its snapshot, ready to embed: every snapshot entity (export) and new
entities from content alone (``hir refresh``).

    emb = Embedder("outputs/x/checkpoints/last.ckpt", "outputs/x/graph", "outputs/x/content")
    z = emb.embed_snapshot()                               # (n_nodes, dim), global-id order
    z_new = emb.embed_new("product", text_vec, attr_vec, has_text,
                          links=[[("category", "shoes"), ("advertiser", "acme")], ...])
    codes, weights = emb.tokens(z_new)                     # Bag-of-Meaning per level
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hir.data.snapshot import Snapshot, load_snapshot
from hir.errors import InputError
from hir.export.recorded import recorded_checkpoint
from hir.model import (
    SPECTRAL_FILE,
    ContextSampler,
    EmbedBatches,
    SpectralBasis,
    content_rows,
    embed_batch,
    load_graph,
    refit_aligned,
)
from hir.model.context import topk_edges
from hir.model.gate import CLOSED, gate_users
from hir.nn import HierarchicalTokenizer, HirNet
from hir.nn.buckets import METADATA, SELF
from hir.nn.net import USER_TYPE

log = logging.getLogger(__name__)


def load_checkpoint(path: str | Path) -> tuple[HirNet, dict[str, Any]]:
    """A ``hir train`` checkpoint -> (the EMA teacher network in eval mode, hyper-parameters with
    ``gate``: the evidence gate of the correction fit on val, :mod:`hir.model.gate`, or None for a
    checkpoint without one: every user as the network embeds it).

    Loaded with ``weights_only=True``: a checkpoint holds tensors and plain values only.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"checkpoint {path} does not exist; run `hir train` first (or set export.checkpoint)")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    hp = ckpt["hyper_parameters"]
    net = HirNet(**hp["net_config"])
    state = {k.removeprefix("teacher."): v for k, v in ckpt["state_dict"].items() if k.startswith("teacher.")}
    net.load_state_dict(state)
    return net.eval(), {**hp, "gate": ckpt.get("hir_gate")}


def resolve_checkpoint(choice: str, ckpt_dir: Path) -> Path:
    """``export.checkpoint``: ``best`` (the best validation point `hir train` recorded in
    ``train_metrics.json``), ``last``, or a path."""
    if choice == "best":
        metrics = ckpt_dir / "train_metrics.json"
        if not metrics.exists():
            raise InputError(f"{metrics} does not exist; run `hir train` first (or set export.checkpoint=PATH)")
        return recorded_checkpoint(json.loads(metrics.read_text())["best_checkpoint"], metrics)
    return ckpt_dir / "last.ckpt" if choice == "last" else Path(choice)


def checkpoint_version(path: str | Path) -> str:
    """``<sha256 of the checkpoint, 10 hex>-<its mtime, UTC>``: stable for one checkpoint file."""
    path = Path(path)
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    stamp = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{h.hexdigest()[:10]}-{stamp}"


def direction(z: torch.Tensor) -> torch.Tensor:
    """(..., w) universal embeddings -> (..., w - 1) their unit direction: every coordinate but the
    last (the slack), normalised. :meth:`HirNet.semantic` at w = K + 1, and the same for served
    embeddings of width d + 1 (``export.dim``)."""
    return torch.nn.functional.normalize(z[..., :-1], dim=-1)


class Embedder:
    """Embeds entities with a trained checkpoint against the snapshot it was trained on.

    Args:
        checkpoint: path of a ``hir train`` checkpoint.
        snapshot, content_dir: the snapshot (prepare's ``graph/``, or its opened
            :class:`~hir.data.snapshot.Snapshot`) and enrich's ``content/``.
        visible_splits: engagement the contexts may see (default train + val: everything before
            the test period).
        user_gate: which users get the transformer's correction: ``checkpoint`` (the evidence
            gate `hir train` fit on val and saved in the checkpoint: users with at most its
            ``max_events`` events in ``visible_splits``; the others get their base), ``open``
            (everybody: the correction as trained) or ``closed`` (nobody).
    """

    def __init__(self, checkpoint: str | Path, snapshot: Snapshot | str | Path, content_dir: str | Path,
                 visible_splits: Sequence[str] = ("train", "val"), refit_base: bool = False, n_iter: int = 6,
                 seed: int = 0, user_gate: str = "checkpoint") -> None:
        self.checkpoint = Path(checkpoint)
        self.net, self.hp = load_checkpoint(checkpoint)
        gates = {"checkpoint": (self.hp["gate"] or {}).get("max_events"), "open": None, "closed": CLOSED}
        if user_gate not in gates:
            raise InputError(f"export.user_gate={user_gate!r}; expected one of {list(gates)}")
        # the users' evidence threshold of the correction (None: every user as the network embeds it)
        self.gate_max_events: float | None = gates[user_gate] if self.net.corrects else None
        data = self.hp.get("data", {})
        self.snapshot = snapshot if isinstance(snapshot, Snapshot) else load_snapshot(snapshot)
        self.store = load_graph(self.snapshot, content_dir, tuple(visible_splits), **data.get("graph", {}))
        sizes = {k: self.store.spec[k] for k in ("n_types", "n_stages", "content_dim", "n_recency")}
        if sizes != {k: self.hp["net_config"].get(k) for k in sizes}:
            raise InputError(
                f"checkpoint {checkpoint} was trained on a snapshot with {self.hp['net_config']} but "
                f"{self.snapshot.dir} + {content_dir} give {sizes}; export with the snapshot it was trained on"
            )
        # the spectral basis sits beside the checkpoint; users are folded in from the engagement
        # visible now (which may be more than training saw)
        spectral = self.checkpoint.parent / SPECTRAL_FILE
        if not spectral.exists():
            raise InputError(f"{spectral} is missing: the spectral basis `hir train` wrote beside {checkpoint}; retrain")
        self.basis = SpectralBasis.load(spectral)
        if self.basis.rank != self.net.base_dim:
            raise InputError(f"{spectral} has rank {self.basis.rank} but {checkpoint} was trained on rank "
                             f"{self.net.base_dim}: the two files come from different runs")
        # the served dimension `hir train` chose on val (export.dim=auto; None: not recorded)
        self.served_dim = self.basis.served_dim
        self.refit = self.refit_report(refit_base, visible_splits)
        if self.refit["done"]:
            self.basis, self.base = refit_aligned(self.store, self.basis, n_iter, seed)
            log.info("export: the spectral base refit on %s (rank %d, %s)", "+".join(visible_splits), self.basis.rank,
                     self.basis.filter.label())
        else:
            self.base = self.basis.base_for(self.store)
        self.sampler = ContextSampler(self.store, **data.get("context", {}))
        self.version = checkpoint_version(checkpoint)
        # tokens come from this tokenizer: the checkpoint's, or the export's refit of it
        # (:meth:`use_tokenizer`); the network's own prototypes keep feeding its contexts
        self.tokenizer: HierarchicalTokenizer = self.net.tokenizer
        self._key_index: dict[str, dict[str, int]] = {}

    def refit_report(self, wanted: bool, visible_splits: Sequence[str]) -> dict[str, Any]:
        """Whether the base is refit on the visible splits (``done``) and why not (``reason``).

        A network whose correction is off (no transformer, or its gate closed: the step-0
        ``init.ckpt`` and a rejected correction's ``closed.ckpt``) is the base in its engagement
        view, so it takes the refit base. A correction trained on the training
        task (``data.task`` in the checkpoint) was trained on one base (the task's view) and
        validated on another (the train split's), so it takes the refit base too; a checkpoint of
        an older training, fit to the train basis alone, keeps it."""
        if not wanted:
            return {"done": False, "reason": "export.refit_base=false"}
        if tuple(visible_splits) == ("train",):
            return {"done": False, "reason": "only train is visible: the basis already saw it all"}
        if self.net.corrects and not self.hp.get("data", {}).get("task"):
            return {"done": False, "reason": f"{self.checkpoint.name} holds a trained transformer correction of the "
                                             "train basis"}
        return {"done": True, "visible_splits": list(visible_splits)}

    def release_base(self) -> None:
        """Drop the spectral base once the snapshot is embedded (`hir export` reads it no more): an
        (n_nodes, K) array, 2.2 GB at 10M events and rank 1024, that would otherwise stay alive
        through the projection and the hierarchy fit; and with it the basis's factors, (entities +
        users) x K (1.7 GB there), which only computed it. The basis keeps its rank, stage
        weighting and filter (what meta.json reports). Embedding again afterwards raises."""
        self.base = None
        b = self.basis
        self.basis = replace(b, v=np.zeros((0, b.rank), b.v.dtype), u=np.zeros((0, b.rank), b.u.dtype))

    @property
    def dim(self) -> int:
        return self.net.dim

    @property
    def levels(self) -> tuple[int, ...]:
        return self.tokenizer.levels

    def use_tokenizer(self, tokenizer: HierarchicalTokenizer) -> None:
        """Tokenise with ``tokenizer`` (the same levels as the checkpoint's; its width that of the
        directions it will see: the rank K, or the served d of ``export.dim``, plus the text width T
        when the tokens read text too, ``export.token_content``) from now on."""
        own = self.net.tokenizer
        widest = own.dim + int(self.store.layout["text_dim"])
        if tokenizer.levels != own.levels or not 1 <= tokenizer.dim <= widest:
            raise InputError(f"tokenizer with levels {tokenizer.levels} and width {tokenizer.dim} does not fit "
                             f"checkpoint {self.checkpoint} (levels {own.levels}, width at most {own.dim} + "
                             f"the text's {widest - own.dim})")
        self.tokenizer = tokenizer.eval()

    def save_tokenizer(self, path: str | Path) -> None:
        """Write the tokenizer in use to ``path`` (``hierarchy/tokenizer.pt``) with this model's version."""
        # free_levels is no tensor: the file keeps it beside the weights so the tree reads alike when loaded
        torch.save({"model_version": self.version, "state_dict": self.tokenizer.state_dict(),
                    "free_levels": self.tokenizer.free_levels}, Path(path))

    def load_tokenizer(self, path: str | Path) -> None:
        """Tokenise with the tokenizer an export of this model saved (:meth:`save_tokenizer`)."""
        saved = torch.load(Path(path), map_location="cpu", weights_only=True)
        if saved["model_version"] != self.version:
            raise InputError(f"{path} was saved by the export of model {saved['model_version']!r}, not "
                             f"{self.version!r} ({self.checkpoint}); use the hierarchy/ of the run that exported it")
        own = self.net.tokenizer
        width = int(saved["state_dict"]["root"].shape[1])  # the served d when the export projected
        free = int(saved.get("free_levels", 0))  # export.hierarchy_free_levels (files before it: 0)
        tokenizer = copy.deepcopy(own) if width == own.dim and free == own.free_levels else \
            HierarchicalTokenizer(width, own.levels, own.top_k, own.tau, own.radius, free)
        tokenizer.load_state_dict(saved["state_dict"])
        self.use_tokenizer(tokenizer)

    @torch.inference_mode()
    def embed_nodes(self, nodes: np.ndarray, batch_size: int = 2048, seed: int = 0) -> np.ndarray:
        """Global node ids (n,) -> (n, dim) float32 unit embeddings: nodes with engagement in the
        visible splits (warm) through the engagement view, the rest (cold start) through the
        knowledge view."""
        if self.base is None:
            raise RuntimeError("this Embedder's spectral base was released (release_base): embed before releasing it")
        ds = EmbedBatches(self.store, self.base, self.sampler, np.asarray(nodes, np.int64), batch_size, seed)
        out = np.zeros((len(nodes), self.dim), np.float32)
        pos = 0
        for i in range(len(ds)):
            batch = ds[i]
            got, z = embed_batch(self.net, batch)
            n = len(got)
            # embed_batch returns warm then cold; put rows back in the batch's node order
            order = np.concatenate([np.flatnonzero(self.store.warm[ds.nodes[pos:pos + n]]),
                                    np.flatnonzero(~self.store.warm[ds.nodes[pos:pos + n]])])
            out[pos + order] = z.float().numpy()
            pos += n
        # the evidence gate: a user with more visible events than the gate admits takes its base
        # (the correction closed); warm entities keep their base and cold ones the knowledge view
        # either way (the correction refines users only)
        if self.gate_max_events is None:  # no gate: no (n, K) copy of the nodes' base to pass it
            return out
        nodes = np.asarray(nodes, np.int64)
        return gate_users(out, self.base.vectors[nodes], self.store.node_type[nodes] == USER_TYPE,
                          self.store.exposure[nodes], self.gate_max_events)

    def embed_snapshot(self, batch_size: int = 2048, seed: int = 0) -> np.ndarray:
        """Every node of the snapshot -> (n_nodes, dim), in global-id order."""
        return self.embed_nodes(np.arange(self.store.n_nodes), batch_size, seed)

    @torch.inference_mode()
    def semantic(self, z: np.ndarray) -> np.ndarray:
        """(n, w) universal embeddings -> (n, w - 1) their unit direction, the tokenizer's space
        (see :class:`hir.nn.HirNet`); w is K + 1, or d + 1 for served ones (:mod:`hir.export.project`)."""
        return direction(torch.from_numpy(np.ascontiguousarray(z, np.float32))).numpy()

    def semantic_rows(self, z: np.ndarray, rows: np.ndarray, block: int = 16384) -> np.ndarray:
        """:meth:`semantic` of ``z[rows]`` (m, w - 1), a block of rows at a time: no (m, w) copy of
        the rows beside the output (a direction is its own row's, so the values are the same)."""
        rows = np.asarray(rows, np.int64)
        out = np.empty((len(rows), z.shape[1] - 1), np.float32)
        for lo in range(0, len(rows), block):
            out[lo:lo + block] = self.semantic(z[rows[lo:lo + block]])
        return out

    @torch.inference_mode()
    def tokens(self, z: np.ndarray, batch_size: int = 8192) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(n, w) embeddings (w = K + 1, or the served d + 1) -> per level: codes (n, k) int32 and
        weights (n, k) float32 summing to 1."""
        codes: list[list[np.ndarray]] = [[] for _ in self.levels]
        weights: list[list[np.ndarray]] = [[] for _ in self.levels]
        for lo in range(0, len(z), batch_size):
            c, w, _ = self.tokenizer(direction(torch.from_numpy(np.ascontiguousarray(z[lo:lo + batch_size], np.float32))))
            for lvl in range(len(self.levels)):
                codes[lvl].append(c[lvl].numpy().astype(np.int32))
                weights[lvl].append(w[lvl].numpy().astype(np.float32))
        k = [min(self.tokenizer.top_k, n) for n in self.levels]
        return ([np.concatenate(c) if c else np.zeros((0, k[i]), np.int32) for i, c in enumerate(codes)],
                [np.concatenate(w) if w else np.zeros((0, k[i]), np.float32) for i, w in enumerate(weights)])

    def node_ids(self, etype: str, keys: Sequence[str]) -> np.ndarray:
        """Entity keys of a type -> global node ids (-1 for keys not in the snapshot)."""
        if etype not in self._key_index:
            self._key_index[etype] = self.snapshot.key_index(etype)
        index = self._key_index[etype]
        local = np.array([index.get(str(k), -1) for k in keys], dtype=np.int64)
        return np.where(local >= 0, self.store.global_ids(etype, np.maximum(local, 0)), -1)

    @torch.inference_mode()
    def embed_new(
        self,
        entity_type: str,
        text_vec: np.ndarray,
        attr_vec: np.ndarray | None = None,
        has_text: np.ndarray | None = None,
        links: Sequence[Sequence[tuple[str, str]]] | None = None,
        image_vec: np.ndarray | None = None,
        seed: int = 0,
    ) -> np.ndarray:
        """Embed entities that are not in the snapshot from content alone (the knowledge view).

        Args:
            entity_type: one of user, product, advertiser, campaign, category.
            text_vec: (n, text_dim) text vectors (zeros when no text), as enrich writes them.
            attr_vec: (n, attr_dim of the type) attribute vectors (enrich's fitted encoders), or None.
            has_text: (n,) bool; default: text_vec rows that are not all zero.
            links: per entity, the existing entities it points to, as (entity_type, key) pairs:
                a product's category and advertiser, a campaign's advertiser and products. Their
                content (and their category ancestors) join the context. Unknown keys are skipped.
            image_vec: (n, image_dim) image vectors when the snapshot has them.
            seed: seed of the draw among many ancestors.

        Returns:
            (n, dim) float32 unit embeddings in the universal space (tokens via :meth:`tokens`).
        """
        st = self.store
        if entity_type not in st.types:
            raise InputError(f"unknown entity type {entity_type!r}; expected one of {list(st.types)}")
        text_vec = np.asarray(text_vec, np.float32).reshape(-1, st.layout["text_dim"]) if text_vec is not None else None
        n = len(text_vec) if text_vec is not None else len(has_text if has_text is not None else [])
        if text_vec is None:
            text_vec = np.zeros((n, st.layout["text_dim"]), np.float32)
        if n == 0:
            return np.zeros((0, self.dim), np.float32)
        if has_text is None:
            has_text = np.abs(text_vec).sum(1) > 0
        rows = content_rows(st.layout, entity_type, text_vec, None if attr_vec is None else np.asarray(attr_vec, np.float32),
                            np.asarray(has_text), None if image_vec is None else np.asarray(image_vec, np.float32))
        k_up = self.sampler.k_up + self.sampler.k_know_down
        direct = np.full((n, k_up), -1, np.int64)
        for i, ent_links in enumerate(links or [[]] * n):
            ids = [int(g) for t, key in ent_links for g in self.node_ids(t, [key]) if g >= 0][:k_up]
            direct[i, :len(ids)] = ids
        # the linked nodes' own ancestors (a category's parents) fill the remaining slots, hop 2
        rng = np.random.default_rng(seed)
        anc = topk_edges(st.up, np.maximum(direct[:, 0], 0), k_up, rng)  # (n, k_up) via the first link
        anc_nodes = np.where((anc >= 0) & (direct[:, :1] >= 0), st.up.dst[np.maximum(anc, 0)], -1)
        node = np.concatenate([np.full((n, 1), -1), direct, anc_nodes], axis=1)[:, : 1 + k_up]
        hop = np.concatenate([np.zeros((n, 1), np.int64), np.ones_like(direct), np.full_like(anc_nodes, 2)], axis=1)[:, : 1 + k_up]
        real = node >= 0
        real[:, 0] = True
        uniq = np.unique(node[node >= 0])
        content = np.concatenate([rows, st.content[uniq]])  # new rows first, then the linked nodes'
        row = np.where(node >= 0, n + np.searchsorted(uniq, node), -1)
        row[:, 0] = np.arange(n)
        tid = st.types.index(entity_type)
        ntype = np.where(node >= 0, st.node_type[np.maximum(node, 0)], 0)
        ntype[:, 0] = tid
        zeros_i = np.zeros(node.shape, np.int64)
        view = {
            "node": torch.from_numpy(node), "row": torch.from_numpy(row), "content": torch.from_numpy(content),
            "type": torch.from_numpy(ntype.astype(np.int64)),
            "relation": torch.from_numpy(np.where(real, METADATA, 0).astype(np.int64)).index_fill_(1, torch.tensor([0]), SELF),
            "hop": torch.from_numpy(np.where(real, hop, 0).astype(np.int64)),
            "stage": torch.from_numpy(zeros_i), "recency": torch.from_numpy(zeros_i.copy()),
            "count": torch.zeros(node.shape), "age": torch.zeros(node.shape), "exposure": torch.zeros(node.shape),
            "mask": torch.from_numpy(real),
        }
        return self.net(view, use_ids=False).float().numpy()
