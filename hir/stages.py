"""What a stage is and how one runs: the stage table, the Hydra app around a stage, and the one
readable line a user's error becomes.

`hir` (:mod:`hir.cli`), `hir promote` and the sweep callbacks all run stages through here, so none
of them imports the command-line module.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# stage name -> (module with `run(cfg) -> dict`, one-line description)
STAGES: dict[str, tuple[str, str]] = {
    "prepare": ("hir.data.prepare", "raw events + entity metadata -> typed graph snapshot (graph/)"),
    "enrich": ("hir.enrich.stage", "entity text/attributes -> content vectors, cached by content hash (content/)"),
    "train": ("hir.train.stage", "bias-aware graph transformer + cross-view distillation (checkpoints/)"),
    "export": ("hir.export.stage", "universal embeddings + Bag-of-Meaning tokens per entity (embeddings/, hierarchy/)"),
    "funnel": ("hir.funnel.stage", "the user's open funnel + its learned deep-funnel scorer (funnel/)"),
    "validate": ("hir.validate.stage", "Great Expectations suites over graph/ and embeddings/ (validation/)"),
    "publish": ("hir.publish.stage", "validated version -> Feast + Milvus, switched atomically (publish/)"),
    "refresh": ("hir.publish.refresh", "embed new entities from a delta file and serve them in the live version"),
    "evaluate": ("hir_evaluation.stage", "ranking + retrieval lift against baselines, report (report/)"),
}
PIPELINE_HELP = "run the stages in `pipeline.stages` in order, in one run dir"
HELPERS: dict[str, tuple[str, str]] = {
    "gather": ("hir_evaluation.gather", "collect a multirun's metrics.json files into one table (md + csv)"),
    "promote": ("hir.publish.promote", "publish one multirun cell into the dataset's serving store (make it live)"),
    "recommend": ("hir.publish.recommend", "discovery and the user's open funnel side by side, scored by the learner"),
    "explain": ("hir.publish.explain", "why this? the Bag-of-Meaning tokens a user and an entity share, from Feast"),
}

log = logging.getLogger("hir")


def serving_dir(shared: str) -> str:
    """``publish.store_dir`` by default: ``shared`` (the dataset's store) in a single run, but
    ``<job dir>/serving`` in a multirun job, so a sweep cell never switches what is served
    (`hir promote <cell dir>` publishes one cell into ``shared`` on purpose)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        job_dir = OmegaConf.select(HydraConfig.get(), "runtime.output_dir", default=None, throw_on_missing=False)
        if job_dir:
            return str(Path(job_dir) / "serving")
        # before any job runs (a sweep callback): nothing publishes there
    return shared


def register_resolvers() -> None:
    """The resolvers conf/ uses: ``${hir_root:}`` (this checkout) and ``${hir_serving_dir:...}`` (:func:`serving_dir`)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("hir_root"):
        OmegaConf.register_new_resolver("hir_root", lambda: str(ROOT))
    if not OmegaConf.has_resolver("hir_serving_dir"):
        OmegaConf.register_new_resolver("hir_serving_dir", serving_dir)


def hydra_argv(args: list[str]) -> list[str]:
    """Hydra's own flags first, then the overrides, so ``-m`` (or ``--cfg job``) may stand
    anywhere, as Hydra's documentation writes them: its argparse parser rejects every
    override after the first flag ("unrecognized arguments")."""
    from hydra._internal.utils import get_args_parser

    takes_value: dict[str, str | int | None] = {}
    for action in get_args_parser()._actions:
        for opt in action.option_strings:
            takes_value[opt] = action.nargs
    flags: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            overrides.append(arg)
            continue
        flags.append(arg)
        nargs = takes_value.get(arg.split("=", 1)[0], 0)
        if "=" in arg or nargs == 0:
            continue
        # one value (e.g. `--cfg job`); `--info` takes an optional one, never an override
        if i < len(args) and not args[i].startswith("-") and (nargs is None or "=" not in args[i]):
            flags.append(args[i])
            i += 1
    return [*flags, *overrides]


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_stage(name: str, cfg: Any) -> dict[str, Any]:
    """Import and run one stage; returns its metrics dict."""
    module = importlib.import_module((STAGES | HELPERS)[name][0])
    t0 = time.perf_counter()
    log.info("stage %s: start", name)
    metrics = module.run(cfg) or {}
    log.info("stage %s: done in %.1fs", name, time.perf_counter() - t0)
    return metrics


def _prewarm(cfg: Any) -> Any:
    """The evaluation's prewarm process (None when it does not apply or the snapshot is missing)."""
    if not (Path(str(cfg.paths.graph_dir)) / "meta.json").exists():
        return None
    from hir_evaluation.stage import prewarm

    return prewarm(cfg)


def run_pipeline(cfg: Any) -> dict[str, Any]:
    """Run every stage of `cfg.pipeline.stages` in order; metrics are keyed by stage."""
    unknown = [s for s in cfg.pipeline.stages if s not in STAGES]
    if unknown:
        raise ValueError(f"pipeline.stages has unknown stages {unknown}; expected a subset of {list(STAGES)}")
    metrics: dict[str, Any] = {}
    prewarm = None
    # the evaluation's snapshot-only baselines start as soon as the snapshot is final (after
    # prepare, or at once when this pipeline does not prepare), on what the stages before evaluate
    # leave of the cores (hir_evaluation.stage.prewarm; eval.prewarm)
    start_at = "prepare" if "prepare" in cfg.pipeline.stages else None
    try:
        if start_at is None:
            prewarm = _prewarm(cfg)
        for name in cfg.pipeline.stages:
            if name == "evaluate" and prewarm is not None:
                prewarm.wait()  # its fits are in the cache evaluate reads
                prewarm = None
            metrics[name] = run_stage(name, cfg)
            if name == start_at:
                prewarm = _prewarm(cfg)
    finally:
        if prewarm is not None:
            prewarm.stop()  # a stage failed: nothing will read its fits
    return metrics


def _no_validation_hint(cfg: Any) -> str:
    """Why train may return no ``val/`` metric: the snapshot's val split lacks deep-funnel events."""
    from hir.data.snapshot import load_snapshot

    try:
        snap = load_snapshot(str(cfg.paths.graph_dir), strict=False)
    except (OSError, ValueError):
        return ""
    meta, meta_path = snap.meta, snap.meta_path
    deep = meta.get("deep_stage")
    n_val = (meta.get("stages_per_split") or {}).get("val", {}).get(deep, 0)
    if n_val:
        return ""
    return (f": dataset {meta.get('dataset')!r} has no {deep!r} (deep-funnel) events in its val split "
            f"({meta_path} stages_per_split.val), so training has no validation pairs to rank. Fix: a longer "
            "val period (data.split.val_fraction), another dataset, or another optimized_metric")


def _lookup(metrics: dict[str, Any], dotted: str, cfg: Any = None) -> float:
    """``metrics[a][b]`` for ``dotted`` = ``a.b``; a HirError that says why when it is missing."""
    from hir.errors import HirError

    node: Any = metrics
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            hint = _no_validation_hint(cfg) if cfg is not None and "val/" in dotted else ""
            raise HirError(f"optimized_metric={dotted!r} is not among the metrics the stage returned "
                           f"({sorted(metrics)}){hint}")
        node = node[part]
    if not isinstance(node, int | float):
        raise HirError(f"optimized_metric={dotted!r} is {node!r}, not a number; name a leaf metric")
    return float(node)


def user_error(err: BaseException) -> BaseException | None:
    """The HirError behind ``err`` (Hydra's instantiate wraps exceptions), else None."""
    from hir.errors import HirError

    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, HirError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _fullest_path(cfg: Any) -> tuple[str | None, Path]:
    """(``paths.<key>``, its dir) of the configured path whose filesystem has the least free space."""
    from hir import space

    candidates: list[tuple[int, str | None, Path]] = []
    paths = getattr(cfg, "paths", None)
    for key in list(paths.keys()) if hasattr(paths, "keys") else []:
        try:
            value = paths[key]
        except Exception:
            continue
        if isinstance(value, str) and value.startswith("/"):
            candidates.append((space.free_bytes(value), f"paths.{key}", Path(value)))
    try:
        store = getattr(getattr(cfg, "publish", None), "store_dir", None)
    except Exception:
        store = None
    if isinstance(store, str) and store.startswith("/"):  # the serving store lives outside paths.*
        candidates.append((space.free_bytes(store), "publish.store_dir", Path(store)))
    if not candidates:
        return None, Path.cwd()
    _, key, where = min(candidates, key=lambda c: c[0])
    return key, where


def disk_full_error(stage: str, cfg: Any, err: BaseException) -> BaseException | None:
    """A full disk that no stage named itself (a checkpoint, an export parquet, the content
    cache...) as one line naming the file, the free space and the fix; None for other errors."""
    from hir import space

    if not space.is_out_of_space(err):
        return None
    file = space.failed_file(err)
    if file:
        where, what = Path(file).parent, Path(file).name
    else:  # the library did not say which file: the stage's configured dir on the fullest disk
        key, where = _fullest_path(cfg)
        what = f"the outputs of `hir {stage}`" + (f" ({key})" if key else "")
    served = ("nothing that is served changed (a version goes live only when a `hir publish` completes); "
              f"`hir {stage}` did not mark these outputs done, so the next run redoes them")
    return space.OutOfSpace(what, where, served, "free space on that disk (or point paths.* at a larger one), "
                            "then run the same command again; docs/operations.md: Out of disk space")


def _hydra_entry(stage: str) -> Any:
    import hydra
    from omegaconf import DictConfig, OmegaConf, open_dict

    @hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="config")
    def _main(cfg: DictConfig) -> float | None:
        # the stage comes from the command line's first word, not from an override, so Hydra's
        # own argument parsing (-m, --cfg, overrides in any order) is untouched
        with open_dict(cfg):
            cfg.stage = stage
        log.info("hir %s (git %s)", stage, git_sha())
        log.debug("resolved config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))
        try:
            metrics = run_pipeline(cfg) if stage == "pipeline" else run_stage(stage, cfg)
            if cfg.get("optimized_metric"):
                return _lookup(metrics, cfg.optimized_metric, cfg)
        except Exception as err:
            error = user_error(err) or disk_full_error(stage, cfg, err)
            if error is None:
                raise
            # one readable line, no traceback: the user can fix this
            log.error("hir %s: %s", stage, error)
            sys.exit(2)
        return None

    return _main


def run_hydra(stage: str, args: list[str]) -> None:
    """Run ``stage`` (a stage, ``pipeline`` or a helper without its own ``main``) as a Hydra app with
    the overrides and Hydra flags ``args``, as `hir <stage> <args>` does; a user error exits 2."""
    register_resolvers()
    # Hydra parses sys.argv[1:]; argv[0] only names the job. `stage=<stage>` makes the composed
    # config (`--help`, `--cfg job`, .hydra/config.yaml) say which stage runs.
    args = [a for a in hydra_argv(args) if not a.startswith("stage=")]
    sys.argv = [f"hir {stage}", *args, f"stage={stage}"]
    _hydra_entry(stage)()
