"""The gradient-boosted funnel scorer: it orders a planted due/overdue case, ranks within users,
round-trips through ``scorer.pt`` into `hir recommend`, and refuses another scikit-learn's model or
a pickle whose hash is not the one the funnel stage recorded."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from hir.funnel.boost import BoostedScorer, fit_boosted, relative_ranks
from hir.funnel.fit import FunnelConfig, score_candidates
from hir.funnel.scorer import ScorerConfig, recall_at
from hir.funnel.serve import Recommender
from hir.funnel.stage import write_funnel
from tests.funnel.test_recommend import Planted

NAMES = ["converted", "log_due", "log_target", "noise"]


def due_overdue(users: int = 400, per_user: int = 8, seed: int = 0):
    """Each user has one converted pair that is due (log_due near 0) and converts, one or two
    converted pairs that are overdue (log_due > 1, bought more often before: the count alone
    points at them) and never convert, and open pairs that do not convert either. The target is
    an interaction (converted and due), which no single feature orders."""
    gen = np.random.default_rng(seed)
    x = np.zeros((users * per_user, len(NAMES)), np.float32)
    y = np.zeros(users * per_user, np.float32)
    for u in range(users):
        lo = u * per_user
        x[lo:lo + per_user, 1] = gen.uniform(-3, 3, per_user)  # open pairs: log_due is noise
        x[lo:lo + per_user, 2] = gen.uniform(0, 1.5, per_user)
        x[lo, :3] = [1.0, gen.uniform(-0.3, 0.3), gen.uniform(0.5, 1.5)]  # the due one
        for j in range(1, 1 + gen.integers(1, 3)):  # overdue, bought more often
            x[lo + j, :3] = [1.0, gen.uniform(1.0, 3.0), gen.uniform(1.5, 3.0)]
        y[lo] = 1.0
    x[:, 3] = gen.normal(size=len(x))
    perm = np.concatenate([u * per_user + gen.permutation(per_user) for u in range(users)])
    return x[perm], y[perm], np.arange(0, users * per_user + 1, per_user), np.ones(users, np.float32)


def test_orders_the_planted_due_over_overdue_case() -> None:
    x, y, offsets, total = due_overdue()
    config = ScorerConfig(kind="gbdt", trees=60, tree_lr=0.2, leaves=8, min_leaf=10, holdout=0.2, checks=3, k=1,
                          relative=[])
    scorer, record = fit_boosted(x, y, offsets, total, config, seed=0, features=NAMES)
    assert record["best_recall"] > 0.9, record
    x2, y2, off2, tot2 = due_overdue(seed=1)
    s = scorer.score(x2, offsets=off2)
    assert recall_at(s, y2, off2, 1, tot2) > 0.9
    # the count alone (the repeat reference's order) puts the overdue pairs first
    assert recall_at(x2[:, 2], y2, off2, 1, tot2) < 0.1
    due = (x2[:, 0] == 1) & (y2 == 1)
    overdue = (x2[:, 0] == 1) & (y2 == 0)
    assert s[due].mean() > s[overdue].mean() + 1.0, (s[due].mean(), s[overdue].mean())


def test_relative_ranks_are_within_each_user() -> None:
    x = np.array([[3.0, 0.0], [1.0, 0.0], [3.0, 0.0], [0.5, 0.0], [2.0, 0.0]], np.float32)
    ranks = relative_ranks(x, np.array([0, 3, 5]), [0])
    np.testing.assert_array_equal(ranks[:, 0], [0, 2, 0, 1, 0])
    with pytest.raises(ValueError, match="relative names"):
        BoostedScorer(None, NAMES, ["no_such_feature"])


def test_relative_ranks_are_read_by_the_scorer() -> None:
    """A target that is each user's largest value of a feature whose scale differs by user: a
    tree on the raw value cannot find it, the within-user rank can."""
    gen = np.random.default_rng(0)
    users, per = 300, 6
    scale = np.repeat(gen.uniform(0.1, 10, users), per)
    x = np.stack([gen.uniform(0, 1, users * per) * scale, gen.normal(size=users * per)], 1).astype(np.float32)
    offsets = np.arange(0, users * per + 1, per)
    y = np.zeros(users * per, np.float32)
    for u in range(users):
        y[u * per + np.argmax(x[u * per:(u + 1) * per, 0])] = 1.0
    base = ScorerConfig(kind="gbdt", trees=40, tree_lr=0.2, leaves=8, min_leaf=10, holdout=0.25, checks=2, k=1,
                        relative=[])
    _, r0 = fit_boosted(x, y, offsets, np.ones(users, np.float32), base, 0, ["a", "b"])
    _, r1 = fit_boosted(x, y, offsets, np.ones(users, np.float32), ScorerConfig(**{**vars(base), "relative": ["a"]}),
                        0, ["a", "b"])
    assert r1["best_recall"] > 0.95 and r1["best_recall"] > r0["best_recall"] + 0.1, (r0, r1)


def test_served_scores_equal_the_fitted_ones_and_a_version_mismatch_is_refused(tiny_graph: Path,
                                                                              tmp_path: Path) -> None:
    shutil.copytree(tiny_graph, tmp_path / "graph")
    config = FunnelConfig(rank=8, discovery=10, popular=5, max_funnel=20,
                          scorer=ScorerConfig(kind="gbdt", trees=20, checks=2, min_leaf=5, relative=["log_target"]))
    write_funnel(tmp_path / "graph", tmp_path / "funnel", ["train", "val"], config, seed=0)
    rec = Recommender(tmp_path / "funnel")
    assert isinstance(rec.scorer, BoostedScorer) and rec.config.scorer.kind == "gbdt"
    users = np.unique(pl.read_parquet(tmp_path / "funnel" / "open_funnel.parquet")["user_id"].to_numpy())[:4]
    cands = rec.candidates(users)
    saved = torch.load(tmp_path / "funnel" / "scorer.pt", weights_only=True)
    fitted = pickle.loads(saved["model"])
    expected = fitted.decision_function(BoostedScorer(fitted, saved["features"], ["log_target"]).inputs(cands.x, cands.offsets))
    scores = score_candidates(rec.scorer, cands)
    np.testing.assert_allclose(scores, expected, rtol=1e-6)
    assert np.unique(scores).size > 1, "a scorer that scores every candidate alike tests nothing"
    out = rec.recommend(users, k=5)
    top = np.sort(scores[cands.offsets[0]:cands.offsets[1]])[::-1][:5]
    np.testing.assert_allclose(out.scores[0], top, rtol=1e-5)
    meta_path = tmp_path / "funnel" / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta["scorer_sha256"] == hashlib.sha256(saved["model"]).hexdigest()
    saved["sklearn"] = "0.0.1"
    torch.save(saved, tmp_path / "funnel" / "scorer.pt")
    with pytest.raises(RuntimeError, match=r"scikit-learn 0\.0\.1.*refit"):
        Recommender(tmp_path / "funnel")


def test_a_swapped_gbdt_pickle_is_refused_before_it_is_unpickled(tiny_graph: Path, tmp_path: Path) -> None:
    """The gbdt's bytes are unpickled only when they hash to meta.json's scorer_sha256; a
    scorer.pt whose model is another pickle (here one that writes a file when unpickled) or whose
    meta records no hash is refused, and the planted pickle never runs."""
    shutil.copytree(tiny_graph, tmp_path / "graph")
    config = FunnelConfig(rank=8, discovery=10, popular=5, max_funnel=20,
                          scorer=ScorerConfig(kind="gbdt", trees=10, checks=2, min_leaf=5, relative=[]))
    write_funnel(tmp_path / "graph", tmp_path / "funnel", ["train", "val"], config, seed=0)
    path = tmp_path / "funnel" / "scorer.pt"
    saved = torch.load(path, weights_only=True)
    marker = tmp_path / "ran"
    saved["model"] = pickle.dumps(Planted(marker))
    torch.save(saved, path)
    with pytest.raises(ValueError, match=r"sha256 is .*meta\.json records"):
        Recommender(tmp_path / "funnel")
    meta_path = tmp_path / "funnel" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["scorer_sha256"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="no sha256 recorded"):
        Recommender(tmp_path / "funnel")
    assert not marker.exists(), "the swapped pickle ran"
    pickle.loads(saved["model"])  # the planted pickle does run when unpickled: the check above is what stopped it
    assert marker.exists()


def test_the_gbdt_refuses_the_mlps_head() -> None:
    from hir.funnel.fit import TrainingSet, fit_training_set

    x, y, offsets, total = due_overdue(users=20)
    train = TrainingSet(x, y, offsets, total, None, {"features": NAMES})
    with pytest.raises(ValueError, match="heads=0 with kind=gbdt"):
        fit_training_set(train, ScorerConfig(kind="gbdt", heads=2), 0)
    with pytest.raises(ValueError, match="expected one of"):
        fit_training_set(train, ScorerConfig(kind="forest"), 0)
