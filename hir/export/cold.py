"""Cold-start entities placed by their content neighbours in the collaborative space.

An entity without visible engagement has no spectral base; the network's knowledge view embeds it
from content and metadata alone. That view is trained (cross-view distillation, alignment) to
land where engagement would have put the entity, but a content model can only predict a blurred
version of a sharp collaborative direction, and a blurred direction scores low against every
user: measured on online_retail (3,677 products, 79 cold), no cold product reached any user's
masked top-20 (item-cold recall@20 0.0, the content-only arm 0.028).

Here a cold entity with text takes the similarity-weighted mean of its ``k`` nearest warm
entities of the same type (cosine of the text vectors) in the exported space (their ``a s``
part, so popular neighbours weigh more), plus ``beta`` of its own knowledge-view direction less
the centre of the type's knowledge views (:func:`own_directions`: the trained view puts every
product near one direction, so only its text-specific part keeps two cold entities with different
texts apart), and the neighbours' mean scale
times ``boost``. ``boost`` is chosen among ``boosts`` on the validation split (masked new-to-user
recall@20, the headline protocol): the one with the best recall of the cold positives among those
whose overall recall is not, beyond the paired noise over val users, more than ``tolerance`` below
the best boost's (:func:`choose_boost`); without validation users whose positives include cold
entities, the first value is kept. Entities without text keep the
knowledge view.

Measured on online_retail (k 20, beta 0.1, boost 2; test, history masked): recall@20 new to the
user 0.0707 -> 0.0885, item-cold 0.0 -> 0.086, full ranking 0.1533 -> 0.1509. On the default
pipeline's run q673 (seed 42; `hir evaluate eval.hir_source=files`, test masked): the raw direction
at beta 0.1 with the point boost rule (boost 1.5) new to the user 0.0988, item-cold 0.0818, 88.6%
of the cold products told apart (validate failed); the centred one at beta 0.1 with the noise
rule (boost 1.75) 0.0987 / 0.1444, 100%. The base arm of benchmarks/learner.py (seed 0): raw, point
rule (1.5) 0.1018 / 0.0489; centred at beta 0.1, noise rule (1.75) 0.0998 / 0.0859 (at 1.5:
0.1015 / 0.0455). A larger beta costs there (centred 0.3: val overall recall@20 at 1.25 0.1072
against 0.1093 at 0.1).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from hir.export.cold_users import turn_like_export
from hir.model.metrics import BLOCK, SMALL_CHUNK, chunk_topk, paired_gain, recall_of_top, top_k_variants

log = logging.getLogger(__name__)


@dataclass
class ColdPlacement:
    """How export places cold entities with text (``export.cold``, conf/export/default.yaml).

    method: ``content_knn`` (the module doc) or ``knowledge`` (the knowledge view alone); k:
    neighbours per cold entity; beta: weight of its own (centred) knowledge-view direction; boosts:
    scale multipliers tried on val; tolerance: the boost with the best val cold recall among those
    whose overall val recall is not, beyond the paired noise, more than this share below the best
    (:func:`choose_boost`).
    """

    method: str
    k: int
    beta: float
    boosts: list[float]
    tolerance: float

    def __post_init__(self) -> None:
        if self.method not in ("content_knn", "knowledge"):
            raise ValueError(f"export.cold.method={self.method!r}; expected content_knn or knowledge")


def unit_text(text: np.ndarray, flag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Text vectors (m, d) float32 and their has-text flags (m,) -> (m, d) unit vectors, zero rows
    where there is no text (flag off or an all-zero vector), and that has (m,)."""
    norms = np.linalg.norm(text, axis=1, keepdims=True)
    has = np.asarray(flag, bool) & (norms[:, 0] > 0)
    return np.where(has[:, None], text / np.maximum(norms, 1e-12), 0.0).astype(np.float32), has


