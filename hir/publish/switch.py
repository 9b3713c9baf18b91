"""Moving the live pointers (Milvus aliases, the unversioned Feast service), undoing a switch
that a crash interrupted, and retiring old versions.

The switch is the only non-atomic window of a publish (a few alias updates and one registry
write, milliseconds): an error inside it restores the previous pointers before re-raising. A
SIGKILL inside it leaves the pointers (aliases, the unversioned service) ahead of ``live.json``,
the commit record. That window is closed for every reader in hir: readers resolve the live
version through ``live.json`` and its manifest and read that version's own collections and views
(never an alias), and the first read after the kill puts the pointers back
(:func:`repair_on_read`), as does the next `hir publish`/`hir refresh` (:func:`recover`). A reader
outside hir that reads the aliases sees the pointers ahead only until then.
"""

from __future__ import annotations

import logging
import shutil
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from hir.errors import HirError
from hir.publish import faults, feast_store, milvus_store
from hir.publish import funnel as funnel_table
from hir.serving import now_iso, read_state, store_lock, write_state

log = logging.getLogger(__name__)


def funnel_views(manifest: dict[str, Any] | None) -> dict[str, str] | None:
    """The live funnel service's projection -> view of ``manifest`` (None: it publishes no funnel)."""
    funnel = ((manifest or {}).get("feast") or {}).get("funnel")
    return {funnel_table.TABLE: funnel["view"]} if funnel else None


def _set_service(store: Any, service: str, views: dict[str, str] | None, version: str | None,
                 description: str) -> None:
    """Make the unversioned ``service`` cover ``views`` (None: the service must not exist)."""
    if views is None:
        if feast_store.service_views(store, service) is not None:
            store.delete_feature_service(service)
    elif feast_store.service_views(store, service) != views:
        store.apply([feast_store.live_service(store, service, views, version or "", description)])


def _restore(client: Any, store: Any, aliases: dict[str, str | None], service: str,
             views: dict[str, str] | None, version: str | None, funnel: dict[str, str] | None = None) -> None:
    """Point every alias, the service and the funnel service back to ``aliases``/``views``/
    ``funnel`` (None = did not exist)."""
    for alias, target in aliases.items():
        current = milvus_store.alias_target(client, alias)
        if target is None and current is not None:
            client.drop_alias(alias)
        elif target is not None and current != target:
            milvus_store.point_alias(client, alias, target)
    _set_service(store, service, views, version, "hir embeddings + tokens of the live version")
    _set_service(store, funnel_table.live_service(service), funnel, version, FUNNEL_DESCRIPTION)


FUNNEL_DESCRIPTION = "hir: the user's open funnel of the live version"


def recover(state: dict[str, Any], client: Any, store: Any, prefix: str, service: str,
            entity_types: list[str]) -> list[str]:
    """Make the aliases of ``entity_types`` and the live service match ``live.json``; returns
    what was repaired (empty when nothing had to be)."""
    live = state["versions"].get(state["live"]) if state["live"] else None
    manifest = live["manifest"] if live else None
    types = set(entity_types) | set((manifest or {}).get("milvus", {}).get("collections", {}))
    return _repair(state, client, store, {t: milvus_store.alias_name(prefix, t) for t in sorted(types)}, service)


def _repair(state: dict[str, Any], client: Any, store: Any, alias_names: dict[str, str], service: str) -> list[str]:
    """Point the aliases ``alias_names`` ({type: alias}) and ``service`` (with its funnel service)
    at what ``live.json`` says: the live version's collections and views, or nothing for a type
    or service the live version lacks."""
    live = state["versions"].get(state["live"]) if state["live"] else None
    manifest = live["manifest"] if live else None
    want = {alias: (manifest or {}).get("milvus", {}).get("collections", {}).get(t)
            for t, alias in sorted(alias_names.items())}
    views = {t: manifest["feast"]["feature_views"][t] for t in manifest["feast"]["service_types"]} if manifest else None
    funnel = funnel_views(manifest)
    repaired = [a for a, target in want.items() if milvus_store.alias_target(client, a) != target]
    if feast_store.service_views(store, service) != views:
        repaired.append(f"feast service {service}")
    if feast_store.service_views(store, funnel_table.live_service(service)) != funnel:
        repaired.append(f"feast service {funnel_table.live_service(service)}")
    if repaired:
        log.warning("repairing a switch interrupted by a crash: %s back to live version %s", repaired,
                    live["version"] if live else None)
        _restore(client, store, want, service, views, live["version"] if live else None, funnel)
    return repaired


def repair_on_read(store_dir: Path, client: Any, store: Any) -> list[str]:
    """What a reader of ``store_dir`` runs once on opening it (:class:`hir.publish.retrieval.Retriever`
    ``.live``): if the aliases or the live services are ahead of ``live.json`` (a SIGKILL between
    the switch and the commit), put them back, unless a publish or refresh holds the store (it
    commits or repairs them itself). ``client`` and ``store`` are the reader's own Milvus client
    and Feast store. Returns what was repaired (empty almost always). The store's lock is taken
    only when something is ahead, so readers never make a publish wait or fail."""
    store_dir = Path(store_dir)
    if not _drift(read_state(store_dir), client, store):
        return []
    with ExitStack() as held:
        try:
            held.enter_context(store_lock(store_dir, "read (putting the live pointers back)"))
        except HirError:  # a publish or refresh holds the store: the pointers are its to move
            return []
        except OSError as err:  # a read-only reader or disk: hir's own reads do not use the pointers anyway
            log.debug("cannot lock %s to put the live pointers back (%s); skipped", store_dir, err)
            return []
        state = read_state(store_dir)  # under the lock: no commit can land between this read and the repair
        return _repair(state, client, store, _alias_names(state), _live_service(state))


