"""The target-aware head: the sink, the self mask, the bucket biases, and that the scorer learns
through it a signal its features do not hold."""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from hir.funnel.head import Context, ContextHead, context_buckets
from hir.funnel.scorer import ScorerConfig, fit_scorer, recall_at


def test_an_empty_or_self_only_context_attends_to_the_sink() -> None:
    head = ContextHead(heads=2)
    cos = torch.tensor([[[0.9, 0.5], [0.2, 0.1]]])  # (1, 2, 2)
    buckets = torch.zeros(1, 2, 3, dtype=torch.long)
    ok = torch.tensor([[[False, False], [True, False]]])  # candidate 0 sees nothing
    out = head(cos, buckets, ok)  # (1, 2, 4): (o, m) per head
    assert out.shape == (1, 2, 4)
    assert torch.equal(out[0, 0], torch.zeros(4))
    # candidate 1 sees one item at cos 0.2: head 0 (alpha 0) puts half its mass on it
    assert torch.isclose(out[0, 1, 1], torch.tensor(0.5)) and torch.isclose(out[0, 1, 0], torch.tensor(0.1))


def test_a_stage_bias_moves_the_attention() -> None:
    head = ContextHead(heads=1)
    with torch.no_grad():
        head.alpha.zero_()
        head.stage[0, 0] = 5.0  # converted items win
    cos = torch.tensor([[[1.0, -1.0]]])
    ok = torch.ones(1, 1, 2, dtype=torch.bool)
    conv_first = head(cos, torch.tensor([[[0, 0, 0], [1, 0, 0]]]), ok)[0, 0, 0]
    conv_second = head(cos, torch.tensor([[[1, 0, 0], [0, 0, 0]]]), ok)[0, 0, 0]
    assert conv_first > 0.9 and conv_second < -0.9


def test_buckets() -> None:
    ctx = pl.DataFrame({"converted": [True, False, False], "gap": [0, 1, 5], "age_days": [0.5, 3.0, None],
                        "n_events": [1, 4, 40]})
    assert context_buckets(ctx, True).tolist() == [[0, 0, 0], [1, 2, 2], [3, 0, 4]]
    assert context_buckets(ctx, False)[:, 1].tolist() == [0, 0, 0]


def planted(users: int, seed: int, per_user: int = 8, dim: int = 6) -> tuple:
    """Each user has two bought and two carted context items; the target is the candidate
    nearest the bought ones. The features are noise, so only the head can find it."""
    gen = np.random.default_rng(seed)
    n_ent = users * (per_user + 4)
    vectors = gen.normal(size=(n_ent, dim)).astype(np.float32)
    cand, ctx, buckets, y = [], [], [], []
    for u in range(users):
        base = u * (per_user + 4)
        c = np.arange(base, base + per_user)
        bought, carted = base + per_user + np.arange(2), base + per_user + 2 + np.arange(2)
        # the target sits near the bought items, a decoy near the carted ones
        vectors[c[0]] = vectors[bought].mean(0) + 0.3 * gen.normal(size=dim)
        vectors[c[1]] = vectors[carted].mean(0) + 0.3 * gen.normal(size=dim)
        perm = gen.permutation(per_user)
        cand.append(c[perm])
        y.append((perm == 0).astype(np.float32))
        ctx.append(np.concatenate([bought, carted]))
        buckets.append(np.array([[0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 0, 0]]))
    offsets = np.arange(0, users * per_user + 1, per_user)
    context = Context(vectors, np.concatenate(cand), offsets, np.arange(0, users * 4 + 1, 4), np.concatenate(ctx),
                      np.concatenate(buckets))
    x = gen.normal(size=(users * per_user, 3)).astype(np.float32)
    return x, np.concatenate(y), offsets, np.ones(users, np.float32), context


def test_the_head_learns_what_the_features_cannot() -> None:
    x, y, offsets, total, context = planted(300, seed=0)
    config = ScorerConfig(hidden=[16], steps=120, batch=64, lr=0.02, holdout=0.2, checks=6, k=1, heads=2)
    model, record = fit_scorer(x, y, offsets, total, config, seed=0, context=context)
    x2, y2, off2, tot2, ctx2 = planted(200, seed=1)
    with_head = recall_at(model.score(x2, ctx2), y2, off2, 1, tot2)
    plain, _ = fit_scorer(x, y, offsets, total, ScorerConfig(hidden=[16], steps=120, batch=64, lr=0.02, holdout=0.2,
                                                             checks=6, k=1), seed=0)
    without = recall_at(plain.score(x2), y2, off2, 1, tot2)
    # chance is 1/8; the decoy near the carts is as close to the context as the target
    assert with_head > 0.7 and without < 0.3, (with_head, without, record["checks"])
    # the head learned to prefer the bought items over the carted ones
    assert (model.head.stage[:, 0] > model.head.stage[:, 1]).any()