def text_vectors(store: Any, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(hi - lo, d) unit text vectors of the nodes ``lo:hi`` from the store's content rows (text
    block first, has-text flag last; see :mod:`hir.model.content`) and has (hi - lo,)."""
    return unit_text(store.content[lo:hi, :store.layout["text_dim"]].astype(np.float32), store.content[lo:hi, -1] > 0)


def own_directions(own: np.ndarray, centre: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The text-specific part of C knowledge-view embeddings: (C, w - 1) unit directions of ``own``
    (C, w) less ``centre`` (w - 1,) (default: their mean direction), and that centre.

    Why centred: the trained knowledge view maps every product to nearly one direction (online_retail,
    q673: mean pairwise cosine 0.990 over the 79 cold products, 0.997-0.999 between 'LETTER "O" /
    "U" / "W" / "Z" BLING KEY RING', whose texts are at 0.77-0.82), so ``beta`` of the raw direction
    moved every cold entity the same way and told none apart. The centre is what the content model
    predicts for any entity of the type; the residual is what it read from this entity's text."""
    unit = own[:, :-1] / np.maximum(np.linalg.norm(own[:, :-1], axis=1, keepdims=True), 1e-12)
    centre = unit.mean(0) if centre is None else np.asarray(centre, np.float32)
    res = unit - centre[None, :]
    return res / np.maximum(np.linalg.norm(res, axis=1, keepdims=True), 1e-12), centre.astype(np.float32)


def distinct_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``x`` (n, d) that first hold each distinct bit pattern, ascending (r,), and
    which of them each row repeats (n,) (``x[first][inverse]`` is ``x``, bit for bit). Bits, not
    values: 0.0 and -0.0 count as two texts, so a row is never merged with one that multiplies
    differently."""
    rows = np.ascontiguousarray(x).view(np.dtype((np.void, x.dtype.itemsize * x.shape[1])))[:, 0]  # (n,)
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    order = np.argsort(first)  # np.unique sorts by bytes; keep first-seen order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse.reshape(-1)]


def text_neighbours(text_q: np.ndarray, ref_text: np.ndarray, k: int, chunk: int = 2048,
                    block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(C, k) float32 cosines and (C, k) int64 rows of the ``k`` warm texts nearest each query:
    bit for bit, ties in the same order, what ranking each ``chunk`` of ``text_q`` (C, t) against
    ``ref_text`` (W, t) by :func:`hir.model.metrics.chunk_topk` gives, with each distinct query
    text ranked once.

    Why it is the same: a query's neighbour list is torch's top-k of its score row, a function of
    the row's bits alone, and two queries with the same bits get the same row from any product of
    at least :data:`~hir.model.metrics.SMALL_CHUNK` rows (chunk_topk's own rule, which its rebuilt
    rows rely on and check). So only a last chunk of fewer rows, which chunk_topk scores as one
    small product whose sums may be ordered otherwise, is ranked as before; every other query
    takes the list of the first query with its text, ranked in products of at least SMALL_CHUNK
    rows. Why: completejourney's 22,495 cold products have 3,260 distinct texts, and every list
    has ties (69,836 warm products, 4,141 texts), so each ranked row costs chunk_topk a second
    pass: ranking them took 21.3 s a chunk at a time and takes 3.2 s (2 shared cores; the same
    bits, checked on its export)."""
    n = len(text_q)
    q = np.ascontiguousarray(text_q, np.float32)
    ref = torch.from_numpy(np.ascontiguousarray(ref_text, np.float32))
    values = np.zeros((n, k), np.float32)
    indices = np.zeros((n, k), np.int64)
    tail = n % chunk if n % chunk < SMALL_CHUNK else 0  # a last chunk chunk_topk scores as one small product
    head = n - tail
    if head:
        first, inverse = distinct_rows(q[:head])
        # at least SMALL_CHUNK rows per product: pad with repeated texts (head has that many rows)
        pad = np.setdiff1d(np.arange(head), first)[:max(0, SMALL_CHUNK - len(first))]
        ranked = np.concatenate([first, pad])
        bounds = [*range(0, len(ranked), chunk), len(ranked)]
        if len(bounds) > 2 and bounds[-1] - bounds[-2] < SMALL_CHUNK:
            del bounds[-2]  # a short last piece joins the one before (never a product under SMALL_CHUNK rows)
        got_v = np.zeros((len(ranked), k), np.float32)
        got_i = np.zeros((len(ranked), k), np.int64)
        for lo, hi in itertools.pairwise(bounds):
            part = torch.from_numpy(q[ranked[lo:hi]])
            v, i = chunk_topk(part, ref, [()] * (hi - lo), k, block)  # unit queries: no zero row to check
            got_v[lo:hi], got_i[lo:hi] = v.numpy(), i.numpy()
        values[:head], indices[:head] = got_v[inverse], got_i[inverse]
    if tail:
        v, i = chunk_topk(torch.from_numpy(q[head:]), ref, [()] * tail, k, block)
        values[head:], indices[head:] = v.numpy(), i.numpy()
    return values, indices


