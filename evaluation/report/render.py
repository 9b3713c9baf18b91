"""Write ``report/``: metrics.json (one schema for every dataset), report.md, a self-contained
report.html (PNGs inlined as base64) and the PNGs; print a short summary table."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hir_evaluation.ranking.registry import BASELINE, lift_key
from hir_evaluation.report.headline import headline_md, ranking_answer, retrieval_answer
from hir_evaluation.report.html import html_page
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


def fmt_spread(v: Mapping[str, Any] | None) -> str:
    """The NE lift's seed spread: ``[min, max]`` of the per-seed lifts in %, or – with one seed."""
    seeds = (v or {}).get("seeds") or []
    if len(seeds) < 2:
        return "–"
    lo, hi = v["seed_spread"]
    return f"[{fmt(100 * lo, 2)}, {fmt(100 * hi, 2)}] ({len(seeds)} seeds)"


RANKING_HEADER = ["arm", "AUC", "NE", "calibration", "NE lift vs baseline [95% CI]", "seed spread"]


def ranking_rows(m: Mapping[str, Any]) -> list[list[str]]:
    r = m.get("ranking") or {}
    rows = []
    for arm in ranking_arms(r):
        a = r.get(arm) or {}
        if a.get("skipped"):
            # the reason's first clause here; the whole of it under the table
            rows.append([arm, "skipped", "–", "–", "skipped: " + str(a["skipped"]).split(":")[0], "–"])
            continue
        lift = r.get(lift_key(arm)) if arm != BASELINE else None
        rows.append([arm, fmt(a.get("auc")), fmt(a.get("ne")), fmt(a.get("calibration"), 3),
                     fmt_ci(lift) if lift else "–", fmt_spread(lift)])
    return rows


def fit_rows(m: Mapping[str, Any]) -> list[list[str]]:
    """Per ranking arm: each fit's best step and best check (1 = the first), steps an epoch, seconds."""
    r = m.get("ranking") or {}
    rows = []
    for arm in ranking_arms(r):
        fit = (r.get(arm) or {}).get("fit") or {}
        if not fit.get("best_steps"):
            continue
        curves = fit.get("curves") or []
        checks = [len(c["curve"]) for c in curves]
        rows.append([arm, ", ".join(str(s) for s in fit["best_steps"]),
                     ", ".join(f"{b}/{c}" for b, c in zip(fit["best_checks"], checks)),
                     str(curves[0].get("steps_per_epoch")) if curves else "–", fmt(fit.get("seconds"), 1)])
    return rows


def explanation_md(r: Mapping[str, Any]) -> str:
    """The "why this?" paragraphs: per explained pair, its score and label, then its shared tokens."""
    out = []
    for e in r.get("explanations") or []:
        head = (f"- user `{e['user']}`, {e.get('entity_text') or ''} (`{e['entity']}`): {e['arm']} score "
                f"{fmt(e['score'], 3)}, label {e['label']}, tokens from {e.get('source')}")
        if e.get("error"):
            out.append(f"{head}: not explained: {e['error']}")
            continue
        ex = e["explanation"]
        levels = []
        for level, overlap in sorted(((int(k), v) for k, v in ex["overlap"].items())):
            tokens = [t for t in ex["shared"] if int(t["level"]) == level][:3]
            names = "; ".join(f"{t['token']} {t.get('label') or '(no label)'} ({fmt(t['weight'], 3)})" for t in tokens)
            levels.append(f"level {level} overlap {fmt(overlap, 3)}" + (f": {names}" if names else ""))
        out.append(head + "\n  - " + "\n  - ".join(levels))
    return "\n".join(out)


MASKED = "masked_new_to_user"
DEEP = "deep_funnel"
# the deep-funnel table's columns: (header, slice or None for the protocol itself, metric)
DEEP_COLUMNS = (("all recall@20", None, "recall@20"), ("repeat recall@20", "repeat", "recall@20"),
                ("explore recall@20", "explore", "recall@20"), ("HR@10", None, "hr@10"), ("HR@20", None, "hr@20"))


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


def deep_rows(section: Mapping[str, Any], arms: Mapping[str, str], bold: tuple[str, str] = ("**", "**")
              ) -> list[list[str]]:
    """The deep-funnel table (DEEP_COLUMNS): per arm of ``arms``, recall@20 on every held-out
    target-stage entity, on the repeat and on the explore slice, then HR@10 and HR@20; the best
    arm of each column wrapped in ``bold``."""
    slices = section.get("slices") or {}

    def value(arm: str, sl: str | None, metric: str) -> Any:
        part = section if sl is None else slices.get(sl) or {}
        return (part.get(arm) or {}).get(metric)

    best = {}
    for header, sl, metric in DEEP_COLUMNS:
        values = {a: v for a in arms if isinstance(v := value(a, sl, metric), float) and v == v}
        best[header] = max(values, key=lambda a: values[a]) if values else None
    rows = []
    for arm in arms:
        cells = []
        for header, sl, metric in DEEP_COLUMNS:
            cell = fmt(value(arm, sl, metric))
            cells.append(f"{bold[0]}{cell}{bold[1]}" if best[header] == arm else cell)
        rows.append([arm, *cells])
    return rows


