"""The one reader of a prepared graph snapshot (``graph/``, docs/contracts.md).

Every stage after prepare reads the snapshot through :class:`Snapshot`; no other module builds
``nodes/`` or ``edges/`` paths. Small files are read eagerly (``meta.json``), tables either
whole (:meth:`Snapshot.nodes`, :meth:`Snapshot.edges`, :attr:`Snapshot.events`) or as Polars
scans for callers that stream (:meth:`Snapshot.scan_nodes`, :meth:`Snapshot.scan_edges`,
:meth:`Snapshot.scan_events`)::

    snap = load_snapshot("outputs/rees46/default/graph")
    snap.stage_order, snap.deep_stage, snap.val_start       # meta.json
    snap.node_counts                                        # {type: n} over ENTITY_TYPES, 0 when absent
    snap.nodes("product")                                   # node_id, key, text, first_seen, attr_*
    snap.key_index("product")                               # {key: node_id}
    snap.scan_edges(engage_relation("product"))             # LazyFrame, or None without the relation
    snap.metadata_edges()                                   # [(relation, src type, dst type, frame)]
    snap.events                                             # events.parquet with split labels
    snap.node_types(), snap.relations()                     # the node / edge tables present
    snap.node_path("product")                               # a table's file, for messages and file checks

Ids: ``node_id`` is dense per type (``0..n-1``), ``key`` is the dataset's id (str).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from hir.data.schema import ENTITY_TYPES, METADATA_RELATIONS, engage_relation
from hir.errors import InputError

META_FILE = "meta.json"
EVENTS_FILE = "events.parquet"
# the columns every reader of events.parquet relies on
EVENT_COLUMNS = ("user_id", "entity_id", "entity_type", "stage", "stage_rank", "timestamp", "split")


class Snapshot:
    """One ``graph/`` directory: ``meta.json`` (read at open), node and edge tables, events.

    Args:
        dir: the snapshot directory.
        meta: its parsed ``meta.json``.
    """

    def __init__(self, dir: Path, meta: dict[str, Any]) -> None:
        self.dir, self.meta = Path(dir), meta
        self._nodes: dict[str, pl.DataFrame] = {}

    def __repr__(self) -> str:
        return f"Snapshot({str(self.dir)!r}, dataset={self.dataset!r}, nodes={self.node_counts})"

    # -- meta.json ------------------------------------------------------------------------------
    @property
    def meta_path(self) -> Path:
        """The ``meta.json`` file (e.g. to hash it)."""
        return self.dir / META_FILE

    @property
    def dataset(self) -> str:
        return str(self.meta.get("dataset", "unknown"))

    @property
    def stage_order(self) -> list[str]:
        """Funnel stages, shallowest first."""
        return list(self.meta["stage_order"])

    @property
    def deep_stage(self) -> str:
        return str(self.meta.get("deep_stage") or self.stage_order[-1])

    @property
    def split_bounds(self) -> dict[str, str]:
        """ISO times ``min``, ``val_start``, ``test_start``, ``max``."""
        return dict(self.meta["split_bounds"])

    @property
    def real_time(self) -> bool:
        """Whether the events' timestamps are the data's own: False where prepare synthesized them
        (a dataset without time, hir/data/split.py): their order within a split is then random,
        so nothing may read recency or a trend from them."""
        return (self.meta.get("split") or {}).get("timestamps") != "synthesized"

    @property
    def val_start(self) -> datetime:
        return datetime.fromisoformat(self.meta["split_bounds"]["val_start"])

    @property
    def test_start(self) -> datetime:
        return datetime.fromisoformat(self.meta["split_bounds"]["test_start"])

    @property
    def end(self) -> datetime:
        return datetime.fromisoformat(self.meta["split_bounds"]["max"])

    @property
    def node_counts(self) -> dict[str, int]:
        """Nodes per entity type, every type of ``ENTITY_TYPES`` (0 for a type the data lacks)."""
        counts = self.meta.get("nodes", {})
        return {t: int(counts.get(t, 0) or 0) for t in ENTITY_TYPES}

    def num_nodes(self, entity_type: str) -> int:
        return int(self.meta.get("nodes", {}).get(entity_type) or self.nodes(entity_type).height)

    # -- nodes/<type>.parquet ---------------------------------------------------------------------
    def node_path(self, entity_type: str) -> Path:
        """The file ``nodes/<type>.parquet`` (it may not exist; for messages and file checks)."""
        return self.dir / "nodes" / f"{entity_type}.parquet"

    def node_types(self) -> list[str]:
        """The types that have a node table, in file-name order."""
        return [p.stem for p in sorted((self.dir / "nodes").glob("*.parquet"))]

    def has_nodes(self, entity_type: str) -> bool:
        return self.node_path(entity_type).exists()

    def _require_nodes(self, entity_type: str) -> Path:
        path = self.node_path(entity_type)
        if not path.exists():
            raise InputError(f"{path} is missing; the snapshot has node types {sorted(self.node_types())}")
        return path

    def scan_nodes(self, entity_type: str) -> pl.LazyFrame:
        """``nodes/<type>.parquet`` as a scan (rows in ``node_id`` order)."""
        return pl.scan_parquet(self._require_nodes(entity_type))

    def nodes(self, entity_type: str, columns: list[str] | None = None) -> pl.DataFrame:
        """``nodes/<type>.parquet``: ``node_id``, ``key``, ``text``, ``first_seen``, ``attr_*``
        (rows in ``node_id`` order). The whole table is cached; ``columns`` reads only those."""
        if columns is not None:
            return pl.read_parquet(self._require_nodes(entity_type), columns=columns)
        if entity_type not in self._nodes:
            self._nodes[entity_type] = pl.read_parquet(self._require_nodes(entity_type))
        return self._nodes[entity_type]

    def node_schema(self, entity_type: str) -> dict[str, pl.DataType]:
        """Column -> dtype of ``nodes/<type>.parquet`` (the file is not read)."""
        return dict(pl.read_parquet_schema(self._require_nodes(entity_type)))

    def keys(self, entity_type: str) -> pl.Series:
        """The type's keys as strings, position = ``node_id``."""
        return self.nodes(entity_type, ["key"])["key"].cast(pl.String)

    def key_index(self, entity_type: str) -> dict[str, int]:
        """``{key: node_id}`` of a type (empty when the snapshot has no such nodes)."""
        if not self.has_nodes(entity_type):
            return {}
        frame = self.nodes(entity_type, ["node_id", "key"])
        return dict(zip(frame["key"].cast(pl.String).to_list(), frame["node_id"].to_list()))

    # -- edges/<relation>.parquet -----------------------------------------------------------------
    def edge_path(self, relation: str) -> Path:
        """The file ``edges/<relation>.parquet`` (it may not exist; for messages and file checks)."""
        return self.dir / "edges" / f"{relation}.parquet"

    def relations(self) -> list[str]:
        """The relations that have an edge table (``<src>__<name>__<dst>``), in file-name order."""
        return [p.stem for p in sorted((self.dir / "edges").glob("*.parquet"))]

    def scan_edges(self, relation: str) -> pl.LazyFrame | None:
        """``edges/<relation>.parquet`` as a scan, or None when the dataset lacks the relation."""
        path = self.edge_path(relation)
        return pl.scan_parquet(path) if path.exists() else None

    def edges(self, relation: str, columns: list[str] | None = None) -> pl.DataFrame | None:
        """``edges/<relation>.parquet`` (``src_id``, ``dst_id``, ...), or None without the relation."""
        path = self.edge_path(relation)
        return pl.read_parquet(path, columns=columns) if path.exists() else None

    def engagement(self, entity_type: str) -> pl.LazyFrame | None:
        """Scan of ``user__engages__<type>``: ``src_id`` (user), ``dst_id``, ``stage``, ``split``,
        ``count``, ``first_ts``, ``last_ts``, ``value``; sorted by (src_id, dst_id). None without it."""
        return self.scan_edges(engage_relation(entity_type))

    def engaged_types(self) -> list[str]:
        """Entity types users engage with (an engagement relation exists), in ``ENTITY_TYPES`` order."""
        return [t for t in ENTITY_TYPES if self.edge_path(engage_relation(t)).exists()]

    def metadata_edges(self) -> list[tuple[str, str, str, pl.DataFrame]]:
        """(relation, src type, dst type, ``src_id``/``dst_id`` frame) of every metadata relation
        the dataset has, in ``METADATA_RELATIONS`` order."""
        out = []
        for rel, (src, dst) in METADATA_RELATIONS.items():
            frame = self.edges(rel, ["src_id", "dst_id"])
            if frame is not None:
                out.append((rel, src, dst, frame))
        return out

    # -- events.parquet -------------------------------------------------------------------------
    @property
    def events_path(self) -> Path:
        """The file ``events.parquet`` (it may not exist; for messages and file checks)."""
        return self.dir / EVENTS_FILE

    def _require_events(self) -> Path:
        path = self.events_path
        if not path.exists():
            raise InputError(f"{path} is missing; the graph snapshot is incomplete; rerun `hir prepare force=true`")
        return path

    def scan_events(self) -> pl.LazyFrame:
        """``events.parquet`` as a scan (columns of ``EVENT_COLUMNS`` plus quantity, value, session)."""
        return pl.scan_parquet(self._require_events())

    @cached_property
    def events(self) -> pl.DataFrame:
        """``events.parquet`` read whole (its columns checked against ``EVENT_COLUMNS``)."""
        path = self._require_events()
        frame = pl.read_parquet(path)
        missing = [c for c in EVENT_COLUMNS if c not in frame.columns]
        if missing:
            raise InputError(
                f"{path} lacks columns {missing} (has {frame.columns}); it predates the snapshot contract, "
                "rerun `hir prepare force=true`"
            )
        return frame

    # -- planted ground truth (synthetic data) --------------------------------------------------
    def truth(self) -> tuple[str, pl.DataFrame] | None:
        """(file name, frame) of the planted hierarchy (``*truth.parquet``: entity_type, key,
        coarse, fine, weight), or None when the data has none."""
        files = sorted(self.dir.glob("*truth.parquet"))
        return (files[0].name, pl.read_parquet(files[0])) if files else None


def load_snapshot(graph_dir: str | Path, strict: bool = True) -> Snapshot:
    """Open a graph snapshot; a missing or partial one is a user error with the fix.

    Args:
        graph_dir: the snapshot directory.
        strict: False opens the directory as it is, for readers of its tables alone (enrich's
            node tables, validate's engagement contexts): ``meta`` is ``meta.json`` when present,
            else ``{}``, and is not checked; a missing table is reported when it is read.
    """
    graph_dir = Path(graph_dir)
    meta_path = graph_dir / META_FILE
    if not strict:
        return Snapshot(graph_dir, json.loads(meta_path.read_text()) if meta_path.exists() else {})
    if not meta_path.exists():
        raise InputError(
            f"no graph snapshot at {graph_dir} (meta.json missing); run `hir prepare` in this run dir first, "
            "or point paths.graph_dir at an existing one, e.g. paths.graph_dir=outputs/rees46/default/graph"
        )
    meta = json.loads(meta_path.read_text())
    for key in ("stage_order", "split_bounds"):
        if key not in meta:
            raise InputError(f"{meta_path} has no {key!r}; it predates the snapshot contract, rerun `hir prepare force=true`")
    return Snapshot(graph_dir, meta)