def neighbour_placement(own: np.ndarray, text_q: np.ndarray, ref_z: np.ndarray, ref_text: np.ndarray, k: int,
                        beta: float, centre: np.ndarray | None = None, chunk: int = 2048,
                        block: int = BLOCK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Directions (C, w - 1) and mean neighbour scales (C,) of C cold entities, in the exported
    space of width w (K + 1, or the served d + 1 of ``export.dim``: placement runs after the
    projection, so `hir refresh` can repeat it against the exported rows), and the centre of
    their knowledge views (w - 1,) (:func:`own_directions`).

    direction = unit(sum_j c_j a_j s_j / sum_j c_j) + beta x unit(own - centre), renormalised, over
    the ``k`` warm entities j of highest text cosine c_j (clipped at 0).

    Args:
        own: (C, w) their knowledge-view embeddings ``[a s, slack]`` (projected like the export).
        text_q: (C, t) their unit text vectors.
        ref_z, ref_text: (W, w) embeddings and (W, t) unit text vectors of the warm entities.
        k: neighbours per cold entity.
        beta: weight of the entity's own (knowledge-view) direction, centred.
        centre: (w - 1,) the knowledge views' centre to remove (default: the mean of ``own``'s
            directions; `hir refresh` passes the export's, meta.json ``cold_placement.centre``).
        chunk, block: cold entities ranked at a time against warm entities at a time
            (:func:`text_neighbours`, each distinct text once, by :func:`hir.model.metrics.chunk_topk`:
            the ranking of the whole (chunk, W) cosine block, ties included, without it; memory
            (chunk, >= block)).
    """
    k = min(k, len(ref_z))
    part = ref_z[:, :-1]
    scale = np.linalg.norm(part, axis=1)
    own_dir, centre = own_directions(own, centre)
    dirs = np.zeros((len(own), part.shape[1]), np.float32)
    mean_a = np.zeros(len(own), np.float32)
    values, indices = text_neighbours(text_q, ref_text, k, chunk, block)  # (C, k) each
    for lo in range(0, len(own), chunk):
        top, w = indices[lo:lo + chunk], values[lo:lo + chunk].clip(min=0) + 1e-6  # (c, k) each
        v = (w[..., None] * part[top]).sum(1) / w.sum(1, keepdims=True)
        dirs[lo:lo + chunk] = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
        mean_a[lo:lo + chunk] = (w * scale[top]).sum(1) / w.sum(1)
    dirs = dirs + beta * own_dir
    dirs /= np.maximum(np.linalg.norm(dirs, axis=1, keepdims=True), 1e-12)
    return dirs, mean_a, centre


def placed(z: np.ndarray, rows: np.ndarray, dirs: np.ndarray, mean_a: np.ndarray, boost: float,
           inplace: bool = False) -> np.ndarray:
    """``z`` (n, w) whose ``rows`` are ``[a s, sqrt(1 - a^2)]`` with s = ``dirs`` and
    a = min(1, ``boost`` x ``mean_a``): a copy, or ``z`` itself written in place when ``inplace``.

    A copy by default: export at ``token_space=full`` with a projection, and `hir refresh`, keep
    the array before placement and compare it row by row with the placed one to find the rows to
    lift back (:func:`hir.export.project.token_vectors`); written in place, the placed rows would
    compare equal and keep their unplaced rank-K vectors. A caller that keeps no such array
    (export without it) places in place: no second (n, w) array (3 GB at 3M entities x 257)."""
    out = z if inplace else z.copy()
    a = np.minimum(mean_a * boost, 1.0)
    out[rows, :-1] = dirs * a[:, None]
    out[rows, -1] = np.sqrt(np.clip(1 - a * a, 0, 1))
    return out


def choose_boost(z: np.ndarray, rows: np.ndarray, dirs: np.ndarray, mean_a: np.ndarray, valset: Any,
                 cold_cands: np.ndarray, boosts: list[float], tolerance: float) -> tuple[float, dict[float, Any]]:
    """The boost with the best val recall@20 of the cold positives among the admissible ones, and
    the val table (per boost: ``all`` and ``cold`` recall, and ``gain`` / ``lo`` / ``hi``, the
    paired 95% interval over val users of its overall recall against the best boost's).

    Admissible: a boost whose overall loss against the best is not, beyond the paired noise, more
    than ``tolerance`` of it (``hi >= -tolerance``). Why the noise and not the point estimate: the
    test period's cold recall rises steeply with the boost (online_retail q673, test item-cold
    recall@20 0.028 / 0.082 / 0.182 at boosts 1 / 1.5 / 2) while val tells neighbouring boosts apart
    only within a paired interval ~5% wide (1.5 against 1.25: -2.4% [-4.1, -0.7]), so the old point
    cut-off (within 1% of the best) chose between 1 and 1.5 by the noise of val users, and each arm
    of benchmarks/learner.py drew its own.

    Args:
        z: (n, w) the exported embeddings before placement; rows (C,), dirs (C, w - 1), mean_a (C,):
            the placement (:func:`neighbour_placement`).
        valset: the masked new-to-user :class:`hir.model.ValSet`; cold_cands: (M,) which of its
            candidates are among ``rows``.
    """
    cold_pos = [p[cold_cands[p]] for p in valset.positives]
    # only the cold candidates move with the boost: the warm ones are ranked once
    # (top_k_variants), and one ranking per boost gives both recalls
    var_rows = np.flatnonzero(cold_cands)
    at = np.full(int(max(rows.max(), valset.cands.max())) + 1, -1, np.int64)
    at[rows] = np.arange(len(rows))
    src = at[valset.cands[var_rows]]  # (R,) rows of the placement of each cold candidate

    def variant(b: float) -> np.ndarray:
        a = np.minimum(mean_a[src] * b, 1.0)
        return np.concatenate([dirs[src] * a[:, None], np.sqrt(np.clip(1 - a * a, 0, 1))[:, None]], axis=1)

    tops = top_k_variants(z[valset.users], z[valset.cands], valset.masked, 20, var_rows, map(variant, boosts))
    per = {b: (recall_of_top(top, valset.positives, 20), recall_of_top(top, cold_pos, 20))
           for b, top in zip(boosts, tops)}
    mean = {b: (float(np.nanmean(a)), float(np.nanmean(c))) for b, (a, c) in per.items()}
    top = max(boosts, key=lambda b: (mean[b][0], -b))
    table = {}
    for b in boosts:
        g = paired_gain(per[b][0], per[top][0])
        table[b] = {"all": round(mean[b][0], 5), "cold": round(mean[b][1], 5),
                    **{key: round(float(g[key]), 4) for key in ("gain", "lo", "hi")}}
    ok = [b for b in boosts if b == top or table[b]["hi"] >= -tolerance]
    return max(ok, key=lambda b: (table[b]["cold"], table[b]["all"], -b)), table


def place_cold(z: np.ndarray, store: Any, valset: Any, cfg: ColdPlacement,
               inplace: bool = False) -> tuple[np.ndarray, dict[str, Any]]:
    """Every non-user type's cold entities with text placed by their neighbours (module doc).

    Args:
        z: (n_nodes, w) exported embeddings (global ids; w = K + 1 or the served d + 1).
        store: the export's :class:`hir.model.GraphStore` (``warm``, ``type_range``).
        valset: :func:`hir.model.validation_set` of the store (masked new-to-user), or None.
        cfg: the placement (:class:`ColdPlacement`).
        inplace: write the placed rows into ``z`` rather than a copy (:func:`placed`).

    Returns:
        the new embeddings and a report (rows placed per type, the chosen boost, the val table).
    """
    report: dict[str, Any] = {"method": cfg.method, "k": int(cfg.k), "beta": float(cfg.beta)}
    if cfg.method == "knowledge":
        return z, report
    plans = []
    for t in store.types:
        lo, hi = store.type_range(t)
        if t == "user" or hi == lo:
            continue
        text, has = text_vectors(store, lo, hi)
        is_cold = ~store.warm[lo:hi]
        cold = np.flatnonzero(is_cold & has)
        warm = np.flatnonzero(~is_cold & has)
        if len(cold) == 0 or len(warm) == 0:
            continue
        zt = z[lo:hi]
        dirs, mean_a, centre = neighbour_placement(zt[cold], text[cold], zt[warm], text[warm], int(cfg.k),
                                                   float(cfg.beta))
        plans.append((lo + cold, dirs, mean_a))
        report.setdefault("placed", {})[t] = len(cold)
        # `hir refresh` centres new entities' knowledge views on the export's (own_directions)
        report.setdefault("centre", {})[t] = [round(float(x), 6) for x in centre]
    boosts = [float(b) for b in cfg.boosts]
    if not plans:
        return z, report | {"boost": None}
    rows = np.concatenate([p[0] for p in plans])
    dirs = np.concatenate([p[1] for p in plans])
    mean_a = np.concatenate([p[2] for p in plans])
    boost, table = boosts[0], {}
    cold_cands = np.isin(valset.cands, rows) if valset is not None and len(valset) else None
    if cold_cands is not None and any(cold_cands[p].any() for p in valset.positives):
        boost, table = choose_boost(z, rows, dirs, mean_a, valset, cold_cands, boosts, float(cfg.tolerance))
        report["val_recall@20_by_boost"] = {str(b): v for b, v in table.items()}
    else:
        report["note"] = "no validation positive is a cold entity: the first boost is kept"
    report["boost"] = boost
    log.info("cold start: %s entities placed by their %d content neighbours (boost %g; val recall@20 by boost %s)",
             report["placed"], int(cfg.k), boost, table or "not measured")
    return placed(z, rows, dirs, mean_a, boost, inplace), report


def place_like_export(emb_dir: str | Path, store: Any, etype: str, z_new: np.ndarray, text_new: np.ndarray,
                      has_text: np.ndarray) -> np.ndarray:
    """New entities (not in the snapshot; ``z_new`` (n, w) from the knowledge view, projected with
    the export's basis when it served a smaller dimension, :mod:`hir.export.project`) placed as
    the export placed its cold ones (its ``cold_placement`` in meta.json: method, k, beta, boost),
    against that export's warm entities of ``etype`` (text from ``store``, the snapshot the
    export embedded). Rows without text, or an export that kept the knowledge view, come back
    unchanged; new users are turned as the export turned its cold users."""
    import json

    meta = json.loads((Path(emb_dir) / "meta.json").read_text())
    plan = meta.get("cold_placement") or {}
    if etype == "user":
        # the export never places users by their content neighbours: they keep the knowledge view,
        # turned as the export turned its own cold users (hir/export/cold_users.py)
        return turn_like_export(plan.get("users") or {}, z_new)
    if plan.get("method") != "content_knn" or plan.get("boost") is None or not len(z_new):
        return z_new
    lo, hi = store.type_range(etype)
    text, has = text_vectors(store, lo, hi)
    warm = pl.read_parquet(Path(emb_dir) / f"{etype}.parquet", columns=["node_id", "embedding", "cold_start"]) \
        .filter(~pl.col("cold_start"))
    ids = warm["node_id"].to_numpy()
    keep = has[ids]
    rows = np.flatnonzero(np.asarray(has_text, bool) & (np.linalg.norm(text_new, axis=1) > 0))
    if not keep.any() or not len(rows) or text.shape[1] != text_new.shape[1]:
        return z_new
    ref_z = np.stack(warm["embedding"].to_numpy())[keep].astype(np.float32)
    q = np.asarray(text_new, np.float32)[rows]
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    # the export's centre; one written before centring has none and did not centre (a zero centre)
    centre = (plan.get("centre") or {}).get(etype)
    centre = np.zeros(z_new.shape[1] - 1, np.float32) if centre is None else np.asarray(centre, np.float32)
    dirs, mean_a, _ = neighbour_placement(z_new[rows], q, ref_z, text[ids[keep]], int(plan["k"]), float(plan["beta"]),
                                          centre)
    return placed(z_new, rows, dirs, mean_a, float(plan["boost"]))
