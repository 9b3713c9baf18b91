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


def test_optuna_sweep_prepares_once_and_finds_the_data(tmp_path):
    """The README's `hir train hparams_search=optuna data=...` from a fresh directory: the trials
    share one snapshot, prepared before the first trial in the run dir `hir prepare` would use."""
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


def test_a_missing_optimized_metric_names_the_cause(tmp_path):
    """No deep-funnel events in the val split: training cannot rank validation pairs, so it
    returns no val/recall@K; the sweep used to die with a KeyError."""
    out = run_hir("pipeline", "pipeline.stages=[prepare,enrich,train]", *TINY_SYNTHETIC, *TINY_MODEL,
                  "data.split.val_fraction=0.0005", "optimized_metric=val/recall@20", f"hydra.run.dir={tmp_path}/run",
                  f"paths.cache_dir={tmp_path}/.cache", cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text and "KeyError" not in text
    # the dataset, the split and the fix are named
    assert "'synthetic'" in text and "val split" in text and "data.split.val_fraction" in text
