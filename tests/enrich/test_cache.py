from __future__ import annotations

import numpy as np

from hir.enrich.cache import VectorCache, sha256_hex


def test_sha256_hex_is_length_prefixed():
    assert sha256_hex("ab", "c") != sha256_hex("a", "bc")
    assert sha256_hex("x") == sha256_hex(b"x")


def test_lookup_returns_stored_vectors_and_misses(tmp_path):
    cache = VectorCache(tmp_path, "enc-a")
    assert cache.dim is None
    keys = [cache.key(t) for t in ("alpha", "beta", "gamma")]
    vecs = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    cache.put(keys[:2], vecs[:2])
    assert cache.dim == 5
    got, found = cache.lookup(keys, 5)
    assert found.tolist() == [True, True, False]
    np.testing.assert_array_equal(got[:2], vecs[:2])
    np.testing.assert_array_equal(got[2], np.zeros(5, np.float32))


def test_keys_depend_on_encoder(tmp_path):
    a, b = VectorCache(tmp_path, "enc-a"), VectorCache(tmp_path, "enc-b")
    assert a.key("same text") != b.key("same text")
    assert a.dir != b.dir
    a.put([a.key("t")], np.ones((1, 2), np.float32))
    assert not b.lookup([b.key("t")], 2)[1].any()


def test_compaction_keeps_every_vector(tmp_path):
    cache = VectorCache(tmp_path, "enc", max_shards=2)
    rng = np.random.default_rng(1)
    stored = {}
    for i in range(5):
        key = cache.key(f"text {i}")
        stored[key] = rng.standard_normal(4).astype(np.float32)
        cache.put([key], stored[key][None])
        assert len(list(cache.dir.glob("shard-*.parquet"))) <= 2
    got, found = cache.lookup(list(stored), 4)
    assert found.all()
    np.testing.assert_array_equal(got, np.stack(list(stored.values())))
