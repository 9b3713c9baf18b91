"""Publish through Feast's Redis online store against a real redis-server (Debian's package),
started on a free loopback port in a tmp dir and stopped afterwards."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.publish import stage as publish
from hir.validate import stage as validate
from tests.publish.fixtures import assert_serving

pytestmark = pytest.mark.redis


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install -y redis-server)")
    import redis

    port = _free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail(f"redis-server did not answer on port {port}")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_publish_and_read_back_through_redis(make_run, redis_url: str) -> None:
    import redis
    from feast import FeatureStore

    cfg = make_run("v1", "publish=feast_redis", f"publish.feast.online_store.redis.connection_string={redis_url}",
                   created=datetime(2026, 1, 1, tzinfo=UTC))
    validate.run(cfg)
    publish.run(cfg)
    manifest = json.loads((Path(cfg.paths.publish_dir) / "manifest.json").read_text())
    assert manifest["feast"]["online_store"] == {"type": "redis", "connection_string": redis_url}
    host, port = redis_url.split(":")
    assert redis.Redis(host=host, port=int(port)).dbsize() > 0  # the rows are in this Redis

    store = FeatureStore(repo_path=manifest["feast"]["repo_path"])
    products = pl.read_parquet(Path(cfg.paths.embeddings_dir) / "product.parquet")
    ids = products["entity_id"].head(20).to_list()
    got = store.get_online_features(features=[f"{manifest['feast']['feature_views']['product']}:embedding",
                                              f"{manifest['feast']['feature_views']['product']}:tokens_l0"],
                                    entity_rows=[{"product_id": i} for i in ids]).to_dict()
    np.testing.assert_allclose(np.asarray(got["embedding"]), np.stack(products["embedding"].head(20).to_numpy()),
                               rtol=1e-6)
    assert got["tokens_l0"] == products["tokens_l0"].head(20).to_list()
    assert_serving(Path(cfg.publish.store_dir), "v1")
