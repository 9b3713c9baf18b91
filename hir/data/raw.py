"""What an adapter hands to the snapshot builder, and the quarantine that counts every row."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from hir.data.quality import REASON, ROW


@dataclass
class SourceReport:
    """Row accounting of one input file or table: input = kept + quarantined."""

    name: str
    path: str
    input_rows: int
    kept_rows: int
    quarantined_rows: int
    reasons: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "input_rows": self.input_rows,
            "kept_rows": self.kept_rows,
            "quarantined_rows": self.quarantined_rows,
            "quarantine": self.reasons,
        }


class Quarantine:
    """Splits a validated source into kept rows and quarantined rows, writes the latter to
    ``<out_dir>/<name>.parquet`` (raw values as text, ``_row``, ``_source``, ``_reason``) and
    keeps a :class:`SourceReport` per source."""

    def __init__(self, out_dir: Path | str) -> None:
        self.out_dir = Path(out_dir)
        self.events: dict[str, SourceReport] = {}
        self.entities: dict[str, SourceReport] = {}

    def split(
        self,
        name: str,
        path: Path | str,
        frame: pl.DataFrame | pl.LazyFrame,
        raw_columns: list[str],
        keep: list[str],
        kind: str = "events",
    ) -> pl.DataFrame | pl.LazyFrame:
        """Return the rows whose ``_reason`` is null, restricted to ``keep`` columns.

        Args:
            name: source name (quarantine file stem and key in meta.json).
            path: where the rows came from (file or package table), for the report.
            frame: rows with a ``_reason`` column (see :func:`hir.data.quality.with_reason`).
            raw_columns: the source's own columns, written as text for quarantined rows.
            keep: columns of the kept rows handed on.
            kind: ``events`` (counted in input/kept/quarantined rows) or ``entities``.
        """
        lazy = frame.lazy()
        if ROW not in lazy.collect_schema().names():
            lazy = lazy.with_row_index(ROW, offset=1)
        bad = lazy.filter(pl.col(REASON).is_not_null()).select(
            *[pl.col(c).cast(pl.String) for c in raw_columns],
            pl.col(ROW),
            pl.lit(str(path)).alias("_source"),
            pl.col(REASON),
        )
        counts = lazy.group_by(pl.col(REASON)).agg(pl.len().alias("n")).collect()
        reasons = {r: int(n) for r, n in counts.iter_rows() if r is not None}
        total = int(counts["n"].sum())
        n_bad = sum(reasons.values())
        if n_bad:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            bad.collect().write_parquet(self.out_dir / f"{name}.parquet")
        report = SourceReport(name, str(path), total, total - n_bad, n_bad, dict(Counter(reasons).most_common()))
        (self.events if kind == "events" else self.entities)[name] = report
        kept = lazy.filter(pl.col(REASON).is_null()).select(keep)
        return kept if isinstance(frame, pl.LazyFrame) else kept.collect()

    def totals(self) -> dict[str, int]:
        reps = self.events.values()
        return {
            "input_rows": sum(r.input_rows for r in reps),
            "kept_rows": sum(r.kept_rows for r in reps),
            "quarantined_rows": sum(r.quarantined_rows for r in reps),
        }

    def summary(self) -> str:
        lines = []
        for r in [*self.events.values(), *self.entities.values()]:
            if r.quarantined_rows:
                lines.append(f"{r.name}: {r.quarantined_rows}/{r.input_rows} rows quarantined {json.dumps(r.reasons)}")
        return "\n".join(lines)


@dataclass
class RawDataset:
    """A dataset in canonical form, keys still in the dataset's own key space.

    Attributes:
        events: kept events with columns user_key, entity_key, entity_type, stage, timestamp
            (Datetime us UTC), quantity, value (Float64), session (String, nullable). Keys are
            String or Int64, the same dtype for every entity type of one dataset.
        stage_order: funnel stages, shallowest first; the last is the deep-funnel label.
        entities: entity type -> frame with ``key`` (same dtype as the event keys), ``text``
            (String, nullable) and ``attr_*`` columns.
        relations: metadata relation name (see ``hir.data.schema.METADATA_RELATIONS``) -> frame
            with ``src_key``, ``dst_key``.
        derived_events: name -> number of events the adapter derived (not read) from inputs.
        artifacts: extra files copied into graph/ (e.g. the synthetic ground truth).
    """

    events: pl.LazyFrame
    stage_order: list[str]
    entities: dict[str, pl.DataFrame] = field(default_factory=dict)
    relations: dict[str, pl.DataFrame] = field(default_factory=dict)
    derived_events: dict[str, int] = field(default_factory=dict)
    artifacts: dict[str, Path] = field(default_factory=dict)
