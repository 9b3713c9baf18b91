"""`hir publish` into Feast (duckdb offline, SQLite online) + Milvus Lite, read back with plain
Feast calls and the retrieval helper. One published store (of the session's validated export) is
shared by the module."""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import polars as pl
import pytest

from hir.publish import milvus_store
from hir.publish import stage as publish
from hir.serving import read_state
from hir.validate import stage as validate
from hir.validate.binding import NotValidated
from tests.conftest import ROOT
from tests.publish.fixtures import CREATED, assert_serving, export_run, lite_dir_free, reading


@pytest.fixture(scope="module")
def served(validated_v1: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The session's validated v1 (created CREATED) published into this module's store."""
    base = tmp_path_factory.mktemp("served")
    cfg = reading(validated_v1, base)
    metrics = publish.run(cfg)
    manifest = json.loads((base / "publish" / "manifest.json").read_text())
    return SimpleNamespace(cfg=cfg, base=base, store_dir=base / "store", metrics=metrics, manifest=manifest,
                           manifest_path=base / "publish" / "manifest.json",
                           emb={t: pl.read_parquet(validated_v1 / "embeddings" / f"{t}.parquet") for t in ("user", "product")})


def test_manifest_says_what_was_published_where(served: SimpleNamespace) -> None:
    m = served.manifest
    types = {"advertiser", "campaign", "category", "product", "user"}
    assert m["version"] == "v1" and not served.metrics["noop"]
    assert set(m["feast"]["feature_views"]) == types == set(m["milvus"]["aliases"])
    assert m["feast"]["feature_service"] == "rankers_v1" and m["feast"]["live_feature_service"] == "rankers"
    assert Path(m["feast"]["repo_path"], "feature_store.yaml").exists()
    assert m["milvus"]["uri"] == str(served.store_dir / "milvus.db")
    assert m["rows"]["product"] == served.emb["product"].height
    assert all(s["self_hit"] >= 0.9 for s in m["milvus"]["sanity"].values())
    assert read_state(served.store_dir)["live"] == "v1"
    assert m["status"] == "live" and m["live_version"] == "v1"
    assert_serving(served.store_dir, "v1")


def test_manifest_records_the_checksum_of_what_feast_and_milvus_got(served: SimpleNamespace) -> None:
    from hir.validate.binding import sha256

    m = served.manifest
    for etype, path in m["feast"]["offline_files"].items():
        assert m["feast"]["offline_sha256"][etype] == sha256(Path(path))
        payload = m["milvus"]["payload"][etype]
        assert payload["sha256"] == sha256(Path(payload["file"])) and payload["rows"] == m["rows"][etype]
    # the payload file holds exactly the vectors Milvus serves
    sent = pl.read_parquet(m["milvus"]["payload"]["product"]["file"]).head(5)
    client = milvus_store.connect(m["milvus"]["uri"])
    try:
        milvus_store.ensure_loaded(client, m["milvus"]["aliases"]["product"])
        got = client.get(m["milvus"]["aliases"]["product"], ids=sent["id"].to_list(), output_fields=["embedding"])
    finally:
        milvus_store.disconnect(client, m["milvus"]["uri"])
    by_id = {g["id"]: np.asarray(g["embedding"], np.float32) for g in got}
    for pid, vec in zip(sent["id"], sent["embedding"].to_list()):
        np.testing.assert_array_equal(by_id[pid], np.asarray(vec, np.float32))


def test_nudged_twins_are_checked_against_the_validated_vectors(make_run) -> None:
    """Exact twins are nudged apart for HNSW; the nudge is recorded and bounded, and one too large
    to still be the validated vector stops the publish before anything is switched."""
    from hir.errors import HirError

    cfg = make_run("twins", created=CREATED)
    path = Path(cfg.paths.embeddings_dir) / "product.parquet"
    frame = pl.read_parquet(path)
    emb = frame["embedding"].to_list()
    for i in (1, 2, 3):
        emb[i] = emb[0]
    frame.with_columns(pl.Series("embedding", emb, dtype=pl.List(pl.Float32))).write_parquet(path)
    validate.run(cfg)
    too_far = export_run(Path(cfg.paths.graph_dir), Path(cfg.paths.output_dir), "twins", "publish.milvus.tie_break=1.0",
                         created=CREATED)
    frame.with_columns(pl.Series("embedding", emb, dtype=pl.List(pl.Float32))).write_parquet(path)  # same files again
    with pytest.raises(HirError, match=r"product vectors for Milvus: 3 vectors would reach Milvus changed from the "
                                       r"validated ones .*lower publish\.milvus\.tie_break"):
        publish.run(too_far)
    assert read_state(Path(cfg.publish.store_dir))["live"] is None
    publish.run(cfg)
    manifest = json.loads((Path(cfg.paths.publish_dir) / "manifest.json").read_text())
    payload = manifest["milvus"]["payload"]["product"]
    assert payload["nudged"] == manifest["milvus"]["tie_broken_rows"]["product"] == 3
    assert 0.999 <= payload["min_cosine_to_validated"] < 1.0
    sent = pl.read_parquet(payload["file"]).filter(pl.col("id").is_in(frame["entity_id"].head(4).to_list()))
    assert sent["twin_group"].n_unique() == 1 and sent["embedding"].n_unique() == 4  # one group, four vectors


def _readme_blocks(section: str, page: str = "docs/serving.md") -> list[str]:
    """The ```python blocks of one section of a documentation page, in order."""
    text = (ROOT / page).read_text()
    body = text[text.index(f"## {section}"):]
    body = body[:body.index("\n## ", 3)]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


def _check_readme_snippets(served: SimpleNamespace, tmp_path: Path, fresh_process: bool) -> None:
    """The serving page's code (docs/serving.md) with only the manifest path, the ids and the dates replaced by
    this store's, run as one script (``fresh_process``: in a new Python, as a user runs it; else
    in this process, with a namespace of its own): Feast online (an unknown id comes back as None
    and the coverage count says so), point in time, and plain pymilvus."""
    import contextlib
    import io
    import runpy
    import subprocess
    import sys

    blocks = _readme_blocks("Reading HIR features downstream")
    assert len(blocks) == 2
    user, product = served.emb["user"]["entity_id"][5], served.emb["product"]["entity_id"][7]
    code = "\n".join(blocks)
    for old, new in (("outputs/completejourney/default/publish/manifest.json",
                      str(served.manifest_path)),
                     ('"1234"', repr(user)), ('"1082185"', repr(product)),
                     ('"2017-06-01"', repr(str(CREATED.date() - timedelta(days=1)))),
                     ('"2017-12-01"', repr(str(CREATED.date() + timedelta(days=1))))):
        assert old in code, old
        code = code.replace(old, new)
    code += """
import json as _json
print("RESULT", _json.dumps({"covered": covered, "status": manifest["status"], "hits": [h["id"] for h in hits[0]],
       "pit": training.sort_values("event_timestamp")["product__model_version"].tolist(),
       "missing": online["product__embedding"][1] is None}))
"""
    script = tmp_path / "readme.py"
    script.write_text(code)
    uri = served.manifest["milvus"]["uri"]
    if fresh_process:
        # Milvus Lite lets one process at a time open the dir: a test before this one that left a
        # client of the module's store open in this process makes the script fail to open it
        assert lite_dir_free(uri), f"{uri} is held open in the test process; an earlier test did not release it"
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        stdout = proc.stdout
    else:
        try:
            with contextlib.redirect_stdout(io.StringIO()) as buf:
                runpy.run_path(str(script), run_name="__main__")
        finally:
            # the snippet's client.close() leaves Milvus Lite's server running in this process,
            # holding the dir until the process exits, as a user's script does; pytest goes on
            # (and the fresh-process run of the same store follows), so release it here
            milvus_store.release(uri)
        stdout = buf.getvalue()
    out = json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert out["covered"] == 1 and out["missing"] is True       # the unknown product: None, counted
    assert out["status"] == "live"
    assert out["pit"] == [None, "v1"]                           # before / after the export's cutoff
    u = served.emb["user"].filter(pl.col("entity_id") == user)["embedding"][0].to_numpy()
    prods = served.emb["product"]
    best = prods["entity_id"][int(np.argmax(np.stack(prods["embedding"].to_numpy()) @ u))]
    assert len(out["hits"]) == 10 and out["hits"][0] == best    # plain pymilvus finds the exact top-1


def test_readme_serving_snippets_run_as_written(served: SimpleNamespace, tmp_path: Path) -> None:
    """The serving page's code (docs/serving.md) runs as written (in this process; the fresh-process run, which
    pays Feast's and pymilvus' imports again, is the slow test below), and leaves the store's
    Milvus Lite dir free for the next process to open."""
    _check_readme_snippets(served, tmp_path, fresh_process=False)
    assert lite_dir_free(served.manifest["milvus"]["uri"])


@pytest.mark.slow
def test_readme_serving_snippets_run_in_a_fresh_process(served: SimpleNamespace, tmp_path: Path) -> None:
    """The same, in a new Python process as a user runs it: the snippets import all they use."""
    _check_readme_snippets(served, tmp_path, fresh_process=True)


def test_online_and_point_in_time_values_are_the_exported_ones(served: SimpleNamespace) -> None:
    """What the serving page's calls return, value by value, against the export files."""
    manifest_path = served.manifest_path
    user, product = served.emb["user"]["entity_id"][5], served.emb["product"]["entity_id"][7]
    t_known = CREATED + timedelta(days=1)
    t_before = CREATED - timedelta(days=1)
    import json

    from feast import FeatureStore

    manifest = json.loads(Path(manifest_path).read_text())
    store = FeatureStore(repo_path=manifest["feast"]["repo_path"])
    service = store.get_feature_service(manifest["feast"]["feature_service"])  # user + product, this version

    online = store.get_online_features(
        features=service, entity_rows=[{"user_id": user, "product_id": product}], full_feature_names=True,
    ).to_dict()
    # online["user__embedding"][0] -> 64 floats; online["product__tokens_l0"][0] -> top-k level-0 tokens

    entity_df = pd.DataFrame({
        "user_id": [user, user], "product_id": [product, product],
        "event_timestamp": pd.to_datetime([t_known, t_before], utc=True),  # as of each row's time
    })
    training = store.get_historical_features(entity_df=entity_df, features=service, full_feature_names=True).to_df()
    u_row = served.emb["user"].filter(pl.col("entity_id") == user).row(0, named=True)
    p_row = served.emb["product"].filter(pl.col("entity_id") == product).row(0, named=True)
    np.testing.assert_allclose(online["user__embedding"][0], u_row["embedding"], rtol=1e-6)
    np.testing.assert_allclose(online["product__embedding"][0], p_row["embedding"], rtol=1e-6)
    assert online["product__tokens_l0"][0] == p_row["tokens_l0"]
    np.testing.assert_allclose(online["user__weights_l1"][0], u_row["weights_l1"], rtol=1e-6)
    assert online["user__model_version"] == ["v1"]

    training = training.sort_values("event_timestamp").reset_index(drop=True)
    assert len(training) == 2
    assert training["product__model_version"].tolist()[0] is None  # before the version existed
    assert training["product__model_version"].tolist()[1] == "v1"
    np.testing.assert_allclose(training["user__embedding"][1], u_row["embedding"], rtol=1e-6)
    assert list(training["product__tokens_l1"][1]) == p_row["tokens_l1"]

    unknown = store.get_online_features(features=service, entity_rows=[{"user_id": "nope", "product_id": "nope"}],
                                        full_feature_names=True).to_dict()
    assert unknown["user__embedding"] == [None]


def test_same_version_again_is_a_noop(served: SimpleNamespace, caplog: pytest.LogCaptureFixture) -> None:
    history = len(read_state(served.store_dir)["history"])
    with caplog.at_level(logging.INFO, logger="hir.publish.stage"):
        metrics = publish.run(served.cfg)
    assert metrics["noop"] and "already live" in caplog.text
    assert "v1: LIVE (feature service, Milvus aliases)" in caplog.text  # the store's state, printed
    assert len(read_state(served.store_dir)["history"]) == history


def test_retrieval_user_to_products_exact_and_filtered(served: SimpleNamespace) -> None:
    from hir.publish.retrieval import Retriever

    products = served.emb["product"]
    vecs = np.stack(products["embedding"].to_numpy())
    w0, t0 = products["weights_l0"].to_list(), products["tokens_l0"].to_list()
    coarse = np.array([t[int(np.argmax(w))] for t, w in zip(t0, w0)])
    user = served.emb["user"].row(3, named=True)
    r = Retriever.live(served.store_dir)
    try:
        hits = r.for_user(user["entity_id"], "product", k=10)
        exact = products["entity_id"].to_numpy()[np.argsort(-vecs @ np.asarray(user["embedding"]))[:10]]
        assert len(hits) == 10 and len({h[0] for h in hits} & set(exact)) >= 9
        assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
        token = int(coarse[0])
        filtered = r.for_user(user["entity_id"], "product", k=5, coarse_tokens=[token])
        allowed = set(products["entity_id"].to_numpy()[coarse == token])
        assert filtered and {h[0] for h in filtered} <= allowed
    finally:
        r.close()


def test_drift_against_the_live_version_is_reported_and_gated(served: SimpleNamespace) -> None:
    # same seed + noise: a refresh of v1 (cosine ~0.95 on shared ids, identical tokens)
    cfg = export_run(Path(served.cfg.paths.graph_dir), served.base / "v2", "v2", "validate.drift.min_mean_cosine=0.99",
                     created=CREATED + timedelta(days=1), noise=0.3)
    with pytest.raises(validate.ValidationFailed, match=r"product\.parquet \(drift vs live\) \| column embedding \| "
                                                        r"mean cosine to the live version >= 0\.99 "):
        validate.run(cfg)
    ok = export_run(Path(served.cfg.paths.graph_dir), served.base / "v2", "v2", "validate.drift.min_mean_cosine=0.9",
                    "validate.drift.min_mean_jaccard=0.99", created=CREATED + timedelta(days=1), noise=0.3)
    metrics = validate.run(ok)
    assert metrics["previous_version"] == "v1"
    d = metrics["drift"]["product"]
    assert d["shared_share"] == 1.0 and 0.9 < d["mean_cosine"] < 0.99 and d["mean_jaccard_l0"] == 1.0


def test_unvalidated_exports_are_refused(served: SimpleNamespace) -> None:
    cfg = export_run(Path(served.cfg.paths.graph_dir), served.base / "v3", "v3", created=CREATED + timedelta(days=2))
    with pytest.raises(NotValidated, match="no validation result"):
        publish.run(cfg)
    assert read_state(served.store_dir)["live"] == "v1"
