"""Named points in `hir publish` and `hir refresh` where the reliability tests inject a crash.

``HIR_PUBLISH_FAIL_AT=<point>`` raises :class:`InjectedFailure` there (an error mid-publish);
``HIR_PUBLISH_KILL_AT=<point>`` sends the process SIGKILL there (no cleanup code runs at all);
``HIR_PUBLISH_NOSPACE_AT=<point>`` raises the error a full disk gives there: SQLite's
``database or disk is full`` at the Feast points (registry and online store), ``OSError(ENOSPC)``
elsewhere (parquet files, Milvus Lite, live.json). Unset, a point costs a few environment lookups.
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3

FAIL_ENV = "HIR_PUBLISH_FAIL_AT"
KILL_ENV = "HIR_PUBLISH_KILL_AT"
NOSPACE_ENV = "HIR_PUBLISH_NOSPACE_AT"

# in the order a publish passes them
POINTS = (
    "stage_files", "feast_apply", "feast_materialize", "milvus_insert", "milvus_index", "milvus_load", "milvus_sanity",
    "switch", "switch_milvus", "switch_feast", "commit", "cleanup",
)
# the same in `hir refresh` (after its journal is written)
REFRESH_POINTS = ("refresh_milvus", "refresh_push_offline", "refresh_push_online", "refresh_commit")
# passed only where a version publishes (or a refresh recomputes) the open funnel
FUNNEL_POINTS = ("stage_funnel", "feast_materialize_funnel", "switch_funnel", "refresh_funnel")


class InjectedFailure(RuntimeError):
    """Raised at a fault point named by HIR_PUBLISH_FAIL_AT."""


def point(name: str) -> None:
    known = POINTS + REFRESH_POINTS + FUNNEL_POINTS
    assert name in known, f"unknown fault point {name!r}; expected one of {known}"
    if os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(FAIL_ENV) == name:
        raise InjectedFailure(f"injected failure at {name!r} ({FAIL_ENV})")
    if os.environ.get(NOSPACE_ENV) == name:
        if name.startswith(("feast", "switch_feast", "refresh_push")):
            raise sqlite3.OperationalError("database or disk is full")
        raise OSError(errno.ENOSPC, f"No space left on device (injected at {name!r}, {NOSPACE_ENV})")
