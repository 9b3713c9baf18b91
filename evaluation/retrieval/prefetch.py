"""The published HIR search handed to whichever process is free first.

The search of every test user's published vector in Milvus (the hir and recommend arms' shared
search, :class:`hir_evaluation.retrieval.hir_search.SharedSearch`) runs on one thread for a
minute or more on completejourney. It used to run after the rankers, in this process, while the
other core had nothing left to do once the retrieval baselines' process
(evaluation/retrieval/background.py) had finished. Now that process offers to run it after its
baselines, and this process at its first HIR arm: a shared ``claim`` decides who. If the
baselines finish while the rankers still train, the second process searches and this one only
reads its lists; if the rankers finish first, this process searches itself, as before (a third
process searching from the start was measured slower: three processes on two cores delayed the
rankers and the baselines alike). The parent uses the lists only for the same test users and
history (:func:`search_fingerprint`) and no deeper than searched. The figures are the same either
way: the same exact (FLAT) search of the same vectors.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hir.data.snapshot import Snapshot
from hir_evaluation.retrieval.data import RetrievalData
from hir_evaluation.retrieval.rank import Ranked

log = logging.getLogger(__name__)

# the shared claim's values: nobody has taken the search yet / the second process / this one
FREE, CHILD, PARENT = 0, 1, 2


@dataclass(frozen=True)
class SearchSpec:
    """What the HIR search reads: ``source`` ``published`` (``where``: the publish manifest;
    Milvus) or ``files`` (``where``: the embeddings dir; exact search, what the tests use), the
    entity type searched and the depth ``k``."""

    source: str
    where: Any
    entity_type: str
    k: int

    def __post_init__(self) -> None:
        if self.source not in ("published", "files"):
            raise ValueError(f"SearchSpec: source={self.source!r}; expected 'published' or 'files'")


def search_fingerprint(data: RetrievalData) -> str:
    """sha256 of what the HIR search reads of ``data``: the test users (U,), the catalogue size
    and each user's history rows (masked and deep), so equal fingerprints give equal lists."""
    h = hashlib.sha256()
    h.update(np.int64(data.n_items).tobytes())
    h.update(np.ascontiguousarray(data.users, dtype=np.int64).tobytes())
    for rows in (data.seen[data.users], data.seen_deep[data.users]):
        h.update(np.ascontiguousarray(rows.indptr, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(rows.indices, dtype=np.int64).tobytes())
    return h.hexdigest()


def run_search(snap: Snapshot, data: RetrievalData, spec: SearchSpec) -> tuple[str, int, Ranked, float]:
    """(In the second process.) ``data`` searched as ``spec`` says; returns (its fingerprint, k,
    the lists (U, k), seconds)."""
    from hir_evaluation.retrieval.hir_search import files_topk, published_topk

    t0 = time.perf_counter()
    search = published_topk(spec.where, snap, spec.entity_type) if spec.source == "published" else \
        files_topk(Path(spec.where), snap, spec.entity_type)
    ranked = search(data, spec.k)
    return search_fingerprint(data), spec.k, ranked, time.perf_counter() - t0


class SearchHandoff:
    """This process's side: :meth:`take` claims the search (None: search here) or waits for the
    second process's lists (``background``: a :class:`Background` started with a ``search``)."""

    def __init__(self, background: Any) -> None:
        self.background = background

    def take(self, data: RetrievalData, k: int) -> Ranked | None:
        """The second process's lists for ``data`` cut to ``k`` (U, k), or None: this process
        claimed the search first, or the lists are not those (another test set, shallower)."""
        from hir_evaluation.retrieval.hir_search import cut

        claim = self.background.claim
        with claim.get_lock():
            if claim.value == FREE:
                claim.value = PARENT
        if claim.value == PARENT:
            log.info("hir retrieval: the baselines' process is still fitting; searching here")
            return None
        t0 = time.perf_counter()
        result = self.background.search_result()
        if result is None:
            log.warning("hir retrieval: the baselines' process did not search (it failed); searching here")
            return None
        fingerprint, depth, ranked, seconds = result
        if k > depth or fingerprint != search_fingerprint(data):
            log.warning("hir retrieval: the baselines' process searched at k=%d, this search (k=%d%s) is another; "
                        "searching here", depth, k, "" if k > depth else ", other test users or history")
            return None
        log.info("hir retrieval: the baselines' process searched in %.0fs (waited %.0fs for it)", seconds,
                 time.perf_counter() - t0)
        return cut(ranked, k)
