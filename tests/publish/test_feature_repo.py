"""The committed feature repo: what one version's definitions are, and the working copy."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import yaml

from hir.publish import feast_store

ROOT = Path(__file__).resolve().parents[2]


def _spec(tmp: Path) -> dict:
    tables = {t: {**feast_store.names(t, "v7", "rankers"), "path": str(tmp / f"{t}.parquet"), "levels": 2}
              for t in ("user", "product", "campaign")}
    return {"version": "v7", "slug": "v7", "feature_service": "rankers_v7", "service_types": ["user", "product"],
            "tables": tables}


def test_working_copy_has_absolute_paths_and_the_configured_online_store(tmp_path: Path) -> None:
    repo = feast_store.write_working_copy(ROOT / "feature_repo", tmp_path / "repo", "hir_x", tmp_path / "reg.db",
                                          {"type": "redis", "connection_string": "localhost:1"}, _spec(tmp_path))
    settings = yaml.safe_load((repo / "feature_store.yaml").read_text())
    assert {k: settings["registry"][k] for k in ("registry_type", "path")} == {"registry_type": "file",
                                                                            "path": str(tmp_path / "reg.db")}
    assert settings["online_store"] == {"type": "redis", "connection_string": "localhost:1"}
    assert settings["offline_store"] == {"type": "duckdb"} and settings["project"] == "hir_x"
    assert (repo / ".feastignore").exists() and (repo / "publish_spec.json").exists()


def test_definitions_of_one_version(tmp_path: Path) -> None:
    from feast import Entity, FeatureService, FeatureView, FileSource, PushSource

    repo = feast_store.write_working_copy(ROOT / "feature_repo", tmp_path / "repo", "hir_x", tmp_path / "reg.db",
                                          {"type": "sqlite", "path": str(tmp_path / "o.db")}, _spec(tmp_path))
    objs = feast_store.load_definitions(repo)
    by_type: dict[type, list] = {}
    for o in objs:
        by_type.setdefault(type(o), []).append(o)
    assert sorted(e.join_key for e in by_type[Entity]) == ["campaign_id", "product_id", "user_id"]
    views = {v.name: v for v in by_type[FeatureView]}
    assert set(views) == {"user_v7", "product_v7", "campaign_v7"}
    product = views["product_v7"]
    assert product.ttl == timedelta(0) and product.online
    assert [f.name for f in product.features] == ["embedding", "tokens_l0", "tokens_l1", "weights_l0",
                                                  "weights_l1", "model_version"]
    assert isinstance(product.stream_source, PushSource) and product.stream_source.name == "product_push_v7"
    assert isinstance(product.batch_source, FileSource) and product.batch_source.path == str(tmp_path / "product.parquet")
    (service,) = by_type[FeatureService]
    assert service.name == "rankers_v7"
    assert [(p.name, p.name_alias) for p in service.feature_view_projections] == [("product_v7", "product"),
                                                                                  ("user_v7", "user")]
