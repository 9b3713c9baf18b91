"""The report's matplotlib figures, each returned as PNG bytes (embedded in report.html and
written next to it)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # headless: the report is written to files, never shown
import matplotlib.pyplot as plt

from hir_evaluation.ranking.registry import BASELINE, lift_key
from hir_evaluation.report.sections import ranking_arms, retrieval_arms

COLORS = {"baseline": "#7f7f7f", "hir": "#d62728", "content": "#1f77b4", "popularity": "#bcbd22",
          "itemknn": "#2ca02c", "lightgcn": "#9467bd", "repeat": "#8c564b"}
# arms without a colour of their own, in order of appearance
MORE_COLORS = ("#17becf", "#e377c2", "#ff7f0e", "#aec7e8", "#98df8a", "#c5b0d5")


def color(arm: str, arms: list[str]) -> str:
    """The arm's colour: its own, else the next spare one by its position among ``arms``."""
    spare = [a for a in arms if a not in COLORS]
    return COLORS.get(arm) or MORE_COLORS[spare.index(arm) % len(MORE_COLORS) if arm in spare else 0]


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and x == x


def lift_bars(ranking: Mapping[str, Any]) -> bytes:
    """Left: NE lift of each arm over the baseline with its bootstrap interval. Right: AUC per arm."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    every = ranking_arms(ranking)
    lifts = [(arm, ranking.get(lift_key(arm)) or {}) for arm in every if arm != BASELINE]
    lifts = [(a, v) for a, v in lifts if _finite(v.get("value"))]
    for i, (arm, v) in enumerate(lifts):
        lo, hi = v.get("ci", [v["value"], v["value"]])
        ax1.bar(i, 100 * v["value"], color=color(arm, every), yerr=[[100 * (v["value"] - lo)], [100 * (hi - v["value"])]], capsize=6)
    ax1.axhline(0, color="black", lw=0.8)
    ax1.set_xticks(range(len(lifts)), [a for a, _ in lifts])
    ax1.set_ylabel("NE lift over baseline (%)")
    ax1.set_title("Relative NE lift (95% CI)")
    arms = [a for a in every if _finite((ranking.get(a) or {}).get("auc"))]
    for i, arm in enumerate(arms):
        m = ranking[arm]
        lo, hi = m.get("auc_ci", [m["auc"], m["auc"]])
        ax2.bar(i, m["auc"], color=color(arm, every), yerr=[[m["auc"] - lo], [hi - m["auc"]]], capsize=6)
    ax2.set_xticks(range(len(arms)), arms)
    lows = [ranking[a]["auc"] for a in arms]
    ax2.set_ylim(max(0.0, min(lows, default=0.5) - 0.1), 1.0)
    ax2.set_title("Test AUC (95% CI)")
    return _png(fig)


def recall_curves(retrieval: Mapping[str, Any], ks: list[int]) -> bytes:
    """recall@K per arm: the full-catalogue protocol, and beside it the masked new-to-user one
    when the section has it."""
    panels = [("full catalogue", retrieval)]
    if retrieval.get("masked_new_to_user"):
        panels.append(("masked new-to-user", retrieval["masked_new_to_user"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.6), squeeze=False)
    roles = retrieval_arms(retrieval)
    for ax, (title, section) in zip(axes[0], panels):
        for arm, role in roles.items():
            m = section.get(arm) or {}
            ys = [m.get(f"recall@{k}") for k in ks]
            if all(_finite(y) for y in ys):
                ax.plot(ks, ys, marker="o", label=arm, color=color(arm, list(roles)), lw=2.2 if role == "model" else 1.4)
        ax.set_xlabel("K")
        ax.set_ylabel("recall@K")
        ax.set_title(f"Retrieval recall@K, {title}", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return _png(fig)


def repeat_explore_bars(retrieval: Mapping[str, Any]) -> bytes:
    """recall@20 per arm on the repeat slice (held-out entities the user engaged with before, at
    any stage; hatched) and the explore slice (new to the user; solid), side by side: the
    full-catalogue protocol, and beside it the deep-funnel one when the section has it. A missing
    value (an arm not run, or without that protocol's list) leaves its bar out."""
    panels = [("full catalogue", retrieval, ("repeat", "new_to_user"))]
    if retrieval.get("deep_funnel"):
        panels.append(("deep funnel", retrieval["deep_funnel"], ("repeat", "explore")))
    roles = retrieval_arms(retrieval)
    arms = list(roles)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(5.5, 0.9 * len(arms) + 2) * len(panels), 3.8),
                             squeeze=False)
    width = 0.38
    for ax, (title, section, (repeat, explore)) in zip(axes[0], panels):
        slices = section.get("slices") or {}
        for i, arm in enumerate(arms):
            for offset, name, hatch in ((-width / 2, repeat, "//"), (width / 2, explore, None)):
                value = ((slices.get(name) or {}).get(arm) or {}).get("recall@20")
                if _finite(value):
                    ax.bar(i + offset, value, width, color=color(arm, arms), hatch=hatch, edgecolor="black", lw=0.5)
        ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("recall@20")
        users = ", ".join(f"{label} {(slices.get(n) or {}).get('users')} users"
                          for label, n in (("repeat", repeat), ("explore", explore)))
        ax.set_title(f"Repeat (hatched) vs explore (solid), {title}\n({users})", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def lightgcn_curve(fit: Mapping[str, Any]) -> bytes:
    """LightGCN's validation recall@20 per epoch (the masked new-to-user one it is selected on,
    and the full-catalogue one, dashed), the selected epoch marked; top axis: seconds."""
    curve = fit.get("curve") or []
    epochs = [c["epoch"] for c in curve]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(epochs, [c["val_recall@20"] for c in curve], color=COLORS["lightgcn"], lw=1.8,
            label="val recall@20, masked new-to-user (selection)")
    if all(_finite(c.get("val_recall@20_full")) for c in curve):
        ax.plot(epochs, [c["val_recall@20_full"] for c in curve], color=COLORS["lightgcn"], lw=1.2, ls="--",
                label="val recall@20, full catalogue")
    best = fit.get("best_epoch")
    if best:
        ax.axvline(best, color="black", lw=0.8, ls=":", label=f"selected epoch {best}")
    secs = np.array([c["seconds"] for c in curve], dtype=float)
    if len(curve) < 2:
        ax.set_xlim(0.5, 1.5 + len(curve))
    elif np.all(np.diff(secs) > 0):  # an invertible epoch -> seconds map
        ep = np.array(epochs, dtype=float)
        top = ax.secondary_xaxis("top", functions=(lambda e: np.interp(e, ep, secs), lambda t: np.interp(t, secs, ep)))
        top.set_xlabel("seconds", fontsize=8)
    stop = "the budget (" + str(fit.get("stopped_by")) + ")" if fit.get("stopped_by_budget") else "patience"
    ax.set_title(f"LightGCN validation curve (stopped by {stop})", fontsize=10)
    ax.set_xlabel("epoch")
    ax.set_ylabel("val recall@20")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _png(fig)


def ranker_curves(ranking: Mapping[str, Any]) -> bytes:
    """Each ranking arm's holdout log loss per check (its first seed's fits; one line per fold
    when cross-fitted), the best check marked; a dotted line at each pass over the fit rows."""
    every = ranking_arms(ranking)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    epoch = 0
    for arm in every:
        fit = (ranking.get(arm) or {}).get("fit") or {}
        curves = fit.get("curves") or []
        if not curves:
            continue
        first = curves[0]["seed"]
        for i, c in enumerate(x for x in curves if x["seed"] == first):
            steps = [p["step"] for p in c["curve"]]
            loss = [p["holdout_log_loss"] for p in c["curve"]]
            ax.plot(steps, loss, color=color(arm, every), lw=1.4, label=arm if i == 0 else None)
            best = int(np.argmin(loss))
            ax.plot(steps[best], loss[best], marker="o", color=color(arm, every))
            epoch = epoch or int(c.get("steps_per_epoch") or 0)
    if epoch:
        for x in range(epoch, int(ax.get_xlim()[1]) + 1, epoch):
            ax.axvline(x, color="black", lw=0.6, ls=":")
    ax.set_xlabel("step (dotted: one pass over the fit rows)")
    ax.set_ylabel("holdout log loss")
    ax.set_title("Ranker holdout curves (dot = the check kept)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def calibration_plot(curves: Mapping[str, Mapping[str, list[float]]]) -> bytes:
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    top = 0.0
    for arm, c in curves.items():
        ax.plot(c["predicted"], c["observed"], marker="o", label=arm, color=color(arm, list(curves)))
        top = max(top, *c["predicted"], *c["observed"])
    ax.plot([0, top], [0, top], ls="--", color="black", lw=0.8, label="perfect")
    ax.set_xlabel("mean predicted probability")
    ax.set_ylabel("observed positive rate")
    ax.set_title("Calibration (test, equal-count bins)")
    ax.legend(fontsize=8)
    return _png(fig)


def token_usage_plot(usage: list[Mapping[str, Any]]) -> bytes:
    fig, axes = plt.subplots(1, max(len(usage), 1), figsize=(3.2 * max(len(usage), 1), 3.0), squeeze=False)
    for ax, level in zip(axes[0], usage):
        counts = level["counts"]
        ax.bar(range(len(counts)), counts, width=1.0, color="#d62728")
        ax.set_title(f"level {level['level']}: {level['used']}/{level['vocab']} used, ppl {level['perplexity']:.1f}", fontsize=9)
        ax.set_xlabel("prototype (by usage)")
        ax.set_ylabel("entities (top-1)")
    return _png(fig)


def embedding_map_plot(points: Mapping[str, Any], title: str) -> bytes:
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    ax.scatter(points["x"], points["y"], c=points["token"], cmap="tab20", s=4, alpha=0.7, linewidths=0)
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
    return _png(fig)


def figures(metrics: Mapping[str, Any], points: Mapping[str, Any] | None, entity_type: str) -> dict[str, bytes]:
    """The report's figures (name -> PNG) from its metrics and the 2-D embedding map points."""
    figs = {
        "ranking_lift": lift_bars(metrics["ranking"]),
        "recall_at_k": recall_curves(metrics["retrieval"], metrics["retrieval"]["ks"]),
        "repeat_explore": repeat_explore_bars(metrics["retrieval"]),
        "calibration": calibration_plot(metrics["ranking"]["calibration_curves"]),
    }
    if any(((metrics["ranking"].get(a) or {}).get("fit") or {}).get("curves") for a in ranking_arms(metrics["ranking"])):
        figs["ranker_curves"] = ranker_curves(metrics["ranking"])
    lightgcn = (metrics["retrieval"].get("fits") or {}).get("lightgcn") or {}
    if lightgcn.get("curve"):
        figs["lightgcn_curve"] = lightgcn_curve(lightgcn)
    if metrics["diagnostics"].get("token_usage"):
        figs["token_usage"] = token_usage_plot(metrics["diagnostics"]["token_usage"])
    if points is not None:
        figs["embedding_map"] = embedding_map_plot(
            points, f"{entity_type} embeddings ({points['method'].upper()}), colour = coarse token")
    return figs
