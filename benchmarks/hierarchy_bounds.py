"""How low held-out concentration can go on a snapshot, and what it costs in balance (issue 34).

    python benchmarks/hierarchy_bounds.py --graph outputs/completejourney/learner/graph

It needs a prepared snapshot (``hir prepare``), not a model. Each tokenization puts every product
into one of k tokens, at k = 8 and 64, issue 34's first two levels. Each is scored with the held-out
concentration of benchmarks/hierarchy.py (hir/export/heldout.py): the test period's distinct
user-token edges over those of a popularity-matched random assignment with the same token sizes.
Each is reported beside its size perplexity: exp(entropy) of the token sizes, counted over
products and over test pairs. Perplexity k means balanced tokens; near 1 means one token holds
almost everything.

- ``in_sample``: a spectral partition fit on the *test* pairs themselves. The user x product
  matrix is degree-normalised, a randomised SVD is taken, and k-means runs on the unit product
  factors. This is a bound no held-out fit reaches in expectation, not a method.
- ``history``: the same partition fit on the train + val pairs. This is honest: it never sees the
  test period.
- ``taxonomy_<d> top``: the k - 1 largest taxonomy classes at depth d, plus one token for the rest.
- ``taxonomy_<d> balanced``: the depth-d classes packed into k tokens of about equal history pairs,
  largest class first into the lightest token. These tokens are content-coherent and balanced.
- ``taxonomy_<d> engaged``: the depth-d classes grouped by who buys them. The same spectral
  partition runs on the user x class matrix of the history pairs, and each product takes its
  class's group. This is honest: content classes, engagement grouping, history only.

Products without a class go to the heaviest token.

With ``--run RUN`` (a run dir with ``embeddings/product.parquet``, exported from this snapshot),
two more rows per k: ``export``, the run's own top-1 tokens at the level with k prototypes, and
``taxonomy_<d> top settled``. The second puts each class's prototype at the mean exported
direction of its warm members, then gives every product its nearest prototype, as a tokenizer
tokenises (:func:`hir.export.fits.top1_of`). Its ``agreement`` is the share of products whose
settled token is still their class's. It shows whether the classes survive in the space the
tokens are read in.

Writes ``benchmarks/results/hierarchy_bounds.json``,
keyed by dataset.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import scipy.sparse as sp
from sklearn.cluster import KMeans
from sklearn.utils.extmath import randomized_svd

from hir.data.snapshot import load_snapshot
from hir.export.heldout import heldout_concentration
from hir.export.hierarchy import taxonomy_labels

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "hierarchy_bounds.json"
SEEDS = (0, 1, 2)
# SVD rank of the spectral partitions per k (enough directions to separate k groups)
RANKS = {8: 16, 64: 64}


def perplexity(tokens: np.ndarray) -> float:
    """exp(entropy) of the token sizes of ``tokens`` (n,): the number of equally used tokens."""
    c = np.bincount(tokens).astype(np.float64)
    c = c[c > 0] / c.sum()
    return float(np.exp(-(c * np.log(c)).sum()))


def spectral_groups(users: np.ndarray, cols: np.ndarray, n_users: int, n_cols: int, k: int, rank: int,
                    seed: int) -> np.ndarray:
    """(n_cols,) group in [0, k) of every column of the binary user x column matrix of the pairs
    (``users``, ``cols``) (E,): k-means on the unit rows of ``V S`` of a rank-``rank`` SVD of
    ``D_u^-1/2 R D_c^-1/2``. Columns without a pair share their group with the zero vector's."""
    m = sp.csr_matrix((np.ones(len(users)), (users, cols)), shape=(n_users, n_cols))
    m.data[:] = 1.0  # distinct pairs
    du, dc = np.asarray(m.sum(1)).ravel(), np.asarray(m.sum(0)).ravel()
    m = sp.diags(1 / np.sqrt(np.maximum(du, 1))) @ m @ sp.diags(1 / np.sqrt(np.maximum(dc, 1)))
    _, s, vt = randomized_svd(m, min(rank, n_cols - 1), random_state=seed)
    v = vt.T * s
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return KMeans(k, n_init=4, random_state=seed).fit_predict(v).astype(np.int64)


