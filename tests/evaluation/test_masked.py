"""The masked new-to-user protocol: no arm ever returns a history entity, and each arm type's
masked list equals a brute-force reference (rank every entity, drop the user's history, keep
the top k) on tiny examples; the Milvus arm through a real Milvus Lite FLAT (exact) index. The
deep-funnel list the same way, dropping only the target-stage pairs (here: about half of the
history pairs, standing in for past purchases)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir_evaluation.retrieval.arms.content import profile_topk
from hir_evaluation.retrieval.arms.itemknn import itemknn_topk
from hir_evaluation.retrieval.arms.lightgcn import fit_lightgcn
from hir_evaluation.retrieval.arms.popularity import popularity_topk
from hir_evaluation.retrieval.data import RetrievalData, interaction_matrix, retrieval_data
from hir_evaluation.retrieval.hir_search import SharedSearch, drop_seen, files_topk, masked_limits
from hir_evaluation.retrieval.rank import Ranked, score_arm
from hir_evaluation.sources.content import user_profiles
from hir_evaluation.sources.published import MILVUS_MAX_LIMIT, grouped_search, search_params_for
from hir_evaluation.tasks import RetrievalTask
from tests.evaluation.fixtures import shipped_arm, write_export

N_USERS, N_ITEMS, K = 25, 30, 6


def _history(seed: int, n: int = 200) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({"user_id": rng.integers(0, N_USERS, n), "entity_id": rng.integers(0, N_ITEMS, n)}).group_by(
        "user_id", "entity_id").agg(pl.len().cast(pl.Float64).alias("n"))


def _deep(history: pl.DataFrame) -> pl.DataFrame:
    """The target-stage pairs of ``history``: a fixed half of them (user + entity even)."""
    return history.filter((pl.col("user_id") + pl.col("entity_id")) % 2 == 0)


def _data(history: pl.DataFrame, n_users: int = N_USERS, n_items: int = N_ITEMS) -> RetrievalData:
    empty: list[set[int]] = [set() for _ in range(n_users)]
    return RetrievalData(users=np.arange(n_users), relevant=empty, new_to_user=empty, item_cold=empty,
                         history=history, n_users=n_users, n_items=n_items, deep_history=_deep(history))


def _brute_masked(scores: np.ndarray, seen: np.ndarray, k: int) -> list[np.ndarray]:
    """Per user: the k best finite scores among entities outside the user's history, best first."""
    out = []
    for s, h in zip(scores, seen):
        allowed = s[np.isfinite(s) & ~h]
        out.append(np.sort(allowed)[::-1][:k])
    return out


def _check(ranked: Ranked, scores: np.ndarray, data: RetrievalData, k: int = K) -> None:
    """``ranked.masked`` holds no history entity and ``ranked.deep`` no target-stage history
    entity, and each has the reference's scores (ties may pick either id), -1 only where fewer
    than k entities are left."""
    for top_k, mask in ((ranked.masked, data.seen), (ranked.deep, data.seen_deep)):
        assert top_k is not None and top_k.shape == (len(data.users), k)
        seen = mask.toarray().astype(bool)[data.users]
        for row, (top, want) in enumerate(zip(top_k, _brute_masked(scores, seen, k))):
            ids = top[top >= 0]
            assert not seen[row, ids].any(), f"user {row} got masked entities {ids[seen[row, ids]]}"
            assert len(set(ids.tolist())) == len(ids)
            assert np.allclose(scores[row, ids], want, atol=1e-5), (row, scores[row, ids], want)
            assert (top[len(ids):] == -1).all()
    assert data.seen_deep[data.users].nnz > 0  # there was something to mask


def _cosine(x: np.ndarray) -> np.ndarray:
    deg = x.sum(0)
    return (x.T @ x) / np.sqrt(np.outer(np.maximum(deg, 1), np.maximum(deg, 1)))


def test_popularity_masked_is_the_most_popular_unseen() -> None:
    history = _history(0)
    data = _data(history)
    counts = np.bincount(history["entity_id"].to_numpy(), weights=history["n"].to_numpy(), minlength=N_ITEMS)
    ranked = popularity_topk(data, K)
    seen = data.seen.toarray().astype(bool)
    for u in range(N_USERS):
        # exact ids: popularity breaks ties by id, so the reference is one list
        order = sorted((i for i in range(N_ITEMS) if counts[i] > 0 and not seen[u, i]), key=lambda i: (-counts[i], i))
        assert ranked.masked[u][ranked.masked[u] >= 0].tolist() == order[:K]
        bought = data.seen_deep[u].toarray().ravel() > 0
        order = sorted((i for i in range(N_ITEMS) if counts[i] > 0 and not bought[i]), key=lambda i: (-counts[i], i))
        assert ranked.deep[u][ranked.deep[u] >= 0].tolist() == order[:K]


