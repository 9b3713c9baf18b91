"""A multirun never switches what is served: each cell publishes into its own store; `hir promote`
serves one cell on purpose. Plus the typed config dicts of conf/publish (no merge trap).

The whole story (a `hir publish -m` sweep, then `hir promote`) is a slow test; the fast ones check
its parts: where a multirun job's store resolves to, what `hir promote` passes to `hir publish`,
and its error for a dir that is not a cell."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from hir.errors import HirError
from hir.publish.stage import milvus_settings, online_settings
from tests.conftest import ROOT, run_hir
from tests.publish.fixtures import TINY, compose_at


@pytest.mark.slow
def test_sweep_cells_never_switch_the_served_version_until_promoted(validated_v1: Path, tmp_path: Path) -> None:
    run = validated_v1  # read only: each cell publishes it into a store of its own
    home = tmp_path / "home"  # stands for the checkout: its outputs/serving/<dataset> is "what is served"
    common = [*TINY, f"paths.root_dir={home}", f"publish.feast.repo_template={ROOT / 'feature_repo'}",
              f"paths.embeddings_dir={run / 'embeddings'}", f"paths.validation_dir={run / 'validation'}"]
    served = home / "outputs" / "serving" / "synthetic"
    proc = run_hir("publish", *common, "-m", "publish.sanity.queries=20,30", f"hydra.sweep.dir={tmp_path / 'mr'}",
                   cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert not served.exists()  # the dataset's store was not touched
    for cell in ("0", "1"):
        manifest = json.loads((tmp_path / "mr" / cell / "publish" / "manifest.json").read_text())
        assert manifest["store_dir"] == str((tmp_path / "mr" / cell / "serving").resolve())
        assert manifest["status"] == "live" and manifest["version"] == "v1"  # live in the cell's own store

    overrides = (tmp_path / "mr" / "1" / ".hydra" / "overrides.yaml").read_text()
    proc = run_hir("promote", str(tmp_path / "mr" / "1"), cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert json.loads((served / "live.json").read_text())["live"] == "v1"
    manifest = json.loads((tmp_path / "mr" / "1" / "publish" / "manifest.json").read_text())
    assert manifest["store_dir"] == str(served.resolve()) and manifest["status"] == "live"
    assert manifest["milvus"]["sanity"]["product"]["rows"] > 0
    assert (tmp_path / "mr" / "1" / ".hydra" / "overrides.yaml").read_text() == overrides  # `hir gather` reads it
    assert "v1: LIVE" in proc.stdout + proc.stderr

    bad = run_hir("promote", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert bad.returncode == 2 and "is not a Hydra job dir" in bad.stderr


def _compose_job(mode: str, job_dir: Path, home: Path) -> DictConfig:
    """The publish config of one Hydra job in ``mode`` (RUN or MULTIRUN) whose output dir is
    ``job_dir``, registered as the running job's Hydra config (what `hir publish` sees)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from hir.stages import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["stage=publish", *TINY, f"paths.root_dir={home}", f"hydra.mode={mode}"],
                      return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(job_dir)
    HydraConfig.instance().set_config(cfg)
    return cfg


@pytest.fixture
def hydra_job() -> Iterator:
    """``_compose_job``, with the Hydra config of the job cleared afterwards."""
    from hydra.core.hydra_config import HydraConfig

    yield _compose_job
    HydraConfig.instance().cfg = None


def test_a_multirun_job_publishes_into_its_own_store(hydra_job, tmp_path: Path) -> None:
    """The part of the slow sweep test above that decides where a cell publishes: in a multirun
    job, publish.store_dir (and with it Feast's online store and Milvus Lite) is the job's
    serving/; in a single run, the dataset's store that `hir promote` publishes into."""
    home = tmp_path / "home"
    cell = tmp_path / "mr" / "1"
    cfg = hydra_job("MULTIRUN", cell, home)
    assert cfg.publish.store_dir == str(cell / "serving")
    assert cfg.publish.milvus.uri == str(cell / "serving" / "milvus.db")
    assert cfg.publish.feast.online_store.sqlite.path == str(cell / "serving" / "feast" / "online.db")
    cfg = hydra_job("RUN", cell, home)
    assert cfg.publish.store_dir == str(home / "outputs" / "serving" / "synthetic")


def test_promote_reenters_publish_with_the_cells_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    """`hir promote <cell> extra=...` runs `hir publish` in the cell's dir with the overrides the
    sweep gave that cell (minus stage=), without rewriting the cell's .hydra/ (`hir gather` reads
    it); a dir that is not a Hydra job dir exits 2 and says so."""
    from hir.publish import promote

    cell = tmp_path / "mr" / "1"
    (cell / ".hydra").mkdir(parents=True)
    (cell / ".hydra" / "overrides.yaml").write_text("- stage=publish\n- data=synthetic\n- publish.sanity.queries=30\n")
    calls = []
    monkeypatch.setattr(promote, "run_hydra", lambda stage, args: calls.append((stage, args)))
    promote.main([str(cell), "publish.allow_rollback=true"])
    assert calls == [("publish", ["data=synthetic", "publish.sanity.queries=30", f"hydra.run.dir={cell.resolve()}",
                                  "hydra.output_subdir=null", "publish.allow_rollback=true"])]

    with pytest.raises(SystemExit) as bad:
        promote.main([str(tmp_path / "nowhere")])
    assert bad.value.code == 2 and "is not a Hydra job dir" in capsys.readouterr().err
    assert len(calls) == 1


def test_switching_the_index_type_does_not_carry_the_other_types_params(tmp_path: Path) -> None:
    """`publish.milvus.index_type=IVF_FLAT` uses IVF_FLAT's own params; with the old flat dicts the
    HNSW ones (M, efConstruction, ef) came along, merged into whatever the user gave."""
    cfg = compose_at(tmp_path / "run", "publish.milvus.index_type=IVF_FLAT", "publish.milvus.index_params.IVF_FLAT.nlist=64")
    m = milvus_settings(cfg.publish)
    assert m["index_params"] == {"nlist": 64} and m["search_params"] == {"nprobe": 64}
    cfg = compose_at(tmp_path / "run", "publish.milvus.index_type=FLAT")
    assert milvus_settings(cfg.publish)["index_params"] == {} == milvus_settings(cfg.publish)["search_params"]
    cfg = compose_at(tmp_path / "run", "publish.milvus.index_type=SCANN")
    with pytest.raises(HirError, match=r"index_type=SCANN has no publish\.milvus\.index_params\.SCANN .*\+publish"):
        milvus_settings(cfg.publish)


def test_online_store_options_follow_the_type(tmp_path: Path) -> None:
    sqlite = online_settings(compose_at(tmp_path / "run").publish)
    assert sqlite == {"type": "sqlite", "path": str(tmp_path / "store" / "feast" / "online.db")}
    redis = online_settings(compose_at(tmp_path / "run", "publish.feast.online_store.type=redis",
                                       "publish.feast.online_store.redis.key_ttl_seconds=60").publish)
    assert redis == {"type": "redis", "connection_string": "localhost:6379", "key_ttl_seconds": 60}
    cfg = compose_at(tmp_path / "run", "+publish.feast.online_store.redis.pasword=x", "publish.feast.online_store.type=redis")
    with pytest.raises(HirError, match=r"online_store\.redis has \['pasword'\], which Feast's redis online store does not take"):
        online_settings(cfg.publish)
    assert OmegaConf.select(compose_at(tmp_path / "run", "publish=feast_redis"), "publish.feast.online_store.type") == "redis"
