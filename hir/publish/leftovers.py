"""What a failed or killed `hir publish` leaves, and the check that keeps a publish from
starting on a disk that is clearly too small.

- :func:`abandon`: right after a publish fails (any error, Ctrl-C), remove what it staged.
- :func:`recover`: at the start of the next publish or refresh (under the store lock), put
  every pointer back to what ``live.json`` says and remove the staged versions a SIGKILL left.
- :func:`check_space`: before anything is written, free space against the export's size times
  the store's growth per export byte measured at its last publish.
"""

from __future__ import annotations

import logging
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hir import space
from hir.atomic import remove_stale_tmp
from hir.publish import feast_store, milvus_store, switch
from hir.serving import write_state

log = logging.getLogger(__name__)


def safe_name(name: str) -> str:
    """Feast projects and Milvus names: letters, digits, underscores."""
    return re.sub(r"[^0-9A-Za-z_]", "_", name)


SPACE_FIX = ("free space on that disk (or set publish.store_dir to a larger one), then run the same command "
             "again; docs/operations.md: Out of disk space")


def served_note(state: dict[str, Any]) -> str:
    """What a failed publish or refresh leaves serving, for its one-line message."""
    live = state["versions"].get(state["live"]) if state["live"] else None
    return (f"the live version {live['version']!r} is unchanged and serving" if live else
            "nothing was served before and nothing is now")


def store_bytes(store_dir: Path) -> int:
    """Bytes of every file under ``store_dir`` (what a publish or a cleanup changes)."""
    return sum(p.stat().st_size for p in Path(store_dir).rglob("*") if p.is_file() and not p.is_symlink())


def allocated_bytes(store_dir: Path) -> int:
    """Bytes the files under ``store_dir`` take on their disk (allocated blocks, what free space
    is counted in; SQLite and Milvus files are larger on disk than their data)."""
    total = 0
    for p in Path(store_dir).rglob("*"):
        try:
            st = p.lstat()
        except FileNotFoundError:  # Milvus Lite's server thread removes its temporary files any time
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_blocks * 512
    return total


def export_bytes(emb_dir: Path) -> int:
    """Bytes of the export's parquet tables (what a publish copies, indexes and materializes)."""
    return sum(p.stat().st_size for p in Path(emb_dir).glob("*.parquet"))


def measured_growth(state: dict[str, Any]) -> tuple[float, str] | None:
    """(store bytes added per export byte, the version it was measured on) at the most recent
    publish into this store that recorded it (``space`` in live.json), or None before any."""
    measured = [e for e in state["versions"].values() if (e.get("space") or {}).get("ratio")]
    if not measured:
        return None
    last = max(measured, key=lambda e: e.get("live_at") or "")
    return float(last["space"]["ratio"]), str(last["version"])


def check_space(cfg: DictConfig, store_dir: Path, emb_dir: Path, state: dict[str, Any], served: str) -> None:
    """Refuse before anything is written when the store's disk has less free space than the new
    version will take: the export's parquet bytes times the store's growth per export byte,
    measured at its last publish (recorded in live.json), or ``publish.space.factor`` before the
    first one. ``publish.space.factor=0`` turns the check off."""
    factor = float(OmegaConf.select(cfg, "publish.space.factor", default=0) or 0)
    if factor <= 0:
        return
    size = export_bytes(emb_dir)
    measured = measured_growth(state)
    ratio, basis = (measured[0], f"the growth measured at the publish of {measured[1]!r}") if measured else \
        (factor, "publish.space.factor; no publish into this store measured one yet")
    need = int(ratio * size)
    what = (f"the new version from {emb_dir} ({ratio:.1f} x its {space.human(size)} of parquet: {basis})")
    free = space.require_free(what, store_dir, need, f"{served}; nothing was written", SPACE_FIX)
    log.info("free space in %s: %s, about %s needed (%s)", store_dir, space.human(free), space.human(need), basis)


def _any_repo(state: dict[str, Any]) -> Path | None:
    """A working copy of feature_repo/ that exists (the live version's first): any opens the shared registry."""
    repos = [Path(e["manifest"]["feast"]["repo_path"]) for e in
             sorted(state["versions"].values(), key=lambda e: e["slug"] != state["live"])]
    return next((r for r in repos if (r / "feature_store.yaml").exists()), None)


