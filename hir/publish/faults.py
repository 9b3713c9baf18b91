"""Named points in `hir publish` where the reliability tests inject a crash.

``HIR_PUBLISH_FAIL_AT=<point>`` raises :class:`InjectedFailure` there (an error mid-publish);
``HIR_PUBLISH_KILL_AT=<point>`` sends the process SIGKILL there (no cleanup code runs at all).
Unset, a point costs one environment lookup.
"""

from __future__ import annotations

import os
import signal

FAIL_ENV = "HIR_PUBLISH_FAIL_AT"
KILL_ENV = "HIR_PUBLISH_KILL_AT"

# in the order a publish passes them
POINTS = (
    "feast_apply", "feast_materialize", "milvus_insert", "milvus_index", "milvus_load", "milvus_sanity",
    "switch", "switch_milvus", "switch_feast", "commit", "cleanup",
)


class InjectedFailure(RuntimeError):
    """Raised at a fault point named by HIR_PUBLISH_FAIL_AT."""


def point(name: str) -> None:
    assert name in POINTS, f"unknown fault point {name!r}; expected one of {POINTS}"
    if os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(FAIL_ENV) == name:
        raise InjectedFailure(f"injected failure at {name!r} ({FAIL_ENV})")
