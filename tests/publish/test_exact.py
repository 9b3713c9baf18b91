"""`hir recommend`'s in-process exact discovery (hir/publish/exact.py) on a tiny published store:
it returns the lists Milvus returns (ids in order, cosines), `--discovery auto` picks it on a
Milvus Lite store, and it sees the entities `hir refresh` inserted after publish, also when the
refresh is committed after the searcher was opened."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

from hir.errors import HirError
from hir.publish import refresh
from hir.publish import stage as publish
from hir.publish.exact import ExactSearch
from hir.publish.recommend import SearchDiscovery, main, open_recommender
from hir.publish.retrieval import Retriever
from hir.serving import read_state
from hir.validate import stage as validate
from tests.publish.export_fixture import contract_rows
from tests.publish.fixtures import funnel_run

NEW = "refreshed-product-1"


@pytest.fixture(scope="module")
def live(tiny_graph: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Run ``x1`` (export + funnel) validated and published once for the module."""
    run = tmp_path_factory.mktemp("exact") / "x1"
    cfg = funnel_run(tiny_graph, run, "x1")
    validate.run(cfg)
    publish.run(cfg)
    store_dir = run.parent / "store"
    users = pl.read_parquet(run / "graph" / "nodes" / "user.parquet").sort("node_id")["key"].cast(pl.String).to_list()
    return SimpleNamespace(cfg=cfg, run=run, store_dir=store_dir, users=users)


def _manifest(live: SimpleNamespace) -> dict:
    state = read_state(live.store_dir)
    return state["versions"][state["live"]]["manifest"]


def _history(live: SimpleNamespace) -> dict[str, list[str]]:
    """Each user's open-funnel entities (what discovery leaves out), by original ids."""
    keys = pl.read_parquet(live.run / "graph" / "nodes" / "product.parquet").sort("node_id")["key"].cast(pl.String)
    pairs = pl.read_parquet(live.run / "funnel" / "open_funnel.parquet", columns=["user_id", "entity_id"])
    out: dict[str, list[str]] = {u: [] for u in live.users}
    for u, e in pairs.iter_rows():
        out[live.users[u]].append(keys[e])
    return out


def _both(live: SimpleNamespace, users: list[str], k: int) -> tuple[list, list]:
    """(exact hits, Milvus hits) of ``users``' embeddings, their history left out."""
    manifest, history = _manifest(live), _history(live)
    exact = ExactSearch(manifest)
    vectors = exact.embeddings("user", users)
    exclude = [history[u] for u in users]
    milvus = Retriever(manifest)
    try:
        return exact.search(vectors, "product", k, exclude=exclude), milvus.search(vectors, "product", k, exclude=exclude)
    finally:
        milvus.close()


def test_exact_search_returns_the_milvus_lists(live: SimpleNamespace) -> None:
    exact, milvus = _both(live, live.users, 20)
    assert len(exact) == len(live.users)
    for got, want in zip(exact, milvus, strict=True):
        assert [i for i, _ in got] == [i for i, _ in want]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)
    history = _history(live)
    assert not any(set(i for i, _ in row) & set(history[u]) for u, row in zip(live.users, exact, strict=True))


def test_exact_search_filters_on_coarse_tokens_like_milvus(live: SimpleNamespace) -> None:
    manifest = _manifest(live)
    exact, milvus = ExactSearch(manifest), Retriever(manifest)
    try:
        vectors = exact.embeddings("user", live.users[:10])
        tokens = [int(t) for t in np.unique(exact._rows("product").coarse)[:2]]
        got = exact.search(vectors, "product", 15, coarse_tokens=tokens)
        want = milvus.search(vectors, "product", 15, coarse_tokens=tokens)
    finally:
        milvus.close()
    assert [[i for i, _ in r] for r in got] == [[i for i, _ in r] for r in want]
    rows = exact.rows["product"]
    assert all(int(rows.coarse[rows.index[i]]) in tokens for r in got for i, _ in r)


def test_recommend_auto_is_exact_on_lite_and_serves_the_milvus_results(live: SimpleNamespace) -> None:
    auto = open_recommender(store=live.store_dir)
    assert isinstance(auto.recommender.discovery, SearchDiscovery)
    assert isinstance(auto.recommender.discovery.retriever, ExactSearch)
    rows, discovery = auto.recommend_both(live.users[:40], k=10)
    via_milvus = open_recommender(store=live.store_dir, discovery="milvus")
    try:
        rows_m, discovery_m = via_milvus.recommend_both(live.users[:40], k=10)
    finally:
        via_milvus.recommender.discovery.retriever.close()
    assert discovery == discovery_m and any(discovery.values())
    assert [(r["user"], r["entity"], r["source"]) for r in rows] == [(r["user"], r["entity"], r["source"]) for r in rows_m]
    np.testing.assert_allclose([r["score"] for r in rows], [r["score"] for r in rows_m], atol=2e-4)


