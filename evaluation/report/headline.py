"""The report's first screen: three answers (did HIR help ranking, with its interval; did it help
retrieval, against the best baseline; where are the outputs) and the tasks in a sentence each,
all from metrics.json."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hir_evaluation.ranking.registry import BASELINE, lift_key

# retrieval ratios within this of 1 read as level (retrieval reports no interval)
LEVEL = 0.02


def _article(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


def _pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def _lift_phrase(lift: Mapping[str, Any]) -> str:
    lo, hi = lift.get("ci") or [None, None]
    ci = f" [{100 * lo:.2f}, {100 * hi:.2f}]" if lo is not None and hi is not None else ""
    return f"{_pct(lift['value'])}{ci}"


def ranking_answer(r: Mapping[str, Any]) -> str:
    """Did the HIR features lower the ranker's test normalized entropy, by the ``hir`` arm's
    interval; the best arm beside it when another does better."""
    lift = r.get(lift_key("hir")) or {}
    skipped = (r.get("skipped") or {}).get("hir")
    if skipped:
        return f"**Not measured**: the hir arm was skipped ({skipped})."
    if lift.get("value") is None:
        return "**Not measured**: no HIR features reached the ranking rows."
    lo, hi = lift.get("ci") or [None, None]
    boot = r.get("bootstrap") or {}
    level = f"{100 * float(boot.get('level') or 0.95):g}%"
    if lo is not None and lo > 0:
        verdict = "**Yes.**"
    elif hi is not None and hi < 0:
        verdict = "**No, it hurt.**"
    else:
        verdict = "**Not measurably**: the interval includes 0."
    text = (f"{verdict} Adding the HIR embeddings to the baseline ranker's features changed its test normalized "
            f"entropy by {_lift_phrase(lift)} (NE lift, positive = better; {level} interval over "
            f"{boot.get('resamples')} paired bootstrap resamples by {boot.get('unit', 'user')}, "
            f"{len(r.get('seeds') or [1])} ranker seeds).")
    arms = [a for a in (r.get("arms") or []) if a not in (BASELINE, "hir")]
    lifts = {a: r.get(lift_key(a)) for a in arms if (r.get(lift_key(a)) or {}).get("value") is not None}
    if lifts:
        best = max(lifts, key=lambda a: lifts[a]["value"])
        if lifts[best]["value"] > lift["value"]:
            text += f" The best arm, {best}, gives {_lift_phrase(lifts[best])}."
    return text


def retrieval_answer(ret: Mapping[str, Any]) -> str:
    """hir's recall@K against the best baseline, under the masked new-to-user protocol (the
    headline) and the full catalogue."""
    parts = []
    for name, section in (("masked new-to-user", ret.get("masked_new_to_user") or {}), ("full catalogue", ret)):
        best = dict(section.get("hir_over_best_baseline") or {})
        if best.get("ratio") is None:
            continue
        best.setdefault("hir", (section.get("hir") or {}).get(best.get("metric", "recall@20")))
        parts.append((name, best))
    if not parts:
        return "**Not measured**: no HIR retrieval (no embeddings were searched)."
    name, best = parts[0]
    ratio = float(best["ratio"])
    # no interval is computed for retrieval: a ratio within LEVEL of 1 is not called a win or a loss
    verdict = ("**Yes.**" if ratio >= 1 + LEVEL else "**No.**" if ratio <= 1 - LEVEL
               else f"**About level** (within {100 * LEVEL:g}%; retrieval has no interval).")
    metric = best.get("metric", "recall@20")
    text = (f"{verdict} Under the {name} protocol, hir's {metric} is {_num(best['hir'])}, {ratio:.2f}× the best "
            f"baseline ({best['best_baseline']}, {_num(best.get('best_value'))}).")
    for other, b in parts[1:]:
        text += (f" On the {other}: {_num(b['hir'])}, {float(b['ratio']):.2f}× {b['best_baseline']} "
                 f"({_num(b.get('best_value'))}).")
    return text


def _num(x: object) -> str:
    return f"{x:.4f}" if isinstance(x, int | float) else "–"


def outputs_table(outputs: Mapping[str, Any]) -> str:
    """Where the run's outputs are, as a markdown table (paths in backticks)."""
    rows = [("this report", "report", "beside it: `report.md`, `metrics.json`, the figures"),
            ("embeddings and tokens", "embeddings", "one parquet per entity type"),
            ("hierarchy", "hierarchy", "prototypes, labels, super-graph"),
            ("publish manifest", "manifest", "what was served where, and its status"),
            ("serving store", "serving_store", "Feast registry and online store, Milvus Lite, `live.json`")]
    lines = ["| output | where | what |", "|---|---|---|"]
    for label, key, note in rows:
        if outputs.get(key):
            lines.append(f"| {label} | `{outputs[key]}` | {note} |")
    if outputs.get("feature_service"):
        aliases = ", ".join(f"`{a}`" for a in (outputs.get("milvus_aliases") or {}).values())
        lines.append(f"| for a ranker | Feast service `{outputs['feature_service']}` | Milvus aliases {aliases} |")
    return "\n".join(lines)


