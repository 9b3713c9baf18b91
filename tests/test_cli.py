import pytest

from tests.conftest import ROOT, run_hir
from tests.train.fixtures import TINY_DATA as FIXTURE_DATA
from tests.train.fixtures import TINY_MODEL as FIXTURE_MODEL


def test_help_lists_stages_and_datasets(tmp_path):
    out = run_hir("--help", cwd=tmp_path)
    assert out.returncode == 0
    for word in ("prepare", "pipeline", "evaluate", "completejourney", "rees46", "events_csv", "online_retail"):
        assert word in out.stdout


def test_unknown_stage_exits_2(tmp_path):
    out = run_hir("bogus", cwd=tmp_path)
    assert out.returncode == 2 and "unknown stage 'bogus'" in out.stderr


def test_missing_column_is_one_readable_error_without_traceback(tmp_path):
    csv = tmp_path / "ev.csv"
    csv.write_text("user,item,ts\n1,a,1570000000\n")
    out = run_hir(
        "prepare", "data=events_csv", f"data.path={csv}", "data.columns.user=user", "data.columns.item=item",
        "data.columns.stage=behavior", "data.columns.timestamp=ts", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path,
    )
    assert out.returncode == 2
    text = out.stdout + out.stderr
    assert "no column 'behavior' (mapped by data.columns.stage)" in text
    assert "Traceback" not in text