def deep_md(r: Mapping[str, Any], arms: Mapping[str, str]) -> list[str]:
    """The deep-funnel protocol's heading, protocol sentence and table (none in reports written
    before it existed)."""
    section = r.get(DEEP)
    if not section:
        return []
    slices = section.get("slices") or {}
    users = ", ".join(f"{name} {(slices.get(name) or {}).get('users')}" for name in ("repeat", "explore"))
    return ["### Retrieval, deep funnel (target-stage history masked)",
            f"Protocol: {section.get('protocol')}. Users scored {section.get('users')} ({users}). "
            f"{ratio_line(section, arms)}",
            _md_table(["arm", *(c[0] for c in DEEP_COLUMNS)], deep_rows(section, arms))]


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
    for col in RANKING_HEADER:
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
    deep = (m.get("retrieval") or {}).get(DEEP)
    if deep:
        t = Table(title=f"retrieval, deep funnel (users {deep.get('users')}; best in bold)")
        for col in ("arm", *(c[0] for c in DEEP_COLUMNS)):
            t.add_column(col, justify="right" if col != "arm" else "left")
        for row in deep_rows(deep, arms, ("[bold]", "[/bold]")):
            t.add_row(*row)
        console.print(t)
    for arm, why in ((m.get("ranking") or {}).get("skipped") or {}).items():
        console.print(f"[red]ranking arm {arm}: skipped: {why}[/]")
    for note in (m.get("sources") or {}).get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    console.print("did HIR help ranking? " + ranking_answer(m.get("ranking") or {}).replace("**", ""), markup=False)
    console.print("did HIR help retrieval? " + retrieval_answer(m.get("retrieval") or {}).replace("**", ""), markup=False)
    console.print(f"report: {report_dir / 'report.html'}")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join([*lines, *["| " + " | ".join(r) + " |" for r in rows]])


def slice_rows(m: Mapping[str, Any]) -> list[list[str]]:
    arms = ranking_arms(m.get("ranking") or {})
    rows = []
    for s in (m.get("ranking") or {}).get("slices", []):
        rows.append([
            s["slice"], str(s["n"]), str(s["positives"]),
            *[fmt((s.get(arm) or {}).get("auc"), 3) for arm in arms],
            *[fmt((s.get(arm) or {}).get("ne"), 3) for arm in arms],
            *[fmt_ci(s.get(lift_key(arm))) for arm in arms if arm != BASELINE],
        ])
    return rows


def retrieval_slice_rows(m: Mapping[str, Any]) -> list[list[str]]:
    """recall@20 per slice: the full-catalogue slices, then the masked protocol's (``masked/...``)
    and the deep-funnel one's (``deep/...``)."""
    rows = []
    r = m.get("retrieval") or {}
    arms = retrieval_arms(r)
    for prefix, section in (("", r), ("masked/", r.get(MASKED) or {}), ("deep/", r.get(DEEP) or {})):
        skipped = section.get("skipped") or {}
        for name, sl in (section.get("slices") or {}).items():
            rows.append([f"{prefix}{name}", str(sl.get("users")), *[
                "skipped" if arm in skipped else fmt((sl.get(arm) or {}).get("recall@20")) for arm in arms]])
    return rows


