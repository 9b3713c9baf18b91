"""BucketVocab: dense ids for valid (type, relation, hop, stage, recency) tuples; ablations collapse."""

from __future__ import annotations

import pytest
import torch

from hir.nn.buckets import ENGAGEMENT, METADATA, PRIMITIVE, SELF, BucketVocab


def _ids(vocab, *tuples):
    t = torch.tensor(tuples).T[:, None, :]  # 5 x (1, n)
    return vocab(*t)


def test_vocabulary_sizes():
    v = BucketVocab(n_types=5, n_stages=3, n_recency=4)
    # keys: 1 primitive + 5 self + 5*2*3*4 engagement + 5*2 metadata
    assert v.n_key == 1 + 5 + 120 + 10
    # queries: (type, relation, hop) only
    assert v.n_query == 1 + 5 + 10 + 10


def test_distinct_tuples_get_distinct_key_ids_and_share_query_ids_across_stage():
    v = BucketVocab(n_types=2, n_stages=2)
    qb, kb = _ids(v, (0, ENGAGEMENT, 1, 1, 1), (0, ENGAGEMENT, 1, 2, 1), (1, SELF, 0, 0, 0), (2, PRIMITIVE, 0, 0, 0))
    assert len(set(kb[0].tolist())) == 4
    assert qb[0, 0] == qb[0, 1]  # queries ignore stage
    assert (kb < v.n_key).all() and (qb < v.n_query).all()


def test_disabled_component_collapses():
    v = BucketVocab(n_types=2, n_stages=3, enabled={"stage": False, "recency": False})
    _, kb = _ids(v, (0, ENGAGEMENT, 1, 1, 1), (0, ENGAGEMENT, 1, 3, 4), (0, ENGAGEMENT, 2, 3, 4))
    assert kb[0, 0] == kb[0, 1] != kb[0, 2]  # stage/recency off, hop still on
    assert v.n_key == 1 + 2 + 2 * 2 + 2 * 2


def test_impossible_tuple_and_unknown_component_fail():
    v = BucketVocab(n_types=2, n_stages=2)
    with pytest.raises(AssertionError, match="impossible bucket"):
        _ids(v, (0, METADATA, 1, 2, 0))  # metadata edges have no funnel stage
    with pytest.raises(ValueError, match="unknown bucket components"):
        BucketVocab(2, 2, enabled={"colour": True})
