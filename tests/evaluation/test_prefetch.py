"""The HIR search run in a third process (evaluation/retrieval/prefetch.py): its lists are the
ones the parent would search itself, cut to each k, and it answers only the test set it searched
(same users and history) no deeper than it searched; a failed process leaves the parent to search."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hir.data.snapshot import load_snapshot
from hir_evaluation.retrieval.data import RetrievalData, retrieval_data
from hir_evaluation.retrieval.hir_search import SharedSearch, files_topk
from hir_evaluation.retrieval.prefetch import SearchPrefetch, search_fingerprint
from hir_evaluation.retrieval.rank import Ranked
from hir_evaluation.tasks import RetrievalTask
from tests.evaluation.fixtures import write_export

TASK = RetrievalTask()


def test_prefetched_lists_equal_the_parent_search_and_only_for_its_test_set(tiny_graph: Path, tmp_path: Path) -> None:
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1)
    snap = load_snapshot(tiny_graph)
    data = retrieval_data(snap, TASK, "test", 0, ["train"])
    exact = files_topk(tmp_path / "embeddings", snap, "product")
    # the child builds its own test set: equal content, another object, the same fingerprint
    assert search_fingerprint(retrieval_data(snap, TASK, "test", 0, ["train"])) == search_fingerprint(data)
    other = retrieval_data(snap, TASK, "test", 0, ["train", "val"])  # more history masked
    assert search_fingerprint(other) != search_fingerprint(data)

    pre = SearchPrefetch(str(tiny_graph), TASK, 0, ["train"], "files", str(tmp_path / "embeddings"), "product", 6)
    calls: list[int] = []

    def counted(d: RetrievalData, k: int) -> Ranked:
        calls.append(k)
        return exact(d, k)

    shared = SharedSearch(counted, depth=6, prefetched=pre.take)
    for k in (3, 6):
        got, want = shared(data, k), exact(data, k)
        for a, b in zip(got.lists(), want.lists(), strict=True):
            assert a.shape == b.shape and np.array_equal(a, b), (k, a, b)
        assert (want.masked >= 0).any()  # users with something to rank: the comparison is not vacuous
    assert calls == []  # both answered from the third process's lists
    assert pre.take(data, 7) is None  # deeper than it searched
    assert pre.take(other, 3) is None  # another test set
    pre.stop()


def test_a_failed_prefetch_leaves_the_search_to_the_parent(tiny_graph: Path, tmp_path: Path) -> None:
    snap = load_snapshot(tiny_graph)
    data = retrieval_data(snap, TASK, "test", 0, ["train"])
    # no export there: the child fails, and take says so with None
    pre = SearchPrefetch(str(tiny_graph), TASK, 0, ["train"], "files", str(tmp_path / "missing"), "product", 6)
    assert pre.take(data, 3) is None
    pre.stop()
