"""`hir gather <multirun dir>`: one comparison table (markdown + CSV) of a Hydra multirun, with the
swept overrides as columns and each job's headline metrics (evaluate's report/metrics.json and
train's train_metrics.json) beside them.

    hir gather multirun/2026-11-29_12-00-00
    hir gather eval.gather.dir=multirun/2026-11-29_12-00-00   # the same, as a Hydra override
    python -m hir_evaluation.gather multirun/2026-11-29_12-00-00 --out comparison
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from hir.errors import InputError
from hir_evaluation.report.sections import ranking_arms, retrieval_arms

log = logging.getLogger(__name__)

# overrides every job shares by construction, never a swept dimension
IGNORED_OVERRIDES = ("stage",)


def dotted_get(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def report_columns(report: Mapping[str, Any]) -> list[str]:
    """The headline metrics of one report/metrics.json, in column order (dotted paths): AUC and NE
    of every ranking arm, hir's calibration and NE lift, the model's recall and NDCG@20, every
    other retrieval arm's recall@20, the model's ratios to the best baseline and the references."""
    ranking = ranking_arms(report.get("ranking") or {})
    retrieval = retrieval_arms(report.get("retrieval") or {})
    models = [a for a, role in retrieval.items() if role == "model"]
    refs = [a for a, role in retrieval.items() if role == "reference"]
    return [
        *[f"ranking.{a}.auc" for a in ranking], *[f"ranking.{a}.ne" for a in ranking], "ranking.hir.calibration",
        "ranking.ne_lift.value", "ranking.ne_lift.ci",
        *[f"retrieval.{m}.{k}" for m in models for k in ("recall@20", "ndcg@20")],
        *[f"retrieval.{a}.recall@20" for a in retrieval if a not in models],
        *[f"retrieval.{m}_over_{b}.ratio" for m in models for b in ("best_baseline", *refs)],
    ]


def job_dirs(root: Path) -> list[Path]:
    """Every job dir under ``root`` (a dir holding ``.hydra/overrides.yaml``), in job order."""
    jobs = [p.parent.parent for p in root.rglob(".hydra/overrides.yaml")]

    def order(p: Path) -> tuple:
        rel = p.relative_to(root).parts
        return tuple((0, int(x)) if x.isdigit() else (1, x) for x in rel)

    return sorted(set(jobs), key=order)


def read_job(job: Path) -> dict[str, Any]:
    """overrides (key -> value text) and the flattened metrics of one job."""
    overrides: dict[str, str] = {}
    for item in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []:
        key, _, value = str(item).partition("=")
        key = key.lstrip("+~")
        if key not in IGNORED_OVERRIDES:
            overrides[key] = value
    metrics: dict[str, Any] = {}
    report = next(iter(sorted(job.rglob("report/metrics.json"))), None)
    if report is not None:
        data = json.loads(report.read_text())
        for col in report_columns(data):
            metrics[col] = dotted_get(data, col)
    train = next(iter(sorted(job.rglob("train_metrics.json"))), None)
    if train is not None:
        data = json.loads(train.read_text())
        data = data.get("metrics", data)
        for key, value in sorted(data.items()):
            if key.startswith("val/") and isinstance(value, int | float):
                metrics[f"train.{key}"] = value
    status = "ok" if metrics else "no metrics"
    return {"job": str(job), "overrides": overrides, "metrics": metrics, "status": status}


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return "[" + ", ".join(_cell(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def table(jobs: Iterable[Mapping[str, Any]], root: Path) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """(header, rows, constant overrides): swept overrides first, then metrics present in any job."""
    jobs = list(jobs)
    keys = sorted({k for j in jobs for k in j["overrides"]})
    swept = [k for k in keys if len({j["overrides"].get(k) for j in jobs}) > 1]
    constant = {k: jobs[0]["overrides"].get(k, "") for k in keys if k not in swept}
    # the reports' columns in their order (a job with more arms adds its own), then train's, sorted
    report_cols = list(dict.fromkeys(m for j in jobs for m in j["metrics"] if not m.startswith("train.")))
    metric_cols = [c for c in (*report_cols, *sorted({m for j in jobs for m in j["metrics"]} - set(report_cols)))
                   if any(j["metrics"].get(c) is not None for j in jobs)]
    header = ["job", *swept, *metric_cols, "status"]
    rows = [[str(Path(j["job"]).relative_to(root)), *[j["overrides"].get(k, "") for k in swept],
             *[_cell(j["metrics"].get(c)) for c in metric_cols], j["status"]] for j in jobs]
    return header, rows, constant


def gather(root: Path, out: Path | None = None) -> dict[str, Any]:
    """Write ``<out>.md`` and ``<out>.csv`` (default ``<root>/comparison``); returns a summary."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root} is not a directory; pass a multirun dir, e.g. `hir gather multirun/2026-11-29_12-00-00`")
    jobs = [read_job(j) for j in job_dirs(root)]
    if not jobs:
        raise InputError(f"{root} holds no Hydra job dirs (no */.hydra/overrides.yaml); is it a multirun dir?")
    header, rows, constant = table(jobs, root)
    out = Path(out) if out else root / "comparison"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    md = [f"# {root.name}: {len(jobs)} jobs", ""]
    if constant:
        md += ["Fixed overrides: " + ", ".join(f"`{k}={v}`" for k, v in constant.items()), ""]
    md += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    best = root / "optimization_results.yaml"
    if best.exists():
        md += ["", "Optuna result:", "", "```yaml", best.read_text().strip(), "```"]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    missing = [r[0] for r in rows if r[-1] != "ok"]
    if missing:
        log.warning("%d job(s) without metrics: %s", len(missing), ", ".join(missing))
    _print(header, rows)
    print(f"comparison: {out.with_suffix('.md')} and {out.with_suffix('.csv')}")
    return {"jobs": len(jobs), "without_metrics": len(missing), "markdown": str(out.with_suffix(".md")),
            "csv": str(out.with_suffix(".csv"))}


