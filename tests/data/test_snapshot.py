"""The snapshot reader (hir.data.snapshot) on the tiny synthetic snapshot prepare writes."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from hir.data.schema import ENTITY_TYPES, METADATA_RELATIONS, engage_relation
from hir.data.snapshot import load_snapshot
from hir.errors import InputError
from tests.train.fixtures import tiny_snapshot


@pytest.fixture(scope="module")
def snap(tmp_path_factory: pytest.TempPathFactory):
    return load_snapshot(tiny_snapshot(tmp_path_factory.mktemp("snapshot")) / "graph")


def test_meta_and_node_tables_agree(snap) -> None:
    meta = json.loads((snap.dir / "meta.json").read_text())
    assert snap.dataset == "synthetic" and snap.stage_order == meta["stage_order"]
    assert snap.val_start < snap.test_start <= snap.end
    assert set(snap.node_counts) == set(ENTITY_TYPES)
    for etype, n in snap.node_counts.items():
        assert snap.has_nodes(etype) == (n > 0)
        if n:
            frame = snap.nodes(etype)
            assert frame["node_id"].to_list() == list(range(n)) and snap.num_nodes(etype) == n
            index = snap.key_index(etype)
            assert [index[k] for k in snap.keys(etype).to_list()] == list(range(n))
            assert snap.node_schema(etype)["key"] == pl.String
            assert snap.scan_nodes(etype).select(pl.len()).collect().item() == n


def test_edges_scans_and_metadata(snap) -> None:
    engaged = [t for t in ENTITY_TYPES if engage_relation(t) in snap.meta["edges"]]
    assert snap.engaged_types() == engaged and "product" in engaged
    scan = snap.engagement("product")
    full = snap.edges(engage_relation("product"))
    assert scan is not None and scan.collect().equals(full)
    assert {"src_id", "dst_id", "stage", "split", "count", "last_ts"} <= set(full.columns)
    assert snap.engagement("user") is None and snap.edges("no__such__relation") is None
    rels = snap.metadata_edges()
    assert [r for r, *_ in rels] == [r for r in METADATA_RELATIONS if r in snap.meta["edges"]]
    for rel, src, dst, frame in rels:
        assert (src, dst) == METADATA_RELATIONS[rel] and frame.columns == ["src_id", "dst_id"]
        assert frame["src_id"].max() < snap.node_counts[src] and frame["dst_id"].max() < snap.node_counts[dst]


def test_events_and_truth(snap) -> None:
    assert set(snap.events["split"].unique()) == {"train", "val", "test"}
    assert snap.scan_events().select(pl.len()).collect().item() == snap.events.height
    name, truth = snap.truth()
    assert name == "synthetic_truth.parquet" and {"entity_type", "key", "coarse", "fine"} <= set(truth.columns)


def test_missing_or_partial_snapshots_say_how_to_fix(tmp_path: Path, snap) -> None:
    with pytest.raises(InputError, match=r"meta.json missing.*run `hir prepare`"):
        load_snapshot(tmp_path / "nowhere")
    (tmp_path / "meta.json").write_text(json.dumps({"nodes": {}}))
    with pytest.raises(InputError, match=r"no 'stage_order'.*rerun `hir prepare force=true`"):
        load_snapshot(tmp_path)
    with pytest.raises(InputError, match=r"coupon.parquet is missing; the snapshot has node types \['advertiser'"):
        snap.nodes("coupon")


def test_listings_and_paths_match_the_files(snap) -> None:
    assert snap.node_types() == sorted(t for t, n in snap.node_counts.items() if n)
    assert snap.relations() == sorted(snap.meta["edges"])
    for etype in snap.node_types():
        assert snap.node_path(etype).relative_to(snap.dir).as_posix() == f"nodes/{etype}.parquet"
    for rel in snap.relations():
        assert snap.edge_path(rel).is_file() and snap.scan_edges(rel) is not None
    assert snap.events_path.is_file() and snap.meta_path.is_file()
    assert not snap.node_path("coupon").exists() and not snap.has_nodes("coupon")


def test_a_lenient_open_reads_tables_without_a_complete_meta(tmp_path: Path) -> None:
    nodes = tmp_path / "graph" / "nodes"
    nodes.mkdir(parents=True)
    pl.DataFrame({"node_id": [0, 1], "key": ["a", "b"]}).write_parquet(nodes / "product.parquet")
    loose = load_snapshot(tmp_path / "graph", strict=False)
    assert loose.meta == {} and loose.node_types() == ["product"] and loose.relations() == []
    assert loose.nodes("product")["key"].to_list() == ["a", "b"]
    (tmp_path / "graph" / "meta.json").write_text(json.dumps({"created": "2026-01-01"}))
    assert load_snapshot(tmp_path / "graph", strict=False).meta == {"created": "2026-01-01"}
    with pytest.raises(InputError, match="no 'stage_order'"):
        load_snapshot(tmp_path / "graph")
    with pytest.raises(InputError, match=r"events.parquet is missing.*rerun `hir prepare force=true`"):
        loose.scan_events()
