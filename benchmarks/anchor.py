"""Token ids across retrains (issue 34's stability), with and without ``export.hierarchy_anchor``.

    python benchmarks/anchor.py --anchor outputs/online_retail/q673 \
        --runs seed=outputs/online_retail/s43 week=outputs/online_retail/wk1

``--anchor`` is the live version's run (its ``embeddings/``); each of ``--runs`` is a retrain (a
finished run dir with graph/, content/, checkpoints/ and its own, independently refitted
embeddings/: another seed, an extra week of data). For each retrain this re-exports it anchored
on the anchor's tokens (``hir export export.hierarchy_anchor=<anchor>/embeddings`` into
``<run>/anchored/`` and ``<run>/anchored_refine/``) and reports per level, over the warm entities both versions tokenise
(matched by key):

- ``fresh``: the independent export's top-1 tokens against the anchor's, as ids (what a consumer
  of token ids sees) and after the best one-to-one matching of tokens by shared members
  (Hungarian on the overlap: the stability of the partition itself, whatever its numbering);
- ``anchored``: the same for the anchored export (``anchored_refine``: with
  ``export.hierarchy_anchor_refine=true``, the co-engagement refinement run after the anchored start);
- both exports' held-out figures (benchmarks/hierarchy.py's ``measure``: concentration of the
  test period's user-token edges, token prediction gain over popularity), so a stabler tree is
  not bought with a worse one.

Writes benchmarks/results/anchor.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy.optimize import linear_sum_assignment

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from hierarchy import Space, measure  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "anchor.json"
log = logging.getLogger("benchmarks.anchor")


def warm_tokens(emb_dir: Path, types: list[str], n_levels: int) -> pl.DataFrame:
    """``key`` (type/entity_id) and ``l<level>`` top-1 tokens of the warm entities of ``types``."""
    frames = []
    for t in types:
        f = pl.read_parquet(emb_dir / f"{t}.parquet", columns=["entity_id", "cold_start",
                                                              *(f"tokens_l{lvl}" for lvl in range(n_levels))])
        frames.append(f.filter(~pl.col("cold_start")).select(
            pl.concat_str(pl.lit(t + "/"), pl.col("entity_id").cast(pl.String)).alias("key"),
            *(pl.col(f"tokens_l{lvl}").list.first().cast(pl.Int64).alias(f"l{lvl}") for lvl in range(n_levels))))
    return pl.concat(frames)


def matched_agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Share of entities whose token in ``b`` is the one matched to their token in ``a`` by the
    best one-to-one matching on shared members (Hungarian on the contingency table)."""
    ka, kb = int(a.max()) + 1, int(b.max()) + 1
    table = np.zeros((ka, kb), np.int64)
    np.add.at(table, (a, b), 1)
    rows, cols = linear_sum_assignment(-table)
    return float(table[rows, cols].sum() / len(a))


def compare(anchor: pl.DataFrame, other: pl.DataFrame, n_levels: int) -> dict[str, Any]:
    both = anchor.join(other, on="key", suffix="_new")
    return {"entities": both.height,
            "ids": [round(float((both[f"l{lvl}"] == both[f"l{lvl}_new"]).mean()), 4) for lvl in range(n_levels)],
            "matched": [round(matched_agreement(both[f"l{lvl}"].to_numpy(), both[f"l{lvl}_new"].to_numpy()), 4)
                        for lvl in range(n_levels)]}


def heldout(run: Path, emb_dir: Path) -> list[dict[str, float]]:
    """benchmarks/hierarchy.py's held-out figures of the tokens in ``emb_dir`` on ``run``'s snapshot."""
    view = run / "_measure"
    view.mkdir(exist_ok=True)
    for name, target in (("graph", run / "graph"), ("embeddings", emb_dir)):
        link = view / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target.resolve())
    space = Space(view)
    levels = measure(space, space.tokens, {})["levels"]
    return [{k: round(float(r[k]), 4) for k in ("concentration", "gain_nats", "recall@5")} for r in levels]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchor", type=Path, required=True, help="the anchor version's run dir (its embeddings/)")
    ap.add_argument("--runs", nargs="+", required=True, help="name=run_dir of each retrain")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    meta = json.loads((args.anchor / "embeddings" / "meta.json").read_text())
    n_levels = len(meta["levels"])
    result: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
        "machine": platform.platform(), "anchor": str(args.anchor), "levels": meta["levels"], "retrains": {}}
    for spec in args.runs:
        name, run = spec.split("=", 1)
        run = Path(run)
        dataset = run.parent.name
        types = Space(run).types
        base = warm_tokens(args.anchor / "embeddings", types, n_levels)
        row: dict[str, Any] = {"run": str(run), "fresh": compare(base, warm_tokens(run / "embeddings", types, n_levels),
                                                                 n_levels),
                               "heldout": {"fresh": heldout(run, run / "embeddings")}}
        for variant, refine in (("anchored", False), ("anchored_refine", True)):
            t0 = time.perf_counter()
            out = run / variant
            subprocess.run([str(Path(sys.executable).with_name("hir")), "export", f"data={dataset}",
                            f"hydra.run.dir={run.resolve()}", f"paths.embeddings_dir={(out / 'embeddings').resolve()}",
                            f"paths.hierarchy_dir={(out / 'hierarchy').resolve()}", "force=true",
                            f"export.hierarchy_anchor={(args.anchor / 'embeddings').resolve()}",
                            f"export.hierarchy_anchor_refine={str(refine).lower()}"], check=True, cwd=ROOT)
            row[variant] = compare(base, warm_tokens(out / "embeddings", types, n_levels), n_levels)
            row[variant]["export_s"] = round(time.perf_counter() - t0, 1)
            row["heldout"][variant] = heldout(run, out / "embeddings")
            reported = json.loads((out / "hierarchy" / "supergraph.json").read_text()).get("hierarchy_anchor", {})
            row[variant]["reported"] = {k: v for k, v in reported.items() if k != "path"}
        log.info("%s: fresh %s; anchored %s; anchored+refine %s; held-out %s", name, row["fresh"], row["anchored"],
                 row["anchored_refine"], row["heldout"])
        result["retrains"][name] = row
    store = json.loads(args.out.read_text()) if args.out.exists() else {}
    store[Path(args.anchor).parent.name] = result
    args.out.write_text(json.dumps(store, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
