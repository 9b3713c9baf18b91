"""The published HIR search run in a third process while the rankers train.

The search of every test user's published vector in Milvus (:func:`published_topk`) runs on one
thread for a minute or more on completejourney, after the rankers, while the other core has
nothing left to do (the retrieval baselines finished in their own process,
evaluation/retrieval/background.py). Started at the beginning of `hir evaluate`, in its own
process, it shares the two cores with the rankers and the baselines instead. The parent takes its
lists (:meth:`SearchPrefetch.take`) only for the same test users and the same history (a
fingerprint of what the search reads) and no deeper than it searched; otherwise, or when the
process failed, the parent searches itself, as before. The figures are the same either way: it
is the same exact (FLAT) search of the same vectors.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from hir_evaluation.retrieval.data import RetrievalData
from hir_evaluation.retrieval.hir_search import cut
from hir_evaluation.retrieval.rank import Ranked
from hir_evaluation.tasks import RetrievalTask

log = logging.getLogger(__name__)


def search_fingerprint(data: RetrievalData) -> str:
    """sha256 of what :func:`published_topk` reads of ``data``: the test users (U,), the catalogue
    size and each user's history rows (masked and deep), so equal fingerprints give equal lists."""
    h = hashlib.sha256()
    h.update(np.int64(data.n_items).tobytes())
    h.update(np.ascontiguousarray(data.users, dtype=np.int64).tobytes())
    for rows in (data.seen[data.users], data.seen_deep[data.users]):
        h.update(np.ascontiguousarray(rows.indptr, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(rows.indices, dtype=np.int64).tobytes())
    return h.hexdigest()


def prefetch_search(graph_dir: str, task: RetrievalTask, seed: int, history_splits: list[str], source: str,
                    where: Any, entity_type: str, k: int) -> tuple[str, int, Ranked, float]:
    """(In the third process.) The test set as the retrieval section builds it, searched at ``k``
    in ``source``: ``published`` (``where``: the publish manifest; Milvus) or ``files`` (``where``:
    the embeddings dir; exact search, what the tests use); returns (its fingerprint, k, the lists,
    seconds)."""
    from threadpoolctl import threadpool_limits

    from hir.data.snapshot import load_snapshot
    from hir_evaluation.retrieval.data import retrieval_data
    from hir_evaluation.retrieval.hir_search import files_topk, published_topk

    if source not in ("published", "files"):
        raise ValueError(f"prefetch_search: source={source!r}; expected 'published' or 'files'")

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - (prefetch) %(message)s")
    t0 = time.perf_counter()
    snap = load_snapshot(graph_dir)
    data = retrieval_data(snap, task, "test", seed, history_splits)
    with threadpool_limits(1):  # one core: the rankers and the baselines have the others' share
        search = published_topk(where, snap, entity_type) if source == "published" else \
            files_topk(Path(where), snap, entity_type)
        ranked = search(data, k)
    return search_fingerprint(data), k, ranked, time.perf_counter() - t0


def _child(conn: Any, *args: Any) -> None:
    """The third process's entry: :func:`prefetch_search`, its result or its error sent back."""
    # before faiss (Milvus Lite's index) loads its OpenMP runtime: one thread, as threadpool_limits
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        conn.send(("ok", prefetch_search(*args)))
    except BaseException as err:  # reported in the parent, which then searches itself
        conn.send(("error", f"{type(err).__name__}: {err}"))
    finally:
        conn.close()


class SearchPrefetch:
    """The third process, started at once; :meth:`take` waits for it once and returns its lists
    for ``data`` cut to k, or None (different test set, shallower search, or a failure: the
    caller searches itself); :meth:`stop` ends it."""

    def __init__(self, graph_dir: str, task: RetrievalTask, seed: int, history_splits: list[str], source: str,
                 where: Any, entity_type: str, k: int) -> None:
        self.t0 = time.perf_counter()
        # spawn, not fork: the parent holds torch and Polars thread pools a fork would copy mid-use
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, name="hir-evaluate-search", daemon=True, args=(
            child_conn, graph_dir, task, seed, history_splits, source, where, entity_type, k))
        self._proc.start()
        child_conn.close()
        self._result: tuple[str, int, Ranked, float] | None = None
        self._taken = False
        log.info("hir retrieval: searching (%s) at k=%d in a third process (pid %s) while the rankers train",
                 source, k, self._proc.pid)

    def _wait(self) -> tuple[str, int, Ranked, float] | None:
        if not self._taken:
            self._taken = True
            t0 = time.perf_counter()
            try:
                status, payload = self._conn.recv()
            except EOFError:  # it died without a word (killed, out of memory)
                status, payload = "error", f"exit code {self._proc.exitcode}"
            self._proc.join()
            if status == "ok":
                self._result = payload
                log.info("hir retrieval: the third process searched in %.0fs (waited %.0fs for it, %.0fs after the "
                         "start)", payload[3], time.perf_counter() - t0, time.perf_counter() - self.t0)
            else:
                log.warning("hir retrieval: the search process failed (%s); searching here", payload)
        return self._result

    def take(self, data: RetrievalData, k: int) -> Ranked | None:
        """Its lists for ``data`` cut to ``k`` (U, k), or None when they are not those."""
        result = self._wait()
        if result is None:
            return None
        fingerprint, depth, ranked, _ = result
        if k > depth or fingerprint != search_fingerprint(data):
            log.warning("hir retrieval: the prefetched search (k=%d) does not answer this one (k=%d%s); searching here",
                        depth, k, "" if k > depth else ", other test users or history")
            return None
        return cut(ranked, k)

    def stop(self) -> None:
        """End the third process if it still runs."""
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join()
