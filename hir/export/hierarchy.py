"""The exported hierarchy against what it should carry: the product taxonomy, and a plain k-means.

- :func:`taxonomy_labels`: every entity's category ancestor per taxonomy depth (and, for the
  synthetic data, its planted interests).
- :func:`taxonomy_nmi`, :func:`taxonomy_purity_table`: NMI and purity of each level's top-1 token
  against those labels.
- :func:`kmeans_reference`: tokens from one plain k-means per level (the level's size) on the
  exported vectors, with the same concentration and taxonomy NMI: the reference the learned
  hierarchy has to beat (issue 19).
- :func:`refit_tokenizer`: the tokenizer's own tree refitted by hierarchical k-means on the
  exported directions of the warm entities (``export.hierarchy_fit=entities``).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl
import torch
from sklearn.metrics import normalized_mutual_info_score

from hir.data.schema import ENTITY_TYPES
from hir.data.snapshot import Snapshot
from hir.export.heldout import heldout_concentration, taxonomy_purity, token_coverage, token_prediction
from hir.export.supergraph import engagement_pairs, planted_recovery, supergraph_stats
from hir.nn.hierarchy import HierarchicalTokenizer

log = logging.getLogger(__name__)

HIERARCHY_FITS = ("checkpoint", "entities", "coengage", "bottomup")


def taxonomy_labels(snap: Snapshot, entity_type: str) -> dict[str, np.ndarray]:
    """Known classes per entity node_id (-1 = unknown): ``taxonomy_d<k>`` = the category ancestor at
    depth k (1 = root) through ``<type>__in_category__category`` and the child_of edges, and for
    the synthetic data the planted ``truth_coarse`` / ``truth_fine`` interests."""
    n = snap.num_nodes(entity_type)
    out: dict[str, np.ndarray] = {}
    in_cat = snap.edges(f"{entity_type}__in_category__category")
    parents = snap.edges("category__child_of__category")
    if in_cat is not None and snap.has_nodes("category"):
        n_cat = snap.num_nodes("category")
        parent = np.full(n_cat, -1)
        if parents is not None:
            parent[parents["src_id"].to_numpy()] = parents["dst_id"].to_numpy()
        # path root -> leaf for every category, by walking up (taxonomies are shallow)
        paths: list[list[int]] = []
        for c in range(n_cat):
            path, node = [], c
            while node >= 0 and len(path) < 32:
                path.append(node)
                node = parent[node]
            paths.append(path[::-1])
        depth = max((len(p) for p in paths), default=0)
        leaf = np.full(n, -1)
        first = in_cat.unique(subset=["src_id"], keep="first")
        leaf[first["src_id"].to_numpy()] = first["dst_id"].to_numpy()
        for d in range(1, depth + 1):
            labels = np.array([paths[c][d - 1] if c >= 0 and len(paths[c]) >= d else -1 for c in leaf])
            if (labels >= 0).sum() > 1:
                out[f"taxonomy_d{d}"] = labels
    truth_path = snap.dir / "synthetic_truth.parquet"
    if truth_path.exists():
        truth = pl.read_parquet(truth_path).filter(pl.col("entity_type") == entity_type)
        keyed = snap.nodes(entity_type).select("node_id", "key").join(truth, on="key", how="inner")
        for col in ("coarse", "fine"):
            if col in keyed.columns:
                labels = np.full(n, -1)
                labels[keyed["node_id"].to_numpy()] = keyed[col].to_numpy()
                out[f"truth_{col}"] = labels
    return out


def _per_taxonomy(labels: dict[str, np.ndarray], offset: int, top1: list[np.ndarray],
                  score: Callable[[np.ndarray, np.ndarray], float]) -> list[dict[str, float]]:
    """Per level, ``{labelling: score(labels, top-1 tokens)}`` over the labelled entities of each
    ``taxonomy_d<k>`` labelling (the other labellings are skipped)."""
    out: list[dict[str, float]] = [{} for _ in top1]
    for name, lab in labels.items():
        if not name.startswith("taxonomy_"):
            continue
        rows = np.flatnonzero(lab >= 0)
        for lvl, t1 in enumerate(top1):
            out[lvl][name] = float(score(lab[rows], t1[offset + rows]))
    return out


def taxonomy_nmi(labels: dict[str, np.ndarray], offset: int, top1: list[np.ndarray]) -> list[dict[str, float]]:
    """Per level, ``{labelling: NMI}`` of the top-1 token against each ``taxonomy_d<k>`` labelling.

    Args:
        labels: :func:`taxonomy_labels` of one entity type ((n_type,) local ids, -1 = unknown).
        offset: the type's first global id.
        top1: per level, (n_nodes,) every node's top-1 token (global ids).
    """
    return _per_taxonomy(labels, offset, top1, normalized_mutual_info_score)


def taxonomy_purity_table(labels: dict[str, np.ndarray], offset: int, top1: list[np.ndarray]) -> list[dict[str, float]]:
    """Per level, ``{labelling: purity}``: the share of labelled entities in their token's most
    frequent class (:func:`hir.export.heldout.taxonomy_purity`), against each ``taxonomy_d<k>``.
    Arguments as :func:`taxonomy_nmi`."""
    return _per_taxonomy(labels, offset, top1, taxonomy_purity)


def kmeans_reference(z: np.ndarray, fit_rows: np.ndarray, users: np.ndarray, entities: np.ndarray, n_users: int,
                     levels: tuple[int, ...], seed: int, labels: dict[str, np.ndarray] | None = None,
                     offset: int = 0) -> tuple[dict[str, Any], list[np.ndarray]]:
    """One plain k-means per level on the exported vectors, and the figures of its tokens.

    Each level gets its own k-means with K_l clusters (no tree), fitted on ``z[fit_rows]`` by
    scikit-learn's MiniBatchKMeans (k-means++ seeding, batches of 4096, seeded). Measured on
    completejourney (92,358 x 129, 2 cores): 50 s for levels 8/64/512, where Lloyd's KMeans took
    278 s (and gave concentrations of 1.37-1.56, its clusters far less even).

    Args:
        z: (n_nodes, dim) exported embeddings, global-id order.
        fit_rows: (m,) global ids the k-means is fitted on and assigns (the engaged types' entities).
        users, entities: (E,) distinct user -> entity edges (user id, global entity id).
        n_users: users of the snapshot.
        levels: K_l per level.
        seed: the k-means seed.
        labels, offset: :func:`taxonomy_labels` of products and their first global id (for NMI).

    Returns:
        (the ``kmeans_reference`` entry of ``hierarchy/supergraph.json``, per level (n_nodes,) its
        top-1 token, -1 outside ``fit_rows``).
    """
    from sklearn.cluster import MiniBatchKMeans

    t0 = time.perf_counter()
    x = np.ascontiguousarray(z[fit_rows], np.float32)
    top1 = []
    for k in levels:
        if len(x) < k:
            raise ValueError(f"k-means reference: {len(x)} entities to fit but level size {k}; lower "
                             "model.net.hierarchy.levels")
        km = MiniBatchKMeans(n_clusters=int(k), random_state=seed, n_init=1, batch_size=4096, max_iter=100)
        assign = np.full(len(z), -1, np.int64)
        assign[fit_rows] = km.fit(x).labels_  # fit labels x with the final centres, as predict(x) would again
        top1.append(assign)
    # the same random baseline (shuffle seed 0) as the learned tokens' figures
    sg = supergraph_stats(users, entities, n_users, 1, top1, levels)
    nmi = taxonomy_nmi(labels, offset, top1) if labels else [{} for _ in levels]
    purity = taxonomy_purity_table(labels, offset, top1) if labels else [{} for _ in levels]
    out = {
        "method": "sklearn MiniBatchKMeans per level (k-means++, batch 4096, 100 epochs max), "
                  "on the exported embeddings of the engaged types' entities",
        "entities": len(fit_rows), "seed": int(seed), "seconds": round(time.perf_counter() - t0, 2),
        "levels": [{"level": s["level"], "prototypes": s["prototypes"], "edges": s["edges"],
                    "random_edges": s["random_edges"], "concentration": s["concentration"],
                    "taxonomy_nmi": nmi[s["level"]], "taxonomy_purity": purity[s["level"]]} for s in sg["levels"]],
    }
    return out, top1


@torch.no_grad()
def refit_tokenizer(tokenizer: HierarchicalTokenizer, directions: np.ndarray, seed: int,
                    iters: int = 25, n_init: int = 10, child_n_init: int = 1) -> HierarchicalTokenizer:
    """A copy of ``tokenizer`` whose tree is refitted by its own hierarchical k-means
    (:meth:`HierarchicalTokenizer.init_from_data`) on ``directions`` (n, dim): the exported unit
    directions of the entities the tokens should group. The tree, sizes, temperature and
    residual bound stay; the input is not modified. Level 0 is the best of ``n_init`` seedings:
    on online_retail's export two seeds' level-0 tokens agreed 0.30 with one and about 0.49 with
    ten (benchmarks/hierarchy.py's aligned top-1 agreement), for 3 s more. Each parent's children
    are the best of ``child_n_init`` seedings."""
    if len(directions) < tokenizer.levels[0]:
        raise ValueError(f"hierarchy refit: {len(directions)} entities for {tokenizer.levels[0]} level-0 "
                         "prototypes; set export.hierarchy_fit=checkpoint")
    out = copy.deepcopy(tokenizer)
    gen = torch.Generator().manual_seed(int(seed))
    out.init_from_data(torch.from_numpy(np.ascontiguousarray(directions, np.float32)), iters, gen, n_init,
                       child_n_init)
    return out


def hierarchy_diagnostics(snapshot: Snapshot, offsets: np.ndarray, node_type: np.ndarray, keys: dict[str, list[str]],
                          top1: list[np.ndarray], levels: tuple[int, ...], z: np.ndarray | None = None,
                          seed: int = 0) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The export's hierarchy diagnostics: :func:`supergraph_stats` of every user -> entity pair of
    the snapshot against the engaged entity types, each level's NMI against the product taxonomy
    (``taxonomy_nmi``, when products have categories), with ``z`` (n_nodes, dim) the exported
    embeddings the same figures for a plain k-means on them (``kmeans_reference``,
    :func:`kmeans_reference`), and :func:`planted_recovery` (None without a
    planted hierarchy). top1: per level, (n_nodes,) every node's top-1 token."""
    users, ents = engagement_pairs(snapshot, offsets)
    engaged = np.unique(node_type[ents]) if len(ents) else np.zeros(0, np.int64)
    n_ent = int(np.isin(node_type, engaged).sum())
    n_users = int(offsets[1] - offsets[0])
    sg = supergraph_stats(users, ents, n_users, n_ent, top1, levels)
    pi = ENTITY_TYPES.index("product")
    labels = taxonomy_labels(snapshot, "product") if "product" in keys else {}
    labels = {k: v for k, v in labels.items() if k.startswith("taxonomy_")}
    for entry, nmi, purity in zip(sg["levels"], taxonomy_nmi(labels, int(offsets[pi]), top1),
                                  taxonomy_purity_table(labels, int(offsets[pi]), top1)):
        entry["taxonomy_nmi"], entry["taxonomy_purity"] = nmi, purity
    km_top1 = None
    if z is not None and len(ents):
        sg["kmeans_reference"], km_top1 = kmeans_reference(z, np.flatnonzero(np.isin(node_type, engaged)), users, ents,
                                                           n_users, levels, seed, labels, int(offsets[pi]))
    sg["heldout"] = heldout_figures(snapshot, offsets, top1, levels, km_top1)
    return sg, planted_recovery(snapshot, keys, offsets, top1)


def heldout_figures(snapshot: Snapshot, offsets: np.ndarray, top1: list[np.ndarray], levels: tuple[int, ...],
                    km_top1: list[np.ndarray] | None) -> dict[str, Any] | None:
    """The tokens judged on the test period's engagement, which neither the model nor the
    prototypes saw (hir/export/heldout.py; issue 34): per level the popularity-matched
    concentration, next-period token prediction (against the tokens' popularity) and the
    history's coverage of the test user-token edges, for the exported tokens and (``km_top1``,
    per level (n_nodes,)) the k-means reference. None without test-period engagement."""
    test = engagement_pairs(snapshot, offsets, ("test",))
    if not len(test[0]):
        return None
    train, val = engagement_pairs(snapshot, offsets, ("train",)), engagement_pairs(snapshot, offsets, ("val",))
    history = (np.concatenate([train[0], val[0]]), np.concatenate([train[1], val[1]]))
    out: dict[str, Any] = {"test_pairs": len(test[0])}
    for name, tokens in (("tokens", top1), ("kmeans_reference", km_top1)):
        if tokens is None:
            continue
        conc = heldout_concentration(*test, tokens, levels)
        pred = token_prediction(history, val, train, test, tokens, levels)
        cov = token_coverage(history, test, tokens, levels)
        out["raw_coverage"] = cov["raw_coverage"]
        out[name] = [{"level": c["level"], "concentration": c["concentration"], "random_sd": c["random_sd"],
                      "log_loss": p["hir"]["log_loss"], "log_loss_popularity": p["popularity"]["log_loss"],
                      "recall@5": p["hir"]["recall@5"], "recall@5_popularity": p["popularity"]["recall@5"],
                      "coverage": v["coverage"], "random_coverage": v["random_coverage"]}
                     for c, p, v in zip(conc, pred, cov["levels"])]
    return out
