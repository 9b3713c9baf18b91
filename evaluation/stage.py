"""`hir evaluate`: ranking and retrieval lift of the HIR embeddings against baselines,
representation diagnostics, and the report (``paths.report_dir``).

HIR features come from the published version (Feast offline store for ranking, Feast online +
Milvus for retrieval) when ``publish/manifest.json`` exists; otherwise from the export files,
logged and recorded in metrics.json under ``sources`` as a fallback.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hir.cli import ROOT
from hir.errors import HirError, InputError
from hir.progress import progress_steps
from hir_evaluation.content_source import content_blocks, load_content
from hir_evaluation.features import affinity
from hir_evaluation.hir_source import embeddings_meta, from_feast, from_files, read_embeddings, side_blocks
from hir_evaluation.published import load_manifest
from hir_evaluation.report import print_summary, write_report
from hir_evaluation.snapshot import Snapshot, load_snapshot
from hir_evaluation.tasks import RankingTask

if TYPE_CHECKING:
    from hir_evaluation.ranking_eval import ArmLoader, Blocks
    from hir_evaluation.retrieval import TopK

# torch, PyG, scikit-learn and matplotlib are imported inside the functions that use them, once
# the inputs are known to exist: a missing file is then reported at once, not after ~10 s of imports

log = logging.getLogger(__name__)
SOURCES = ("auto", "published", "files", "none")


TASK_DIR = ROOT / "conf" / "eval" / "task"


def resolve_tasks(cfg: DictConfig, snap: Snapshot) -> tuple[RankingTask, Any]:
    """The dataset's tasks: ``eval.task`` as composed (conf/config.yaml selects
    conf/eval/task/<data>.yaml), else that file loaded by the dataset's name, else the generic
    task (shallowest stage -> deepest stage on products)."""
    from hir_evaluation.retrieval import RetrievalTask

    task = cfg.eval.get("task")
    name = str(cfg.data.get("name", snap.dataset)) if "data" in cfg else snap.dataset
    if not task and (TASK_DIR / f"{name}.yaml").exists():
        log.info("eval.task not composed; using %s", TASK_DIR / f"{name}.yaml")
        task = OmegaConf.load(TASK_DIR / f"{name}.yaml")

    if not task:
        log.warning(
            "no eval task config for dataset %r (conf/eval/task/%s.yaml); using the generic funnel task "
            "(shallowest stage -> %s)", name, name, snap.deep_stage,
        )
        return RankingTask(), RetrievalTask()
    ranking = instantiate(task.ranking, _convert_="all") if task.get("ranking") else RankingTask()
    retrieval = instantiate(task.retrieval, _convert_="all") if task.get("retrieval") else RetrievalTask()
    return ranking, retrieval


class Sources:
    """Where the HIR and content arms read from, with the notes the report must show."""

    def __init__(self, cfg: DictConfig, snap: Snapshot, entity_type: str) -> None:
        ev, paths = cfg.eval, cfg.paths
        mode = str(ev.get("hir_source", "auto"))
        if mode not in SOURCES:
            raise HirError(f"eval.hir_source={mode!r}; expected one of {list(SOURCES)}")
        self.notes: list[str] = []
        self.snap, self.entity_type = snap, entity_type
        self.emb_dir = Path(paths.embeddings_dir)
        self.manifest = load_manifest(Path(paths.publish_dir)) if mode in ("auto", "published") else None
        if mode == "published" and self.manifest is None:
            raise InputError(f"eval.hir_source=published but {Path(paths.publish_dir) / 'manifest.json'} does not exist; "
                             "run `hir publish` first")
        has_files = (self.emb_dir / f"{entity_type}.parquet").exists() and (self.emb_dir / "user.parquet").exists()
        if self.manifest is not None and self.manifest.get("status") == "retired":
            raise InputError(
                f"{Path(paths.publish_dir) / 'manifest.json'} pins version {self.manifest['version']!r}, which its store "
                f"retired (live there: {self.manifest.get('live_version')!r}); publish this run again (`hir publish`), "
                "or evaluate its export files with eval.hir_source=files"
            )
        if self.manifest is not None:
            self.hir = "published"
            if self.manifest.get("status") == "kept":
                self.notes.append(f"version {self.manifest['version']!r} is kept, not live, in {self.manifest['store_dir']} "
                                  f"(live: {self.manifest.get('live_version')!r}); evaluated through its pinned views")
        elif mode in ("auto", "files") and has_files:
            self.hir = "files"
            if mode == "auto":
                note = (f"FALLBACK: no published version at {paths.publish_dir}; HIR features read from the export "
                        f"files {self.emb_dir} (point-in-time join in polars, exact search instead of Milvus)")
                log.warning(note)
                self.notes.append(note)
        else:
            self.hir = "none"
            if bool(ev.get("require_hir", True)) and mode != "none":
                raise InputError(
                    f"no HIR embeddings: neither {Path(paths.publish_dir) / 'manifest.json'} nor "
                    f"{self.emb_dir}/{{user,{entity_type}}}.parquet exist; run `hir pipeline` (or export + publish), "
                    "or set eval.require_hir=false to evaluate the baselines alone"
                )
            self.notes.append("no HIR embeddings: the hir arms are empty (eval.require_hir=false)")
        self.content_dir = Path(paths.content_dir)
        path = self.content_dir / f"{entity_type}.parquet"
        self.content = path.exists()
        if self.content and not pl.read_parquet(path, columns=["has_text"])["has_text"].any():
            # a dataset without any text (gowalla's check-ins): nothing a content arm could use,
            # and nothing to fix, so the arms are not run rather than failed
            self.content = False
            self.notes.append(f"no {entity_type} of this dataset has text ({path}): the content arms are not run")
        elif not self.content:
            if bool(ev.get("require_content", True)):
                raise InputError(
                    f"{self.content_dir / f'{entity_type}.parquet'} is missing: no content vectors; run `hir enrich` "
                    "first, or set eval.require_content=false to skip the content arms"
                )
            self.notes.append(f"no content vectors in {self.content_dir}: the content arms are empty")

    @cached_property
    def as_of(self) -> datetime | None:
        """The time the HIR embeddings are valid from (latest user ``event_timestamp``): the
        cutoff of the engagement the export saw. None without embeddings."""
        if self.hir == "published":
            path = Path(self.manifest["feast"].get("offline_files", {}).get("user", self.emb_dir / "user.parquet"))
        elif self.hir == "files":
            path = self.emb_dir / "user.parquet"
        else:
            return None
        if not path.exists():
            return None
        return pl.read_parquet(path, columns=["event_timestamp"])["event_timestamp"].max()

    def history_splits(self, configured: Any) -> list[str]:
        """Periods the retrieval arms learn from: as configured, else the ones the export saw
        (train only when it is valid from before the val period ends), so no arm knows more."""
        if configured:
            return list(configured)
        as_of = self.as_of
        if as_of is not None and as_of < self.snap.test_start:
            self.notes.append(f"the HIR export is valid from {as_of.isoformat()} (before the test period): "
                              "the retrieval baselines learn from the train period only, like it")
            return ["train"]
        return ["train", "val"]

    @property
    def model_version(self) -> str | None:
        if self.manifest is not None:
            return str(self.manifest["version"])
        return embeddings_meta(self.emb_dir).get("model_version")

    def hir_ranking(self) -> ArmLoader | None:
        """The HIR arm's loader for ranking rows (Feast or files), None without embeddings."""
        if self.hir == "none":
            return None

        def load(rows: pl.DataFrame) -> Blocks:
            read = from_feast if self.hir == "published" else from_files
            src = self.manifest if self.hir == "published" else self.emb_dir
            user, entity = read(src, self.snap, rows, self.entity_type)
            if not user.present.any() and not entity.present.any():
                note = ("HIR features are empty for every ranking row: the embeddings' event_timestamp is later "
                        "than every candidate time, so the point-in-time join returns nothing. event_timestamp must be "
                        "the cutoff of the engagement the export saw (not the export's wall-clock time).")
                log.warning(note)
                self.notes.append(note)
            du, vu, bu = side_blocks("hir_user", user)
            de, ve, be = side_blocks("hir_entity", entity)
            return du | de | {"hir_affinity": affinity(user.vectors, entity.vectors)}, vu | ve, bu | be

        return load

    def content_ranking(self, profile_stages: list[str] | None) -> ArmLoader | None:
        """The content arm's loader for ranking rows, None without content vectors."""
        if not self.content:
            return None

        def load(rows: pl.DataFrame) -> Blocks:
            # the user profile is cut at val_start, the end of the period the HIR model trains on
            dense, vectors = content_blocks(self.snap, self.content_dir, rows, self.entity_type,
                                            self.snap.val_start, profile_stages)
            return dense, vectors, {}

        return load

    def hir_retrieval(self) -> TopK | None:
        """The HIR retrieval arm (Milvus or exact search over the files), None without embeddings."""
        from hir_evaluation.hir_retrieval import files_topk, published_topk

        if self.hir == "published":
            return published_topk(self.manifest, self.snap, self.entity_type)
        if self.hir == "files":
            return files_topk(self.emb_dir, self.snap, self.entity_type)
        return None

    def content_vectors(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(entity content vectors, has-vector) for the retrieval content arm, None without content."""
        if not self.content:
            return None
        return load_content(self.content_dir, self.entity_type, self.snap.num_nodes(self.entity_type))


def run_diagnostics(cfg: DictConfig, snap: Snapshot, entity_type: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The ``diagnostics`` section and the 2-D map points (None when there is no export)."""
    from hir_evaluation import diagnostics as diag


    ev, emb_dir, hier = cfg.eval, Path(cfg.paths.embeddings_dir), Path(cfg.paths.hierarchy_dir)
    types = [t for t in ("user", entity_type) if (emb_dir / f"{t}.parquet").exists()]
    if not types:
        return {"token_usage": [], "nmi": {}, "supergraph": None, "stability": None, "top_prototypes": []}, None
    frames = {t: read_embeddings(emb_dir, t) for t in types}
    out: dict[str, Any] = {"token_usage": diag.token_usage(frames, embeddings_meta(emb_dir).get("levels"))}
    out["nmi"] = {}
    if entity_type in frames:
        labels = diag.taxonomy_labels(snap, entity_type)
        out["nmi"][entity_type] = diag.nmi_table(frames[entity_type], labels) if labels else {}
    out["supergraph"] = diag.supergraph_gain(hier)
    out["top_prototypes"] = diag.top_prototypes(hier, int(ev.diagnostics.top_prototypes))
    other = ev.get("compare_embeddings_dir")
    out["stability"] = None
    if other:
        other_path = Path(other) / f"{entity_type}.parquet"
        if not other_path.exists():
            raise InputError(f"eval.compare_embeddings_dir={other}: {other_path} is missing; point it at another run's embeddings/")
        out["stability"] = diag.token_stability(frames[entity_type], read_embeddings(Path(other), entity_type))
    points = diag.embedding_map(frames[entity_type], int(ev.diagnostics.map_points), int(ev.seed)) if entity_type in frames else None
    return out, points


def figures(metrics: dict[str, Any], points: dict[str, Any] | None, entity_type: str) -> dict[str, bytes]:
    from hir_evaluation import plots


    figs = {
        "ranking_lift": plots.lift_bars(metrics["ranking"]),
        "recall_at_k": plots.recall_curves(metrics["retrieval"], metrics["retrieval"]["ks"]),
        "calibration": plots.calibration_plot(metrics["ranking"]["calibration_curves"]),
    }
    lightgcn = (metrics["retrieval"].get("fits") or {}).get("lightgcn") or {}
    if lightgcn.get("curve"):
        figs["lightgcn_curve"] = plots.lightgcn_curve(lightgcn)
    if metrics["diagnostics"].get("token_usage"):
        figs["token_usage"] = plots.token_usage_plot(metrics["diagnostics"]["token_usage"])
    if points is not None:
        figs["embedding_map"] = plots.embedding_map_plot(
            points, f"{entity_type} embeddings ({points['method'].upper()}), colour = coarse token")
    return figs


def run(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry: evaluate the run's HIR version and write ``paths.report_dir``."""
    report_dir = Path(cfg.paths.report_dir)
    done = report_dir / "metrics.json"
    if done.exists() and not cfg.force:
        log.info("report exists at %s; reusing it (force=true recomputes)", report_dir)
        metrics = json.loads(done.read_text())
        print_summary(metrics, report_dir)
        require_arms(metrics, cfg.eval, report_dir)
        return metrics
    ev = cfg.eval
    seed = int(ev.seed)
    snap = load_snapshot(cfg.paths.graph_dir)
    rank_task, ret_task = resolve_tasks(cfg, snap)
    sources = Sources(cfg, snap, rank_task.entity_type)
    from hir_evaluation.ranking_eval import evaluate_ranking
    from hir_evaluation.retrieval_eval import evaluate_retrieval

    timings: dict[str, float] = {}
    with progress_steps("evaluate", 4) as step:
        t0 = time.perf_counter()
        ranking = evaluate_ranking(
            snap, rank_task, instantiate(ev.ranker), list(ev.ranker_fit_splits),
            {"hir": sources.hir_ranking(), "content": sources.content_ranking(
                list(ret_task.history_stages) if ret_task.history_stages else None)},
            int(ev.bootstrap.resamples), str(ev.bootstrap.unit), float(ev.bootstrap.level), seed,
            int(ev.id_buckets), float(ev.min_fit_coverage), bool(ev.ranker_crossfit_fallback), int(ev.crossfit_folds),
        )
        sources.notes += ranking["notes"]
        for arm, why in ranking["skipped"].items():
            ranking[arm]["skipped"] = why  # metrics.json: ranking.<arm>.skipped = the reason
        timings["ranking"] = time.perf_counter() - t0
        step("retrieval")
        t0 = time.perf_counter()
        retrieval = evaluate_retrieval(
            snap, ret_task, instantiate(ev.lightgcn), sources.hir_retrieval(), sources.content_vectors(), seed,
            int(ev.itemknn_neighbours), sources.history_splits(ev.get("retrieval_history_splits")),
            list(ev.retrieval_arms) if ev.get("retrieval_arms") else None,
        )
        timings["retrieval"] = time.perf_counter() - t0
        step("diagnostics")
        t0 = time.perf_counter()
        diagnostics, points = run_diagnostics(cfg, snap, rank_task.entity_type)
        timings["diagnostics"] = time.perf_counter() - t0
        step("report")
        metrics: dict[str, Any] = {
            "schema": 1,
            "dataset": snap.dataset,
            "model_version": sources.model_version,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "sources": {
                "ranking_hir": {"published": "feast", "files": "files", "none": None}[sources.hir],
                "retrieval_hir": {"published": "milvus", "files": "files", "none": None}[sources.hir],
                "fallback": sources.hir == "files",
                "content": str(sources.content_dir) if sources.content else None,
                "embeddings_as_of": sources.as_of.isoformat() if sources.as_of else None,
                "notes": sources.notes,
            },
            "ranking": ranking,
            "retrieval": retrieval,
            "diagnostics": diagnostics,
            "config": OmegaConf.to_container(ev, resolve=True),
        }
        t0 = time.perf_counter()
        figs = figures(metrics, points, rank_task.entity_type)
        metrics["timings_s"] = timings | {"figures": time.perf_counter() - t0}
        metrics = write_report(report_dir, metrics, figs)
    print_summary(metrics, report_dir)
    require_arms(metrics, cfg.eval, report_dir)
    return metrics


# ranking arm -> the option that lets it be missing from a report
ARM_OPTIONS = {"hir": "eval.require_hir", "content": "eval.require_content"}


def require_arms(metrics: dict[str, Any], ev: DictConfig, report_dir: Path) -> None:
    """A ranking arm that was skipped fails the stage (the report is written first, and says
    why), unless its ``eval.require_<arm>=false`` allows it."""
    skipped = {arm: why for arm, why in ((metrics.get("ranking") or {}).get("skipped") or {}).items()
               if bool(ev.get(ARM_OPTIONS.get(arm, "").removeprefix("eval."), True))}
    if skipped:
        lines = "; ".join(f"ranking arm {arm} skipped: {why}" for arm, why in skipped.items())
        options = " ".join(f"{ARM_OPTIONS[a]}=false" for a in skipped if a in ARM_OPTIONS)
        raise HirError(f"{lines}. The report ({report_dir / 'report.md'}) has the other arms; to accept a report "
                       f"without {', '.join(skipped)}, run again with {options}")
