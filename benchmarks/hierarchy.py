"""The hierarchy judged on engagement it never saw (issue 34), beside a plain k-means.

    python benchmarks/hierarchy.py --run outputs/online_retail/i34 [--row today] [--methods hir,kmeans,...]
    python benchmarks/hierarchy.py --run RUN --embeddings RUN/full/embeddings   # a full-rank re-export

The ``hir`` and fit methods refit the checkpoint's rank-K tree on the exported vectors, so they need
an export at full rank (``export.dim=null``); at the default ``export.token_space=full`` its warm
entities' tokens are those of the served export.

Reads one run's export (``embeddings/<type>.parquet``: vectors and tokens; the checkpoint for the
seed refits) and its snapshot (``graph/``: the test period's engagement, the taxonomy), and
computes per tokenization and level (hir/export/heldout.py):

- held-out concentration: the test period's distinct user-token edges over those of a random
  assignment with the same token sizes and popularity-matched entities;
- next-period token prediction: each user's train+val token distribution (smoothing chosen on
  val) predicting the tokens of their new test-period entities, log-loss and recall@1/@5, beside
  the tokens' popularity;
- super-graph coverage: the share of test user-token edges the history's user-token graph
  holds, against the raw user-entity edges';
- taxonomy purity per level against the category depth that level stands for (coarsest = depth 1,
  finest = the deepest), and NMI;
- two-seed top-1 agreement after aligning prototypes (Hungarian on the cosine of the tokens'
  member means).

Tokenizations (``--methods``): ``hir`` the export's own tokens and the tokenizer refitted with two
more seeds (export.hierarchy_fit=entities); ``kmeans`` MiniBatchKMeans per level on the exported
vectors, 3 seeds (the reference); ``kmeans_dir`` the same on their unit directions (the
tokenizer's space); ``coengage`` hir's tokens refined by co-engagement on the train pairs
(export.hierarchy_fit=coengage); ``bottomup`` the tree built from a flat k-means at level 1,
grouped by co-engagement on the train pairs into level 0 (export.hierarchy_fit=bottomup); both
fit on the refit as the export fits them (:func:`hir.export.fits.fit_tree`: settled into the
tokenizer, whose nearest prototypes give every entity's tokens); ``flat_tree`` a tree with
unbalanced branching (:func:`flat_tree_tokens`) on the export's token space, 3 seeds.

Appends one row to benchmarks/results/hierarchy.json, keyed ``<dataset>/<row>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from _results_md import shown  # benchmarks/ (the script's folder is on sys.path)
from sklearn.metrics import normalized_mutual_info_score

from hir.data.snapshot import load_snapshot
from hir.export.fits import fit_tree, top1_of
from hir.export.heldout import (
    aligned_agreement,
    heldout_concentration,
    prototypes_of,
    taxonomy_purity,
    token_coverage,
    token_prediction,
)
from hir.export.hierarchy import taxonomy_labels

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "hierarchy.json"
log = logging.getLogger("benchmarks.hierarchy")
SEEDS = (0, 1, 2)


class Space:
    """The engaged entity types of one export laid end to end (``offset[type] + node_id``), their
    vectors, cold flags and exported tokens, and the users' pairs per split."""

    def __init__(self, run: Path, embeddings: Path | None = None) -> None:
        emb_dir = embeddings or run / "embeddings"
        self.snap = load_snapshot(run / "graph")
        self.types = self.snap.engaged_types()
        frames = {t: pl.read_parquet(emb_dir / f"{t}.parquet").sort("node_id") for t in self.types}
        self.offset = dict(zip(self.types, np.cumsum([0] + [f.height for f in frames.values()])[:-1].tolist()))
        self.emb_dir = emb_dir
        self.meta = json.loads((emb_dir / "meta.json").read_text())
        self.levels = tuple(self.meta["levels"])
        dim = int(frames[self.types[0]]["embedding"].list.len()[0])
        self.z = np.concatenate([f["embedding"].list.to_array(dim).to_numpy() for f in frames.values()]).astype(np.float32)
        self.cold = np.concatenate([f["cold_start"].to_numpy() for f in frames.values()])
        self.tokens = [np.concatenate([f[f"tokens_l{lvl}"].list.first().to_numpy() for f in frames.values()]).astype(np.int64)
                       for lvl in range(len(self.levels))]
        self.pairs = {s: self._pairs((s,)) for s in ("train", "val", "test")}
        self.pairs["history"] = self._pairs(("train", "val"))
        self.n_users = self.snap.num_nodes("user")

    def _pairs(self, splits: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (user, entity) pairs of ``splits`` over every engaged type."""
        us, es = [], []
        for t in self.types:
            e = self.snap.engagement(t).filter(pl.col("split").is_in(list(splits))).select("src_id", "dst_id").unique().collect()
            us.append(e["src_id"].to_numpy())
            es.append(e["dst_id"].to_numpy() + self.offset[t])
        return np.concatenate(us).astype(np.int64), np.concatenate(es).astype(np.int64)


def kmeans_tokens(x: np.ndarray, levels: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """One MiniBatchKMeans per level on x (n, d) (as hir.export.hierarchy.kmeans_reference)."""
    from sklearn.cluster import MiniBatchKMeans

    out = []
    for k in levels:
        km = MiniBatchKMeans(n_clusters=int(k), random_state=seed, n_init=1, batch_size=4096, max_iter=100)
        out.append(km.fit(x).predict(x).astype(np.int64))
    return out


def flat_tree_tokens(x: np.ndarray, levels: tuple[int, ...], seed: int, n_init: int = 3) -> list[np.ndarray]:
    """A tree with unbalanced branching, built bottom up: a flat k-means of ``levels[-1]`` on x
    (n, d), then each coarser level a k-means of the finer level's centroids weighted by their
    members, so a parent owns as many children as its members need (the lead of
    docs/hierarchy.md's free-levels section; the tokenizer's ``j // branch`` tree cannot hold
    it). An entity's coarse token is its finest token's ancestor; ``n_init``: the finest level's
    k-means keeps the best of that many seedings. Returns the (n,) tokens per level, coarsest
    first."""
    from sklearn.cluster import KMeans, MiniBatchKMeans

    km = MiniBatchKMeans(n_clusters=int(levels[-1]), random_state=seed, n_init=n_init, batch_size=4096, max_iter=100).fit(x)
    tokens = [km.predict(x).astype(np.int64)]
    centres, weight = km.cluster_centers_, np.bincount(tokens[0], minlength=int(levels[-1])).astype(np.float64)
    for k in reversed(levels[:-1]):
        # an empty finer cluster weighs nothing but still needs a parent
        up = KMeans(n_clusters=int(k), random_state=seed, n_init=10).fit(centres, sample_weight=weight + 1e-6)
        parent = up.labels_.astype(np.int64)
        tokens.insert(0, parent[tokens[0]])
        centres, weight = up.cluster_centers_, np.bincount(parent, weights=weight, minlength=int(k))
    return tokens


def blended_directions(run: Path, space: Space, d: np.ndarray, weight: float) -> np.ndarray:
    """``export.token_content``: the unit directions ``d`` (n, K) of the engaged entities blended
    with their text at ``weight`` (hir/export/content_tokens.py): (n, K + T) unit rows, the space
    the export fitted and read the tokens in. The text is the run's content (``<run>/content``)."""
    from hir.export.content_tokens import array_text, blend

    texts = []
    for t in space.types:
        f = pl.read_parquet(run / "content" / f"{t}.parquet").sort("node_id")
        width = int(f["text_vec"].list.len().max())
        texts.append((f["text_vec"].list.to_array(width).to_numpy(), f["has_text"].to_numpy()))
    width = texts[0][0].shape[1]
    text = array_text(np.concatenate([t for t, _ in texts]), np.concatenate([h for _, h in texts]), width)
    x = blend(np.concatenate([d, np.zeros((len(d), 1), np.float32)], 1), text, width, weight)[:, :-1]
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def hir_refits(run: Path, space: Space, seeds: tuple[int, ...], fits: tuple[str, ...] = (),
               token_content: float = 0.0, free_levels: int = 0,
               child_n_init: int = 1) -> dict[str, dict[int, list[np.ndarray]]]:
    """Tokens of the checkpoint's tree refitted (export.hierarchy_fit=entities) with each seed on
    the directions of the warm engaged entities, as `hir export` does with cfg.seed, and of each
    of ``fits`` (coengage, bottomup: :func:`hir.export.fits.fit_tree` on that refit and the train
    pairs, what the export sees), in the space blended with text at ``token_content`` when > 0
    (:func:`blended_directions`), the finest ``free_levels`` levels of the tree free of the residual
    bound (export.hierarchy_free_levels, :class:`hir.nn.HierarchicalTokenizer`). Returns {fit name
    ("hir" for the refit): {seed: per level (n,)}}."""
    import copy

    import torch

    from hir.export.embed import load_checkpoint, resolve_checkpoint
    from hir.export.hierarchy import refit_tokenizer

    if space.meta.get("projection"):
        # the checkpoint's rank-K tree is refitted on the exported directions: they must be the rank's own
        raise SystemExit(
            f"{space.emb_dir} is served at {space.meta['dim']} of rank {space.meta['projection']['rank']} + 1 "
            "coordinates; the refits need the rank's own vectors. Export the run at full rank into a dir of its own "
            "(hir export export.dim=null paths.embeddings_dir=<run>/full/embeddings "
            "paths.hierarchy_dir=<run>/full/hierarchy) and pass --embeddings <run>/full/embeddings: with "
            "export.token_space=full (the default) its warm entities' tokens are the served export's")
    net, _ = load_checkpoint(resolve_checkpoint("best", run / "checkpoints"))
    with torch.no_grad():
        d = net.semantic(torch.from_numpy(space.z)).numpy()
    tree = net.tokenizer
    if token_content > 0:
        from hir.export.content_tokens import widened

        d = blended_directions(run, space, d, token_content)
        tree = widened(net.tokenizer, d.shape[1])
    if free_levels:
        tree = tree.reshaped(free_levels=free_levels)
    warm = np.flatnonzero(~space.cold)
    users, ents = space.pairs["train"]
    pos = np.minimum(np.searchsorted(warm, ents), len(warm) - 1)
    seen = warm[pos] == ents
    out: dict[str, dict[int, list[np.ndarray]]] = {name: {} for name in ("hir", *fits)}
    for seed in seeds:
        tok = refit_tokenizer(tree, d[warm], seed, child_n_init=child_n_init).eval()
        out["hir"][seed] = top1_of(tok, d)
        for fit in fits:
            fitted = copy.deepcopy(tok)
            fit_tree(fitted, d[warm], fit, (users[seen], pos[seen]), space.n_users, seed)
            out[fit][seed] = top1_of(fitted, d)
    return out


def path_consistency(tokens: list[np.ndarray], levels: tuple[int, ...]) -> list[float]:
    """Per level below the coarsest, the share of entities whose top-1 token's parent (``j // b``,
    the tokenizer's tree) is their top-1 token one level up: 1 where every entity's tokens form a
    path down the tree (the residual bound all but ensures it; a free level need not)."""
    return [float((tokens[lvl] // (k // levels[lvl - 1]) == tokens[lvl - 1]).mean())
            for lvl, k in enumerate(levels) if lvl]


def perplexity(tokens: np.ndarray) -> float:
    """exp(entropy) of the token sizes: the number of equally used tokens they amount to."""
    share = np.bincount(tokens)[np.bincount(tokens) > 0] / len(tokens)
    return float(np.exp(-(share * np.log(share)).sum()))


def measure(space: Space, tokens: list[np.ndarray], tax: dict[str, np.ndarray]) -> dict[str, Any]:
    """Every held-out figure of one tokenization (per level)."""
    p = space.pairs
    conc = heldout_concentration(*p["test"], tokens, space.levels)
    pred = token_prediction(p["history"], p["val"], p["train"], p["test"], tokens, space.levels)
    cov = token_coverage(p["history"], p["test"], tokens, space.levels)
    rows = []
    for lvl in range(len(space.levels)):
        row = {"level": lvl, "prototypes": space.levels[lvl], "concentration": conc[lvl]["concentration"],
               "random_sd": conc[lvl]["random_sd"], "log_loss": pred[lvl]["hir"]["log_loss"],
               "log_loss_popularity": pred[lvl]["popularity"]["log_loss"],
               # nats a user's history adds over the tokens' popularity: comparable across
               # tokenizations whose token sizes (and so popularity log-loss) differ
               "gain_nats": pred[lvl]["popularity"]["log_loss"] - pred[lvl]["hir"]["log_loss"],
               "recall@1": pred[lvl]["hir"]["recall@1"], "recall@5": pred[lvl]["hir"]["recall@5"],
               "recall@1_popularity": pred[lvl]["popularity"]["recall@1"],
               "recall@5_popularity": pred[lvl]["popularity"]["recall@5"], "alpha": pred[lvl]["alpha"],
               "coverage": cov["levels"][lvl]["coverage"], "random_coverage": cov["levels"][lvl]["random_coverage"],
               "perplexity": perplexity(tokens[lvl])}
        if tax:
            depths = sorted(tax, key=lambda n: int(n.removeprefix("taxonomy_d")))
            # coarsest level <-> depth 1 (e.g. department), finest <-> the deepest (e.g. commodity)
            matched = depths[min(lvl, len(depths) - 1)] if lvl < len(space.levels) - 1 else depths[-1]
            lab = tax[matched]
            rows_l = np.flatnonzero(lab >= 0)
            tok = tokens[lvl][space.offset["product"] + rows_l]
            row["taxonomy"] = matched
            row["taxonomy_purity"] = taxonomy_purity(lab[rows_l], tok)
            row["taxonomy_nmi"] = float(normalized_mutual_info_score(lab[rows_l], tok))
        rows.append(row)
    return {"levels": rows, "test_pairs": conc[0]["pairs"], "prediction_pairs": pred[0]["pairs"],
            "prediction_users": pred[0]["users"], "raw_coverage": cov["raw_coverage"]}


def agreement(space: Space, a: list[np.ndarray], b: list[np.ndarray], x: np.ndarray) -> list[float]:
    """Per level, aligned top-1 agreement of two tokenizations over the engaged entities."""
    return [aligned_agreement(a[lvl], b[lvl], prototypes_of(x, a[lvl], k), prototypes_of(x, b[lvl], k))
            for lvl, k in enumerate(space.levels)]


def summary(runs: dict[int, dict[str, Any]], levels: int) -> list[dict[str, Any]]:
    """Per level, the mean and spread (sd) over seeds of each figure."""
    keys = ["concentration", "log_loss", "log_loss_popularity", "gain_nats", "recall@1", "recall@5", "recall@1_popularity",
            "recall@5_popularity", "coverage", "random_coverage", "taxonomy_purity", "taxonomy_nmi"]
    out = []
    for lvl in range(levels):
        row: dict[str, Any] = {"level": lvl}
        for key in keys:
            vals = [r["levels"][lvl][key] for r in runs.values() if key in r["levels"][lvl]]
            if vals:
                row[key] = float(np.mean(vals))
                row[f"{key}_sd"] = float(np.std(vals))
        out.append(row)
    return out


def markdown(row: dict[str, Any]) -> str:
    """One results row as a markdown table: per method and level the mean over seeds (± sd of
    the concentration) of every figure, popularity's beside prediction's."""
    head = ["method", "level", "concentration (± seeds)", "log-loss", "popularity", "gain (nats)", "recall@5",
            "popularity", "coverage", "random", "two-seed agreement", "taxonomy purity"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in row["methods"].items():
        for s, agree in zip(m["summary"], m["two_seed_agreement"]):
            cells = [name, str(s["level"]), f"{s['concentration']:.3f} ± {s['concentration_sd']:.3f}",
                     f"{s['log_loss']:.3f}", f"{s['log_loss_popularity']:.3f}", f"{s['gain_nats']:+.3f}",
                     f"{s['recall@5']:.3f}", f"{s['recall@5_popularity']:.3f}", f"{s['coverage']:.3f}",
                     f"{s['random_coverage']:.3f}", f"{agree:.3f}",
                     f"{s['taxonomy_purity']:.3f}" if "taxonomy_purity" in s else "–"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a run dir with graph/, embeddings/, checkpoints/")
    ap.add_argument("--embeddings", type=Path, default=None,
                    help="the export to judge (default <run>/embeddings); it must be at full rank (export.dim=null)")
    ap.add_argument("--row", default="today", help="the row's name in hierarchy.json")
    ap.add_argument("--methods", default="hir,kmeans,kmeans_dir,coengage,bottomup")
    ap.add_argument("--seed", type=int, default=42, help="the seed the run's export used (cfg.seed)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the results file (a row is added or replaced)")
    ap.add_argument("--token-content", type=float, default=None,
                    help="the hir fits' text weight (export.token_content; default: the export's own, meta.json)")
    ap.add_argument("--child-n-init", type=int, default=1,
                    help="seedings of each parent's children k-means in the hir refits (best of n; 1 = the export's)")
    ap.add_argument("--free-levels", type=int, default=None,
                    help="the hir fits' finest levels free of the residual bound (export.hierarchy_free_levels; "
                         "default: the export's own, meta.json)")
    ap.add_argument("--flat-n-init", type=int, default=3,
                    help="flat_tree: seedings of the finest level's k-means (the best of n)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    t0 = time.perf_counter()
    space = Space(args.run, args.embeddings)
    n_ent = len(space.z)
    tax = {k: v for k, v in taxonomy_labels(space.snap, "product").items() if k.startswith("taxonomy_")} \
        if "product" in space.types else {}
    methods = args.methods.split(",")
    dirs = space.z[:, :-1] / np.maximum(np.linalg.norm(space.z[:, :-1], axis=1, keepdims=True), 1e-12)
    result: dict[str, Any] = {"when": datetime.now(UTC).isoformat(timespec="seconds"),
                              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                                       capture_output=True, text=True).stdout.strip(),
                              "machine": platform.platform(), "run": shown(args.run), "levels": list(space.levels),
                              "entities": n_ent, "users": space.n_users,
                              "pairs": {s: len(p[0]) for s, p in space.pairs.items()}, "methods": {}}
    tokenizations: dict[str, dict[int, list[np.ndarray]]] = {}
    fits = tuple(f for f in ("coengage", "bottomup") if f in methods)
    weight = float(space.meta.get("token_content", 0.0) if args.token_content is None else args.token_content)
    result["token_content"] = weight
    free = int(space.meta.get("hierarchy_free_levels", 0) if args.free_levels is None else args.free_levels)
    result["free_levels"] = free
    result["child_n_init"] = args.child_n_init
    if "flat_tree" in methods:
        result["flat_n_init"] = args.flat_n_init
    if "hir" in methods or fits:
        refits = hir_refits(args.run, space, (args.seed, args.seed + 1, args.seed + 2), fits, weight, free,
                            args.child_n_init)
        same = [float((refits["hir"][args.seed][lvl] == space.tokens[lvl]).mean()) for lvl in range(len(space.levels))]
        log.info("hir refit with the export's seed reproduces its tokens on %s of entities", same)
        result["hir_refit_reproduces_export"] = same
        tokenizations.update(refits)
    if "kmeans" in methods:
        tokenizations["kmeans"] = {s: kmeans_tokens(space.z, space.levels, s) for s in SEEDS}
    if "kmeans_dir" in methods:
        tokenizations["kmeans_dir"] = {s: kmeans_tokens(dirs, space.levels, s) for s in SEEDS}
    if "flat_tree" in methods:  # on the space the export's tokens read: the directions blended with the text
        x = blended_directions(args.run, space, dirs, weight) if weight > 0 else dirs
        tokenizations["flat_tree"] = {s: flat_tree_tokens(x, space.levels, s, args.flat_n_init) for s in SEEDS}
    for name, by_seed in tokenizations.items():
        t1 = time.perf_counter()
        runs = {s: measure(space, toks, tax) for s, toks in by_seed.items()}
        seeds = list(by_seed)
        agree = [agreement(space, by_seed[seeds[0]], by_seed[s], dirs) for s in seeds[1:]]
        result["methods"][name] = {
            "seeds": seeds, "summary": summary(runs, len(space.levels)),
            "two_seed_agreement": [float(np.mean([a[lvl] for a in agree])) for lvl in range(len(space.levels))],
            "per_seed": {str(s): r for s, r in runs.items()}, "seconds": round(time.perf_counter() - t1, 1)}
        if name in ("hir", *fits):  # the tokenizer's tree: do an entity's tokens form a path down it?
            paths = [path_consistency(toks, space.levels) for toks in by_seed.values()]
            result["methods"][name]["path_consistency"] = [float(np.mean(c)) for c in zip(*paths)]
        s = result["methods"][name]["summary"]
        log.info("%s: concentration %s, log-loss %s (popularity %s), agreement %s", name,
                 [round(r["concentration"], 3) for r in s], [round(r["log_loss"], 3) for r in s],
                 [round(r["log_loss_popularity"], 3) for r in s],
                 [round(a, 3) for a in result["methods"][name]["two_seed_agreement"]])
    result["seconds"] = round(time.perf_counter() - t0, 1)
    store = json.loads(args.out.read_text()) if args.out.exists() else {}
    store[f"{space.snap.dataset}/{args.row}"] = result
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(store, indent=1) + "\n")
    print(markdown(result))
    print(f"wrote {args.out} [{space.snap.dataset}/{args.row}] in {result['seconds']} s")


if __name__ == "__main__":
    main()