# the terminal shows these (when present); the files hold every column
HEADLINE = ("ranking.ne_lift.value", "ranking.hir.auc", "retrieval.hir.recall@20",
            "retrieval.hir_over_best_baseline.ratio", "train.val/recall@20")


def _print(header: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    metrics_start = next((i for i, h in enumerate(header) if h.startswith(("ranking.", "retrieval.", "train."))),
                         len(header) - 1)
    keep = [i for i, h in enumerate(header) if i < metrics_start or h in HEADLINE or h == "status"]
    def short(value: str) -> str:  # 0.0011155792840695788 -> 0.001116 (the files keep every digit)
        try:
            return f"{float(value):.4g}" if "." in value else value
        except ValueError:
            return value

    # swept keys by their last part (model.optim.lr -> lr), metrics in full
    names = [header[i] if i >= metrics_start else header[i].rsplit(".", 1)[-1] for i in keep]
    cells = [[short(row[i]) if 0 < i < metrics_start else row[i] for i in keep] for row in rows]
    console = Console()
    # a table wider than the terminal would fold every cell letter by letter: then one line per job
    width = sum(max(len(n), *(len(c[j]) for c in cells)) + 3 for j, n in enumerate(names)) + 1
    if width > console.width:
        console.print("hir gather (headline metrics; every column is in the .md / .csv)", soft_wrap=True)
        for c in cells:
            console.print(f"  job {c[0]}: " + ", ".join(f"{n}={v}" for n, v in zip(names[1:], c[1:]) if v),
                          soft_wrap=True, highlight=False)
        return
    t = Table(title="hir gather (headline metrics; every column is in the .md / .csv)")
    for name in names:
        t.add_column(name, no_wrap=True)
    for c in cells:
        t.add_row(*c)
    console.print(t)


def run(cfg: Any) -> dict[str, Any]:
    """Hydra entry (`hir gather eval.gather.dir=<multirun dir>`)."""
    target = cfg.eval.gather.get("dir") if "eval" in cfg else None
    if not target:
        raise InputError("which multirun? `hir gather <multirun dir>` or `hir gather eval.gather.dir=<multirun dir>`")
    out = cfg.eval.gather.get("out")
    return gather(Path(target), Path(out) if out else None)


def main(argv: list[str] | None = None) -> None:
    """Plain command line: ``gather <multirun dir> [--out PATH]`` (no Hydra, no run dir)."""
    parser = argparse.ArgumentParser(prog="hir gather", description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="a Hydra multirun dir (multirun/<date>_<time>)")
    parser.add_argument("--out", type=Path, default=None, help="output path without suffix (default <dir>/comparison)")
    # `hir gather eval.gather.dir=<dir>` and `eval.gather.out=<path>` (the Hydra spelling) work here too
    argv = [a.split("=", 1)[1] if a.startswith(("eval.gather.dir=", "dir=")) else a for a in (argv or [])]
    argv = [f"--out={a.split('=', 1)[1]}" if a.startswith("eval.gather.out=") else a for a in argv]
    args = parser.parse_args(argv)
    try:
        gather(args.dir, args.out)
    except InputError as err:
        parser.exit(2, f"hir gather: error: {err}\n")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
