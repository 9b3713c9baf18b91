"""`hir export`: checkpoint + snapshot -> ``embeddings/<type>.parquet`` and ``hierarchy/``.

Every entity of every type gets a row: its universal embedding (engagement view when it has
engagement in ``export.visible_splits``, knowledge view alone otherwise, flagged ``cold_start``), its Bag-of-Meaning (top-k
tokens and renormalised weights per level), the model version and timestamps
(docs/contracts.md). ``hierarchy/`` holds the prototypes with readable labels and usage, and the
super-graph density statistics.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hir.atomic import remove_stale_tmp, write_text_atomic
from hir.export.cold import ColdPlacement
from hir.export.cold_users import ColdUsers
from hir.export.project import PROJECTION_FILE

# sleeping OpenMP threads, as in the train stage (set before torch loads)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

log = logging.getLogger(__name__)

META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.pt"  # hierarchy/: the tokenizer the export's tokens come from (refresh reuses it)


@dataclass
class ExportConfig:
    """What `hir export` exports (conf/export/default.yaml).

    checkpoint: ``best`` (train_metrics.json's best validation point), ``last`` or a path;
    batch_size: nodes embedded at a time; visible_splits: engagement the exported contexts may
    see; label_members: member entities whose text labels a prototype; cold: the placement of
    cold entities with text; hierarchy_fit: the prototypes the tokens come from (``checkpoint``:
    as trained; ``entities``: the checkpoint's tree refitted on the exported directions of the warm
    entities, :func:`hir.export.hierarchy.refit_tokenizer`; ``coengage``: that refit with each
    engaged entity's tokens refined top down by co-engagement on the visible pairs; ``bottomup``:
    a flat k-means at level 1 grouped by co-engagement into level 0, :func:`fitted_hierarchy`);
    kmeans_reference: also report the hierarchy figures of a plain k-means on the exported
    vectors; dim: the served directions d (the embedding has d + 1 coordinates; null/``full`` =
    the spectral rank K; ``auto`` = the d `hir train` chose on val, :mod:`hir.model.served`), see
    :mod:`hir.export.project`; token_space: where the tokens are fitted and read at a served
    dimension (``full``: the rank-K directions; ``served``: the d served ones); dim_fallback: the d
    ``auto`` serves for a basis that records no choice (trained before it existed); token_content:
    the weight of an entity's text direction beside its collaborative one in the space the tokens
    are fitted and read (0: the collaborative direction alone), :mod:`hir.export.content_tokens`;
    hierarchy_free_levels: how many of the fitted tree's finest levels are free of the residual
    bound (:class:`hir.nn.HierarchicalTokenizer`; 0: every level bounded); hierarchy_child_n_init:
    the seedings of each parent's children k-means in the refit (the best of n).
    """

    checkpoint: str
    batch_size: int
    visible_splits: list[str]
    label_members: int
    cold: ColdPlacement
    hierarchy_fit: str
    kmeans_reference: bool
    refit_base: bool = True
    refit_n_iter: int = 6
    # which users get the transformer's correction (hir.export.embed.Embedder): the evidence gate
    # fit on val (``checkpoint``), ``open`` (everybody) or ``closed``
    user_gate: str = "checkpoint"
    dim: int | str | None = None
    # a previous version's token table (a run's embeddings/ or a store's versions/<slug>/data/):
    # the refit starts from its tokens so token ids survive the retrain (hir/export/anchor.py)
    hierarchy_anchor: str | None = None
    # with an anchor, also run hierarchy_fit's co-engagement refinement after the anchored start
    # (bottomup builds its tree from scratch, so it never runs on an anchored tree)
    hierarchy_anchor_refine: bool = False
    # users without visible engagement: the knowledge view, or turned toward the recent demand
    # when that beats it on val (hir/export/cold_users.py)
    cold_users: ColdUsers = field(default_factory=ColdUsers)
    # at a served dimension below the rank: the tokens' space (hir/export/project.py)
    token_space: str = "full"
    # export.dim=auto with a basis trained before `hir train` chose the served dimension on val
    dim_fallback: int = 256
    # the text's weight in the space the tokens are fitted and read (hir/export/content_tokens.py)
    token_content: float = 0.0
    # the finest levels of the fitted tree free of the residual bound (hir.nn.HierarchicalTokenizer)
    hierarchy_free_levels: int = 0
    # seedings of each parent's children k-means in the tree's refit (the best of n; level 0 takes 10)
    hierarchy_child_n_init: int = 1
    # the val choices of cold placement score at most this many (val user x candidate) pairs: a
    # seeded sample of users where the catalogue is larger (hir.model.ValSet.limited; null = all)
    val_pairs: float | None = None

    def __post_init__(self) -> None:
        from hir.export.hierarchy import HIERARCHY_FITS
        from hir.export.project import TOKEN_SPACES, served_rank

        self.dim = served_rank(self.dim)  # raises on a bad value before any work
        if self.token_space not in TOKEN_SPACES:
            raise ValueError(f"export.token_space={self.token_space!r}; expected one of {list(TOKEN_SPACES)}")
        if self.hierarchy_fit not in HIERARCHY_FITS:
            raise ValueError(f"export.hierarchy_fit={self.hierarchy_fit!r}; expected one of {list(HIERARCHY_FITS)}")
        self.token_content = float(self.token_content)
        if not math.isfinite(self.token_content) or self.token_content < 0:
            raise ValueError(f"export.token_content={self.token_content}: expected a weight >= 0 (0 = no text in the "
                             "token space)")
        self.hierarchy_free_levels = int(self.hierarchy_free_levels)
        self.hierarchy_child_n_init = int(self.hierarchy_child_n_init)
        if self.hierarchy_child_n_init < 1:
            raise ValueError(f"export.hierarchy_child_n_init={self.hierarchy_child_n_init}: expected a count >= 1")
        if self.hierarchy_free_levels and self.hierarchy_fit == "checkpoint":
            raise ValueError(f"export.hierarchy_free_levels={self.hierarchy_free_levels} needs a tree fitted at export "
                             "(the checkpoint's prototypes are trained within the bound): set "
                             "export.hierarchy_fit=coengage, or export.hierarchy_free_levels=0")
        if self.token_content > 0 and self.hierarchy_fit == "checkpoint":
            raise ValueError("export.token_content > 0 needs a tree fitted at export (the checkpoint's prototypes live "
                             "in the collaborative space alone): set export.hierarchy_fit=coengage, or "
                             "export.token_content=0")


def export_meta(embedder: Any, ckpt: str, ex: ExportConfig, z: Any, codes: list[Any], keys: dict[str, list[str]],
                event_ts: datetime, created: datetime, sg: dict[str, Any], planted: dict[str, Any] | None,
                cold_report: dict[str, Any], seconds: dict[str, float], projection: Any,
                inputs: dict[str, Any]) -> dict[str, Any]:
    """``embeddings/meta.json`` (docs/contracts.md): the model version, sizes, counts, cut-off
    and what the export measured; ``ckpt``: the checkpoint as meta.json records it
    (:func:`hir.export.recorded.record_checkpoint`: relative to the export dir when it is in the
    run dir); ``inputs``: :func:`user_inputs`, taken before :func:`embed_snapshot` released the
    embedder's base."""
    import numpy as np

    st = embedder.store
    norms = np.linalg.norm(z, axis=1)
    meta = {
        # dim: the served width (validate and publish take it from here); export_dim: as configured
        "model_version": embedder.version, "checkpoint": ckpt, "dim": int(z.shape[1]), "export_dim": ex.dim,
        "projection": projection.report if projection is not None else None,
        # where the tokens were fitted and read (the served space is the full rank without a projection)
        "token_space": ex.token_space if projection is not None else "full",
        # the text's weight in that space (hir/export/content_tokens.py; `hir refresh` blends alike)
        "token_content": ex.token_content,
        # the fitted tree's finest levels free of the residual bound (hierarchy/tokenizer.pt keeps it too)
        "hierarchy_free_levels": ex.hierarchy_free_levels,
        # the seedings of each parent's children k-means in the tree's refit
        "hierarchy_child_n_init": ex.hierarchy_child_n_init,
        # how the tree was fitted (a change re-exports: the tokens differ)
        "hierarchy_fit": ex.hierarchy_fit,
        "levels": list(embedder.levels), "top_k": [int(c.shape[1]) for c in codes],
        "counts": {t: len(k) for t, k in keys.items()},
        "cold_start": {t: int((~st.warm[slice(*st.type_range(t))]).sum()) for t in keys},
        "event_timestamp": event_ts.isoformat(), "created": created.isoformat(),
        "visible_splits": list(ex.visible_splits), "norm_min": float(norms.min()), "norm_max": float(norms.max()),
        "supergraph_gain": {f"l{s['level']}": s["gain"] for s in sg["levels"]}, "cold_placement": cold_report,
        "spectral": {"rank": embedder.basis.rank, "stage_base": embedder.basis.stage_base,
                     "filter": embedder.basis.filter.label(), "refit": embedder.refit},
        # the users the transformer's correction reaches (None: no correction, or everybody)
        "user_gate": {"max_events": embedder.gate_max_events, "corrects": embedder.net.corrects},
        # the users' input distribution here, beside train_metrics.json's task.inputs (training, val)
        "inputs": inputs,
        "seconds": seconds,
    }
    return meta | ({"planted_hierarchy": planted} if planted else {})


def user_inputs(embedder: Any) -> dict[str, Any]:
    """The users' input distribution (:func:`hir.model.stats.input_stats` of every user, seed 0)
    on the embedder's base, for meta.json's ``inputs``."""
    import numpy as np

    from hir.model.stats import input_stats

    st = embedder.store
    return input_stats(st, embedder.base, embedder.sampler, np.arange(*st.type_range("user")), 0)


# the token settings an export is reused for only when they match, and what a meta.json written
# before a key was recorded meant by its absence (None: trusted on it, as before)
TOKEN_SETTINGS = {"token_content": 0.0, "hierarchy_free_levels": 0, "hierarchy_fit": None,
                  "hierarchy_child_n_init": 1}


# export settings that do not change what export writes: how many nodes are embedded at a time,
# and how the checkpoint is named (``best`` or its path: meta.json's model_version says which one)
UNWRITTEN_SETTINGS = ("batch_size", "checkpoint")


def settings_digest(export: Mapping[str, Any], seed: int) -> str:
    """A digest (16 hex) of every export setting that shapes the outputs (``export``: the resolved
    ``cfg.export`` as plain data, less :data:`UNWRITTEN_SETTINGS`) and the run's ``seed`` (the
    cold placement's val sample, the tree's fits). meta.json records it, and an export is reused
    only under the same digest: a changed cold placement, val budget or cold-user setting re-exports
    like a changed token setting."""
    from hir.settings import digest

    return digest({"export": {k: v for k, v in export.items() if k not in UNWRITTEN_SETTINGS}, "seed": int(seed)})


def reusable(meta_path: Path, ckpt: Path, force: bool, dim: int | None = None, token_space: str = "full",
             tokens: dict[str, Any] | None = None, settings: str | None = None) -> dict[str, Any] | None:
    """The existing export's meta.json when it is of checkpoint ``ckpt`` at served dimension ``dim``
    (export.dim) with its tokens in ``token_space``, written under the same ``settings`` digest
    (:func:`settings_digest`; a meta.json written before the digest was recorded is checked on
    ``tokens`` alone: every setting of ``tokens``, keys of :data:`TOKEN_SETTINGS`, as recorded), and
    not ``force``; else None."""
    from hir.export.embed import checkpoint_version

    if meta_path.exists() and not force and ckpt.exists():
        meta = json.loads(meta_path.read_text())
        if settings is not None and meta.get("settings_digest") not in (None, settings):
            return None
        same_tokens = meta.get("projection") is None or meta.get("token_space", "served") == token_space
        for key, want in (tokens or {}).items():
            had = meta.get(key, TOKEN_SETTINGS[key])
            same_tokens = same_tokens and (had is None or had == want)
        if meta.get("model_version") == checkpoint_version(ckpt) and meta.get("export_dim") == dim and same_tokens:
            return meta
    return None


def embed_snapshot(embedder: Any, ex: ExportConfig, seed: int) -> tuple[Any, Any, dict[str, Any], Any]:
    """Every snapshot node's embedding (n_nodes, d + 1) at the served dimension, cold entities
    with text placed by their content neighbours there (:mod:`hir.export.cold`; the boost chosen
    on the val split) and cold users as :mod:`hir.export.cold_users` chooses; the vectors the
    tokens read (``export.token_space``: (n_nodes, K + 1) at ``full``, :func:`token_vectors`; the
    served ones otherwise); the placement's report (the users' under ``users``) and the projection
    (None at full rank)."""
    import numpy as np

    from hir.export.cold import place_cold
    from hir.export.cold_users import place_cold_users
    from hir.export.project import resolve_dim, token_vectors
    from hir.model import validation_set

    st = embedder.store
    z = embedder.embed_snapshot(ex.batch_size, seed)
    embedder.release_base()  # nothing below reads it (meta.json's inputs are taken before, user_inputs)
    if not np.isfinite(z).all():
        raise RuntimeError(f"non-finite embeddings from {embedder.checkpoint}: the checkpoint is corrupt or "
                           "training diverged")
    full = z
    z, projection = serve_dim(embedder, z, resolve_dim(ex.dim, embedder.served_dim, ex.dim_fallback), ex.token_space)
    # kept for token_vectors, which compares it with the placed rows: placement then returns new arrays
    # (hir/export/cold.py placed, cold_users); without it, the entities are placed in place (no copy)
    projected = z if projection is not None and ex.token_space == "full" else None
    valset = validation_set(st, None, seed, "masked_new").limited(ex.val_pairs, seed) if len(st.val_pairs) else None
    z, report = place_cold(z, st, valset, ex.cold, inplace=projected is None)
    # after the entities are placed: the cold users are chosen against the final candidates. In
    # place: z is place_cold's copy where `projected` is kept, and nothing else reads it otherwise
    z, report["users"] = place_cold_users(z, st, valset, ex.cold_users, inplace=True)
    z_tokens = token_vectors(full, projected, z, projection) if projected is not None else z
    return z, z_tokens, report, projection


def serve_dim(embedder: Any, z: Any, dim: int | None, token_space: str = "full") -> tuple[Any, Any]:
    """``export.dim``: the network's (n_nodes, K + 1) embeddings projected onto d served
    directions (:mod:`hir.export.project`), and at ``token_space=served`` the tokenizer moved
    into that space, or both as they are at full rank. Before cold placement, so `hir refresh`
    (knowledge view, then the saved projection, then placement) writes what the export would."""
    from hir.export.project import describe, fit_projection, served_tokenizer

    st = embedder.store
    is_user = st.node_type == st.types.index("user")
    projection = fit_projection(z, is_user, st.warm, dim, embedder.version)
    if projection is not None:
        z = projection.apply(z, is_user)
        if token_space == "served":
            embedder.use_tokenizer(served_tokenizer(embedder.tokenizer, projection))
    log.info("served dimension: %s%s", describe(projection), f" {projection.report}" if projection else "")
    return z, projection


def blended_tokens(embedder: Any, z_tok: Any, weight: float) -> Any:
    """``export.token_content``: the token vectors (n_nodes, w) blended with every node's text
    (:class:`hir.export.content_tokens.Blended`, read as an (n_nodes, w - 1 + T + 1) array a block
    at a time), and the embedder's tokenizer widened to that space (the refit that follows sets
    its prototypes)."""
    from hir.export.content_tokens import Blended, store_text, widened

    st = embedder.store
    if not int(st.layout["text_dim"]):  # no entity has text: the blend would change nothing
        log.info("token space: export.token_content=%.3g but no entity has text; the collaborative directions alone",
                 weight)
        return z_tok
    out = Blended(z_tok, store_text(st), int(st.layout["text_dim"]), weight)
    embedder.use_tokenizer(widened(embedder.tokenizer, out.shape[1] - 1))
    log.info("token space: collaborative directions blended with text at weight %.3g (width %d)", weight,
             out.shape[1] - 1)
    return out


def fitted_rows(embedder: Any) -> Any:
    """Global ids (m,) of the entities the token tree is fitted on: the warm entities of the
    engaged types (those the super-graph counts)."""
    import numpy as np

    st = embedder.store
    engaged = [st.types.index(t) for t in embedder.snapshot.engaged_types()]
    return np.flatnonzero(np.isin(st.node_type, engaged) & st.warm)


def refit_hierarchy(embedder: Any, z: Any, seed: int, child_n_init: int = 1) -> None:
    """``export.hierarchy_fit=entities``: tokenise with the checkpoint's tree refitted on the exported
    directions of the warm entities of the engaged types (those the super-graph counts)."""
    from hir.export.hierarchy import refit_tokenizer

    rows = fitted_rows(embedder)
    t0 = time.perf_counter()
    embedder.use_tokenizer(refit_tokenizer(embedder.tokenizer, embedder.semantic_rows(z, rows), seed,
                                           child_n_init=child_n_init))
    log.info("hierarchy refitted on the directions of %d warm entities in %.1fs", len(rows), time.perf_counter() - t0)


def anchored_hierarchy(embedder: Any, z: Any, anchor_dir: str, keys: dict[str, list[str]]) -> dict[str, Any]:
    """``export.hierarchy_anchor``: the refit of :func:`refit_hierarchy` started from a previous
    version's tokens (:func:`hir.export.anchor.anchor_tree`) instead of a seeded k-means. Returns
    what the anchor covered (path, entities fitted and anchored), the fitted ``rows`` (m,) and
    their anchor tokens ``previous`` (per level (m,), -1 where the anchor lacks the entity)."""
    import numpy as np

    from hir.export.anchor import anchor_tree, read_anchor

    st = embedder.store
    rows = fitted_rows(embedder)
    t0 = time.perf_counter()
    anchor = read_anchor(anchor_dir, keys, embedder.levels)
    previous = []
    for lvl in range(len(embedder.levels)):
        prev = np.full(st.n_nodes, -1, np.int64)
        for t, levels in anchor.items():
            lo = st.type_range(t)[0]
            prev[lo:lo + len(levels[lvl])] = levels[lvl]
        previous.append(prev[rows])
    anchor_tree(embedder.tokenizer, embedder.semantic_rows(z, rows), previous)
    anchored = int((np.stack(previous) >= 0).all(0).sum())
    log.info("hierarchy refitted from the tokens of %s (%d of %d warm entities anchored) in %.1fs", anchor_dir,
             anchored, len(rows), time.perf_counter() - t0)
    return {"path": str(anchor_dir), "fitted": len(rows), "anchored": anchored, "rows": rows, "previous": previous}


def anchor_report(anchored: dict[str, Any], top1: list[Any]) -> dict[str, Any]:
    """``hierarchy_anchor`` of supergraph.json: the anchor's path and coverage, and per level the
    share of anchored warm entities whose exported top-1 token (``top1``: per level, global ids)
    is still the anchor's."""
    from hir.export.anchor import anchor_agreement

    agree = anchor_agreement(anchored["previous"], [t[anchored["rows"]] for t in top1])
    log.info("tokens kept from the anchor per level: %s of %d entities", agree["agreement"], agree["compared"])
    return {k: anchored[k] for k in ("path", "fitted", "anchored")} | agree


def fitted_hierarchy(embedder: Any, z: Any, fit: str, visible_splits: list[str], seed: int) -> None:
    """``export.hierarchy_fit`` ``coengage`` or ``bottomup`` (:func:`hir.export.fits.fit_tree`) on
    the warm entities of the engaged types and their visible pairs, after the refit: the
    tokenizer in use is fitted in place, so the tokens and ``hierarchy/tokenizer.pt`` agree."""
    import numpy as np

    from hir.export.fits import fit_tree
    from hir.export.supergraph import engagement_pairs

    st = embedder.store
    t0 = time.perf_counter()
    rows = fitted_rows(embedder)
    directions = embedder.semantic_rows(z, rows)
    users, ents = engagement_pairs(embedder.snapshot, st.offsets, tuple(visible_splits))
    pos = np.minimum(np.searchsorted(rows, ents), len(rows) - 1)
    seen = rows[pos] == ents  # pairs of entities outside the fitted rows (cold by definition) drop out
    fit_tree(embedder.tokenizer, directions, fit, (users[seen], pos[seen]), int(st.offsets[1] - st.offsets[0]), seed)
    log.info("hierarchy fit %s on %d visible pairs of %d entities in %.1fs", fit, int(seen.sum()), len(rows),
             time.perf_counter() - t0)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Export embeddings + tokens for every snapshot entity; returns counts, version, stats."""
    from hydra.utils import instantiate

    from hir.export.embed import Embedder, resolve_checkpoint
    from hir.export.hierarchy import hierarchy_diagnostics
    from hir.export.recorded import record_checkpoint
    from hir.export.tables import keys_and_texts, write_embeddings, write_prototypes

    ex: ExportConfig = instantiate(cfg.export)
    emb_dir, hier_dir = Path(cfg.paths.embeddings_dir), Path(cfg.paths.hierarchy_dir)
    ckpt = resolve_checkpoint(ex.checkpoint, Path(cfg.paths.checkpoint_dir))
    tokens = {"token_content": ex.token_content, "hierarchy_free_levels": ex.hierarchy_free_levels,
              "hierarchy_fit": ex.hierarchy_fit, "hierarchy_child_n_init": ex.hierarchy_child_n_init}
    digest = settings_digest(OmegaConf.to_container(cfg.export, resolve=True), int(cfg.seed))
    if (meta := reusable(emb_dir / META_FILE, ckpt, bool(cfg.force), ex.dim, ex.token_space, tokens, digest)) is not None:
        log.info("embeddings of model %s exist at %s; reusing them (force=true re-exports)", meta["model_version"], emb_dir)
        return meta
    # a re-export invalidates the old one first: a kill below must not leave old meta.json over new files
    (emb_dir / META_FILE).unlink(missing_ok=True)
    for d in (emb_dir, hier_dir):  # what a killed export left under temporary names
        remove_stale_tmp(d)
    t0 = time.perf_counter()
    embedder = Embedder(ckpt, cfg.paths.graph_dir, cfg.paths.content_dir, tuple(ex.visible_splits), ex.refit_base,
                        ex.refit_n_iter, int(cfg.seed), ex.user_gate)
    inputs = user_inputs(embedder)  # before embed_snapshot releases the base
    z, z_tok, cold_report, projection = embed_snapshot(embedder, ex, int(cfg.seed))
    t_embed = time.perf_counter() - t0
    t_fit = time.perf_counter()
    keys, texts = keys_and_texts(embedder.snapshot, embedder.store)
    anchored = None
    z_ref = z_tok  # the k-means reference is fitted on the exported vectors, blend or not
    if ex.token_content > 0:
        z_tok = blended_tokens(embedder, z_tok, ex.token_content)
    if ex.hierarchy_free_levels:  # the fits below set the prototypes; the tree they fit has its finest levels free
        embedder.use_tokenizer(embedder.tokenizer.reshaped(free_levels=ex.hierarchy_free_levels))
    # the tree is fitted, and every row tokenised, on z_tok (export.token_space); z is what is served
    if ex.hierarchy_anchor and ex.hierarchy_fit != "checkpoint":
        anchored = anchored_hierarchy(embedder, z_tok, str(ex.hierarchy_anchor), keys)
    elif ex.hierarchy_fit != "checkpoint":
        refit_hierarchy(embedder, z_tok, int(cfg.seed), ex.hierarchy_child_n_init)
    if ex.hierarchy_fit in ("coengage", "bottomup") and (anchored is None or (
            ex.hierarchy_anchor_refine and ex.hierarchy_fit == "coengage")):
        fitted_hierarchy(embedder, z_tok, ex.hierarchy_fit, ex.visible_splits, int(cfg.seed))
    t_fit = time.perf_counter() - t_fit
    codes, weights = embedder.tokens(z_tok)
    top1 = [c[:, 0].astype("int64") for c in codes]
    created, event_ts = datetime.now(UTC), datetime.fromisoformat(embedder.store.visible_end)
    emb_dir.mkdir(parents=True, exist_ok=True)
    hier_dir.mkdir(parents=True, exist_ok=True)
    write_embeddings(emb_dir, embedder, keys, z, codes, weights, event_ts, created)
    if projection is not None:  # `hir refresh` projects new entities with it
        projection.save(emb_dir / PROJECTION_FILE)
    else:
        (emb_dir / PROJECTION_FILE).unlink(missing_ok=True)
    write_prototypes(hier_dir / "prototypes.parquet", embedder, z_tok, top1, texts, ex.label_members)
    embedder.save_tokenizer(hier_dir / TOKENIZER_FILE)
    sg, planted = hierarchy_diagnostics(embedder.snapshot, embedder.store.offsets, embedder.store.node_type, keys,
                                        top1, embedder.levels, z_ref if ex.kmeans_reference else None, int(cfg.seed))
    sg["hierarchy_fit"] = ex.hierarchy_fit
    if anchored is not None:
        sg["hierarchy_anchor"] = anchor_report(anchored, top1)
    write_text_atomic(hier_dir / "supergraph.json", json.dumps(sg, indent=2))
    meta = export_meta(embedder, record_checkpoint(ckpt, emb_dir), ex, z, codes, keys, event_ts, created, sg,
                       planted, cold_report, {"embed": round(t_embed, 2), "hierarchy_fit": round(t_fit, 2),
                                              "total": round(time.perf_counter() - t0, 2)}, projection, inputs)
    meta["settings_digest"] = digest
    # meta.json last and atomic: its presence marks a complete export (what `reusable` checks)
    write_text_atomic(emb_dir / META_FILE, json.dumps(meta, indent=2))
    log.info("exported %s (cold start %s) as model %s in %.1fs; super-graph density gain %s%s",
             meta["counts"], meta["cold_start"], embedder.version, meta["seconds"]["total"],
             {k: round(v or 0, 1) for k, v in meta["supergraph_gain"].items()},
             f"; planted-hierarchy NMI {planted.get('product', planted.get('all'))}" if planted else "")
    print(f"embeddings: {emb_dir}\nhierarchy: {hier_dir}")
    return meta
