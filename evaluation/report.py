"""Write ``report/``: metrics.json (one schema for every dataset), report.md, a self-contained
report.html (PNGs inlined as base64) and the PNGs; print a short summary table."""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RANKING_ARMS = ("baseline", "hir", "content")
RETRIEVAL_ARMS = ("hir", "popularity", "itemknn", "lightgcn", "content", "repeat")


def clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null, numpy scalars plain numbers."""
    if isinstance(obj, Mapping):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, str | bytes):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def fmt(x: Any, digits: int = 4) -> str:
    return "–" if not isinstance(x, int | float) or x != x else f"{x:.{digits}f}"


def fmt_ci(v: Mapping[str, Any] | None, pct: bool = True) -> str:
    if not v or v.get("value") is None:
        return "–"
    scale = 100.0 if pct else 1.0
    lo, hi = v.get("ci") or [None, None]
    ci = f" [{fmt(scale * lo, 2)}, {fmt(scale * hi, 2)}]" if lo is not None and hi is not None else ""
    return f"{fmt(scale * v['value'], 2)}{'%' if pct else ''}{ci}"


def ranking_rows(m: Mapping[str, Any]) -> list[list[str]]:
    r = m.get("ranking") or {}
    rows = []
    for arm in RANKING_ARMS:
        a = r.get(arm) or {}
        if a.get("skipped"):
            # the reason's first clause here; the whole of it under the table
            rows.append([arm, "skipped", "–", "–", "skipped: " + str(a["skipped"]).split(":")[0]])
            continue
        lift = r.get("ne_lift") if arm == "hir" else r.get("ne_lift_content") if arm == "content" else None
        rows.append([arm, fmt(a.get("auc")), fmt(a.get("ne")), fmt(a.get("calibration"), 3),
                     fmt_ci(lift) if arm != "baseline" else "–"])
    return rows


def retrieval_rows(m: Mapping[str, Any], ks: list[int]) -> list[list[str]]:
    r = m.get("retrieval") or {}
    return [[arm, *[fmt((r.get(arm) or {}).get(f"recall@{k}")) for k in ks], fmt((r.get(arm) or {}).get("ndcg@20"))]
            for arm in RETRIEVAL_ARMS]


def print_summary(m: Mapping[str, Any], report_dir: Path) -> None:
    """The terminal summary: ranking and retrieval tables and where the report is."""
    console = Console()
    t = Table(title=f"hir evaluate: ranking ({m.get('dataset')}, test rows {m.get('ranking', {}).get('rows', {}).get('test')})")
    for col in ("arm", "AUC", "NE", "calibration", "NE lift vs baseline [95% CI]"):
        t.add_column(col, justify="right" if col != "arm" else "left")
    for row in ranking_rows(m):
        t.add_row(*row)
    console.print(t)
    ks = m.get("retrieval", {}).get("ks") or [10, 20, 50]
    t = Table(title=f"retrieval (test users {m.get('retrieval', {}).get('users')})")
    for col in ("arm", *[f"recall@{k}" for k in ks], "ndcg@20"):
        t.add_column(col, justify="right" if col != "arm" else "left")
    for row in retrieval_rows(m, ks):
        t.add_row(*row)
    console.print(t)
    ratio = (m.get("retrieval") or {}).get("hir_over_best_baseline") or {}
    if ratio.get("ratio") is not None:
        console.print(f"hir / best baseline ({ratio['best_baseline']}) recall@20: {ratio['ratio']:.3f}")
    repeat = (m.get("retrieval") or {}).get("hir_over_repeat") or {}
    if repeat.get("ratio") is not None:
        console.print(f"hir / repeat (the user's own past entities) recall@20: {repeat['ratio']:.3f}")
    for arm, why in ((m.get("ranking") or {}).get("skipped") or {}).items():
        console.print(f"[red]ranking arm {arm}: skipped: {why}[/]")
    for note in (m.get("sources") or {}).get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"report: {report_dir / 'report.html'}")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join([*lines, *["| " + " | ".join(r) + " |" for r in rows]])


def slice_rows(m: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for s in (m.get("ranking") or {}).get("slices", []):
        rows.append([
            s["slice"], str(s["n"]), str(s["positives"]),
            *[fmt((s.get(arm) or {}).get("auc"), 3) for arm in RANKING_ARMS],
            *[fmt((s.get(arm) or {}).get("ne"), 3) for arm in RANKING_ARMS],
            fmt_ci(s.get("ne_lift")),
        ])
    return rows


def retrieval_slice_rows(m: Mapping[str, Any]) -> list[list[str]]:
    slices = (m.get("retrieval") or {}).get("slices") or {}
    return [[name, str(sl.get("users")), *[fmt((sl.get(arm) or {}).get("recall@20")) for arm in RETRIEVAL_ARMS]]
            for name, sl in slices.items()]


SLICE_HEADER = ["slice", "rows/users", "positives", "AUC base", "AUC hir", "AUC content",
                "NE base", "NE hir", "NE content", "NE lift hir [CI]"]


def diagnostics_md(d: Mapping[str, Any]) -> str:
    parts = []
    usage = d.get("token_usage") or []
    if usage:
        parts.append(_md_table(["level", "vocab", "used", "used %", "perplexity"], [
            [str(u["level"]), str(u["vocab"]), str(u["used"]), fmt(100 * u["used_fraction"], 1), fmt(u["perplexity"], 1)]
            for u in usage]))
    for etype, table in (d.get("nmi") or {}).items():
        labels = sorted({k for row in table.values() for k in row})
        if labels:
            parts.append(f"NMI of top-1 tokens vs known classes ({etype}):\n\n" + _md_table(
                ["tokens", *labels], [[lvl, *[fmt(row.get(lab), 3) for lab in labels]] for lvl, row in table.items()]))
    sg = d.get("supergraph") or {}
    if sg.get("levels"):
        parts.append(f"Super-graph density (raw user->entity graph: {fmt(sg.get('raw_density'), 6)}):\n\n" + _md_table(
            ["level", "prototypes", "density", "gain over raw"],
            [[str(e.get("level")), str(e.get("prototypes", "")), fmt(e.get("density"), 6), fmt(e.get("gain"), 1)]
             for e in sg["levels"]]))
    if d.get("stability"):
        parts.append("Token stability vs the comparison export:\n\n" + _md_table(
            ["level", "entities", "Jaccard", "top-1 agreement", "NMI"],
            [[str(s["level"]), str(s["entities"]), fmt(s["jaccard"], 3), fmt(s["top1_agreement"], 3), fmt(s["nmi"], 3)]
             for s in d["stability"]]))
    if d.get("top_prototypes"):
        parts.append("Most used prototypes:\n\n" + _md_table(["level", "prototype", "usage", "label"], [
            [str(p["level"]), str(p["proto_id"]), fmt(p["usage"], 4), str(p["label"])] for p in d["top_prototypes"]]))
    return "\n\n".join(parts) or "No export diagnostics (no embeddings/hierarchy found)."


def ratio_md(r: Mapping[str, Any]) -> str:
    best, rep = r.get("hir_over_best_baseline") or {}, r.get("hir_over_repeat") or {}
    out = []
    if best.get("ratio") is not None:
        out.append(f"hir / best baseline ({best['best_baseline']}) recall@20 = {fmt(best['ratio'], 3)}")
    if rep.get("ratio") is not None:
        out.append(f"hir / repeat (reference: the user's own past entities) = {fmt(rep['ratio'], 3)}")
    return "; ".join(out) + "." if out else ""


def protocol_md(r: Mapping[str, Any]) -> str:
    rows, pos, boot = r.get("rows") or {}, r.get("positives") or {}, r.get("bootstrap") or {}
    return (f"Protocol: {r.get('protocol')}; rows fit {rows.get('fit')} / test {rows.get('test')}, positives fit "
            f"{pos.get('fit')} / test {pos.get('test')}; {boot.get('resamples')} paired bootstrap resamples by "
            f"{boot.get('unit')}, {100 * float(boot.get('level') or 0):g}% intervals. Every arm: same rows, recipe, "
            "seed and step budget; features point-in-time.")


def fits_md(m: Mapping[str, Any]) -> str:
    """One line on how each trained arm ended (best step/epoch, time, budget stops)."""
    parts = []
    for arm in RANKING_ARMS:
        fit = ((m.get("ranking") or {}).get(arm) or {}).get("fit")
        if fit:
            parts.append(f"ranker {arm}: best at step {fit['steps']} ({fmt(fit['seconds'], 1)}s)")
    g = ((m.get("retrieval") or {}).get("fits") or {}).get("lightgcn")
    if g:
        stop = ", stopped by eval.lightgcn.max_seconds" if g.get("stopped_by_budget") else ""
        parts.append(f"LightGCN: best epoch {g['best_epoch']}, val recall@20 {fmt(g['best_val_recall@20'])} "
                     f"({fmt(g['seconds'], 1)}s{stop})")
    for arm, why in ((m.get("ranking") or {}).get("skipped") or {}).items():
        parts.append(f"ranking arm {arm}: skipped: {why}")
    return "Training: " + "; ".join(parts) + "." if parts else ""


def markdown(m: Mapping[str, Any], figures: Mapping[str, str]) -> str:
    ks = (m.get("retrieval") or {}).get("ks") or [10, 20, 50]
    src = m.get("sources") or {}
    out = [
        f"# hir evaluation: {m.get('dataset')}",
        f"Model version `{m.get('model_version')}`; HIR ranking features from **{src.get('ranking_hir')}**, "
        f"HIR retrieval from **{src.get('retrieval_hir')}**.",
        *[f"> note: {n}" for n in src.get("notes", [])],
        "## Ranking (deep funnel)",
        f"Task: `{json.dumps((m.get('ranking') or {}).get('task'))}`",
        protocol_md(m.get("ranking") or {}),
        _md_table(["arm", "AUC", "NE", "calibration", "NE lift vs baseline [95% CI]"], ranking_rows(m)),
        "## Retrieval",
        f"History: {(m.get('retrieval') or {}).get('history_splits')}; no arm filters a user's past entities. "
        f"{ratio_md(m.get('retrieval') or {})}",
        _md_table(["arm", *[f"recall@{k}" for k in ks], "ndcg@20"], retrieval_rows(m, ks)),
        fits_md(m),
        "## Slices",
        _md_table(SLICE_HEADER, slice_rows(m)),
        _md_table(["retrieval slice", "users", *[f"{a} recall@20" for a in RETRIEVAL_ARMS]], retrieval_slice_rows(m)),
        "## Representation diagnostics",
        diagnostics_md(m.get("diagnostics") or {}),
        "## Figures",
        *[f"![{name}]({fname})" for name, fname in figures.items()],
    ]
    return "\n\n".join(out) + "\n"


def html_page(md_text: str, figures: Mapping[str, bytes], title: str) -> str:
    """A self-contained page: the markdown's tables rendered as HTML, figures inlined."""
    body: list[str] = []
    table: list[str] = []

    def flush() -> None:
        if table:
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in table if not set(r) <= set("|- ")]
            head, *rest = cells
            body.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>" + "".join(
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rest) + "</table>")
            table.clear()

    for line in md_text.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("!["):
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line.lstrip('# '))}</h{level}>")
        elif line.strip():
            body.append(f"<p>{html.escape(line.lstrip('> '))}</p>")
    flush()
    for name, png in figures.items():
        data = base64.b64encode(png).decode()
        body.append(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{data}"/>'
                    f"<figcaption>{html.escape(name)}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;"
             "text-align:right}th{background:#f3f3f3}figure{display:inline-block;margin:1em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


def write_report(report_dir: Path, metrics: dict[str, Any], figures: Mapping[str, bytes]) -> dict[str, Any]:
    """Write metrics.json, the PNGs, report.md and report.html; returns the cleaned metrics."""
    report_dir.mkdir(parents=True, exist_ok=True)
    names = {}
    for name, png in figures.items():
        fname = f"{name}.png"
        (report_dir / fname).write_bytes(png)
        names[name] = fname
    metrics = clean(metrics)
    md_text = markdown(metrics, names)
    (report_dir / "report.md").write_text(md_text)
    (report_dir / "report.html").write_text(html_page(md_text, figures, f"hir evaluation: {metrics.get('dataset')}"))
    # metrics.json last: its presence marks a complete report (the stage reuses it unless force)
    tmp = report_dir / "metrics.json.tmp"
    tmp.write_text(json.dumps(metrics, indent=2))
    tmp.replace(report_dir / "metrics.json")
    return metrics
