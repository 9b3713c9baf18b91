"""The retrieval baselines fitted in a second process while the rankers train.

On a machine with two cores the rankers (one thread, ``eval.ranker.threads``) leave one core
idle for most of `hir evaluate`; the baselines that read neither the HIR export nor the content
vectors (popularity, item-kNN, LightGCN, GF-CF, repeat: one thread each) use it. The second
process writes their top-k lists into the evaluation's fit cache (evaluation/cache.py) under the
same keys the retrieval section looks up, so nothing else changes: the retrieval section finds
them there (and says they were fitted in parallel), and whatever the second process did not
finish, or failed on, is fitted in the main process as before. The figures are the same: every
arm is seeded and runs on one thread either way.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

from hir_evaluation.cache import FitCache
from hir_evaluation.retrieval.prefetch import CHILD, FREE, SearchSpec, run_search
from hir_evaluation.tasks import RetrievalTask

log = logging.getLogger(__name__)


def fit_baselines(
    graph_dir: str,
    task: RetrievalTask,
    specs: dict[str, Any],
    seed: int,
    history_splits: list[str],
    run: list[str] | None,
    cache_root: str,
    snapshot: str,
    search: SearchSpec | None = None,
    claim: Any = None,
    nice: int = 0,
    then: tuple[Any, tuple[Any, ...]] | None = None,
    label: str = "parallel",
) -> dict[str, Any]:
    """(In the second process.) Fit every arm of ``specs`` that needs no optional input and is
    not cached yet, and store its top-k lists in the cache; then, when ``search`` is given and
    the parent has not claimed it yet (``claim``, a shared int: evaluation/retrieval/prefetch.py),
    run the HIR search. ``nice``: added to this process's niceness first (the pipeline's
    prewarm runs at 19, so the stages in the foreground keep the cores they use). ``then``:
    (function, args) called last, in this process, its result returned as "then" (the
    pipeline's prewarm of the ranking fits; a failure there is logged, the fits above still
    count). Returns {"fits": arm -> seconds, "search": its result or None, "then": ...}."""
    from threadpoolctl import threadpool_limits

    from hir.data.snapshot import load_snapshot
    from hir_evaluation.retrieval.data import retrieval_data
    from hir_evaluation.retrieval.evaluate import arm_key
    from hir_evaluation.retrieval.registry import RetrievalContext, build_arms

    if nice:
        os.nice(nice)
    logging.basicConfig(level=logging.INFO, format=f"[%(asctime)s][%(name)s][%(levelname)s] - ({label}) %(message)s")
    snap = load_snapshot(graph_dir)
    data = retrieval_data(snap, task, "test", seed, history_splits)
    ctx = RetrievalContext(snap, task, data, seed)
    cache, k, done = FitCache(Path(cache_root), snapshot), max(task.ks), {}
    with threadpool_limits(1):  # one core each: the rankers have the other
        for name, arm in build_arms(specs).items():
            if arm.info.needs or (run is not None and name not in run):
                continue
            key = arm_key(name, arm, k, seed, task, data, None, history_splits)
            if cache.get("retrieval", name, key) is not None:
                continue
            t0 = time.perf_counter()
            cache.put("retrieval", name, key, arm.topk(ctx, k))
            done[name] = time.perf_counter() - t0
        found = None
        if search is not None and claim is not None:
            with claim.get_lock():  # whichever process is free first searches (the parent: at its first HIR arm)
                mine = claim.value == FREE
                if mine:
                    claim.value = CHILD
            if mine:
                try:
                    found = run_search(snap, data, search)
                except Exception as err:  # the fits above still count; the parent then searches itself
                    log.warning("hir retrieval: the search failed here (%s: %s); the parent searches", type(err).__name__,
                                err)
        after = None
        if then is not None:
            fn, fn_args = then
            try:
                after = fn(*fn_args)
            except Exception as err:  # the parent's evaluation fits whatever is missing itself
                log.warning("evaluate prewarm: %s failed (%s: %s); evaluate fits those itself", getattr(fn, "__name__", fn),
                            type(err).__name__, err)
    return {"fits": done, "search": found, "then": after}


def _child(conn: Any, *args: Any) -> None:
    """The second process's entry: :func:`fit_baselines`, its result or its error sent back."""
    try:
        conn.send(("ok", fit_baselines(*args)))
    except BaseException as err:  # reported in the parent, which then fits the arms itself
        conn.send(("error", f"{type(err).__name__}: {err}"))
    finally:
        conn.close()


