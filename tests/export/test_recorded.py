"""How meta.json records the export's checkpoint (hir.export.recorded): relative to the export dir
when the checkpoint is in the run dir, so a moved run dir still resolves its own; older absolute
paths still read."""

from __future__ import annotations

from pathlib import Path

from hir.export.recorded import exported_checkpoint, record_checkpoint


def _run(root: Path) -> Path:
    (root / "embeddings").mkdir(parents=True)
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "best.ckpt").touch()
    return root


def test_the_runs_own_checkpoint_is_recorded_relative_and_resolves_after_a_move(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    recorded = record_checkpoint(run / "checkpoints" / "best.ckpt", run / "embeddings")
    assert recorded == "../checkpoints/best.ckpt"
    assert exported_checkpoint(recorded, run / "embeddings") == run / "checkpoints" / "best.ckpt"
    moved = run.rename(tmp_path / "moved")
    assert exported_checkpoint(recorded, moved / "embeddings") == moved / "checkpoints" / "best.ckpt"


def test_a_checkpoint_outside_the_run_dir_stays_absolute(tmp_path: Path) -> None:
    run, other = _run(tmp_path / "run"), _run(tmp_path / "other")
    recorded = record_checkpoint(other / "checkpoints" / "best.ckpt", run / "embeddings")
    assert recorded == str((other / "checkpoints" / "best.ckpt").resolve())
    # the other run's file, not this run's file of the same name
    assert exported_checkpoint(recorded, run / "embeddings") == other / "checkpoints" / "best.ckpt"
    # an export dir outside the run dir (paths.embeddings_dir=...): absolute too
    assert Path(record_checkpoint(run / "checkpoints" / "best.ckpt", tmp_path / "elsewhere" / "emb")).is_absolute()


def test_an_older_absolute_path_reads_where_the_run_dir_is_now(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    recorded = str(run / "checkpoints" / "best.ckpt")  # what exports wrote before
    assert exported_checkpoint(recorded, run / "embeddings") == Path(recorded)
    moved = run.rename(tmp_path / "moved")
    assert exported_checkpoint(recorded, moved / "embeddings") == moved / "checkpoints" / "best.ckpt"
    # neither there nor in the run's checkpoints/: the recorded path, for the caller to report missing
    (moved / "checkpoints" / "best.ckpt").unlink()
    assert exported_checkpoint(recorded, moved / "embeddings") == Path(recorded)
