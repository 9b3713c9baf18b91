"""live.json and the store lock: small pieces the publish guarantees rest on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hir.errors import HirError
from hir.serving import read_state, slug, store_lock, write_state


def test_slug_keeps_safe_names_and_separates_unsafe_ones() -> None:
    assert slug("v1") == "v1" and slug("20261129_abc") == "20261129_abc"
    a, b = slug("2026-11-29/a"), slug("2026_11_29_a")
    assert a != b and a.startswith("2026_11_29_a_") and set(a) <= set("0123456789abcdefghijklmnopqrstuvwxyz_")


def test_state_round_trip_is_atomic(tmp_path: Path) -> None:
    assert read_state(tmp_path) == {"format": 1, "live": None, "versions": {}, "history": []}
    state = {"format": 1, "live": "v1", "versions": {"v1": {"version": "v1"}}, "history": []}
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state and not list(tmp_path.glob("*.tmp"))


def test_one_writer_per_store(tmp_path: Path) -> None:
    with (store_lock(tmp_path, "publish"), pytest.raises(HirError, match=r"locked by hir publish \(pid \d+\)"),
          store_lock(tmp_path, "refresh")):
        pass
    with store_lock(tmp_path, "refresh"):  # released when the holder leaves
        pass


def test_a_holder_caught_between_taking_the_lock_and_naming_itself_is_still_named(tmp_path: Path) -> None:
    """The holder writes its name just after it takes the lock: a second writer that looks in between
    waits for the name rather than reporting an anonymous holder; and one whose holder lets go
    meanwhile gets the store."""
    import fcntl
    import threading

    holder = (tmp_path / ".lock").open("a+")
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken, not yet named

    def name() -> None:
        holder.write("hir publish (pid 4242)")
        holder.flush()

    threading.Timer(0.2, name).start()
    with pytest.raises(HirError, match=r"locked by hir publish \(pid 4242\)"), store_lock(tmp_path, "refresh"):
        pass
    holder.seek(0)
    holder.truncate()  # the holder empties the file just before it lets go
    threading.Timer(0.2, lambda: fcntl.flock(holder, fcntl.LOCK_UN)).start()
    with store_lock(tmp_path, "refresh"):
        assert (tmp_path / ".lock").read_text() == f"hir refresh (pid {os.getpid()})"
    holder.close()


def test_the_lock_of_a_killed_process_is_free(tmp_path: Path) -> None:
    """A writer killed with SIGKILL (no Python cleanup, as when a publish is killed mid-way)
    leaves no stale lock: the next writer gets the store."""
    import signal
    import subprocess
    import sys

    holder = ("import sys, time\nfrom pathlib import Path\nfrom hir.serving import store_lock\n"
              "with store_lock(Path(sys.argv[1]), 'publish'):\n    print('held', flush=True)\n    time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(HirError, match=rf"locked by hir publish \(pid {proc.pid}\)"), store_lock(tmp_path, "refresh"):
            pass
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with store_lock(tmp_path, "refresh"):  # the kernel dropped the dead process's lock
        assert "hir refresh (pid" in (tmp_path / ".lock").read_text()
