"""Deep-funnel retrieval: the learned funnel scorer against the plain ordering of the same
candidates, the user's open funnel, the discovery list and the repeat reference, on test.

    python benchmarks/funnel.py --datasets beibei,completejourney,online_retail --seeds 0,1,2

Each dataset needs a prepared snapshot (``hir prepare data=<name>``; ``--graph`` points at
another). Per seed the scorer is trained on its training views (hir/funnel/fit.py: next-period
cuts on data with time, a denoised view without) and every arm ranks each test user's list from
the events before the test period. Two protocols (evaluation/retrieval, issue 31):

- ``full``: nothing masked; relevance = every test-period target-stage entity.
- ``deep_funnel`` (GHCF/EHCF/CRGCN): only the user's history entities *of the target stage* are
  masked; carts, views and coupons stay rankable.

Each reports recall@K and HR@K over all test users and apart for **repeat** (test entities the user
engaged with before, any stage) and **explore** (new to the user) relevance. Ratios between arms
are pooled over seeds with a paired bootstrap over users (the same users resampled in every seed).
Writes ``benchmarks/results/funnel.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _results_md import markers, shown, write_section  # noqa: E402  (benchmarks/)

from hir.data.snapshot import load_snapshot  # noqa: E402
from hir.funnel.candidates import CYCLE_FEATURES, FEATURES, NEIGHBOUR_FEATURES  # noqa: E402
from hir.funnel.fit import (  # noqa: E402
    Candidates,
    FunnelConfig,
    FunnelModel,
    choose_task,
    concat_views,
    fit_period,
    fit_training_set,
    score_candidates,
    top_per_user,
    view_candidates,
    view_sets,
)
from hir.funnel.scorer import fit_scorer  # noqa: E402
from hir.funnel.source import plain_order  # noqa: E402

KS = (10, 20, 50)
ARMS = ("recommend", "plain", "open_funnel", "open_funnel_pop", "discovery", "repeat")
# optional arms (--extra): the scorer without the affinity features, without the repurchase-cycle
# features, with the target-aware head, and either kind of scorer (hir/funnel/boost.py: the one
# that is not funnel.config.scorer.kind is the paired arm; the ablations refit the default kind)
KINDS = ("mlp", "gbdt")
# how the fit is checked (hir/funnel/fit.py ``select``), on the same candidates: ``holdout`` (held-out
# training users), ``period`` (the val period, then refit), ``period_keep`` (the val period, no
# refit), ``period_<kind>`` (either kind, period-checked and refitted); next_period data only
# ``period_all`` refits on every view, the oldest included
SELECT_ARMS = {"holdout": ("holdout", True, None), "period": ("period", True, None),
               "period_keep": ("period", False, None), "period_all": ("period", "all", None),
               **{f"period_{k}": ("period", True, k) for k in KINDS}}
# ``blend``: the recommend arm's and the gbdt arm's (``period_gbdt`` when run, else ``gbdt``) mean
# within-user rank, the two fits on the same candidates (needs one of those arms in --extra too).
# Measured (3 seeds, paired over users): completejourney full recall@20 blend / mlp 1.004 [0.997,
# 1.011]; beibei deep_funnel hit@10 0.470 against the mlp's 0.466 and the gbdt's 0.480: not a default
EXTRA = ("no_affinity", "no_cycle", "no_nbr", "head", *KINDS, *SELECT_ARMS, "blend")
AFFINITY_COLUMNS = [i for i, n in enumerate(FEATURES) if n.startswith(("aff_", "log_ctx_"))]
CYCLE_COLUMNS = [list(FEATURES).index(n) for n in CYCLE_FEATURES]
NEIGHBOUR_COLUMNS = [list(FEATURES).index(n) for n in NEIGHBOUR_FEATURES]
# the arms that refit the scorer on the same candidates with some columns inert (0), fitted and
# checked as the recommend arm is (``no_nbr`` needs --neighbours > 0: else its columns are 0 already)
ABLATIONS = {"no_affinity": AFFINITY_COLUMNS, "no_cycle": CYCLE_COLUMNS, "no_nbr": NEIGHBOUR_COLUMNS}
log = logging.getLogger("funnel")


def blend_scores(cands: Candidates, *arms: np.ndarray) -> np.ndarray:
    """(n,) minus the mean over ``arms`` ((n,) scores each) of each row's rank within its user
    (0 = the user's best), so that two scorers on different scales count alike."""
    group = np.repeat(np.arange(len(cands.offsets) - 1), np.diff(cands.offsets))
    frame = pl.DataFrame({"g": group, **{f"s{i}": a for i, a in enumerate(arms)}})
    ranks = frame.select(pl.col(f"s{i}").rank("average", descending=True).over("g") for i in range(len(arms)))
    return -ranks.to_numpy().mean(1)


def plain_scores(cands: Candidates) -> np.ndarray:
    """The non-learned ordering of the same candidates, as scores: the user's engaged entities in
    :func:`plain_order` (deepest stage, most events there, most recent, most converted by
    others), then the discovery list by position, then popular entities."""
    rows = cands.rows.with_row_index("i")
    funnel = plain_order(rows.filter(pl.col("in_funnel")), include_converted=True)
    score = np.zeros(rows.height, np.float64)
    score[funnel["i"].to_numpy()] = 3e6 - funnel["pos"].to_numpy()
    rest = rows.filter(~pl.col("in_funnel"))
    disc = rest["disc_pos"].fill_null(0).to_numpy()
    pop = rest["pop_pos"].fill_null(0).to_numpy()
    score[rest["i"].to_numpy()] = np.where(disc > 0, 2e6 - disc, np.where(pop > 0, 1e6 - pop, 0))
    return score


def open_funnel_scores(cands: Candidates, popularity_first: bool = False) -> np.ndarray:
    """The issue's reference: the user's not-yet-converted entities by stage, recency and
    popularity (``popularity_first``: by stage, popularity, recency), then the discovery
    (item-neighbour) list. Converted pairs and popular fill come last."""
    rows = cands.rows.with_row_index("i")
    keys = ["entity_buyers", "age_days"] if popularity_first else ["age_days", "entity_buyers"]
    open_ = rows.filter(pl.col("in_funnel") & ~pl.col("converted").fill_null(False)).sort(
        ["user_id", "deepest", *keys], descending=[False, True, popularity_first, not popularity_first])
    open_ = open_.with_columns(pl.int_range(pl.len()).over("user_id").alias("pos"))
    score = np.zeros(rows.height, np.float64)
    score[open_["i"].to_numpy()] = 3e6 - open_["pos"].to_numpy()
    rest = rows.filter(~(pl.col("in_funnel") & ~pl.col("converted").fill_null(False)))
    disc = rest["disc_pos"].fill_null(0).to_numpy()
    score[rest["i"].to_numpy()] = np.where(disc > 0, 2e6 - disc, -1.0)
    return score


def discovery_scores(cands: Candidates) -> np.ndarray:
    """The discovery list alone (the embedding retrieval's kind: new-to-user neighbours)."""
    disc = cands.rows["disc_pos"].fill_null(0).to_numpy()
    return np.where(disc > 0, -disc.astype(np.float64), -np.inf)


def repeat_scores(cands: Candidates) -> np.ndarray:
    """The user's target-stage history, most converted first (the ``repeat`` reference of
    evaluation/retrieval/arms/repeat.py: history = the target stage)."""
    r = cands.rows
    n = r["n_target"].fill_null(0).to_numpy().astype(np.float64)
    n = np.where(n > 0, n, -np.inf)
    return np.where(r["in_funnel"].to_numpy(), n, -np.inf)


def per_user_metrics(ids: np.ndarray, rel: list[set[int]], mask: list[set[int]], ks: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Per-user recall@K and hit@K of ranked ``ids`` (U, L) after removing each user's ``mask``
    entities; users with no relevant entity get NaN."""
    out = {f"{m}@{k}": np.full(len(rel), np.nan) for k in ks for m in ("recall", "hit")}
    for u, (row, r, m) in enumerate(zip(ids, rel, mask, strict=True)):
        if not r:
            continue
        kept = [e for e in row.tolist() if e >= 0 and e not in m]
        for k in ks:
            hits = len(r.intersection(kept[:k]))
            out[f"recall@{k}"][u] = hits / len(r)
            out[f"hit@{k}"][u] = float(hits > 0)
    return out


def ceiling(cands: Candidates, rel: list[set[int]], mask: list[set[int]]) -> dict[str, float]:
    """What any ordering of the candidates can reach: the mean over users with a relevant entity of
    the share of it among the user's unmasked candidates (recall ceiling) and of any of it (hit
    ceiling). ``rel``, ``mask``: per user of ``cands.users``."""
    ent = cands.rows["entity_id"].to_numpy()
    rec, hit = [], []
    for r, (want, masked) in enumerate(zip(rel, mask, strict=True)):
        if not want:
            continue
        got = len(want.intersection(ent[cands.offsets[r]:cands.offsets[r + 1]].tolist()) - masked)
        rec.append(got / len(want))
        hit.append(float(got > 0))
    return {"recall": float(np.mean(rec)), "hit": float(np.mean(hit))}


def bootstrap_ratio(num: np.ndarray, den: np.ndarray, resamples: int = 1000, seed: int = 0) -> dict[str, float]:
    """Ratio of means and its 95% paired-bootstrap interval; num, den: (seeds, users), the same
    users resampled in every seed (NaN users dropped)."""
    ok = ~(np.isnan(num).any(0) | np.isnan(den).any(0))
    num, den = num[:, ok], den[:, ok]
    gen = np.random.default_rng(seed)
    idx = gen.integers(0, num.shape[1], size=(resamples, num.shape[1]))
    if den.mean() <= 0:  # the reference retrieves nothing here: no ratio
        return {"ratio": None, "lo": None, "hi": None, "users": int(ok.sum())}
    ratios = num[:, idx].mean(axis=(0, 2)) / np.maximum(den[:, idx].mean(axis=(0, 2)), 1e-12)
    return {"ratio": float(num.mean() / den.mean()), "lo": float(np.quantile(ratios, 0.025)),
            "hi": float(np.quantile(ratios, 0.975)), "users": int(ok.sum())}


def run_dataset(name: str, graph: Path, seeds: list[int], config: FunnelConfig, max_users: int,
                extra: tuple[str, ...] = (), head: tuple[int, int] = (2, 64)) -> dict[str, Any]:
    """Every arm of ``name`` over ``seeds``; ``extra``: arms of :data:`EXTRA` (paired with
    ``recommend``: the same training candidates, one more scorer fit each); ``head``: the head
    arm's heads and batch."""
    arms = ARMS + tuple(a for a in EXTRA if a in extra)
    build = replace(config, scorer=replace(config.scorer, heads=head[0] if "head" in extra else config.scorer.heads))
    snap = load_snapshot(graph)
    stage = snap.deep_stage
    target_rank = snap.stage_order.index(stage)
    ev = snap.events.filter(pl.col("entity_type") == "product")
    visible = ev.filter(pl.col("split").is_in(["train", "val"]) & (pl.col("timestamp") < pl.lit(snap.test_start)))
    test = ev.filter((pl.col("split") == "test") & (pl.col("stage_rank") == target_rank)).select("user_id", "entity_id").unique()
    users = np.unique(test["user_id"].to_numpy())
    if max_users and len(users) > max_users:
        users = np.sort(np.random.default_rng(0).choice(users, max_users, replace=False))
    rel_by_user = test.filter(pl.col("user_id").is_in(users)).group_by("user_id").agg("entity_id").sort("user_id")
    rel = [set(x) for x in rel_by_user["entity_id"].to_list()]
    hist_any = visible.select("user_id", "entity_id").unique().group_by("user_id").agg("entity_id")
    hist_deep = visible.filter(pl.col("stage_rank") >= target_rank).select("user_id", "entity_id").unique() \
        .group_by("user_id").agg("entity_id")
    any_map = dict(zip(hist_any["user_id"].to_list(), hist_any["entity_id"].to_list(), strict=True))
    deep_map = dict(zip(hist_deep["user_id"].to_list(), hist_deep["entity_id"].to_list(), strict=True))
    seen = [set(any_map.get(u, ())) for u in users.tolist()]
    masks = {"full": [set() for _ in users], "deep_funnel": [set(deep_map.get(u, ())) for u in users.tolist()]}
    slices = {"all": rel, "repeat": [r & s for r, s in zip(rel, seen, strict=True)],
              "explore": [r - s for r, s in zip(rel, seen, strict=True)]}
    n_users, n_ent = snap.num_nodes("user"), snap.num_nodes("product")
    split_mode = str(snap.meta.get("split", {}).get("mode", ""))
    config.use_time = snap.meta.get("split", {}).get("timestamps") != "synthesized"
    asof = snap.test_start - timedelta(microseconds=1)
    per_seed: dict[str, dict[str, dict[str, dict[str, np.ndarray]]]] = {}
    fits = []
    task = choose_task(build.task, split_mode)
    periodic = task == "next_period"
    if not periodic and any(a in SELECT_ARMS for a in extra):
        raise ValueError(f"{name}: the select arms {list(SELECT_ARMS)} need next_period data (task {task} has no period)")
    for seed in seeds:
        t0 = time.perf_counter()
        # cuts + 1 views when any fit is period-checked (the latest is the check view); the first
        # ``cuts`` are the holdout fit's training views exactly
        n_views = build.cuts + 1 if periodic and (config.select == "period" or set(extra) & set(SELECT_ARMS)) else build.cuts
        parts, views = view_sets(visible, target_rank, task, snap.val_start, snap.test_start, n_users, n_ent, build, seed,
                                 n_views)
        train = concat_views(parts[:build.cuts], task, views[:build.cuts])
        checked: dict[str, Any] = {}  # kind -> the period-checked fit (the other period arms reuse it)
        if config.select == "period" and periodic:
            scorer, record, first = fit_period(parts, views, task, config.scorer, seed, config.refit)
            checked[config.scorer.kind] = (first, {k: v for k, v in record.items() if k != "refit_fit"})
        else:
            scorer, record = fit_training_set(train, config.scorer, seed)
            record = record | train.record | {"select": "holdout"}
        model = FunnelModel(scorer, config, target_rank, record)
        t_fit = time.perf_counter() - t0
        cands = view_candidates(visible, users, asof, target_rank, n_users, n_ent, build, seed)
        assert np.array_equal(cands.users, users), "every test user must get candidates"
        scores = {"recommend": model.score(cands).astype(np.float64), "plain": plain_scores(cands),
                  "open_funnel": open_funnel_scores(cands),
                  "open_funnel_pop": open_funnel_scores(cands, popularity_first=True), "discovery": discovery_scores(cands),
                  "repeat": repeat_scores(cands)}
        t_serve = time.perf_counter() - t0 - t_fit
        for arm, cols in ABLATIONS.items():  # the same candidates, the arm's columns inert (0)
            if arm not in extra:
                continue
            t_abl = time.perf_counter()
            xt = cands.x.copy()
            xt[:, cols] = 0.0
            if config.select == "period" and periodic:  # the same views, check and refit as recommend
                zeroed = [replace(p, x=p.x.copy(), context=None) for p in parts]
                for p in zeroed:
                    p.x[:, cols] = 0.0
                s0, rec0, _ = fit_period(zeroed, views, task, replace(config.scorer, heads=0), seed, config.refit)
            else:
                x0 = train.x.copy()
                x0[:, cols] = 0.0
                s0, rec0 = fit_training_set(replace(train, x=x0, context=None), replace(config.scorer, heads=0), seed)
            scores[arm] = score_candidates(s0, replace(cands, x=xt, context=None)).astype(np.float64)
            model.record[f"{arm}_fit"] = {"best_step": rec0["best_step"], "best_recall": rec0["best_recall"],
                                          "seconds": round(time.perf_counter() - t_abl, 1)}
        for arm in KINDS:  # the other kind of scorer on the same training and test candidates
            if arm not in extra:
                continue
            t_kind = time.perf_counter()
            sk, rec_k = fit_training_set(train, replace(config.scorer, kind=arm), seed)
            scores[arm] = score_candidates(sk, cands).astype(np.float64)
            model.record[f"{arm}_fit"] = {"best_step": rec_k["best_step"], "best_recall": rec_k["best_recall"],
                                          "seconds": round(time.perf_counter() - t_kind, 1)}
        for arm, (select, refit, kind) in SELECT_ARMS.items():  # the same candidates, checked another way
            if arm not in extra:
                continue
            t_sel = time.perf_counter()
            cfg_sel = replace(config.scorer, kind=kind or config.scorer.kind)
            if select == "period" and refit is False and cfg_sel.kind in checked:
                ss, rec_s = checked[cfg_sel.kind]
            elif select == "period":
                if refit == "all" and cfg_sel.kind in checked:  # the same check, refitted on every view
                    ss, rec_s = fit_training_set(concat_views(parts, task, views), cfg_sel, seed,
                                                 stop_at=max(int(checked[cfg_sel.kind][1]["best_step"]), 1))
                else:
                    ss, rec_s, first = fit_period(parts, views, task, cfg_sel, seed, bool(refit), refit == "all")
                    checked[cfg_sel.kind] = (first, {k: v for k, v in rec_s.items() if k != "refit_fit"})
            else:
                ss, rec_s = fit_training_set(train, cfg_sel, seed)
            scores[arm] = score_candidates(ss, cands).astype(np.float64)
            model.record[f"{arm}_fit"] = {"best_step": rec_s["best_step"], "best_recall": rec_s["best_recall"],
                                          "seconds": round(time.perf_counter() - t_sel, 1)}
        if "head" in extra:
            t_head = time.perf_counter()
            head_cfg = replace(config.scorer, heads=head[0], batch=head[1])
            sh, rec_h = fit_scorer(train.x, train.y, train.offsets, train.total, head_cfg, seed, train.context)
            scores["head"] = sh.score(cands.x, cands.context).astype(np.float64)
            model.record["head_fit"] = {"best_step": rec_h["best_step"], "best_recall": rec_h["best_recall"],
                                        "seconds": round(time.perf_counter() - t_head, 1),
                                        "alpha": sh.head.alpha.tolist(), "stage_bias": sh.head.stage.tolist()}
        if "blend" in extra:
            other = next((a for a in ("period_gbdt", "gbdt") if a in scores), None)
            if other is None:
                raise ValueError("--extra blend needs a gbdt arm: add period_gbdt (next_period data) or gbdt")
            scores["blend"] = blend_scores(cands, scores["recommend"], scores[other])
        lists = {}
        for arm, s in scores.items():  # -inf entries are not retrieved
            ids, vals = top_per_user(cands, s, max(KS) + 200)
            lists[arm] = np.where(np.isfinite(vals), ids, -1)
        per_seed[str(seed)] = {proto: {arm: {sl: per_user_metrics(lists[arm], sets, mask, KS) for sl, sets in slices.items()}
                                       for arm in arms} for proto, mask in masks.items()}
        fits.append(model.record | {"seed": seed, "ceiling": {proto: ceiling(cands, rel, mask) for proto, mask in masks.items()}, "fit_seconds": round(t_fit, 1), "serve_seconds": round(t_serve, 1),
                                    "candidates_per_user": float(cands.rows.height / len(users))})
        r = per_seed[str(seed)]
        log.info("%s seed %d: ceiling %s", name, seed, fits[-1]["ceiling"])
        log.info("%s seed %d: deep_funnel hit@10 rec %.4f plain %.4f open %.4f | full recall@20 rec %.4f repeat %.4f (%.0fs)",
                 name, seed, np.nanmean(r["deep_funnel"]["recommend"]["all"]["hit@10"]),
                 np.nanmean(r["deep_funnel"]["plain"]["all"]["hit@10"]), max(np.nanmean(r["deep_funnel"][a]["all"]["hit@10"]) for a in ("open_funnel", "open_funnel_pop")),
                 np.nanmean(r["full"]["recommend"]["all"]["recall@20"]), np.nanmean(r["full"]["repeat"]["all"]["recall@20"]),
                 time.perf_counter() - t0)
    out: dict[str, Any] = {"graph": shown(graph), "users": len(users), "target_stage": stage, "arms": list(arms),
                           "split_mode": split_mode, "fits": fits, "protocols": {}}
    for proto in masks:
        part: dict[str, Any] = {}
        for arm in arms:
            part[arm] = {sl: {m: float(np.nanmean([np.nanmean(per_seed[str(s)][proto][arm][sl][m]) for s in seeds]))
                              for m in per_seed[str(seeds[0])][proto][arm][sl]}
                         | {"users": int(np.sum(~np.isnan(per_seed[str(seeds[0])][proto][arm][sl]["recall@10"])))}
                         for sl in slices}
            part[arm]["per_seed_recall@20"] = [float(np.nanmean(per_seed[str(s)][proto][arm]["all"]["recall@20"])) for s in seeds]
        ratios = {}
        pairs = [("recommend", "plain"), ("recommend", "open_funnel"), ("recommend", "open_funnel_pop"),
                 ("recommend", "repeat"), ("recommend", "discovery")]
        pairs += [(a, "repeat") for a in ("no_cycle", "no_nbr") if a in arms]
        pairs += [("recommend", a) for a in ABLATIONS if a in arms]
        pairs += [("head", "recommend"), ("head", "plain")] if "head" in arms else []
        pairs += [("blend", "recommend"), ("blend", "repeat"), ("blend", "open_funnel_pop")] if "blend" in arms else []
        pairs += [p for a in (*KINDS, *SELECT_ARMS) if a in arms for p in ((a, "recommend"), (a, "repeat"), (a, "plain"))]
        for a, b in pairs:
            for sl in slices:
                for m in ("recall@20", "hit@10", "hit@20"):
                    num = np.stack([per_seed[str(s)][proto][a][sl][m] for s in seeds])
                    den = np.stack([per_seed[str(s)][proto][b][sl][m] for s in seeds])
                    if np.isnan(den).all():
                        continue
                    ratios[f"{a}/{b}:{sl}:{m}"] = bootstrap_ratio(num, den)
        part["ratios"] = ratios
        out["protocols"][proto] = part
    return out


TARGETS = {"beibei": "hit@10 >= 0.50 and hit@20 >= 0.63 (deep_funnel), above the open-funnel reference",
           "completejourney": "recall@20 >= 1.2x repeat (full); above the plain ordering",
           "online_retail": "recall@20 >= 1.2x repeat (full); above the plain ordering"}


def render(result: dict[str, Any]) -> str:
    """The docs/results.md section of a funnel.json."""
    begin, end = markers("funnel")
    lines = [begin, "## Deep-funnel retrieval (`python benchmarks/funnel.py`) {#deep-funnel-retrieval}", "",
             f"Test users' lists from `hir recommend`'s scorer against the plain ordering of the same candidates, "
             f"the user's open funnel and the repeat reference; seeds {result['seeds']}, means over seeds; ratios "
             "pooled over seeds with a paired bootstrap over users (95%). `full`: nothing masked; `deep_funnel`: "
             "only the user's target-stage history masked (GHCF). repeat / explore: test entities the user engaged "
             f"with before / new to the user. On {result['cpus']} shared cores; each dataset gives the time of its run.", ""]
    for name, d in result["datasets"].items():
        lines += [f"### {name}", "", f"{d['users']} test users, target `{d['target_stage']}`, split `{d['split_mode']}`, "
                  f"scorer task `{d['fits'][0]['task']}`, checked on `{d['fits'][0].get('select', 'holdout')}`; "
                  f"target: {TARGETS.get(name, '-')}."
                  + (f" Measured {d['when']}." if "when" in d else ""), "",
                  *(["Candidate-set ceiling (any ordering of the candidates, mean over seeds): " + "; ".join(
                      f"{proto} recall {np.mean([f['ceiling'][proto]['recall'] for f in d['fits']]):.4f}, "
                      f"hit {np.mean([f['ceiling'][proto]['hit'] for f in d['fits']]):.4f}"
                      for proto in d["fits"][0]["ceiling"]) + ".", ""] if "ceiling" in d["fits"][0] else []),
                  "| protocol | arm | recall@20 | hit@10 | hit@20 | repeat recall@20 | explore recall@20 |",
                  "|---|---|---|---|---|---|---|"]
        for proto, part in d["protocols"].items():
            for arm in d.get("arms", ARMS):
                a = part[arm]
                lines.append(f"| {proto} | {arm} | {a['all']['recall@20']:.4f} | {a['all']['hit@10']:.4f} | "
                             f"{a['all']['hit@20']:.4f} | {a['repeat']['recall@20']:.4f} | {a['explore']['recall@20']:.4f} |")
        lines += ["", "| ratio (protocol: arms: metric) | value | 95% interval |", "|---|---|---|"]
        for proto, part in d["protocols"].items():
            for key in ("recommend/plain:all:recall@20", "recommend/plain:all:hit@10", "recommend/open_funnel_pop:all:hit@10",
                        "recommend/repeat:all:recall@20", "recommend/discovery:explore:recall@20",
                        "recommend/no_affinity:all:recall@20", "recommend/no_affinity:all:hit@10",
                        "recommend/no_cycle:all:recall@20", "recommend/no_cycle:repeat:recall@20",
                        "recommend/no_cycle:all:hit@10", "no_cycle/repeat:all:recall@20",
                        "recommend/no_nbr:all:recall@20", "recommend/no_nbr:all:hit@10", "no_nbr/repeat:all:recall@20",
                        "head/recommend:all:recall@20", "head/recommend:all:hit@10",
                        *(f"{a}/{b}:all:{m}" for a in (*KINDS, *SELECT_ARMS) for b, m in (("recommend", "recall@20"), ("recommend", "hit@10"),
                                                                        ("repeat", "recall@20"), ("plain", "recall@20")))):
                if part["ratios"].get(key, {}).get("ratio") is not None:
                    r = part["ratios"][key]
                    lines.append(f"| {proto}: {key} | {r['ratio']:.3f} | [{r['lo']:.3f}, {r['hi']:.3f}] |")
        lines.append("")
    lines.append(end)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="beibei,completejourney,online_retail")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--graph", default="outputs/{data}/default/graph", help="snapshot dir pattern")
    p.add_argument("--max-users", type=int, default=0, help="test users sampled (0 = all)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "funnel.json"))
    p.add_argument("--steps", type=int, default=None, help="scorer steps (default: ScorerConfig)")
    p.add_argument("--affinity-context", type=int, default=None, help="FunnelConfig.affinity_context (0 = off)")
    p.add_argument("--neighbours", type=int, default=None, help="FunnelConfig.neighbours (TIFU-KNN users; 0 = off)")
    p.add_argument("--neighbour-decay", type=float, default=None, help="FunnelConfig.neighbour_decay (0.9 or 0.97)")
    p.add_argument("--heads", type=int, default=None, help="ScorerConfig.heads (0 = no target-aware head)")
    p.add_argument("--cuts", type=int, default=None, help="FunnelConfig.cuts (next_period training views)")
    p.add_argument("--kind", default=None, choices=KINDS, help="ScorerConfig.kind of the recommend arm")
    p.add_argument("--select", default=None, choices=("holdout", "period"), help="FunnelConfig.select of the recommend arm")
    p.add_argument("--no-refit", action="store_true", help="FunnelConfig.refit=false (keep the period-checked fit)")
    p.add_argument("--whole", type=float, default=None, help="FunnelConfig.whole (denoise: hidden pairs that lose every event)")
    p.add_argument("--max-train-users", type=int, default=None, help="FunnelConfig.max_train_users (per view; 0 = all)")
    p.add_argument("--extra", default="", help=f"optional arms, comma-separated, of {EXTRA}")
    p.add_argument("--head-arm", default="2,64", help="the head arm's heads,batch")
    p.add_argument("--docs", default=str(ROOT / "docs" / "results.md"), help="results page to update ('' = none)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = FunnelConfig()
    if args.steps:
        config.scorer.steps = args.steps
    if args.cuts is not None:
        config.cuts = args.cuts
    if args.heads is not None:
        config.scorer.heads = args.heads
    if args.kind is not None:
        config.scorer.kind = args.kind
    if args.select is not None:
        config.select = args.select
    if args.no_refit:
        config.refit = False
    if args.whole is not None:
        config.whole = args.whole
    if args.max_train_users is not None:
        config.max_train_users = args.max_train_users
    if args.affinity_context is not None:
        config.affinity_context = args.affinity_context
    if args.neighbours is not None:
        config.neighbours = args.neighbours
    if args.neighbour_decay is not None:
        config.neighbour_decay = args.neighbour_decay
    seeds = [int(s) for s in args.seeds.split(",")]
    out_path = Path(args.out)
    result: dict[str, Any] = json.loads(out_path.read_text()) if out_path.exists() else {}
    result |= {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.platform(),
               "cpus": os.cpu_count(), "seeds": seeds, "ks": list(KS), "config": json.loads(json.dumps(config, default=vars))}
    result.setdefault("datasets", {})
    for name in args.datasets.split(","):
        graph = Path(args.graph.format(data=name))
        t0 = time.perf_counter()
        extra = tuple(a for a in args.extra.split(",") if a)
        if set(extra) - set(EXTRA):
            p.error(f"--extra {args.extra!r}: expected arms of {EXTRA}")
        head = tuple(int(v) for v in args.head_arm.split(","))
        result["datasets"][name] = run_dataset(name, graph, seeds, config, args.max_users, extra, head) | {
            "seconds": round(time.perf_counter() - t0, 1), "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "config": json.loads(json.dumps(config, default=vars))}
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1))
        log.info("wrote %s (%s)", out_path, name)
    if args.docs:
        write_section(render(result), Path(args.docs), "funnel")


if __name__ == "__main__":
    main()