def _stages(stages: list[str] | tuple[str, ...] | None) -> str:
    stages = list(stages or [])
    return " or ".join(stages) if stages else "the shallowest stage"


def ranking_task_sentence(r: Mapping[str, Any]) -> str:
    """The ranking task and protocol in plain words, from metrics.json's ``ranking``."""
    t = r.get("task") or {}
    etype, label = t.get("entity_type", "entity"), t.get("label_stage") or "the deepest stage"
    window = f"within {t['window']}" if t.get("window") else "before the end of the period"
    kind = t.get("kind")
    if kind == "funnel":
        task = (f"every (user, {etype}) pair with {_article(_stages(t.get('candidate_stages')))} event in a period is a "
                f"candidate at that event, positive when the user reaches {label} with it {window}")
    elif kind == "next_period":
        task = (f"for each user who reaches {label} in a period, the candidates are the user's "
                f"{t.get('history_items')} most recent past {etype}s, the {t.get('popular_items')} most popular and "
                f"{t.get('negatives')} random ones, positive when the user reaches {label} with it in the period")
    elif kind == "conversion":
        task = (f"of the {etype}s a user took to {_stages(t.get('candidate_stages'))} before the period and never to "
                f"{label}, the ones the user takes to {label} in the period are positive")
    else:
        task = f"a {kind} task on {etype}s"
    rows, pos = r.get("rows") or {}, r.get("positives") or {}
    fit = r.get("fit_splits") or []
    how = ("cross-fitted on the test period by user folds" if fit == ["test"]
           else f"trained on the {' and '.join(fit)} period")
    return (f"**Ranking task** ({kind}): {task}. Every arm's ranker is {how} ({rows.get('fit')} rows, "
            f"{pos.get('fit')} positives) with the same recipe and seeds, and scored on the test period "
            f"({rows.get('test')} rows, {pos.get('test')} positives); features are point-in-time.")


def retrieval_task_sentence(ret: Mapping[str, Any]) -> str:
    """The retrieval task in plain words, from metrics.json's ``retrieval``."""
    t = ret.get("task") or {}
    if not t:
        return ""
    etype = t.get("entity_type", "entity")
    target = t.get("target_stage") or "deepest-stage"
    ks = ", ".join(str(k) for k in ret.get("ks") or [])
    return (f"**Retrieval task**: for each of {ret.get('users')} test users, every arm returns its top {etype}s, "
            f"learning from the {' and '.join(ret.get('history_splits') or [])} history; relevant = the user's "
            f"{target} {etype}s of the test period; recall and NDCG at {ks}, with and without the user's past "
            f"{etype}s masked.")


def headline_md(m: Mapping[str, Any]) -> str:
    """The report's first screen as markdown."""
    ranking, retrieval = m.get("ranking") or {}, m.get("retrieval") or {}
    parts = [
        f"**Did HIR help ranking?** {ranking_answer(ranking)}",
        f"**Did HIR help retrieval?** {retrieval_answer(retrieval)}",
        "**Where are the outputs?**",
        outputs_table(m.get("outputs") or {}),
        ranking_task_sentence(ranking) if ranking.get("task") else "",
        retrieval_task_sentence(retrieval),
    ]
    return "\n\n".join(p for p in parts if p)