def abandon(cfg: DictConfig, state: dict[str, Any], store_dir: Path, sl: str) -> str:
    """Remove what a failed publish of ``sl`` staged (a version that never went live); returns
    what the message says about it. A version kept for rollback, or live, is left alone."""
    entry = state["versions"].get(sl)
    if entry is None:  # it failed before its entry was recorded: at most a partial serving copy
        vdir = store_dir / "versions" / sl
        if vdir.exists():
            freed = store_bytes(vdir)
            shutil.rmtree(vdir, ignore_errors=True)
            return f"the failed attempt's partial files were removed ({space.human(freed)} freed)"
        return "nothing of the failed attempt needed removing"
    if entry["status"] != "staged" or state["live"] == sl:
        return "nothing of the failed attempt needed removing"
    before = store_bytes(store_dir)
    try:
        repo = _any_repo(state)
        store = feast_store.open_store(repo) if repo else None
        client = milvus_store.connect(cfg.publish.milvus.uri, cfg.publish.milvus.token)
        try:
            if store is not None:  # pointers back to live.json before anything of the new version goes
                types = sorted({t for e in state["versions"].values() for t in e["manifest"]["milvus"]["collections"]})
                switch.recover(state, client, store, safe_name(cfg.publish.milvus.prefix),
                               cfg.publish.feast.feature_service, types)
            removed = switch.remove_objects(store_dir, client, store, entry, cfg.publish.feast.feature_service)
        finally:
            milvus_store.disconnect(client, cfg.publish.milvus.uri)
        del state["versions"][sl]
        write_state(store_dir, state)
    except Exception as err:
        log.warning("removing the failed attempt at %r failed too (%s); the next publish or refresh removes it",
                    entry["version"], err)
        return "its partial writes are removed by the next `hir publish` or `hir refresh`"
    freed = max(before - store_bytes(store_dir), 0)
    log.info("removed the failed attempt at %r: %d Milvus collection(s), %d Feast object(s), %s freed",
             entry["version"], len(removed["milvus"]), len(removed["feast"]), space.human(freed))
    return f"the failed attempt's partial writes were removed ({space.human(freed)} freed)"


def recover(cfg: DictConfig, state: dict[str, Any]) -> list[str]:
    """Undo what a SIGKILL left: every alias and the live service back to what live.json says,
    then remove the staged-but-never-live versions of interrupted publishes (the store lock is
    held, so no publish that is still running owns them). Returns what was repaired or removed
    (empty almost always)."""
    repo = _any_repo(state)
    if repo is None:  # nothing was ever applied here
        return []
    store_dir = Path(cfg.publish.store_dir).resolve()
    for d in (store_dir, store_dir / "feast"):  # a killed writer's temporary files (live.json, the registry)
        remove_stale_tmp(d)
    types = sorted({t for e in state["versions"].values() for t in e["manifest"]["milvus"]["collections"]})
    client = milvus_store.connect(cfg.publish.milvus.uri, cfg.publish.milvus.token)
    store = feast_store.open_store(repo)
    try:
        repaired = switch.recover(state, client, store, safe_name(cfg.publish.milvus.prefix),
                                  cfg.publish.feast.feature_service, types)
        for sl, entry in list(state["versions"].items()):
            if entry["status"] != "staged" or sl == state["live"]:
                continue
            before = store_bytes(store_dir)
            removed = switch.remove_objects(store_dir, client, store, entry, cfg.publish.feast.feature_service)
            del state["versions"][sl]
            write_state(store_dir, state)
            log.warning("removed the leftovers of an interrupted publish of %r (staged %s, never live): %d Milvus "
                        "collection(s), %d Feast object(s), %s freed", entry["version"], entry.get("staged_at"),
                        len(removed["milvus"]), len(removed["feast"]), space.human(max(before - store_bytes(store_dir), 0)))
            repaired.append(f"staged {entry['version']}")
        return repaired
    finally:
        milvus_store.disconnect(client, cfg.publish.milvus.uri)
