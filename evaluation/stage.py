"""`hir evaluate`: ranking and retrieval lift of the HIR embeddings against baselines,
representation diagnostics, and the report (``paths.report_dir``).

HIR features come from the published version (Feast offline store for ranking, Feast online +
Milvus for retrieval) when ``publish/manifest.json`` exists; otherwise from the export files,
logged and recorded in metrics.json under ``sources`` as a fallback. The arms are the registries
``eval.ranking`` and ``eval.retrieval`` (evaluation/ranking/registry.py, retrieval/registry.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hir.data.snapshot import Snapshot, load_snapshot
from hir.errors import HirError
from hir.progress import progress_steps
from hir.settings import changed, file_digests, shown
from hir_evaluation.cache import FitCache, cacheable, snapshot_hash
from hir_evaluation.ranking.registry import BASELINE, bind, build_ranking_arms, require_options
from hir_evaluation.report.render import print_summary, write_report
from hir_evaluation.sources.selection import Sources
from hir_evaluation.tasks import RankingTask, RetrievalTask

# torch, PyG, scikit-learn and matplotlib are imported inside the functions that use them, once
# the inputs are known to exist: a missing file is then reported at once, not after ~10 s of imports

log = logging.getLogger(__name__)


def resolve_tasks(cfg: DictConfig, snap: Snapshot) -> tuple[RankingTask, RetrievalTask]:
    """The dataset's tasks: ``eval.task`` as composed (conf/config.yaml selects
    conf/eval/task/<data>.yaml), else that file loaded by the dataset's name, else the generic
    task (shallowest stage -> deepest stage on products)."""
    task = cfg.eval.get("task")
    name = str(cfg.data.get("name", snap.dataset)) if "data" in cfg else snap.dataset
    task_file = Path(cfg.paths.root_dir) / "conf" / "eval" / "task" / f"{name}.yaml"
    if not task and task_file.exists():
        log.info("eval.task not composed; using %s", task_file)
        task = OmegaConf.load(task_file)
    if not task:
        log.warning(
            "no eval task config for dataset %r (conf/eval/task/%s.yaml); using the generic funnel task "
            "(shallowest stage -> %s)", name, name, snap.deep_stage,
        )
        return RankingTask(), RetrievalTask()
    ranking = instantiate(task.ranking, _convert_="all") if task.get("ranking") else RankingTask()
    retrieval = instantiate(task.retrieval, _convert_="all") if task.get("retrieval") else RetrievalTask()
    return ranking, retrieval


def fit_cache(cfg: DictConfig, snap: Snapshot) -> FitCache:
    """The baseline fits of this snapshot (``eval.cache``; evaluation/cache.py)."""
    enabled = bool(cfg.eval.cache.enabled)
    digest = snapshot_hash(snap.dir) if enabled else "disabled"
    return FitCache(Path(cfg.eval.cache.dir), digest, enabled)


def ranking_section(
    cfg: DictConfig, snap: Snapshot, task: RankingTask, sources: Sources, cache: FitCache | None = None
) -> dict[str, Any]:
    """metrics.json's ``ranking``: the baseline and every arm of ``eval.ranking``; a skipped arm
    carries its reason (``ranking.<arm>.skipped``), the notes go to the sources; ``explanations``:
    the shared tokens of the pairs ``eval.explain.arm`` scores highest (the report's "why this?")."""
    from hir_evaluation.ranking.evaluate import evaluate_ranking
    from hir_evaluation.ranking.explain import explain_pairs

    ev = cfg.eval
    arms = build_ranking_arms(ev.ranking)
    cached = frozenset({BASELINE, *(name for name, arm in arms.items() if cacheable(arm.needs))})
    ranking = evaluate_ranking(
        snap, task, instantiate(ev.ranker), list(ev.ranker_fit_splits), bind(arms, sources),
        int(ev.bootstrap.resamples), str(ev.bootstrap.unit), float(ev.bootstrap.level), int(ev.seed),
        int(ev.id_buckets), float(ev.min_fit_coverage), bool(ev.ranker_crossfit_fallback), int(ev.crossfit_folds),
        int(ev.ranker_seeds), int(ev.explain.pairs) if sources.hir != "none" else 0, str(ev.explain.arm),
        cache, cached, ev.get("ranker_workers", 1),
    )
    sources.notes += ranking["notes"]
    for arm, why in ranking["skipped"].items():
        ranking[arm]["skipped"] = why
    pairs = ranking.pop("top_pairs", [])
    if pairs:
        ranking["explanations"] = explain_pairs(snap, task.entity_type, pairs, sources.manifest,
                                                Path(cfg.paths.embeddings_dir), Path(cfg.paths.hierarchy_dir))
    return ranking


# each test user's masked new-to-user recall@20 per retrieval arm (paired comparisons of runs)
RETRIEVAL_USERS_FILE = "retrieval_users.parquet"


def search_depth(snap: Snapshot, arms: dict[str, Any], run: Any) -> int:
    """How deep the HIR search goes once for every arm that reads it: the recommend arm's
    discovery depth (the run's funnel/meta.json) when that arm runs, else 0 (the hir arm's k)."""
    meta = snap.dir.parent / "funnel" / "meta.json"
    if "recommend" not in arms or (run and "recommend" not in run) or not meta.exists():
        return 0
    return int(json.loads(meta.read_text()).get("discovery") or 0)


def retrieval_section(
    cfg: DictConfig, snap: Snapshot, task: RetrievalTask, sources: Sources, cache: FitCache | None = None,
    history_splits: list[str] | None = None, wait: Callable[[], None] | None = None,
    prefetched: Callable[[Any, int], Any] | None = None,
) -> dict[str, Any]:
    """metrics.json's ``retrieval``: every arm of ``eval.retrieval`` (or of ``eval.retrieval_arms``);
    ``history_splits``: the periods the arms learn from (default: as the sources say); ``wait``:
    joins the background baselines (called before the first arm they fit); ``prefetched``: the
    HIR search's lists from the baselines' process (:class:`SearchHandoff.take`)."""
    from hir_evaluation.retrieval.evaluate import evaluate_retrieval
    from hir_evaluation.retrieval.hir_search import hir_search
    from hir_evaluation.retrieval.registry import build_arms

    ev = cfg.eval
    arms = build_arms(ev.retrieval)
    return evaluate_retrieval(
        snap, task, arms, int(ev.seed),
        hir_search(sources, search_depth(snap, arms, ev.get("retrieval_arms")), prefetched),
        sources.content_vectors(),
        history_splits or sources.history_splits(ev.get("retrieval_history_splits")),
        list(ev.retrieval_arms) if ev.get("retrieval_arms") else None,
        int(ev.retrieval_few_events), cache, Path(cfg.paths.report_dir) / RETRIEVAL_USERS_FILE, wait,
    )


def search_spec(cfg: DictConfig, snap: Snapshot, task: RetrievalTask, sources: Sources) -> Any:
    """The published HIR search the baselines' process may run after its fits
    (``eval.parallel_search``; evaluation/retrieval/prefetch.py), at the depth the retrieval
    section will ask, or None: not published (the file fallback is a fast exact search), turned
    off, or no arm reads it."""
    from hir_evaluation.retrieval.prefetch import SearchSpec
    from hir_evaluation.retrieval.registry import build_arms

    ev = cfg.eval
    run = list(ev.retrieval_arms) if ev.get("retrieval_arms") else None
    arms = build_arms(ev.retrieval)
    readers = [n for n in ("hir", "recommend") if n in arms and (run is None or n in run)]
    if sources.hir != "published" or not bool(ev.get("parallel_search", False)) or not readers:
        return None
    # SharedSearch's first call: the hir arm's k (the largest of the task's ks) or the depth
    return SearchSpec("published", sources.manifest, sources.entity_type, max(max(task.ks), search_depth(snap, arms, run)))


def predicted_history_splits(cfg: DictConfig) -> list[str]:
    """The periods the retrieval arms will learn from, known before the export exists: as
    configured, else as :meth:`Sources.history_splits` will find them from the export's cutoff
    (an export that sees val is stamped at the test period's start, one of train alone before it)."""
    configured = cfg.eval.get("retrieval_history_splits")
    if configured:
        return list(configured)
    visible = list(cfg.export.get("visible_splits") or ["train"]) if "export" in cfg else ["train"]
    return ["train", "val"] if "val" in visible or "test" in visible else ["train"]


def prewarm_ranking(container: dict[str, Any]) -> dict[str, float]:
    """(In the prewarm's process, after the retrieval baselines.) The ranking fits that read
    nothing of the HIR export (the baseline, the content arm) made into the fit cache under the
    keys `hir evaluate` will look up; ``container``: the run's resolved config. Nothing when the
    content vectors are not written yet (enrich failed or is still running): evaluate fits them.
    Returns arm -> seconds of the fits made."""
    from threadpoolctl import threadpool_limits

    from hir_evaluation.ranking.evaluate import prewarm_ranking as fit_ahead

    cfg = OmegaConf.create(container)
    ev = cfg.eval
    snap = load_snapshot(cfg.paths.graph_dir)
    rank_task, ret_task = resolve_tasks(cfg, snap)
    if not (Path(cfg.paths.content_dir) / "meta.json").exists() and bool(ev.get("require_content", True)):
        log.info("evaluate prewarm: no content vectors in %s yet; evaluate fits the ranking baselines", cfg.paths.content_dir)
        return {}
    cfg.eval.hir_source, cfg.eval.require_hir = "none", False  # these fits read nothing of HIR
    sources = Sources(cfg, snap, rank_task.entity_type, ret_task.history_stages)
    arms = {name: arm for name, arm in build_ranking_arms(ev.ranking).items() if cacheable(arm.needs)}
    with threadpool_limits(int(ev.ranker.get("threads", 1))):
        return fit_ahead(snap, rank_task, instantiate(ev.ranker), list(ev.ranker_fit_splits), bind(arms, sources),
                         int(ev.seed), int(ev.ranker_seeds), int(ev.id_buckets), fit_cache(cfg, snap))


def prewarm(cfg: DictConfig) -> Any:
    """`hir pipeline`: start the evaluation's fits that read nothing of the HIR export in a second
    process at the lowest priority as soon as the snapshot exists, so they use what the stages
    before `hir evaluate` leave of the cores: the retrieval baselines (popularity, item-kNN,
    LightGCN, GF-CF, repeat), then the ranking baseline and content arms (:func:`prewarm_ranking`,
    once enrich has written the content vectors). They land in the evaluation's fit cache, where
    `hir evaluate` finds them (logged as reused). Returns the process handle (its ``wait()`` /
    ``stop()``), or None: evaluation is not among the stages, the cache or ``eval.prewarm`` is
    off, or the report would be reused (nothing to fit: :func:`reusable_report`).

    The fits' inputs are predicted (the history periods from ``export.visible_splits``; the
    ranking rows fitted on ``eval.ranker_fit_splits``, not cross-fitted); a wrong prediction only
    misses the cache: evaluate then fits those arms itself, with the same figures."""
    ev = cfg.eval
    if ("evaluate" not in cfg.pipeline.stages or not bool(ev.cache.enabled) or not bool(ev.get("prewarm", False))
            or reusable_report(cfg) is not None):
        return None
    from hir_evaluation.retrieval.background import Background

    snap = load_snapshot(cfg.paths.graph_dir)
    _, ret_task = resolve_tasks(cfg, snap)
    try:
        then = (prewarm_ranking, (OmegaConf.to_container(cfg, resolve=True),))
    except Exception as err:  # a config the child cannot rebuild: evaluate fits the ranking baselines itself
        log.warning("evaluate prewarm: the ranking fits are left to evaluate (the config does not resolve: %s)", err)
        then = None
    return Background(snap.dir, ret_task, OmegaConf.to_container(ev.retrieval, resolve=True), int(ev.seed),
                      predicted_history_splits(cfg), list(ev.retrieval_arms) if ev.get("retrieval_arms") else None,
                      fit_cache(cfg, snap), nice=19, purpose="ahead of `hir evaluate`, at the lowest priority",
                      then=then, label="prewarm")


def outputs_record(cfg: DictConfig, sources: Sources) -> dict[str, Any]:
    """metrics.json's ``outputs``: where this run's report, export and served version are (the
    report's "where are the outputs?")."""
    paths = cfg.paths
    out: dict[str, Any] = {"run_dir": str(paths.output_dir), "report": str(Path(paths.report_dir) / "report.html"),
                           "embeddings": str(paths.embeddings_dir), "hierarchy": str(paths.hierarchy_dir)}
    manifest = sources.manifest
    if manifest:
        out |= {"manifest": str(Path(paths.publish_dir) / "manifest.json"), "serving_store": manifest.get("store_dir"),
                "version": manifest.get("version"),
                "feature_service": (manifest.get("feast") or {}).get("feature_service"),
                "milvus_aliases": (manifest.get("milvus") or {}).get("aliases") or {}}
    return out


@contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Record the block's wall time in ``timings[name]`` (metrics.json ``timings_s``)."""
    t0 = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - t0


# the outputs a report is computed from: (cfg.paths key, the file that marks the output whole)
INPUTS = {"graph": ("graph_dir", "meta.json"), "content": ("content_dir", "meta.json"),
          "embeddings": ("embeddings_dir", "meta.json"), "funnel": ("funnel_dir", "meta.json")}
# eval settings that gate a report or change how fast it is made, never its figures
UNCOMPARED = ("eval.require_hir", "eval.require_content", "eval.cache", "eval.parallel_baselines", "eval.prewarm",
              "eval.parallel_search", "eval.ranker_workers", "eval.gather")


def evaluated_inputs(cfg: DictConfig) -> dict[str, str | None]:
    """What a report was computed from (metrics.json ``inputs``): the sha256 (16 hex) of the
    meta.json of the snapshot, the content, the export and the funnel, and the published version
    (the run's manifest ``version``); None where there is none."""
    out = file_digests({name: Path(cfg.paths[key]) / file for name, (key, file) in INPUTS.items()})
    manifest = Path(cfg.paths.publish_dir) / "manifest.json"
    out["version"] = json.loads(manifest.read_text()).get("version") if manifest.exists() else None
    return out


def stale_report(metrics: dict[str, Any], cfg: DictConfig) -> str | None:
    """Why a finished report (its metrics.json ``metrics``) no longer describes this run, or None
    when it does: an input it was computed from has changed since (:func:`evaluated_inputs`: a
    new snapshot, export, funnel or published version), or it was computed under other ``eval.*``
    settings (less :data:`UNCOMPARED` and paths), or it records no inputs (an older hir's)."""
    had = metrics.get("inputs")
    if had is None:
        return "it records no inputs (written by an older hir)"
    moved = [name for name, now in evaluated_inputs(cfg).items() if had.get(name) != now]
    if moved:
        return f"its inputs changed since it was written ({', '.join(moved)})"
    differ = changed({"eval": metrics.get("config") or {}}, {"eval": OmegaConf.to_container(cfg.eval, resolve=True)},
                     UNCOMPARED, ignore_paths=True)
    return f"it was computed under other settings ({shown(differ)})" if differ else None


def reusable_report(cfg: DictConfig) -> dict[str, Any] | None:
    """The finished report's metrics when `hir evaluate` would reuse it (it exists, still describes
    this run, and ``force`` is off), else None; says why a finished one is not reused."""
    path = Path(cfg.paths.report_dir) / "metrics.json"
    if not path.exists() or cfg.force:
        return None
    metrics = json.loads(path.read_text())
    if (why := stale_report(metrics, cfg)) is None:
        return metrics
    log.info("the report at %s is recomputed: %s", path.parent, why)
    return None


def run(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry: evaluate the run's HIR version and write ``paths.report_dir``."""
    report_dir, ev = Path(cfg.paths.report_dir), cfg.eval
    if (metrics := reusable_report(cfg)) is not None:
        log.info("report exists at %s and its inputs and settings are this run's; reusing it (force=true "
                 "recomputes)", report_dir)
        print_summary(metrics, report_dir)
        require_arms(metrics, ev, report_dir)
        return metrics
    from hir_evaluation.report.diagnostics import diagnostics_section
    from hir_evaluation.report.plots import figures

    # recomputing (force=true, or a report of other inputs or settings): the old metrics.json must
    # not mark a half-rewritten report as done
    (report_dir / "metrics.json").unlink(missing_ok=True)
    inputs = evaluated_inputs(cfg)  # what this report reads, before it reads it

    snap = load_snapshot(cfg.paths.graph_dir)
    rank_task, ret_task = resolve_tasks(cfg, snap)
    sources = Sources(cfg, snap, rank_task.entity_type, ret_task.history_stages)
    timings: dict[str, float] = {}
    with timed(timings, "snapshot_hash"):
        cache = fit_cache(cfg, snap)
    history = sources.history_splits(ev.get("retrieval_history_splits"))
    background = None
    if cache.enabled and bool(ev.parallel_baselines):
        from hir_evaluation.retrieval.background import Background

        background = Background(snap.dir, ret_task, OmegaConf.to_container(ev.retrieval, resolve=True), int(ev.seed),
                                history, list(ev.retrieval_arms) if ev.get("retrieval_arms") else None, cache,
                                search_spec(cfg, snap, ret_task, sources))
    with progress_steps("evaluate", 4) as step:
        try:
            with timed(timings, "ranking"):
                ranking = ranking_section(cfg, snap, rank_task, sources, cache)
        except BaseException:
            if background is not None:
                background.stop()
            raise
        step("retrieval")
        def join() -> None:
            assert background is not None
            with timed(timings, "retrieval_wait"):
                background.join(cache)

        with timed(timings, "retrieval"):
            # the HIR and content arms run while the background baselines finish
            handoff = None
            if background is not None and background.claim is not None:
                from hir_evaluation.retrieval.prefetch import SearchHandoff

                handoff = SearchHandoff(background).take
            retrieval = retrieval_section(cfg, snap, ret_task, sources, cache, history,
                                          join if background is not None else None, handoff)
        step("diagnostics")
        with timed(timings, "diagnostics"):
            diagnostics, points = diagnostics_section(
                Path(cfg.paths.embeddings_dir), Path(cfg.paths.hierarchy_dir), snap, rank_task.entity_type,
                int(ev.diagnostics.top_prototypes), int(ev.diagnostics.map_points), int(ev.seed),
                ev.get("compare_embeddings_dir"))
        step("report")
        metrics: dict[str, Any] = {
            "schema": 1, "dataset": snap.dataset, "model_version": sources.model_version,
            "created": datetime.now(UTC).isoformat(timespec="seconds"), "sources": sources.record(),
            "ranking": ranking, "retrieval": retrieval, "diagnostics": diagnostics, "cache": cache.record(),
            "outputs": outputs_record(cfg, sources),
            "config": OmegaConf.to_container(ev, resolve=True), "inputs": inputs,
        }
        with timed(timings, "figures"):
            figs = figures(metrics, points, rank_task.entity_type)
        metrics = write_report(report_dir, metrics | {"timings_s": timings}, figs)
    print_summary(metrics, report_dir)
    require_arms(metrics, ev, report_dir)
    return metrics


def require_arms(metrics: dict[str, Any], ev: DictConfig, report_dir: Path) -> None:
    """A ranking arm that was skipped fails the stage (the report is written first, and says
    why), unless an ``eval.require_<input>=false`` of an input it needs allows it."""
    options = require_options(build_ranking_arms(ev.ranking))
    skipped = {arm: why for arm, why in ((metrics.get("ranking") or {}).get("skipped") or {}).items()
               if all(bool(ev.get(opt.removeprefix("eval."), True)) for opt in options.get(arm, []))}
    if skipped:
        lines = "; ".join(f"ranking arm {arm} skipped: {why}" for arm, why in skipped.items())
        allow = " ".join(dict.fromkeys(opt + "=false" for a in skipped for opt in options.get(a, [])))
        raise HirError(f"{lines}. The report ({report_dir / 'report.md'}) has the other arms; to accept a report "
                       f"without {', '.join(skipped)}, run again with {allow}")