def slice_header(m: Mapping[str, Any]) -> list[str]:
    """The ranking slice table's columns: AUC and NE per arm (the baseline as ``base``), hir's NE lift."""
    arms = ["base" if a == BASELINE else a for a in ranking_arms(m.get("ranking") or {})]
    return ["slice", "rows/users", "positives", *[f"AUC {a}" for a in arms], *[f"NE {a}" for a in arms],
            *[f"NE lift {a} [CI]" for a in arms if a != "base"]]


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
        # beside the learned tokens: a plain k-means per level on the exported vectors (the
        # reference the hierarchy has to beat), and NMI of each against the deepest taxonomy level
        ref = {e.get("level"): e for e in (sg.get("kmeans_reference") or {}).get("levels") or []}
        tax = sorted({k for e in sg["levels"] for k in (e.get("taxonomy_nmi") or {})},
                     key=lambda k: int(k.removeprefix("taxonomy_d")))  # taxonomy_d<depth>
        deepest = tax[-1] if tax else None
        header = ["level", "prototypes", "density", "gain over raw", "random gain", "concentration"]
        if ref:
            header.append("k-means concentration")
        if deepest:
            header += [f"NMI {deepest}", *([f"k-means NMI {deepest}"] if ref else [])]
        # purity: each level against the taxonomy depth it stands for (coarsest = depth 1, finest =
        # the deepest), beside the k-means reference's
        has_purity = bool(tax) and any(e.get("taxonomy_purity") for e in sg["levels"])
        if has_purity:
            header += ["purity (depth)", *(["k-means purity"] if ref else [])]
        rows = []
        for e in sg["levels"]:
            km = ref.get(e.get("level")) or {}
            row = [str(e.get("level")), str(e.get("prototypes", "")), fmt(e.get("density"), 6), fmt(e.get("gain"), 1),
                   fmt(e.get("random_gain"), 1), fmt(e.get("concentration"), 3)]
            if ref:
                row.append(fmt(km.get("concentration"), 3))
            if deepest:
                row += [fmt((e.get("taxonomy_nmi") or {}).get(deepest), 3),
                        *([fmt((km.get("taxonomy_nmi") or {}).get(deepest), 3)] if ref else [])]
            if has_purity:
                lvl = int(e.get("level") or 0)
                depth = tax[-1] if lvl == len(sg["levels"]) - 1 else tax[min(lvl, len(tax) - 1)]
                row += [f"{fmt((e.get('taxonomy_purity') or {}).get(depth), 3)} ({depth.removeprefix('taxonomy_')})",
                        *([fmt((km.get("taxonomy_purity") or {}).get(depth), 3)] if ref else [])]
            rows.append(row)
        fit = f" Tokens from the {sg['hierarchy_fit']} prototypes (export.hierarchy_fit)." if sg.get("hierarchy_fit") else ""
        parts.append(f"Super-graph density (raw user->entity graph: {fmt(sg.get('raw_density'), 6)}). The gain "
                     "over raw is above 1 for any assignment; beside it, a random assignment of the same token "
                     "sizes, and the concentration (user-token edges / the random assignment's: below 1 when "
                     "users' entities share tokens more than chance)"
                     + (", the same for a plain k-means per level on the exported vectors" if ref else "")
                     + (", and the NMI of products' top-1 token against the taxonomy" if deepest else "")
                     + f".{fit}\n\n" + _md_table(header, rows))
    held = sg.get("heldout") or {}
    if held.get("tokens"):
        ref = {e["level"]: e for e in held.get("kmeans_reference") or []}
        rows = []
        for e in held["tokens"]:
            km = ref.get(e["level"]) or {}
            # nats the history adds over the tokens' popularity: comparable across tokenizations,
            # whose token sizes (and so raw log-losses) differ
            gain = e["log_loss_popularity"] - e["log_loss"]
            km_gain = km["log_loss_popularity"] - km["log_loss"] if km.get("log_loss") is not None else None
            rows.append([str(e["level"]), fmt(e["concentration"], 3), fmt(km.get("concentration"), 3),
                         fmt(gain, 3), fmt(km_gain, 3), fmt(e["recall@5"], 3), fmt(e["recall@5_popularity"], 3),
                         fmt(km.get("recall@5"), 3), fmt(km.get("recall@5_popularity"), 3),
                         fmt(e["coverage"], 3), fmt(km.get("coverage"), 3)])
        parts.append(
            f"Held out (the test period's {held.get('test_pairs')} user-entity pairs, which neither the model nor the "
            "prototypes saw): concentration against a popularity-matched random assignment of the same token sizes "
            "(below 1 = a user's new entities share tokens); a user's history tokens predicting the tokens of their "
            "new test entities (the nats their history adds over the tokens' popularity, and recall@5 beside "
            "popularity's); and the share of test "
            f"user-token edges the history already holds (raw user-entity edges: {fmt(held.get('raw_coverage'), 3)}). "
            "Beside each, a plain k-means per level on the same vectors.\n\n" + _md_table(
                ["level", "concentration", "k-means", "gain (nats)", "k-means", "recall@5", "popularity",
                 "k-means recall@5", "k-means popularity", "coverage", "k-means"], rows))
    if d.get("level0_tokens"):
        has_purity = any("purity" in t for t in d["level0_tokens"])
        parts.append("Level-0 tokens: label (class-based TF-IDF over all members' text), the most probable members"
                     + (", and purity: the share of members in the token's most frequent top-level category" if has_purity
                        else "") + ".\n\n" + _md_table(
            ["token", "usage", "label", "top members", *(["purity", "category"] if has_purity else [])],
            [[str(t["token"]), fmt(t["usage"], 3), str(t["label"]),
              " / ".join(m.replace("|", "/") for m in t.get("members") or []),
              *([fmt(t.get("purity"), 3), str(t.get("category", ""))] if has_purity else [])]
             for t in d["level0_tokens"]]))
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
    out = [f"History: {r.get('history_splits')}; test users {r.get('users')}. "
           f"{'Three' if r.get(DEEP) else 'Two'} protocols for every arm; "
           "the best arm on each metric is in bold and named in the `best` row."]
    for title, section in retrieval_sections(m):
        protocol = section.get("protocol") or "no arm filters a user's past entities"
        out += [f"### Retrieval, {title}",
                f"Protocol: {protocol}; users scored "
                f"{section.get('users')}. {ratio_line(section, arms)}",
                _md_table(["arm", *retrieval_metrics(ks)], retrieval_rows(section, ks, arms))]
        if line := skipped_line(section):
            out.append(line + ".")
    return out + deep_md(r, arms)


