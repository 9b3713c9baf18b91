"""A multirun never switches what is served: each cell publishes into its own store; `hir promote`
serves one cell on purpose. Plus the typed config dicts of conf/publish (no merge trap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hir.errors import HirError
from hir.publish.stage import milvus_settings, online_settings
from hir.validate import stage as validate
from tests.conftest import ROOT, run_hir
from tests.publish.conftest import TINY, compose_at


def test_sweep_cells_never_switch_the_served_version_until_promoted(make_run, tmp_path: Path) -> None:
    cfg = make_run("v1")
    validate.run(cfg)
    run = Path(cfg.paths.output_dir)
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
