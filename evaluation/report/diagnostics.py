"""Representation diagnostics of an export: token usage per level, NMI of tokens against a known
taxonomy (or the synthetic data's planted interests), super-graph density gain, token stability
between two trainings, the labels of the most used prototypes, and a 2-D map of embeddings."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import normalized_mutual_info_score

from hir.data.snapshot import Snapshot
from hir.errors import InputError
from hir.export.hierarchy import taxonomy_labels
from hir_evaluation.sources.hir import embeddings_meta, read_embeddings, token_levels

log = logging.getLogger(__name__)


def top1(frame: pl.DataFrame, level: int) -> np.ndarray:
    """Each row's highest-weight token of ``level`` (-1 when it has none)."""
    tok = frame[f"tokens_l{level}"]
    wts = frame[f"weights_l{level}"]
    best = wts.list.arg_max()
    return tok.list.get(best.fill_null(0), null_on_oob=True).fill_null(-1).to_numpy().astype(np.int64)


def token_usage(frames: dict[str, pl.DataFrame], vocab: list[int] | None) -> list[dict[str, Any]]:
    """Per level: prototypes used as any entity's top-1 token, their share of the vocabulary, the
    perplexity of the top-1 distribution (effective number of prototypes) and the sorted counts."""
    levels = min(token_levels(f.columns) for f in frames.values())
    out = []
    for level in range(levels):
        tokens = np.concatenate([top1(f, level) for f in frames.values()])
        tokens = tokens[tokens >= 0]
        size = int(vocab[level]) if vocab and level < len(vocab) else int(tokens.max(initial=-1)) + 1
        counts = np.bincount(tokens, minlength=size)
        p = counts[counts > 0] / max(counts.sum(), 1)
        out.append({
            "level": level,
            "vocab": size,
            "used": int((counts > 0).sum()),
            "used_fraction": float((counts > 0).sum() / max(size, 1)),
            "perplexity": float(np.exp(-(p * np.log(p)).sum())) if p.size else 0.0,
            "counts": sorted((int(c) for c in counts), reverse=True),
        })
    return out


