from tests.conftest import ROOT, run_hir


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