class Background:
    """The second process, started at once; :meth:`join` waits for it and tells ``cache`` which
    fits it made (logged as made in parallel, listed as stored); :meth:`stop` ends it (the main
    process failed: nothing waits for a fit nobody will read)."""

    def __init__(self, graph_dir: Path, task: RetrievalTask, specs: dict[str, Any], seed: int,
                 history_splits: list[str], run: list[str] | None, cache: FitCache,
                 search: SearchSpec | None = None, nice: int = 0, purpose: str = "while the rankers train",
                 then: tuple[Any, tuple[Any, ...]] | None = None, label: str = "parallel") -> None:
        self.t0 = time.perf_counter()
        # spawn, not fork: the parent holds torch and Polars thread pools a fork would copy mid-use
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=False)
        # who runs the HIR search (prefetch.py): FREE until this process or the parent takes it
        self.claim = ctx.Value("i", FREE) if search is not None else None
        self._proc = ctx.Process(target=_child, name="hir-evaluate-baselines", daemon=True, args=(
            child_conn, str(graph_dir), task, specs, seed, history_splits, run, str(cache.dir.parent), cache.snapshot,
            search, self.claim, nice, then, label))
        self._proc.start()
        child_conn.close()
        self._joined: dict[str, Any] | None = None
        log.info("retrieval baselines: fitting in a second process (pid %s) %s%s", self._proc.pid, purpose,
                 "; then the HIR search, unless this process is free first" if search is not None else "")

    def _receive(self) -> dict[str, Any]:
        """The second process's result, waited for once: {"fits": arm -> seconds ({} when it failed:
        the arms are then fitted in this process, and the reason is logged), "search": ...}."""
        if self._joined is None:
            try:
                status, payload = self._conn.recv()
            except EOFError:  # it died without a word (killed, out of memory)
                status, payload = "error", f"exit code {self._proc.exitcode}"
            self._proc.join()
            if status != "ok":
                log.warning("retrieval baselines: the second process failed (%s); fitting them here", payload)
            self._joined = payload if status == "ok" else {"fits": {}, "search": None, "then": None}
            self._joined["seconds"] = time.perf_counter() - self.t0
        return self._joined

    def search_result(self) -> Any:
        """The HIR search the second process ran ((fingerprint, k, lists, seconds), waiting for it),
        or None (it failed, or the parent claimed the search)."""
        return self._receive()["search"]

    def wait(self) -> dict[str, float]:
        """Wait for the second process without taking its fits into a cache object (the pipeline's
        prewarm: the evaluation that follows reads them from the cache's files); arm -> its
        seconds there ({} when it failed)."""
        joined = self._receive()
        fits = {f"retrieval/{n}": s for n, s in joined["fits"].items()}
        fits |= {f"ranking/{n}": s for n, s in (joined.get("then") or {}).items()}
        log.info("evaluate prewarm: %s fitted ahead of evaluate (%s) in %.0fs", ", ".join(fits) or "none",
                 ", ".join(f"{n} {s:.0f}s" for n, s in fits.items()), joined["seconds"])
        return fits

    def join(self, cache: FitCache) -> dict[str, float]:
        """Wait for the second process; arm -> its seconds there ({} when it failed)."""
        joined = self._receive()
        done: dict[str, float] = joined["fits"]
        cache.parallel |= {f"retrieval/{name}" for name in done}
        log.info("retrieval baselines: %s fitted in parallel (%s), joined after %.0fs", ", ".join(done) or "none",
                 ", ".join(f"{n} {s:.0f}s" for n, s in done.items()), joined["seconds"])
        return done

    def stop(self) -> None:
        """End the second process if it still runs."""
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join()