def _alias_names(state: dict[str, Any]) -> dict[str, str]:
    """{type: alias} of every version in live.json (a type the live version lacks loses its alias)."""
    return {t: a for e in state["versions"].values() if e["status"] != "retired"
            for t, a in e["manifest"]["milvus"]["aliases"].items()}


def _live_service(state: dict[str, Any]) -> str | None:
    live = state["versions"].get(state["live"]) if state["live"] else None
    return live["manifest"]["feast"]["live_feature_service"] if live else None


def _drift(state: dict[str, Any], client: Any, store: Any) -> bool:
    """Whether any alias or live service differs from what ``live.json`` says (reads only)."""
    service = _live_service(state)
    if service is None:
        return False
    live = state["versions"][state["live"]]["manifest"]
    want = {a: live["milvus"]["collections"].get(t) for t, a in _alias_names(state).items()}
    views = {t: live["feast"]["feature_views"][t] for t in live["feast"]["service_types"]}
    return (any(milvus_store.alias_target(client, a) != c for a, c in want.items())
            or feast_store.service_views(store, service) != views
            or feast_store.service_views(store, funnel_table.live_service(service)) != funnel_views(live))


def switch(state: dict[str, Any], store_dir: Path, client: Any, store: Any, entry: dict[str, Any],
           service: str) -> None:
    """Point aliases and the live service at ``entry`` and commit ``live.json``; on any error
    put the previous pointers back and re-raise."""
    manifest = entry["manifest"]
    aliases = manifest["milvus"]["aliases"]
    before = {a: milvus_store.alias_target(client, a) for a in aliases.values()}
    views_before = feast_store.service_views(store, service)
    funnel_before = feast_store.service_views(store, funnel_table.live_service(service))
    old = state["live"]
    try:
        for i, (etype, alias) in enumerate(sorted(aliases.items())):
            milvus_store.point_alias(client, alias, manifest["milvus"]["collections"][etype])
            if i == 0:
                faults.point("switch_milvus")
        faults.point("switch_feast")
        served = {t: manifest["feast"]["feature_views"][t] for t in manifest["feast"]["service_types"]}
        store.apply([feast_store.live_service(store, service, served, entry["version"])])
        # the funnel's live service moves with it; a version without a funnel removes it (serving
        # the previous version's funnel beside new embeddings would mix versions)
        _set_service(store, funnel_table.live_service(service), funnel_views(manifest), entry["version"],
                     FUNNEL_DESCRIPTION)
        faults.point("switch_funnel")
        faults.point("commit")
        at = now_iso()
        if old and old in state["versions"]:
            state["versions"][old]["status"] = "kept"
        entry.update(status="live", live_at=at)
        state["versions"][entry["slug"]] = entry
        state["live"] = entry["slug"]
        state["history"].append({"at": at, "event": "publish", "version": entry["version"],
                                 "previous": state["versions"][old]["version"] if old else None})
        write_state(store_dir, state)
    except BaseException:
        log.error("switch to %s failed; restoring the previous pointers", entry["version"])
        old_version = state["versions"][old]["version"] if old else None
        _restore(client, store, before, service, views_before, old_version, funnel_before)
        raise


def retire(state: dict[str, Any], store_dir: Path, client: Any, store: Any, keep: int, service: str) -> list[str]:
    """Keep the live version and the ``keep - 1`` most recently live before it; drop every other
    version (older kept ones and abandoned staged ones): collections, Feast objects, files."""
    ever_live = sorted((e for e in state["versions"].values() if e["status"] in ("live", "kept")),
                       key=lambda e: e.get("live_at") or "", reverse=True)
    keep_slugs = {state["live"], *(e["slug"] for e in ever_live[: max(keep, 1)])}
    retired = []
    for slug, entry in state["versions"].items():
        if slug in keep_slugs or entry["status"] == "retired":
            continue
        remove_objects(store_dir, client, store, entry, service)
        entry.update(status="retired", retired_at=now_iso())
        retired.append(entry["version"])
    if retired:
        write_state(store_dir, state)
        log.info("retired versions %s (publish.keep_versions=%d)", retired, keep)
    return retired


def remove_objects(store_dir: Path, client: Any, store: Any, entry: dict[str, Any], service: str) -> dict[str, list[str]]:
    """Drop one version's Milvus collections, Feast objects (views with their online tables,
    sources, service) and files under ``versions/<slug>``; what was never created is skipped.
    Returns the names removed. Never call it on the live version (its aliases point here)."""
    slug, manifest = entry["slug"], entry["manifest"]
    # files first: they are most of the space, and freeing them lets the SQLite writes below
    # (registry, online tables) succeed on a disk that a failed publish filled
    shutil.rmtree(Path(store_dir) / "versions" / slug, ignore_errors=True)
    failed: list[BaseException] = []
    dropped: list[str] = []
    removed: list[str] = []
    try:  # each system on its own: a Milvus that fails must not keep the Feast objects
        dropped = milvus_store.drop(client, list(manifest["milvus"]["collections"].values()))
    except Exception as err:
        failed.append(err)
    try:
        tables = {t: feast_store.names(t, slug, service) for t in manifest["feast"]["feature_views"]}
        services = [manifest["feast"]["feature_service"]]
        if manifest["feast"].get("funnel"):
            tables[funnel_table.TABLE] = funnel_table.names(slug, service)
            services.append(manifest["feast"]["funnel"]["feature_service"])
        removed = feast_store.drop_version(store, tables, *services) if store else []
    except Exception as err:
        failed.append(err)
    if failed:
        raise failed[0]
    return {"milvus": dropped, "feast": removed}
