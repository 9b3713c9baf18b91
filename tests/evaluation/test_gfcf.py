"""GF-CF, the registry's proof arm: its scores equal the paper's formula computed densely, its
randomized SVD finds the top singular space, and the registry runs it from the composed config on a
synthetic snapshot, where it beats popularity."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp

from hir.data.snapshot import load_snapshot
from hir_evaluation.retrieval.arms import gfcf
from hir_evaluation.retrieval.arms.gfcf import GFCF, gfcf_scores, top_right_singular
from hir_evaluation.retrieval.data import RetrievalData, interaction_matrix
from hir_evaluation.retrieval.evaluate import MASKED, evaluate_retrieval
from hir_evaluation.retrieval.registry import RetrievalContext, build_arms

N_USERS, N_ITEMS = 40, 30


def _history(seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    pairs = pl.DataFrame({"user_id": rng.integers(0, N_USERS - 1, 300), "entity_id": rng.integers(0, N_ITEMS - 2, 300)})
    # the last user and the last two items have no history
    return pairs.group_by("user_id", "entity_id").agg(pl.len().cast(pl.Float64).alias("n"))


def _dense_gfcf(r: np.ndarray, k: int, alpha: float) -> np.ndarray:
    """The paper's formula with dense matrices: r R~ᵀR~ + α r D_I^-1/2 V_k V_kᵀ D_I^1/2."""
    du, di = r.sum(1), r.sum(0)
    inv_u = np.where(du > 0, 1 / np.sqrt(np.maximum(du, 1)), 0.0)
    inv_i = np.where(di > 0, 1 / np.sqrt(np.maximum(di, 1)), 0.0)
    norm = inv_u[:, None] * r * inv_i[None, :]
    v = np.linalg.svd(norm)[2][:k].T  # (I, k)
    scores = r @ norm.T @ norm + alpha * (r * inv_i) @ v @ (v.T * np.sqrt(di))
    scores[:, di == 0] = -np.inf
    return scores


def test_scores_are_the_papers_formula() -> None:
    history = _history(0)
    r = interaction_matrix(history, N_USERS, N_ITEMS)
    users = np.arange(N_USERS)
    got = gfcf_scores(r, 8, 0.3, seed=0)(users).numpy().astype(np.float64)
    want = _dense_gfcf(r.toarray().astype(np.float64), 8, 0.3)
    assert np.array_equal(np.isinf(got), np.isinf(want)) and np.isinf(got[:, -2:]).all()
    finite = np.isfinite(want)
    assert np.allclose(got[finite], want[finite], atol=1e-5)
    assert np.allclose(got[-1][np.isfinite(got[-1])], 0.0)  # no history: nothing to filter
    # the ideal low-pass term matters: without it the scores differ
    assert not np.allclose(gfcf_scores(r, 8, 0.0, seed=0)(users).numpy()[finite], got[finite], atol=1e-3)


def test_randomized_svd_finds_the_top_space(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    # one larger component and 100 tiny ones: after normalisation singular value 1 repeats 101
    # times (one per component), where ARPACK does not converge
    blocks = [sp.random(3, 2, density=0.9, random_state=rng) for _ in range(100)]
    x = sp.block_diag([*blocks, sp.random(80, 60, density=0.1, random_state=rng)], format="csr")
    x.data[:] = 1.0
    du, di = np.asarray(x.sum(1)).ravel(), np.asarray(x.sum(0)).ravel()
    norm = sp.csr_matrix(sp.diags(1 / np.sqrt(np.maximum(du, 1))) @ x @ sp.diags(1 / np.sqrt(np.maximum(di, 1))))
    sigma = np.linalg.svd(norm.toarray(), compute_uv=False)
    monkeypatch.setattr(gfcf, "DENSE_SVD_ENTRIES", 0)  # force the randomized path
    for k in (16, 120):  # inside the repeated singular value, and past it
        v = top_right_singular(norm, k, seed=0)
        assert v.shape == (norm.shape[1], k) and np.allclose(v.T @ v, np.eye(k), atol=1e-8)
        # the top-k space: it captures the largest possible energy, Σ of the k largest σ²
        assert np.linalg.norm(norm @ v) ** 2 == pytest.approx((sigma[:k] ** 2).sum(), rel=1e-9)
    assert top_right_singular(norm[:1], 10, seed=0).shape == (norm.shape[1], 0)  # rank clipped to min(U, I) - 1


def test_masked_lists_hold_no_history() -> None:
    history = _history(2)
    rel = [set() for _ in range(N_USERS)]
    data = RetrievalData(users=np.arange(N_USERS), relevant=rel, new_to_user=rel, item_cold=rel, history=history,
                         n_users=N_USERS, n_items=N_ITEMS)
    ranked = GFCF(rank=8, ideal_weight=0.3).topk(RetrievalContext(None, None, data, 0), 5)  # type: ignore[arg-type]
    seen = data.seen.toarray().astype(bool)
    assert ranked.masked is not None and ranked.full.shape == ranked.masked.shape == (N_USERS, 5)
    assert not any(seen[u, ranked.masked[u][ranked.masked[u] >= 0]].any() for u in range(N_USERS))
    assert (ranked.full[ranked.full >= 0] < N_ITEMS - 2).all()  # never an entity without history


def test_registry_runs_gfcf_on_synthetic_data(compose: Callable) -> None:
    from hir.data.prepare import run as prepare

    data = ["data=synthetic", "data.adapter.n_users=300", "data.adapter.n_products=200", "data.adapter.n_events=20000"]
    cfg = compose(*data, "eval.task.retrieval.target_stage=view", stage="evaluate")
    prepare(compose(*data, stage="prepare"))
    from hydra.utils import instantiate

    snap = load_snapshot(cfg.paths.graph_dir)
    arms = build_arms(cfg.eval.retrieval)  # every configured arm; only two are run
    out = evaluate_retrieval(snap, instantiate(cfg.eval.task.retrieval, _convert_="all"), arms, 0,
                             run=["popularity", "gfcf"])
    assert out["arms"]["gfcf"] == "baseline" and out["lightgcn"]["recall@20"] is None  # listed, not run
    for section in (out, out[MASKED]):
        gf, pop = section["gfcf"]["recall@20"], section["popularity"]["recall@20"]
        # the planted interests: a collaborative filter finds them, popularity cannot
        assert gf > 1.5 * pop, (gf, pop)
    assert out[MASKED]["users"] >= 50
