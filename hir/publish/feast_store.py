"""Feast side of a publish: per-version working copy of feature_repo/, apply, materialize,
the switch of the live FeatureService, and removal of retired versions.

All versions of one store share ``<store_dir>/feast/registry.db`` and one online store, so the
previous version keeps serving while a new one is applied and materialized under new view names.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import shutil
import time
import warnings
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from hir.errors import HirError

log = logging.getLogger(__name__)
# feast logs every registry refresh at INFO; our progress steps say what is happening
logging.getLogger("feast").setLevel(logging.WARNING)

TEMPLATE_FILES = ("feature_store.yaml", "features.py", ".feastignore")


def names(etype: str, slug: str, service: str) -> dict[str, str]:
    """Object names of one entity type in one version."""
    return {"view": f"{etype}_{slug}", "source": f"{etype}_src_{slug}", "push_source": f"{etype}_push_{slug}",
            "join_key": f"{etype}_id", "service": f"{service}_{slug}"}


def _plain(t: pa.DataType) -> pa.DataType:
    """large/fixed-size Arrow types (polars writes large_*) as the plain ones Feast's type map knows."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_list(t) or pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(_plain(t.value_type))
    return t


def plain_table(table: pa.Table) -> pa.Table:
    """``table`` with the plain Arrow types Feast's type map knows (:func:`_plain`)."""
    return table.cast(pa.schema([pa.field(f.name, _plain(f.type)) for f in table.schema]))


def serving_copy(src: Path, dst: Path, join_key: str) -> dict[str, Any]:
    """Copy an export table into the serving store with ``entity_id`` renamed to ``join_key``.

    The copy makes a published version independent of the run dir (a later export there cannot
    change what is served) and gives each entity its own join key (``product_id``), which a
    FileSource field_mapping cannot do for views fed by a PushSource in Feast 0.67.
    Returns rows and the event_timestamp range (for the materialize window).
    """
    table = pq.read_table(src)
    table = plain_table(table.rename_columns([join_key if c == "entity_id" else c for c in table.column_names]))
    dst.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, dst)
    ts = table["event_timestamp"]
    return {"rows": table.num_rows, "ts_min": pc.min(ts).as_py(), "ts_max": pc.max(ts).as_py()}


def write_working_copy(template: Path, repo: Path, project: str, registry: Path, online_store: dict[str, Any],
                       spec: dict[str, Any]) -> Path:
    """``repo``/ = the committed feature_repo/ files + a feature_store.yaml with absolute paths +
    ``publish_spec.json`` (names, parquet paths and levels of this version)."""
    import json

    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    for name in TEMPLATE_FILES:
        if not (template / name).exists():
            raise HirError(f"feature repo template {template} lacks {name}; set publish.feast.repo_template to hir's "
                           "feature_repo/ directory")
        shutil.copy(template / name, repo / name)
    settings = yaml.safe_load((template / "feature_store.yaml").read_text())
    from hir.publish.registry_store import CLASS_PATH

    # the registry is rewritten atomically (hir/publish/registry_store.py): a full disk or a kill
    # mid-write must not empty the one file every version of the store resolves through
    settings.update(project=project, registry={"registry_type": "file", "path": str(registry),
                                               "registry_store_type": CLASS_PATH},
                    online_store=dict(online_store))
    header = "# written by `hir publish` from feature_repo/feature_store.yaml; do not edit\n"
    (repo / "feature_store.yaml").write_text(header + yaml.safe_dump(settings, sort_keys=False))
    (repo / "publish_spec.json").write_text(json.dumps(spec, indent=2))
    return repo


def load_definitions(repo: Path) -> list:
    """The Feast objects the working copy's features.py defines (imported by path, not by name,
    so two versions' copies never share a module)."""
    import json

    module_name = f"hir_feature_repo_{abs(hash(str(repo)))}"
    spec = importlib.util.spec_from_file_location(module_name, repo / "features.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.definitions(json.loads((repo / "publish_spec.json").read_text()))


def open_store(repo: Path) -> Any:
    from feast import FeatureStore

    return FeatureStore(repo_path=str(repo))


def apply(store: Any, objects: list) -> None:
    """Register one version's objects (partial apply: other versions are left alone)."""
    store.apply(objects, partial=True)


def materialize(store: Any, views: dict[str, str], windows: dict[str, tuple[datetime, datetime]]) -> dict[str, float]:
    """Load each view's rows into the online store; returns seconds per entity type."""
    seconds = {}
    for etype, view in views.items():
        lo, hi = windows[etype]
        t0 = time.perf_counter()
        # Feast prints a coloured banner and a progress bar per view; our progress steps say what runs
        out = io.StringIO()
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            # ibis 12 calls duckdb's deprecated fetch_arrow_table per batch
            warnings.filterwarnings("ignore", message=".*fetch_arrow_table", category=DeprecationWarning)
            store.materialize(start_date=lo - timedelta(seconds=1), end_date=hi + timedelta(seconds=1),
                              feature_views=[view])
        log.debug("feast materialize %s: %s", view, out.getvalue().strip())
        seconds[etype] = time.perf_counter() - t0
    return seconds


def live_service(store: Any, name: str, views: dict[str, str], version: str,
                 description: str = "hir embeddings + tokens of the live version") -> Any:
    """The unversioned service ``name`` over the given views (projection name -> view name)."""
    from feast import FeatureService

    fvs = [store.get_feature_view(v).with_name(etype) for etype, v in sorted(views.items())]
    return FeatureService(name=name, features=fvs, tags={"hir_version": version}, description=description)


def service_views(store: Any, name: str) -> dict[str, str] | None:
    """entity type -> view name behind the service ``name``, or None when it does not exist."""
    from feast.errors import FeatureServiceNotFoundException

    try:
        service = store.get_feature_service(name)
    except FeatureServiceNotFoundException:
        return None
    return {p.name_alias or p.name: p.name for p in service.feature_view_projections}


def drop_version(store: Any, tables: dict[str, dict[str, str]], *services: str) -> list[str]:
    """Remove a version's services, views (and their online tables) and sources; objects that
    never got applied (a crashed publish) are skipped. Returns the removed names."""
    from feast.errors import DataSourceNotFoundException, FeastObjectNotFoundException

    getters = [(store.get_feature_service, s) for s in services]
    for t in tables.values():
        getters += [(store.get_feature_view, t["view"]), (store.get_data_source, t["push_source"]),
                    (store.get_data_source, t["source"])]
    found = []
    for get, name in getters:
        try:
            found.append(get(name))
        except (FeastObjectNotFoundException, DataSourceNotFoundException, ValueError):
            continue
    if found:
        _cheap_drops(store)
        store.apply([], objects_to_delete=found, partial=False)
    return [o.name for o in found]


def _cheap_drops(store: Any) -> None:
    """Let the SQLite online store drop a view's table on a nearly full disk.

    Debian's SQLite (the one Python links here) is built with ``secure_delete`` on: every page a
    DROP TABLE frees is zeroed, so the rollback journal first copies the whole table. Removing a
    failed version's 30 MB of online rows then needs 30 MB free, exactly when a full disk made
    it fail ("database or disk is full", benchmarks/faults.py disk_full_publish_tmpfs). With it
    off, freed pages go to the freelist unjournaled and the drop needs a few pages.
    """
    from feast.infra.online_stores.sqlite import SqliteOnlineStore

    online = getattr(store._get_provider(), "online_store", None)
    if isinstance(online, SqliteOnlineStore):
        online._get_conn(store.config).execute("PRAGMA secure_delete = OFF")