@pytest.mark.parametrize("neighbours", [0, 4, N_ITEMS])
def test_itemknn_masked_matches_brute_force(neighbours: int) -> None:
    history = _history(1)
    data = _data(history)
    x = interaction_matrix(history, N_USERS, N_ITEMS).toarray().astype(np.float64)
    cos = _cosine(x)
    if neighbours:  # each item keeps its `neighbours` most similar items
        for i in range(N_ITEMS):
            if (cos[i] > 0).sum() > neighbours:
                cos[i, np.argsort(-cos[i], kind="stable")[neighbours:]] = 0
    scores = x @ cos
    scores[:, x.sum(0) == 0] = -np.inf
    ranked = itemknn_topk(data, K, neighbours)
    if neighbours in (0, N_ITEMS):
        _check(ranked, scores, data)
    else:  # a pruned row may break ties between equally similar items either way: history only
        seen = data.seen.toarray().astype(bool)
        assert not any(seen[u, ranked.masked[u][ranked.masked[u] >= 0]].any() for u in range(N_USERS))


def test_content_masked_matches_brute_force() -> None:
    rng = np.random.default_rng(2)
    history = _history(2)
    vecs = rng.normal(size=(N_ITEMS, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    has = np.ones(N_ITEMS, dtype=bool)
    has[[3, 7]] = False
    vecs[~has] = 0
    data = _data(history)
    profiles, present = user_profiles(vecs, has, history["user_id"].to_numpy(), history["entity_id"].to_numpy(), N_USERS)
    scores = profiles.astype(np.float64) @ vecs.T.astype(np.float64)
    scores[:, ~has] = -np.inf
    scores[~present] = -np.inf
    _check(profile_topk(data, vecs, has, K), scores, data)


def test_lightgcn_masked_matches_brute_force() -> None:
    history = _history(3, 300)
    data = _data(history)
    cfg = shipped_arm("retrieval", "lightgcn", dim=8, layers=2, lr=0.05, batch_size=128, steps_per_epoch=5,
                      max_epochs=3, patience=3, min_epochs=1, max_seconds=30)
    res = fit_lightgcn(data, data, data, K, cfg, seed=0)
    emb = res.embeddings.astype(np.float64)
    _check(res.ranked, emb[:N_USERS] @ emb[N_USERS:].T, data)


def test_files_arm_masked_matches_brute_force(tiny_graph: Path, tmp_path: Path) -> None:
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1)
    snap = load_snapshot(tiny_graph)
    data = retrieval_data(snap, RetrievalTask(), "test", history_splits=["train"])
    emb = {t: pl.read_parquet(tmp_path / "embeddings" / f"{t}.parquet").sort("node_id") for t in ("user", "product")}
    users, items = (np.stack(emb[t]["embedding"].to_list()).astype(np.float64) for t in ("user", "product"))
    ranked = files_topk(tmp_path / "embeddings", snap, "product")(data, 3)
    _check(ranked, (users @ items.T)[data.users], data, 3)
    assert data.seen[data.users].nnz > 0  # the tiny test users do have history to mask


def test_shared_search_is_one_search_cut_per_k(tiny_graph: Path, tmp_path: Path) -> None:
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1)
    snap = load_snapshot(tiny_graph)
    data = retrieval_data(snap, RetrievalTask(), "test", history_splits=["train"])
    exact = files_topk(tmp_path / "embeddings", snap, "product")
    calls: list[int] = []

    def counted(d: RetrievalData, k: int) -> Ranked:
        calls.append(k)
        return exact(d, k)

    shared = SharedSearch(counted, depth=5)
    for k in (2, 3, 5):
        got, want = shared(data, k), exact(data, k)
        for a, b in zip(got.lists(), want.lists(), strict=True):
            assert a.shape == b.shape and (a == b).all(), (k, a, b)
    shared(data, 6)  # deeper than held: searched again, at 6
    assert calls == [5, 6]


def test_masked_scores_only_new_to_user_entities() -> None:
    data = _data(pl.DataFrame({"user_id": [0], "entity_id": [1], "n": [1.0]}), 1, 4)
    data.relevant, data.new_to_user, data.item_cold = [{1, 2}], [{2}], [{2}]
    ranked = Ranked(full=np.array([[1, 0, 3]]), masked=np.array([[2, 0, 3]]))
    out = score_arm(ranked, data, (1, 3))
    assert out["all"]["recall@1"] == 0.5 and out["new_to_user"]["recall@3"] == 0.0
    assert out["masked_new_to_user"]["recall@1"] == 1.0 and out["masked_item_cold"]["ndcg@3"] == 1.0
    assert "masked_new_to_user" not in score_arm(Ranked(ranked.full, None), data, (1, 3))


