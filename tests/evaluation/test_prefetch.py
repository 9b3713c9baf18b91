"""The HIR search handed to whichever process is free first (evaluation/retrieval/prefetch.py):
when the baselines' process claims it, its lists are the ones this process would search itself,
cut to each k, for the test set it searched only (same users and history) and no deeper; when
this process claims it first, it searches itself and the baselines' process does not search."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hir.data.snapshot import load_snapshot
from hir_evaluation.cache import FitCache
from hir_evaluation.retrieval.background import Background
from hir_evaluation.retrieval.data import RetrievalData, retrieval_data
from hir_evaluation.retrieval.hir_search import SharedSearch, files_topk
from hir_evaluation.retrieval.prefetch import CHILD, PARENT, SearchHandoff, SearchSpec, search_fingerprint
from hir_evaluation.retrieval.rank import Ranked
from hir_evaluation.tasks import RetrievalTask
from tests.evaluation.fixtures import write_export

TASK = RetrievalTask()
SPECS = {"popularity": {"_target_": "hir_evaluation.retrieval.arms.popularity.Popularity"}}


def _background(graph: Path, tmp_path: Path, emb: Path) -> Background:
    cache = FitCache(tmp_path / "cache", "0" * 16)
    return Background(graph, TASK, SPECS, 0, ["train"], None, cache, SearchSpec("files", str(emb), "product", 6))


def test_the_baselines_process_searches_when_it_is_free_first(tiny_graph: Path, tmp_path: Path) -> None:
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1)
    snap = load_snapshot(tiny_graph)
    data = retrieval_data(snap, TASK, "test", 0, ["train"])
    exact = files_topk(tmp_path / "embeddings", snap, "product")
    # the child builds its own test set: equal content, another object, the same fingerprint
    assert search_fingerprint(retrieval_data(snap, TASK, "test", 0, ["train"])) == search_fingerprint(data)
    other = retrieval_data(snap, TASK, "test", 0, ["train", "val"])  # more history masked
    assert search_fingerprint(other) != search_fingerprint(data)

    background = _background(tiny_graph, tmp_path, tmp_path / "embeddings")
    assert background.search_result() is not None  # waited for: its fits were done, it claimed the search
    assert background.claim.value == CHILD
    calls: list[int] = []

    def counted(d: RetrievalData, k: int) -> Ranked:
        calls.append(k)
        return exact(d, k)

    handoff = SearchHandoff(background)
    shared = SharedSearch(counted, depth=6, prefetched=handoff.take)
    for k in (3, 6):
        got, want = shared(data, k), exact(data, k)
        for a, b in zip(got.lists(), want.lists(), strict=True):
            assert a.shape == b.shape and np.array_equal(a, b), (k, a, b)
        assert (want.masked >= 0).any()  # users with something to rank: the comparison is not vacuous
    assert calls == []  # both answered from the second process's lists
    assert handoff.take(data, 7) is None  # deeper than it searched
    assert handoff.take(other, 3) is None  # another test set
    assert set(background.join(FitCache(tmp_path / "cache", "0" * 16))) == {"popularity"}  # its fits, as before


def test_this_process_searches_when_it_claims_first(tiny_graph: Path, tmp_path: Path) -> None:
    snap = load_snapshot(tiny_graph)
    data = retrieval_data(snap, TASK, "test", 0, ["train"])
    # no export there: had the child searched, it would have failed; it never gets to
    background = _background(tiny_graph, tmp_path, tmp_path / "missing")
    assert SearchHandoff(background).take(data, 3) is None  # claimed at once, while the child starts
    assert background.claim.value == PARENT
    assert background.search_result() is None
    assert set(background.join(FitCache(tmp_path / "cache", "0" * 16))) == {"popularity"}  # its fits still count


def test_a_failed_search_there_keeps_its_fits(tiny_graph: Path, tmp_path: Path) -> None:
    background = _background(tiny_graph, tmp_path, tmp_path / "missing")  # no export: the search fails
    assert background.search_result() is None and background.claim.value == CHILD
    snap = load_snapshot(tiny_graph)
    assert SearchHandoff(background).take(retrieval_data(snap, TASK, "test", 0, ["train"]), 3) is None
    assert set(background.join(FitCache(tmp_path / "cache", "0" * 16))) == {"popularity"}