def test_the_cli_takes_exact(live: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    main([live.users[0], "--store", str(live.store_dir), "--discovery", "exact", "--k", "3", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in rows] == [1, 2, 3] and {r["user"] for r in rows} == {live.users[0]}
    with pytest.raises(SystemExit) as err:
        main([live.users[0], "--store", str(live.store_dir), "--discovery", "nearest"])
    assert err.value.code == 2
    assert "--discovery 'nearest'; expected one of auto, exact, milvus, base" in capsys.readouterr().err


def test_bad_choices_and_files_are_refused(live: SimpleNamespace, tmp_path: Path) -> None:
    with pytest.raises(HirError, match="needs a published version"):
        open_recommender(funnel=live.run / "funnel", discovery="exact")
    manifest = _manifest(live)
    with pytest.raises(HirError, match="has no Milvus collection"):
        ExactSearch(manifest).search(np.ones((1, manifest["dim"]), np.float32), "no_such_type")
    # a payload file edited after the insert: the search could differ from Milvus's, so it is refused
    bad = json.loads(json.dumps(manifest))
    copy = tmp_path / "product.milvus.parquet"
    shutil.copy(manifest["milvus"]["payload"]["product"]["file"], copy)
    table = pl.read_parquet(copy)
    table.head(table.height - 1).write_parquet(copy)
    bad["milvus"]["payload"]["product"]["file"] = str(copy)
    with pytest.raises(HirError, match="changed since it was inserted into Milvus"):
        ExactSearch(bad).search(np.ones((1, manifest["dim"]), np.float32), "product")
    del bad["milvus"]["payload"]
    with pytest.raises(HirError, match="records no file of the product rows"):
        ExactSearch(bad).search(np.ones((1, manifest["dim"]), np.float32), "product")
    # a funnel of another snapshot: its dense ids would name other entities
    other = tmp_path / "other"
    shutil.copytree(live.run / "graph", other / "graph")
    meta = json.loads((other / "graph" / "meta.json").read_text())
    (other / "graph" / "meta.json").write_text(json.dumps(meta | {"seed_note": "another snapshot"}))
    shutil.copytree(live.run / "funnel", other / "funnel")
    with pytest.raises(HirError, match=r"not on .* which version 'x1' was published from"):
        open_recommender(store=live.store_dir, funnel=other / "funnel")


def test_a_refreshed_entity_is_found_by_the_exact_search(live: SimpleNamespace) -> None:
    """Last in the module: the refresh changes the store. The new product gets a user's own
    vector, so it is that user's nearest; a searcher opened before the refresh sees it too."""
    manifest = _manifest(live)
    opened = ExactSearch(manifest, store_dir=live.store_dir)
    user = live.users[3]
    vector = opened.embeddings("user", [user])  # (1, dim)
    assert NEW not in [i for i, _ in opened.search(vector, "product", 5)[0]]
    at = datetime.fromisoformat(manifest["feast"]["funnel"]["asof"]) + timedelta(days=1)
    rows = contract_rows(pl.Series([NEW]), pl.Series([10_000]), pl.Series([True]), "product", dim=manifest["dim"],
                         levels=manifest["levels"], top_k=manifest["top_k"], version="x1", seed=[7],
                         created=datetime.now(UTC))
    rows = rows.with_columns(pl.Series("embedding", [vector[0].tolist()], pl.List(pl.Float32)),
                             pl.lit(at).cast(pl.Datetime("us", "UTC")).alias("event_timestamp"))
    record = refresh.refresh_rows(live.cfg, {"product": rows}, "delta.csv", read_state(live.store_dir))
    assert Path(record["milvus"]["product"]["file"]).exists()

    for searcher in (opened, ExactSearch(_manifest(live))):
        hit, score = searcher.search(vector, "product", 5)[0][0]
        assert (hit, round(score, 4)) == (NEW, 1.0)
    assert len(opened.rows["product"].files) == 2, "the refresh's payload file was not read"
    # and the lists still equal Milvus's (which holds the refreshed row too)
    exact, milvus = _both(live, live.users[:50], 20)
    assert [[i for i, _ in r] for r in exact] == [[i for i, _ in r] for r in milvus]
    assert any(NEW in [i for i, _ in r] for r in exact)


def test_the_two_passes_return_a_whole_faiss_scan_ranked_as_lite(tmp_path: Path) -> None:
    """No Milvus: rows in groups of near-duplicates (1e-6 apart, where BLAS and faiss round a
    dot product differently and many rows tie to float32 at the k-th place), some left out; the
    BLAS screen must keep every row faiss would rank in the top k, so the lists and scores equal
    one faiss scan of all allowed rows, ranked by (float32 distance, row) as Lite ranks."""
    import faiss
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    base = rng.normal(size=(40, 33)).astype(np.float32)
    vecs = (np.repeat(base, 50, axis=0) + rng.normal(scale=1e-6, size=(2000, 33))).astype(np.float32)
    ids = [f"e{i}" for i in range(len(vecs))]
    path = tmp_path / "product.milvus.parquet"
    pq.write_table(pa.table({"id": ids, "coarse_token": pa.array(rng.integers(0, 3, len(ids)), pa.int64()),
                             "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1)), 33)}), path)
    manifest = {"version": "t", "milvus": {"payload": {"product": {"file": str(path)}}, "collections": {"product": "c"}}}
    search = ExactSearch(manifest)
    queries = base[:12] + rng.normal(scale=0.05, size=(12, 33)).astype(np.float32)
    exclude = [rng.choice(ids, 30, replace=False).tolist() for _ in queries]
    got = search.search(queries, "product", 25, exclude=exclude)
    rows = search.rows["product"]
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    for i, row in enumerate(got):
        valid = np.ones(len(ids), bool)
        valid[[rows.index[e] for e in exclude[i]]] = False
        bitmap = np.packbits(valid, bitorder="little")
        sel = faiss.SearchParametersIVF(sel=faiss.IDSelectorBitmap(len(ids), faiss.swig_ptr(bitmap)), nprobe=1)
        ip, found = rows.faiss.search(q[i:i + 1], 25, params=sel)
        dist = (1.0 - ip[0].astype(np.float64)).astype(np.float32)
        order = np.lexsort((found[0], dist))
        assert row == [(ids[found[0][o]], 1.0 - float(dist[o])) for o in order]
    ties = sum(len(r) - len({s for _, s in r}) for r in got)
    assert ties > 0, "the data was meant to tie rows to float32"