def test_masked_limits_cover_the_history_in_few_buckets() -> None:
    sizes = np.arange(0, 5000)
    limits = masked_limits(50, sizes)
    need = 50 + sizes
    assert (limits >= need).all() and (limits <= 1.25 * need).all()
    assert len(np.unique(limits)) <= 4 * int(np.ceil(np.log2(need.max() / need.min()))) + 4
    assert masked_limits(50, np.array([MILVUS_MAX_LIMIT]))[0] == MILVUS_MAX_LIMIT


def test_grouped_search_batches_by_limit_and_keeps_order() -> None:
    calls: list[tuple[int, int]] = []

    def search(q: np.ndarray, limit: int) -> list[list[str]]:
        calls.append((len(q), limit))
        return [[f"q{int(row[0])}"] * limit for row in q]

    queries = np.arange(7, dtype=np.float32)[:, None]
    limits = np.array([2, 3, 2, 2, 3, 2, 2])
    hits = grouped_search(search, queries, limits, batch=3)
    assert hits == [[f"q{i}"] * int(limits[i]) for i in range(7)]
    assert sorted(calls) == [(2, 2), (2, 3), (3, 2)]  # 5 queries at limit 2 in batches of 3, 2 at limit 3
    with pytest.raises(ValueError, match="one per query"):
        grouped_search(search, queries, limits[:3])


def test_search_params_raise_ef_only_for_hnsw() -> None:
    hnsw = {"milvus": {"index": {"index_type": "HNSW"}, "search_params": {"ef": 128}}}
    assert search_params_for(hnsw, 50) == {"ef": 128} and search_params_for(hnsw, 700) == {"ef": 700}
    flat = {"milvus": {"index": {"index_type": "FLAT"}, "search_params": {}}}
    assert search_params_for(flat, 700) == {}


def test_milvus_masked_search_equals_exact_masked_search(tmp_path: Path) -> None:
    """k + |history| hits per user from an exact (FLAT) index, history dropped: the same ids as
    exact masked search over the same vectors."""
    from hir.publish import milvus_store

    rng = np.random.default_rng(4)
    n_items, n_users, k = 300, 40, 5
    items = rng.normal(size=(n_items, 8)).astype(np.float32)
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    users = rng.normal(size=(n_users, 8)).astype(np.float32)
    users /= np.linalg.norm(users, axis=1, keepdims=True)
    # histories of very different sizes (0 to 120), biased toward each user's nearest items
    sims = users @ items.T
    rows, cols = [], []
    for u in range(n_users):
        size = int(rng.integers(0, 121)) if u else 0
        near = np.argsort(-sims[u])[: 2 * size]
        cols += rng.choice(near, size=size, replace=False).tolist() if size else []
        rows += [u] * size
    history = pl.DataFrame({"user_id": rows, "entity_id": cols, "n": [1.0] * len(rows)},
                           schema={"user_id": pl.Int64, "entity_id": pl.Int64, "n": pl.Float64})
    data = _data(history, n_users, n_items)
    seen = data.seen

    uri = str(tmp_path / "milvus.db")
    client = milvus_store.connect(uri)
    try:
        data_in = {"ids": [f"p{i}" for i in range(n_items)], "vectors": items, "coarse": np.zeros(n_items, np.int64)}
        milvus_store.stage(client, "probe", data_in, "product", "v1",
                           {"insert_batch": 1000, "index_type": "FLAT", "metric_type": "COSINE", "index_params": {}})

        def search(q: np.ndarray, limit: int) -> list[list[str]]:
            res = client.search("probe", data=q.tolist(), limit=limit, output_fields=["id"])
            return [[h["id"] for h in row] for row in res]

        limits = masked_limits(k, np.diff(seen.indptr))
        hits = grouped_search(search, users, limits, batch=16)
    finally:
        milvus_store.disconnect(client, uri)
    ids = [[int(key[1:]) for key in row] for row in hits]
    # masked drops the history, deep only its target-stage part, from the same hits
    for mask in (seen, data.seen_deep):
        dense = sims.astype(np.float64)
        dense[mask.toarray().astype(bool)] = -np.inf
        exact = np.argsort(-dense, axis=1, kind="stable")[:, :k]
        assert np.array_equal(drop_seen(ids, mask, k), exact)
    assert len(np.unique(limits)) < n_users // 2  # users share search calls
