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

from hir_evaluation.ranking.registry import BASELINE, lift_key
from hir_evaluation.report.sections import ranking_arms, retrieval_arms


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
    for arm in ranking_arms(r):
        a = r.get(arm) or {}
        if a.get("skipped"):
            # the reason's first clause here; the whole of it under the table
            rows.append([arm, "skipped", "–", "–", "skipped: " + str(a["skipped"]).split(":")[0]])
            continue
        rows.append([arm, fmt(a.get("auc")), fmt(a.get("ne")), fmt(a.get("calibration"), 3),
                     fmt_ci(r.get(lift_key(arm))) if arm != BASELINE else "–"])
    return rows


MASKED = "masked_new_to_user"


def retrieval_metrics(ks: list[int]) -> list[str]:
    return [*[f"recall@{k}" for k in ks], *[f"ndcg@{k}" for k in ks]]


def retrieval_sections(m: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(title, section) of each retrieval protocol in metrics.json: the full catalogue, then the
    masked new-to-user one (absent in reports written before it existed)."""
    r = m.get("retrieval") or {}
    out: list[tuple[str, Mapping[str, Any]]] = [("full catalogue", r)]
    if r.get(MASKED):
        out.append((f"{MASKED} (history masked)", r[MASKED]))
    return out


def retrieval_rows(
    section: Mapping[str, Any], ks: list[int], arms: Mapping[str, str], bold: tuple[str, str] = ("**", "**")
) -> list[list[str]]:
    """One row per arm of ``arms`` (name -> role; the best arm's value of each metric wrapped in
    ``bold``; a skipped arm says why), then a ``best`` row naming the winning arm per metric."""
    best = section.get("best") or {}
    skipped = section.get("skipped") or {}
    rows = []
    for arm in arms:
        values = section.get(arm) or {}
        if arm in skipped:  # the reason goes under the table (skipped_line)
            rows.append([arm, "skipped", *["–"] * (2 * len(ks) - 1)])
            continue
        cells = []
        for metric in retrieval_metrics(ks):
            cell = fmt(values.get(metric))
            cells.append(f"{bold[0]}{cell}{bold[1]}" if best.get(metric) == arm else cell)
        rows.append([arm, *cells])
    rows.append(["best", *[str(best.get(metric) or "–") for metric in retrieval_metrics(ks)]])
    return rows


def skipped_line(section: Mapping[str, Any]) -> str:
    """Why the arms a protocol skips have no values."""
    return "; ".join(f"{arm} skipped: {why}" for arm, why in (section.get("skipped") or {}).items())


def ratio_line(section: Mapping[str, Any], arms: Mapping[str, str]) -> str:
    """Each model arm (hir) over the best baseline, and over each reference arm where reported
    (repeat), of one protocol; ``arms``: name -> role."""
    out = []
    for model in (a for a, role in arms.items() if role == "model"):
        best = section.get(f"{model}_over_best_baseline") or {}
        if best.get("ratio") is not None:
            out.append(f"{model} / best baseline ({best['best_baseline']}) {best.get('metric', 'recall@20')} = "
                       f"{fmt(best['ratio'], 3)}")
        elif best.get("best_baseline"):
            out.append(f"best baseline {best['best_baseline']} {best.get('metric', 'recall@20')} = "
                       f"{fmt(best.get('best_value'))} (no {model} value)")
        for ref in (a for a, role in arms.items() if role == "reference"):
            if (section.get(f"{model}_over_{ref}") or {}).get("ratio") is not None:
                out.append(f"{model} / {ref} (a reference, not a baseline) = "
                           f"{fmt(section[f'{model}_over_{ref}']['ratio'], 3)}")
    return "; ".join(out)


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
    arms = retrieval_arms(m.get("retrieval") or {})
    for title, section in retrieval_sections(m):
        t = Table(title=f"retrieval, {title} (users {section.get('users')}; best in bold)")
        for col in ("arm", *retrieval_metrics(ks)):
            t.add_column(col, justify="right" if col != "arm" else "left")
        for row in retrieval_rows(section, ks, arms, ("[bold]", "[/bold]")):
            t.add_row(*row)
        console.print(t)
        for line in (skipped_line(section), ratio_line(section, arms)):
            if line:
                console.print(f"{title}: {line}")
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
            *[fmt((s.get(arm) or {}).get("auc"), 3) for arm in ranking_arms(m.get("ranking") or {})],
            *[fmt((s.get(arm) or {}).get("ne"), 3) for arm in ranking_arms(m.get("ranking") or {})],
            fmt_ci(s.get("ne_lift")),
        ])
    return rows


def retrieval_slice_rows(m: Mapping[str, Any]) -> list[list[str]]:
    """recall@20 per slice: the full-catalogue slices, then the masked protocol's (``masked/...``)."""
    rows = []
    arms = retrieval_arms(m.get("retrieval") or {})
    for prefix, section in (("", m.get("retrieval") or {}), ("masked/", (m.get("retrieval") or {}).get(MASKED) or {})):
        skipped = section.get("skipped") or {}
        for name, sl in (section.get("slices") or {}).items():
            rows.append([f"{prefix}{name}", str(sl.get("users")), *[
                "skipped" if arm in skipped else fmt((sl.get(arm) or {}).get("recall@20")) for arm in arms]])
    return rows


def slice_header(m: Mapping[str, Any]) -> list[str]:
    """The ranking slice table's columns: AUC and NE per arm (the baseline as ``base``), hir's NE lift."""
    arms = ["base" if a == BASELINE else a for a in ranking_arms(m.get("ranking") or {})]
    return ["slice", "rows/users", "positives", *[f"AUC {a}" for a in arms], *[f"NE {a}" for a in arms],
            "NE lift hir [CI]"]


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
        parts.append(f"Super-graph density (raw user->entity graph: {fmt(sg.get('raw_density'), 6)}). The gain "
                     "over raw is above 1 for any assignment; beside it, a random assignment of the same token "
                     "sizes, and the concentration (user-token edges / the random assignment's: below 1 when "
                     "users' entities share tokens more than chance):\n\n" + _md_table(
            ["level", "prototypes", "density", "gain over raw", "random gain", "concentration"],
            [[str(e.get("level")), str(e.get("prototypes", "")), fmt(e.get("density"), 6), fmt(e.get("gain"), 1),
              fmt(e.get("random_gain"), 1), fmt(e.get("concentration"), 3)]
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


def retrieval_md(m: Mapping[str, Any]) -> list[str]:
    """The retrieval section's paragraphs: one table per protocol, each with its hir/best ratio."""
    r = m.get("retrieval") or {}
    ks, arms = r.get("ks") or [10, 20, 50], retrieval_arms(r)
    out = [f"History: {r.get('history_splits')}; test users {r.get('users')}. Two protocols for every arm; "
           "the best arm on each metric is in bold and named in the `best` row."]
    for title, section in retrieval_sections(m):
        protocol = section.get("protocol") or "no arm filters a user's past entities"
        out += [f"### Retrieval, {title}",
                f"Protocol: {protocol}; users scored "
                f"{section.get('users')}. {ratio_line(section, arms)}",
                _md_table(["arm", *retrieval_metrics(ks)], retrieval_rows(section, ks, arms))]
        if line := skipped_line(section):
            out.append(line + ".")
    return out


def protocol_md(r: Mapping[str, Any]) -> str:
    rows, pos, boot = r.get("rows") or {}, r.get("positives") or {}, r.get("bootstrap") or {}
    return (f"Protocol: {r.get('protocol')}; rows fit {rows.get('fit')} / test {rows.get('test')}, positives fit "
            f"{pos.get('fit')} / test {pos.get('test')}; {boot.get('resamples')} paired bootstrap resamples by "
            f"{boot.get('unit')}, {100 * float(boot.get('level') or 0):g}% intervals. Every arm: same rows, recipe, "
            "seed and step budget; features point-in-time.")


def fits_md(m: Mapping[str, Any]) -> str:
    """One line on how each trained arm ended (best step/epoch, time, budget stops)."""
    parts = []
    for arm in ranking_arms(m.get("ranking") or {}):
        fit = ((m.get("ranking") or {}).get(arm) or {}).get("fit")
        if fit:
            parts.append(f"ranker {arm}: best at step {fit['steps']} ({fmt(fit['seconds'], 1)}s)")
    for arm, g in ((m.get("retrieval") or {}).get("fits") or {}).items():
        by = g.get("stopped_by") or ("max_seconds" if g.get("stopped_by_budget") else "patience")
        stop = (f", stopped by the budget eval.retrieval.{arm}.{by}" if g.get("stopped_by_budget")
                else ", at its val plateau")
        parts.append(f"{arm}: best epoch {g.get('best_epoch')} of {g.get('epochs', '?')}, "
                     f"{g.get('selection', 'val recall@20')} {fmt(g.get('best_val_recall@20'))} "
                     f"({fmt(g.get('seconds'), 1)}s{stop})")
    for arm, why in ((m.get("ranking") or {}).get("skipped") or {}).items():
        parts.append(f"ranking arm {arm}: skipped: {why}")
    return "Training: " + "; ".join(parts) + "." if parts else ""


def markdown(m: Mapping[str, Any], figures: Mapping[str, str]) -> str:
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
        *retrieval_md(m),
        fits_md(m),
        "## Slices",
        _md_table(slice_header(m), slice_rows(m)),
        _md_table(["retrieval slice", "users", *[f"{a} recall@20" for a in retrieval_arms(m.get("retrieval") or {})]],
                  retrieval_slice_rows(m)),
        "## Representation diagnostics",
        diagnostics_md(m.get("diagnostics") or {}),
        "## Figures",
        *[f"![{name}]({fname})" for name, fname in figures.items()],
    ]
    return "\n\n".join(out) + "\n"


def _cell(text: str) -> str:
    """A table cell as HTML: markdown ``**bold**`` (the best arm's value) becomes <b>."""
    if len(text) > 4 and text.startswith("**") and text.endswith("**"):
        return f"<b>{html.escape(text[2:-2])}</b>"
    return html.escape(text)


def html_page(md_text: str, figures: Mapping[str, bytes], title: str) -> str:
    """A self-contained page: the markdown's tables rendered as HTML, figures inlined."""
    body: list[str] = []
    table: list[str] = []

    def flush() -> None:
        if table:
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in table if not set(r) <= set("|- ")]
            head, *rest = cells
            body.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>" + "".join(
                "<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in r) + "</tr>" for r in rest) + "</table>")
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