def test_bad_rows_succeed_with_quarantine(tmp_path):
    csv = tmp_path / "ev.csv"
    csv.write_text("user,item,behavior,ts\n1,a,pv,1570000000\n2,b,buy,1570000100\n3,c,pv,garbage\n4,,pv,1570000200\n")
    out = run_hir(
        "prepare", "data=events_csv", f"data.path={csv}", "data.columns.user=user", "data.columns.item=item",
        "data.columns.stage=behavior", "data.columns.timestamp=ts", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    import json

    meta = json.loads((tmp_path / "run" / "graph" / "meta.json").read_text())
    assert (meta["input_rows"], meta["kept_rows"], meta["quarantined_rows"]) == (4, 2, 2)
    assert (tmp_path / "run" / "graph" / "quarantine" / "events.parquet").exists()


def test_project_root_is_found(tmp_path):
    assert (ROOT / "conf" / "config.yaml").exists()


# the train tests' tiny synthetic data (a planted 4 x 2 hierarchy)
TINY_SYNTHETIC = list(FIXTURE_DATA)
# the train tests' tiny model (tests/train/fixtures.py follows conf/model), one epoch
TINY_MODEL = [*FIXTURE_MODEL, "trainer.max_epochs=1"]


def test_multirun_flag_may_stand_anywhere(tmp_path):
    """`hir prepare experiment-ish=... -m data=...`: overrides after -m used to be rejected."""
    out = run_hir("prepare", *TINY_SYNTHETIC[:1], "-m", *TINY_SYNTHETIC[1:], "seed=1,2",
                  f"hydra.sweep.dir={tmp_path}/mr", f"paths.cache_dir={tmp_path}/.cache", cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "unrecognized arguments" not in out.stderr
    for job in ("0", "1"):
        assert (tmp_path / "mr" / job / "graph" / "meta.json").exists()


def test_help_and_cfg_show_the_stage_that_runs(tmp_path):
    out = run_hir("train", "--help", cwd=tmp_path)
    assert out.returncode == 0
    assert "hir train: one stage of hir" in out.stdout
    assert "\nstage: train\n" in out.stdout and "stage: pipeline" not in out.stdout
    # --cfg after an override (Hydra's flags may stand anywhere too), and its value kept
    out = run_hir("export", "model.net.depth=3", "--cfg", "job", "seed=5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("stage: export\n") and "\n    depth: 3\n" in out.stdout and "\nseed: 5\n" in out.stdout


@pytest.mark.slow
def test_optuna_sweep_prepares_once_and_finds_the_data(tmp_path):
    """The README's `hir train hparams_search=optuna data=...` from a fresh directory: the trials
    share one snapshot, prepared before the first trial in the run dir `hir prepare` would use.
    (Slow: a sweep of two trainings; the fast test below runs its sweep callback in-process.)"""
    out = run_hir("train", "hparams_search=optuna", *TINY_SYNTHETIC, *TINY_MODEL, "hydra.sweeper.n_trials=2",
                  "hydra.sweeper.sampler.n_startup_trials=2", f"paths.cache_dir={tmp_path}/.cache", cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert (tmp_path / "outputs" / "synthetic" / "default" / "graph" / "meta.json").exists()
    assert (tmp_path / "outputs" / "synthetic" / "default" / "content" / "meta.json").exists()
    (sweep,) = (tmp_path / "multirun").iterdir()
    assert (sweep / "optimization_results.yaml").exists()
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    assert not (sweep / "0" / "graph").exists()  # trials read the shared snapshot, never their own
    assert text.count("stage prepare: start") == 1
    assert "setup plugin" not in text  # alembic's plugin registry at INFO, through Hydra's logger


@pytest.mark.slow
def test_a_missing_optimized_metric_names_the_cause(tmp_path):
    """No deep-funnel events in the val split: training cannot rank validation pairs, so it
    returns no val/recall@K; the sweep used to die with a KeyError. (Slow: the pipeline through
    the `hir` command; the fast test below is the train stage's own metrics in-process.)"""
    out = run_hir("pipeline", "pipeline.stages=[prepare,enrich,train]", *TINY_SYNTHETIC, *TINY_MODEL,
                  "data.split.val_fraction=0.0005", "optimized_metric=val/recall@20", f"hydra.run.dir={tmp_path}/run",
                  f"paths.cache_dir={tmp_path}/.cache", cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text and "KeyError" not in text
    # the dataset, the split and the fix are named
    assert "'synthetic'" in text and "val split" in text and "data.split.val_fraction" in text


def test_the_optuna_sweep_prepares_the_shared_snapshot_its_trials_read(tmp_path):
    """The fast part of the optuna sweep test above: conf/hparams_search/optuna.yaml's callback
    prepares and enriches once, before the first trial, into the run dir a single run would use,
    and every trial's config reads that snapshot, not one in its own job dir."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import instantiate
    from omegaconf import OmegaConf, open_dict

    from hir.stages import register_resolvers

    register_resolvers()
    run_dir, job_dir = tmp_path / "outputs" / "synthetic" / "default", tmp_path / "multirun" / "0"
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["stage=train", "hparams_search=optuna", *TINY_SYNTHETIC, *TINY_MODEL,
                                           f"hydra.run.dir={run_dir}", f"paths.cache_dir={tmp_path}/.cache"],
                      return_hydra_config=True)
    try:
        callback = instantiate(cfg.hydra.callbacks.prepare_once)
        assert callback.stages == ["prepare", "enrich"]
        callback.on_multirun_start(cfg)
        assert (run_dir / "graph" / "meta.json").exists() and (run_dir / "content" / "meta.json").exists()
        # a trial: its own job dir, the shared snapshot
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(job_dir)
        HydraConfig.instance().set_config(cfg)
        trial = OmegaConf.to_container(cfg.paths, resolve=True)
        assert trial["output_dir"] == str(job_dir)
        assert trial["graph_dir"] == str(run_dir / "graph") and trial["content_dir"] == str(run_dir / "content")
        assert cfg.optimized_metric == "val/recall@20"
    finally:
        HydraConfig.instance().cfg = None


def test_a_missing_validation_metric_names_the_dataset_the_split_and_the_fix(tmp_path):
    """The fast part of the missing-metric test above, in-process: on a snapshot whose val split
    has no deep-funnel event, the train stage stops with a user error (what the `hir` command
    prints without a traceback, exit 2) naming the dataset, the split and the fix; and a metric
    lookup that misses val/recall@K on such a snapshot says the same instead of a KeyError."""
    from hir.data.prepare import run as prepare
    from hir.errors import HirError
    from hir.stages import _lookup, user_error
    from hir.train.stage import run as train
    from tests.train.fixtures import compose, write_content

    run = tmp_path / "run"
    cfg = compose(run, *TINY_SYNTHETIC, *TINY_MODEL, "data.split.val_fraction=0.0005",
                  "optimized_metric=val/recall@20")
    prepare(cfg)
    write_content(run / "graph", run / "content")
    with pytest.raises(HirError) as stopped:
        train(cfg)
    with pytest.raises(HirError) as missing:
        _lookup({"train/loss": 1.0}, cfg.optimized_metric, cfg)
    for err in (stopped.value, missing.value):
        assert user_error(err) is err  # the hir command: exit 2, the message, no traceback
        text = str(err)
        assert "'synthetic'" in text and "val split" in text and "data.split.val_fraction" in text, text