def protocol_md(r: Mapping[str, Any]) -> str:
    rows, pos, boot = r.get("rows") or {}, r.get("positives") or {}, r.get("bootstrap") or {}
    seeds = r.get("seeds") or []
    return (f"Protocol: {r.get('protocol')}; rows fit {rows.get('fit')} / test {rows.get('test')}, positives fit "
            f"{pos.get('fit')} / test {pos.get('test')}; {boot.get('resamples')} paired bootstrap resamples by "
            f"{boot.get('unit')} (the same draws for every arm and seed; each draw averages the seeds), "
            f"{100 * float(boot.get('level') or 0):g}% intervals; {max(len(seeds), 1)} ranker seed(s) {seeds}, the "
            "spread of the per-seed NE lifts beside each interval. Every arm: same rows, recipe, seeds and step "
            "budget; features point-in-time.")


def fits_md(m: Mapping[str, Any]) -> str:
    """One line on how each trained retrieval arm ended (best epoch, time, budget stops) and which
    ranking arms were skipped."""
    parts = []  # the rankers' fits have their own table (fit_rows)
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


def cache_sentence(cache: Mapping[str, Any]) -> str:
    """Which baseline fits came from the cache (metrics.json ``cache``), as a sentence."""
    if not cache.get("enabled"):
        return ""
    reused = ", ".join(cache.get("reused") or []) or "none"
    parallel = ", ".join(cache.get("fitted_in_parallel") or [])
    return (f" Baseline fits reused from the cache of this snapshot ({cache.get('dir')}): {reused}"
            + (f"; fitted in a second process while the rankers trained: {parallel}." if parallel else "."))


def as_sentence(text: str) -> str:
    """``text`` ending as a sentence: the notes are written as clauses (they are also log lines)."""
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else f"{text}."


def markdown(m: Mapping[str, Any], figures: Mapping[str, str]) -> str:
    src = m.get("sources") or {}
    out = [
        f"# hir evaluation: {m.get('dataset')}",
        headline_md(m),
        f"Model version `{m.get('model_version')}`; HIR ranking features from {src.get('ranking_hir')}, "
        f"HIR retrieval from {src.get('retrieval_hir')}.{cache_sentence(m.get('cache') or {})}",
        *[f"> note: {as_sentence(n)}" for n in src.get("notes", [])],
        "## Ranking (deep funnel)",
        protocol_md(m.get("ranking") or {}),
        _md_table(RANKING_HEADER, ranking_rows(m)),
        "Ranker fits (every seed and fold): the step of the best holdout check, and which check it was out of "
        "how many (1 = the first: the ranker never improved after its first check); the curves are the "
        "`ranker_curves` figure and `ranking.<arm>.fit.curves` in metrics.json.",
        _md_table(["arm", "best step", "best check / checks", "steps an epoch", "seconds"], fit_rows(m)),
        "### Why this? (the shared Bag-of-Meaning tokens of top-ranked test pairs, as `hir explain` gives them)",
        explanation_md(m.get("ranking") or {}) or "No explanations (no HIR features, or eval.explain.pairs=0).",
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
    (report_dir / "report.html").write_text(html_page(md_text, figures, f"hir evaluation: {metrics.get('dataset')}", names))
    # metrics.json last: its presence marks a complete report (the stage reuses it unless force)
    tmp = report_dir / "metrics.json.tmp"
    tmp.write_text(json.dumps(metrics, indent=2))
    tmp.replace(report_dir / "metrics.json")
    return metrics