def nmi_table(frame: pl.DataFrame, labels: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """NMI between each level's top-1 token and each known labelling, over entities that have both.

    ``frame`` holds ``node_id`` and the token columns of one entity type.
    """
    ids = frame["node_id"].to_numpy()
    out: dict[str, dict[str, float]] = {}
    for level in range(token_levels(frame.columns)):
        tokens = top1(frame, level)
        row: dict[str, float] = {}
        for name, lab in labels.items():
            y = lab[ids]
            keep = (y >= 0) & (tokens >= 0)
            if keep.sum() > 1:
                row[name] = float(normalized_mutual_info_score(y[keep], tokens[keep]))
        out[f"l{level}"] = row
    return out


def align_tokens(a: np.ndarray, b: np.ndarray) -> dict[int, int]:
    """Map run-B prototype ids onto run-A ids maximising top-1 agreement (Hungarian matching):
    prototype ids are arbitrary per training, so raw ids of two seeds never match."""
    size = int(max(a.max(initial=0), b.max(initial=0))) + 1
    table = np.zeros((size, size))
    np.add.at(table, (b, a), 1)
    rows, cols = linear_sum_assignment(-table)
    return {int(r): int(c) for r, c in zip(rows, cols)}


def token_stability(first: pl.DataFrame, second: pl.DataFrame) -> list[dict[str, float]]:
    """Per level: mean Jaccard of the (aligned) top-k token sets of the same entities in two
    exports, the top-1 agreement after alignment, and the alignment-free NMI of top-1 tokens."""
    joined = first.join(second, on="entity_id", how="inner", suffix="_b")
    out = []
    for level in range(min(token_levels(first.columns), token_levels(second.columns))):
        a_top = top1(joined, level)
        b_top = top1(joined.select(pl.col(f"tokens_l{level}_b").alias(f"tokens_l{level}"),
                                   pl.col(f"weights_l{level}_b").alias(f"weights_l{level}")), level)
        mapping = align_tokens(a_top, b_top)
        jac = []
        for ta, tb in zip(joined[f"tokens_l{level}"].to_list(), joined[f"tokens_l{level}_b"].to_list()):
            sa, sb = set(ta or []), {mapping.get(int(t), -1) for t in (tb or [])}
            jac.append(len(sa & sb) / len(sa | sb) if sa | sb else 1.0)
        mapped = np.array([mapping.get(int(t), -1) for t in b_top])
        out.append({
            "level": level,
            "entities": joined.height,
            "jaccard": float(np.mean(jac)) if jac else float("nan"),
            "top1_agreement": float((mapped == a_top).mean()) if len(a_top) else float("nan"),
            "nmi": float(normalized_mutual_info_score(a_top, b_top)) if len(a_top) > 1 else float("nan"),
        })
    return out


def supergraph_gain(hierarchy_dir: Path) -> dict[str, Any] | None:
    """``hierarchy/supergraph.json`` (raw user->entity density and its projection onto each
    level's prototypes), with ``gain`` = projected / raw density filled in where missing: a denser
    super-graph shares signal across sparse users."""
    path = Path(hierarchy_dir) / "supergraph.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    raw = data.get("raw_density", (data.get("raw") or {}).get("density"))
    for entry in data.get("levels") or []:
        dens = entry.get("density") if isinstance(entry, dict) else None
        if entry.get("gain") is None and isinstance(dens, int | float) and isinstance(raw, int | float) and raw > 0:
            entry["gain"] = float(dens / raw)
    data["raw_density"] = raw
    return data


def top_prototypes(hierarchy_dir: Path, per_level: int) -> list[dict[str, Any]]:
    """The ``per_level`` most used prototypes of each level with their readable labels."""
    path = Path(hierarchy_dir) / "prototypes.parquet"
    if not path.exists():
        return []
    protos = pl.read_parquet(path, columns=["level", "proto_id", "parent_id", "label", "usage"])
    top = protos.sort(["level", "usage"], descending=[False, True]).group_by("level", maintain_order=True).head(per_level)
    return top.to_dicts()


def level0_tokens(hierarchy_dir: Path, frame: pl.DataFrame, labels: dict[str, np.ndarray],
                  snap: Snapshot, entity_type: str) -> list[dict[str, Any]]:
    """Per level-0 token, what a person checks its label against: its label, usage and top
    members (``hierarchy/prototypes.parquet``) and, where ``entity_type`` has a taxonomy
    (``labels``: :func:`taxonomy_labels`), its purity at depth 1: the share of its labelled
    members in its most frequent top-level category, and that category's key."""
    path = Path(hierarchy_dir) / "prototypes.parquet"
    if not path.exists():
        return []
    protos = pl.read_parquet(path).filter(pl.col("level") == 0).sort("proto_id")
    members = protos["members"].to_list() if "members" in protos.columns else [[] for _ in range(protos.height)]
    out = [{"token": int(t), "label": lab, "usage": float(u), "members": list(m or [])[:3]}
           for t, lab, u, m in zip(protos["proto_id"], protos["label"], protos["usage"], members)]
    dept = labels.get("taxonomy_d1")
    if dept is None or "tokens_l0" not in frame.columns:
        return out
    ids = frame["node_id"].to_numpy()
    tok, cls = top1(frame, 0), dept[ids]
    names = snap.keys("category").cast(pl.String).to_list() if snap.has_nodes("category") else []
    for row in out:
        c = cls[(tok == row["token"]) & (cls >= 0)]
        if len(c):
            vals, counts = np.unique(c, return_counts=True)
            best = int(np.argmax(counts))
            row["purity"] = float(counts[best] / len(c))
            row["category"] = names[vals[best]] if vals[best] < len(names) else str(vals[best])
    return out


def embedding_map(frame: pl.DataFrame, points: int, seed: int) -> dict[str, list]:
    """2-D map (UMAP when the package is installed, else PCA) of up to ``points`` embeddings,
    coloured by their coarsest top-1 token."""
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(frame.height, size=min(points, frame.height), replace=False))
    sub = frame[idx]
    dim = int(sub["embedding"].list.len().max() or 0)
    x = sub["embedding"].cast(pl.List(pl.Float32)).list.to_array(dim).to_numpy().astype(np.float64)
    try:
        import umap  # optional; not a dependency of hir

        xy, method = umap.UMAP(n_components=2, random_state=seed).fit_transform(x), "umap"
    except ImportError:
        x = x - x.mean(0)
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        xy, method = x @ vt[:2].T, "pca"
    color = top1(sub, 0) if "tokens_l0" in sub.columns else np.zeros(len(idx), dtype=np.int64)
    return {"x": xy[:, 0].tolist(), "y": xy[:, 1].tolist(), "token": color.tolist(), "method": method}


def diagnostics_section(
    emb_dir: Path, hier_dir: Path, snap: Snapshot, entity_type: str, top: int, map_points: int, seed: int,
    compare_dir: Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """metrics.json's ``diagnostics`` section of the export in ``emb_dir``/``hier_dir`` and the
    2-D map points (None without an export). ``compare_dir``: another export's embeddings/, for
    token stability."""
    types = [t for t in ("user", entity_type) if (emb_dir / f"{t}.parquet").exists()]
    if not types:
        return {"token_usage": [], "nmi": {}, "supergraph": None, "stability": None, "top_prototypes": []}, None
    frames = {t: read_embeddings(emb_dir, t) for t in types}
    out: dict[str, Any] = {"token_usage": token_usage(frames, embeddings_meta(emb_dir).get("levels"))}
    out["nmi"] = {}
    labels: dict[str, np.ndarray] = {}
    if entity_type in frames:
        labels = taxonomy_labels(snap, entity_type)
        out["nmi"][entity_type] = nmi_table(frames[entity_type], labels) if labels else {}
    out["supergraph"] = supergraph_gain(hier_dir)
    out["top_prototypes"] = top_prototypes(hier_dir, top)
    out["level0_tokens"] = level0_tokens(hier_dir, frames[entity_type], labels, snap, entity_type) \
        if entity_type in frames else []
    out["stability"] = None
    if compare_dir:
        other_path = Path(compare_dir) / f"{entity_type}.parquet"
        if not other_path.exists():
            raise InputError(f"eval.compare_embeddings_dir={compare_dir}: {other_path} is missing; point it at another "
                             "run's embeddings/")
        out["stability"] = token_stability(frames[entity_type], read_embeddings(Path(compare_dir), entity_type))
    points = embedding_map(frames[entity_type], map_points, seed) if entity_type in frames else None
    return out, points
