"""The serving state of one store dir: which version is live, which are staged or kept.

``<store_dir>/live.json`` is the commit record of `hir publish`: it is rewritten atomically
(write + fsync + rename) and only after a version is fully staged in Feast and Milvus and the
aliases/feature service point at it. Anything else in the store (registry, online tables,
collections) may hold a half-staged version after a crash; live.json never names one.

Layout::

    {"format": 1, "live": <slug> | null,
     "versions": {<slug>: {"version", "slug", "created", "status": staged|live|kept|retired,
                           "staged_at", "live_at", "hashes", "manifest", "manifest_paths"}},
     "history": [{"at", "event", "version", "previous"}]}

``manifest_paths`` are the run files (``<run>/publish/manifest.json``) that describe a version;
:func:`sync_manifests` keeps their ``status`` (and the store's ``live_version``) current, so a
run's manifest says when the version it pins is no longer the live one.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from hashlib import sha1
from pathlib import Path
from typing import Any

from hir.errors import HirError

LIVE_FILE = "live.json"
FORMAT = 1


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def slug(version: str) -> str:
    """A name-safe form of a model version for Feast/Milvus object names (``[A-Za-z0-9_]``);
    a short hash keeps two versions that differ only in punctuation apart."""
    safe = re.sub(r"[^0-9A-Za-z_]", "_", version)
    if safe != version or not safe:
        safe = f"{safe}_{sha1(version.encode()).hexdigest()[:6]}"
    return safe


def read_state(store_dir: Path) -> dict[str, Any]:
    path = Path(store_dir) / LIVE_FILE
    if not path.exists():
        return {"format": FORMAT, "live": None, "versions": {}, "history": []}
    state = json.loads(path.read_text())
    if state.get("format") != FORMAT:
        raise HirError(f"{path} has format {state.get('format')}, this hir writes {FORMAT}; publish into a new "
                       "publish.store_dir or remove the old store")
    return state


def write_state(store_dir: Path, state: dict[str, Any]) -> None:
    """Atomic replace: readers see the old or the new file, never a torn one."""
    path = Path(store_dir) / LIVE_FILE
    tmp = path.with_suffix(".json.tmp")
    with tmp.open("w") as fh:
        json.dump(state, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def live_entry(store_dir: Path) -> dict[str, Any] | None:
    """The live version's entry (with its ``manifest``), or None before the first publish."""
    state = read_state(store_dir)
    return state["versions"].get(state["live"]) if state["live"] else None


def live_manifest(store_dir: Path) -> dict[str, Any]:
    """The manifest of the live version; a clear error when nothing was published there."""
    entry = live_entry(store_dir)
    if entry is None:
        raise HirError(f"nothing is published in {store_dir} ({LIVE_FILE} names no live version); run `hir publish`")
    return entry["manifest"]


def _take_or_holder(fh: Any, patience_s: float = 1.0) -> str | None:
    """Take the lock on ``fh`` (None), or the name its holder wrote. A holder writes its name just
    after it takes the lock and empties the file just before it lets go, so an empty file means one
    of those two moments: look again, and try the lock again, for up to ``patience_s``."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip()
            if holder or time.monotonic() >= deadline:
                return holder or "another process"
            time.sleep(0.02)


@contextmanager
def store_lock(store_dir: Path, what: str) -> Iterator[None]:
    """One writer per store dir (publish, refresh); a second one fails fast and says who holds it."""
    store_dir = Path(store_dir)
    store_dir.mkdir(parents=True, exist_ok=True)
    path = store_dir / ".lock"
    fh = path.open("a+")
    holder = _take_or_holder(fh)
    if holder is not None:
        fh.close()
        raise HirError(f"{store_dir} is locked by {holder}; wait for it to finish (the lock is released when "
                       "that process exits)")
    fh.seek(0)
    fh.truncate()
    fh.write(f"hir {what} (pid {os.getpid()})")
    fh.flush()
    try:
        yield
    finally:
        fh.truncate(0)
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def status_fields(state: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """What a run manifest says about its version's standing in the store."""
    live = state["versions"].get(state["live"]) if state["live"] else None
    return {"status": entry["status"], "live_version": live["version"] if live else None,
            "status_updated_at": now_iso()}


def sync_manifests(state: dict[str, Any]) -> list[str]:
    """Rewrite every recorded run manifest with its version's current manifest and status
    (live, kept, retired); paths that are gone are dropped. Returns the files written."""
    written = []
    for entry in state["versions"].values():
        keep = []
        for p in entry.get("manifest_paths", []):
            path = Path(p)
            if not path.parent.exists():
                continue
            old = json.loads(path.read_text()) if path.exists() else {}
            body = {**entry["manifest"], **status_fields(state, entry)}
            if old.get("noop"):
                body["noop"] = True
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(body, indent=2, default=str))
            os.replace(tmp, path)
            keep.append(p)
            written.append(p)
        if "manifest_paths" in entry:
            entry["manifest_paths"] = keep
    return written


def describe_store(state: dict[str, Any], store_dir: Path) -> str:
    """One line per version that is live or kept in the store (what `hir publish` prints)."""
    lines = [f"serving store {store_dir}:"]
    for entry in sorted(state["versions"].values(), key=lambda e: e.get("live_at") or "", reverse=True):
        if entry["status"] in ("live", "kept"):
            what = "LIVE (feature service, Milvus aliases)" if entry["status"] == "live" else \
                "kept (rankers_<version>, for rollback)"
            lines.append(f"  {entry['version']}: {what}")
    retired = [e["version"] for e in state["versions"].values() if e["status"] == "retired"]
    if retired:
        lines.append(f"  retired: {', '.join(retired[-5:])}")
    return "\n".join(lines)
