"""The journal of a `hir refresh`: what it is about to change in the live version, written before
it changes anything, so a failure is undone at once and a kill by the next publish or refresh.

A refresh changes three shared things: the live Milvus collections (new ids upserted), the live
offline parquet of each type (Feast's offline push rewrites it in place) and the Feast online store.
Before the first of them, :func:`begin` backs each offline parquet up and writes
``versions/<slug>/refresh/pending-<stamp>.json``: the ids, collections and backups. :func:`undo`
puts the backups back, deletes the ids from Milvus and removes the refresh's files, unless
``live.json`` already records the refresh (it committed; only the journal is left to delete).
The Feast online rows of an undone refresh stay (Feast has no delete): they belong to ids that
neither the offline table nor Milvus serve, and a re-run of the same delta overwrites them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import polars as pl
from omegaconf import DictConfig

from hir.atomic import write_text_atomic
from hir.publish import milvus_store
from hir.serving import read_state

log = logging.getLogger(__name__)

PREFIX = "pending-"


def journal_path(store_dir: Path, slug: str, stamp: str) -> Path:
    return Path(store_dir) / "versions" / slug / "refresh" / f"{PREFIX}{stamp}.json"


def begin(store_dir: Path, entry: dict[str, Any], stamp: str, frames: dict[str, pl.DataFrame],
          events_file: str | None, funnel: bool = False) -> Path:
    """Back up the offline parquet of every type in ``frames`` (and of the open funnel when
    ``funnel``: its rows are recomputed) and write the journal; returns its path."""
    manifest = entry["manifest"]
    path = journal_path(store_dir, entry["slug"], stamp)
    out_dir = path.parent / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    journal = {"stamp": stamp, "slug": entry["slug"], "version": entry["version"], "out_dir": str(out_dir),
               "milvus_uri": manifest["milvus"]["uri"], "events_file": events_file,
               "ids": {e: f["entity_id"].to_list() for e, f in frames.items()},
               "collections": {e: manifest["milvus"]["collections"][e] for e in frames}, "backups": {}}
    # the journal first (naming the backups to come), so a kill during a copy is undone too
    journal["backups"] = {e: {"file": manifest["feast"]["offline_files"][e], "backup": str(out_dir / f"{e}.offline.bak")}
                          for e in frames}
    if funnel:
        journal["backups"]["open_funnel"] = {"file": manifest["feast"]["funnel"]["path"],
                                             "backup": str(out_dir / "open_funnel.offline.bak")}
    write_text_atomic(path, json.dumps(journal, indent=2))
    for b in journal["backups"].values():
        tmp = Path(b["backup"] + ".tmp")
        shutil.copyfile(b["file"], tmp)
        os.replace(tmp, b["backup"])
    return path


def _committed(store_dir: Path, journal: dict[str, Any]) -> bool:
    """Whether live.json records the refresh (it finished; only the journal was not yet removed)."""
    entry = read_state(store_dir)["versions"].get(journal["slug"]) or {}
    return any(journal["out_dir"] in str(r.get("validation", "")) for r in entry.get("manifest", {}).get("refreshes", []))


def undo(cfg: DictConfig, store_dir: Path, path: Path) -> str:
    """Undo the refresh of journal ``path`` (see the module docstring); returns what the
    one-line message says about it."""
    path = Path(path)
    if not path.exists():
        return "nothing of it had been written"
    journal = json.loads(path.read_text())
    out_dir = Path(journal["out_dir"])
    if _committed(store_dir, journal):
        for b in journal["backups"].values():
            Path(b["backup"]).unlink(missing_ok=True)
        path.unlink()
        return "it had committed; only its journal was left"
    restored = 0
    for b in journal["backups"].values():
        if Path(b["backup"]).exists():
            os.replace(b["backup"], b["file"])  # the offline table exactly as before the refresh
            restored += 1
    removed = 0
    client = milvus_store.connect(journal["milvus_uri"], cfg.publish.milvus.token)
    try:
        for etype, ids in journal["ids"].items():
            coll = journal["collections"][etype]
            if ids and client.has_collection(coll):
                # pymilvus 3 answers with the ids asked for (inserted or not); 2.x with {"delete_count": n}
                res = client.delete(coll, ids=ids)
                removed += int(res.get("delete_count", 0)) if isinstance(res, dict) else len(res or [])
                client.flush(coll)
    finally:
        milvus_store.disconnect(client, journal["milvus_uri"])
    shutil.rmtree(out_dir, ignore_errors=True)
    if journal.get("events_file"):
        Path(journal["events_file"]).unlink(missing_ok=True)
    path.unlink()
    return (f"its partial writes were undone ({restored} offline table(s) restored, its {removed} id(s) deleted "
            "from Milvus, its files removed)")


def undo_leftovers(cfg: DictConfig, store_dir: Path) -> list[str]:
    """Undo every refresh a kill interrupted (a journal left in any version's refresh dir);
    returns what each undo did."""
    done = []
    for path in sorted(Path(store_dir).glob(f"versions/*/refresh/{PREFIX}*.json")):
        what = undo(cfg, store_dir, path)
        log.warning("undid an interrupted refresh (%s): %s", path.name, what)
        done.append(what)
    return done