def score(tokens: np.ndarray, k: int, test: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    """Held-out concentration of one tokenization (n_products,) and its size perplexities."""
    users, items = test
    c = heldout_concentration(users, items, [tokens], [k])[0]
    return {"concentration": round(float(c["concentration"]), 4), "random_sd": round(float(c["random_sd"]), 4),
            "perplexity_products": round(perplexity(tokens), 2), "perplexity_test_pairs": round(perplexity(tokens[items]), 2)}


def expand_classes(group: np.ndarray, cls: np.ndarray, weight: np.ndarray, k: int) -> np.ndarray:
    """(classes,) token of every class -> (n_items,) token of every product through its class
    ``cls`` (n_items,; -1 = none); products without a class take the token heaviest in ``weight``
    (classes,)."""
    tok = np.full(len(cls), int(np.argmax(np.bincount(group, weights=weight, minlength=k))), np.int64)
    known = cls >= 0
    tok[known] = group[cls[known]]
    return tok


def settled(tokens: np.ndarray, directions: np.ndarray, warm: np.ndarray, k: int) -> np.ndarray:
    """(n,) nearest of k prototypes, each the unit mean of its warm members' ``directions`` (n, K)."""
    protos = np.stack([directions[warm & (tokens == j)].mean(0) if (warm & (tokens == j)).any()
                       else np.zeros(directions.shape[1]) for j in range(k)])
    protos /= np.maximum(np.linalg.norm(protos, axis=1, keepdims=True), 1e-12)
    return np.argmax(directions @ protos.T.astype(directions.dtype), axis=1).astype(np.int64)


def export_of(run: Path, entity_type: str) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    """A run's export of ``entity_type``: unit directions (n, K) in node-id order, the warm flag
    (n,) and the top-1 token per level size {k: (n,)}."""
    f = pl.read_parquet(run / "embeddings" / f"{entity_type}.parquet").sort("node_id")
    levels = json.loads((run / "embeddings" / "meta.json").read_text())["levels"]
    z = f["embedding"].list.to_array(int(f["embedding"].list.len()[0])).to_numpy().astype(np.float32)[:, :-1]
    z /= np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    top1 = {int(k): f[f"tokens_l{lvl}"].list.first().to_numpy().astype(np.int64) for lvl, k in enumerate(levels)}
    return z, ~f["cold_start"].to_numpy(), top1


def by_seed(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Seeds' scores -> their mean and per-seed list of each figure."""
    return {key: {"mean": round(float(np.mean([r[key] for r in rows])), 4), "seeds": [r[key] for r in rows]}
            for key in rows[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", type=Path, required=True, help="a prepared snapshot (a run's graph/)")
    ap.add_argument("--entity-type", default="product")
    ap.add_argument("--ks", default="8,64")
    ap.add_argument("--run", type=Path, default=None, help="a run exported from this snapshot: its tokens too")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    t0 = time.perf_counter()
    snap = load_snapshot(args.graph)
    t = args.entity_type
    n_items, n_users = snap.num_nodes(t), snap.num_nodes("user")

    def pairs(splits: list[str]) -> tuple[np.ndarray, np.ndarray]:
        e = snap.engagement(t).filter(pl.col("split").is_in(splits)).select("src_id", "dst_id").unique().collect()
        return e["src_id"].to_numpy().astype(np.int64), e["dst_id"].to_numpy().astype(np.int64)

    test, hist = pairs(["test"]), pairs(["train", "val"])
    hist_deg = np.bincount(hist[1], minlength=n_items).astype(np.float64)
    tax = {d: lab for d, lab in taxonomy_labels(snap, t).items() if d.startswith("taxonomy_")}
    exported = export_of(args.run, t) if args.run else None
    out: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
        "machine": platform.platform(), "graph": str(args.graph), "entity_type": t, "products": n_items,
        "users": n_users, "run": str(args.run) if args.run else None, "test_pairs": len(test[0]), "history_pairs": len(hist[0]), "k": {}}
    for k in (int(x) for x in args.ks.split(",")):
        rows: dict[str, Any] = {}
        for name, (u, i) in (("in_sample", test), ("history", hist)):
            rows[name] = by_seed([score(spectral_groups(u, i, n_users, n_items, k, RANKS.get(k, k), s), k, test)
                                  for s in SEEDS])
        if exported is not None and k in exported[2]:
            rows["export"] = score(exported[2][k], k, test)
        for depth in sorted(tax, key=lambda d: int(d.removeprefix("taxonomy_d"))):
            lab = tax[depth]
            known = lab >= 0
            classes, inv = np.unique(lab[known], return_inverse=True)
            if len(classes) < k:
                continue
            cls = np.full(n_items, -1)
            cls[known] = inv
            weight = np.bincount(cls[known], weights=hist_deg[known], minlength=len(classes))

            top = np.full(len(classes), k - 1, np.int64)
            top[np.argsort(-np.bincount(cls[known], minlength=len(classes)))[:k - 1]] = np.arange(k - 1)
            load, packed = np.zeros(k), np.zeros(len(classes), np.int64)
            for c in np.argsort(-weight):
                packed[c] = int(np.argmin(load))
                load[packed[c]] += weight[c]
            hk = known[hist[1]]
            engaged = [expand_classes(spectral_groups(hist[0][hk], cls[hist[1][hk]], n_users, len(classes), k,
                                              RANKS.get(k, k), s), cls, weight, k) for s in SEEDS]
            rows[f"{depth} top"] = score(expand_classes(top, cls, weight, k), k, test)
            if exported is not None:
                classes_tok = expand_classes(top, cls, weight, k)
                near = settled(classes_tok, exported[0], exported[1], k)
                rows[f"{depth} top settled"] = score(near, k, test) | {
                    "agreement": round(float((near == classes_tok).mean()), 4)}
            rows[f"{depth} balanced"] = score(expand_classes(packed, cls, weight, k), k, test)
            rows[f"{depth} engaged"] = by_seed([score(e, k, test) for e in engaged])
            rows[f"{depth} engaged"]["classes"] = len(classes)
        out["k"][str(k)] = rows
        print(k, json.dumps(rows), flush=True)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    store = json.loads(args.out.read_text()) if args.out.exists() else {}
    store[snap.dataset] = out
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(store, indent=1) + "\n")
    print(f"wrote {args.out} [{snap.dataset}] in {out['seconds']} s")


if __name__ == "__main__":
    main()
