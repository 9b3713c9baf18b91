"""Read the prepare stage's graph snapshot (docs/contracts.md, `graph/`) for evaluation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from hir.errors import InputError

EVENT_COLUMNS = ("user_id", "entity_id", "entity_type", "stage", "stage_rank", "timestamp", "split")


@dataclass
class Snapshot:
    """The files of one `graph/` directory, loaded lazily where they are large."""

    dir: Path
    meta: dict[str, Any]
    _nodes: dict[str, pl.DataFrame] = field(default_factory=dict, repr=False)

    @property
    def dataset(self) -> str:
        return str(self.meta.get("dataset", "unknown"))

    @property
    def stage_order(self) -> list[str]:
        return list(self.meta["stage_order"])

    @property
    def deep_stage(self) -> str:
        return str(self.meta.get("deep_stage") or self.stage_order[-1])

    @property
    def val_start(self) -> datetime:
        return datetime.fromisoformat(self.meta["split_bounds"]["val_start"])

    @property
    def test_start(self) -> datetime:
        return datetime.fromisoformat(self.meta["split_bounds"]["test_start"])

    @property
    def end(self) -> datetime:
        return datetime.fromisoformat(self.meta["split_bounds"]["max"])

    @cached_property
    def events(self) -> pl.DataFrame:
        """graph/events.parquet (columns of EVENT_COLUMNS plus quantity/value)."""
        path = self.dir / "events.parquet"
        if not path.exists():
            raise InputError(f"{path} is missing; the graph snapshot is incomplete; rerun `hir prepare force=true`")
        frame = pl.read_parquet(path)
        missing = [c for c in EVENT_COLUMNS if c not in frame.columns]
        if missing:
            raise InputError(
                f"{path} lacks columns {missing} (has {frame.columns}); it predates the snapshot contract, "
                "rerun `hir prepare force=true`"
            )
        return frame

    def nodes(self, entity_type: str) -> pl.DataFrame:
        """graph/nodes/<type>.parquet: node_id, key, text, first_seen, attr_* columns."""
        if entity_type not in self._nodes:
            path = self.dir / "nodes" / f"{entity_type}.parquet"
            if not path.exists():
                have = sorted(p.stem for p in (self.dir / "nodes").glob("*.parquet"))
                raise InputError(f"{path} is missing; the snapshot has node types {have}")
            self._nodes[entity_type] = pl.read_parquet(path)
        return self._nodes[entity_type]

    def has_nodes(self, entity_type: str) -> bool:
        return (self.dir / "nodes" / f"{entity_type}.parquet").exists()

    def edges(self, relation: str) -> pl.DataFrame | None:
        """graph/edges/<relation>.parquet, or None when the dataset lacks the relation."""
        path = self.dir / "edges" / f"{relation}.parquet"
        return pl.read_parquet(path) if path.exists() else None

    def num_nodes(self, entity_type: str) -> int:
        return int(self.meta.get("nodes", {}).get(entity_type) or self.nodes(entity_type).height)


def load_snapshot(graph_dir: str | Path) -> Snapshot:
    """Open a graph snapshot; a missing or partial one is a user error with the fix."""
    graph_dir = Path(graph_dir)
    meta_path = graph_dir / "meta.json"
    if not meta_path.exists():
        raise InputError(
            f"no graph snapshot at {graph_dir} (meta.json missing); run `hir prepare` in this run dir first, "
            "or point paths.graph_dir at an existing one, e.g. paths.graph_dir=outputs/rees46/default/graph"
        )
    meta = json.loads(meta_path.read_text())
    for key in ("stage_order", "split_bounds"):
        if key not in meta:
            raise InputError(f"{meta_path} has no {key!r}; it predates the snapshot contract, rerun `hir prepare force=true`")
    return Snapshot(dir=graph_dir, meta=meta)
