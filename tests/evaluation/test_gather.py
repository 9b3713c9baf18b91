"""`hir gather`: a multirun's metrics in one table with the swept overrides as columns."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hir.errors import InputError
from hir_evaluation.gather import gather, main


def _job(root: Path, num: int, overrides: list[str], hir_recall: float | None, val_recall: float | None) -> None:
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if hir_recall is not None:
        (job / "report").mkdir()
        (job / "report" / "metrics.json").write_text(json.dumps({
            "ranking": {"baseline": {"auc": 0.7}, "hir": {"auc": 0.75}, "ne_lift": {"value": 0.02, "ci": [0.01, 0.03]}},
            "retrieval": {"hir": {"recall@20": hir_recall}, "popularity": {"recall@20": 0.1}},
        }))
    if val_recall is not None:
        (job / "train_metrics.json").write_text(json.dumps({"metrics": {"val/recall@20": val_recall, "loss": 1.0}}))


def test_gather_table(tmp_path: Path) -> None:
    root = tmp_path / "multirun" / "2026-11-29_12-00-00"
    _job(root, 0, ["model.bias.table=true", "data=rees46", "stage=pipeline"], 0.30, 0.40)
    _job(root, 1, ["model.bias.table=false", "data=rees46", "stage=pipeline"], 0.25, 0.35)
    _job(root, 10, ["model.bias.table=false", "data=rees46", "stage=pipeline"], None, None)  # a failed job
    summary = gather(root)
    assert summary == {"jobs": 3, "without_metrics": 1, "markdown": str(root / "comparison.md"),
                       "csv": str(root / "comparison.csv")}
    rows = list(csv.DictReader((root / "comparison.csv").open()))
    # job order is numeric (10 after 1); only the swept override is a column, data= is fixed
    assert [r["job"] for r in rows] == ["0", "1", "10"]
    assert [r["model.bias.table"] for r in rows] == ["true", "false", "false"]
    assert "data" not in rows[0] and "stage" not in rows[0]
    assert rows[0]["retrieval.hir.recall@20"] == "0.3000" and rows[1]["train.val/recall@20"] == "0.3500"
    assert rows[0]["ranking.ne_lift.ci"] == "[0.0100, 0.0300]"
    assert rows[2]["status"] == "no metrics"
    md = (root / "comparison.md").read_text()
    assert "Fixed overrides: `data=rees46`" in md and "| model.bias.table |" in md


def test_gather_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(InputError, match="no Hydra job dirs"):
        gather(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "missing")])
    assert exit_info.value.code == 2 and "is not a directory" in capsys.readouterr().err


def test_gather_main_accepts_both_spellings(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    _job(root, 0, ["eval.seed=1"], 0.3, None)
    _job(root, 1, ["eval.seed=2"], 0.2, None)
    main([str(root)])
    assert (root / "comparison.md").exists()
    main([f"eval.gather.dir={root}", f"eval.gather.out={tmp_path / 'table'}"])
    assert "eval.seed" in (tmp_path / "table.csv").read_text().splitlines()[0]


def test_gather_never_folds_cells_letter_by_letter(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns (a log file, a narrow terminal) a wide table becomes one line per job whose
    values are intact, instead of a table whose cells fold one letter per line."""
    monkeypatch.setenv("COLUMNS", "80")
    root = tmp_path / "wide"
    for i in range(3):
        _job(root, i, [f"model.optim.lr={0.001 * (i + 1)}", f"model.objective.weights.distill={i}.5",
                       f"model.bias.table={'true' if i % 2 else 'false'}"], 0.3 + i / 100, 0.4)
    gather(root)
    out = capsys.readouterr().out
    assert "job 1: table=true, distill=1.5, lr=0.002" in out
    assert "retrieval.hir.recall@20=0.3100" in out
    assert not any(len(line.strip("│ ┃")) == 1 for line in out.splitlines())  # no letter-per-line cells
