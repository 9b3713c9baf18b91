"""What an adapter hands to the snapshot builder, and the quarantine that counts every row."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from hir.data.quality import REASON, ROW


def file_stamp(path: str) -> dict[str, int]:
    """``{"bytes", "mtime_ns"}`` of a source that is a file (empty otherwise): what `hir prepare`
    compares, on reusing a snapshot, to tell a source file changed since (no hash: a stat is free,
    a multi-GB file's hash is not)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return {}
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns} if stat.S_ISREG(st.st_mode) else {}


def changed_sources(meta: dict[str, Any]) -> list[str]:
    """``path (what changed)`` for every source file of a snapshot's meta.json (``sources`` and
    ``entity_sources``) whose size or modification time differ from the ones recorded, or that is
    gone; a source recorded without a stamp (an older hir, a table that is not a file) is skipped."""
    out = []
    for group in ("sources", "entity_sources"):
        for record in (meta.get(group) or {}).values():
            if "bytes" not in record:
                continue
            now = file_stamp(record["path"])
            if not now:
                out.append(f"{record['path']} (gone)")
            elif now["bytes"] != record["bytes"]:
                out.append(f"{record['path']} ({record['bytes']} -> {now['bytes']} bytes)")
            elif now["mtime_ns"] != record["mtime_ns"]:
                out.append(f"{record['path']} (modified since)")
    return out


@dataclass
class SourceReport:
    """Row accounting of one input file or table: input = kept + quarantined."""

    name: str
    path: str
    input_rows: int
    kept_rows: int
    quarantined_rows: int
    reasons: dict[str, int]
    # reason -> {"column": the source column the check read, "values": a few raw values}
    examples: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {
            "path": self.path,
            "input_rows": self.input_rows,
            "kept_rows": self.kept_rows,
            "quarantined_rows": self.quarantined_rows,
            "quarantine": self.reasons,
        }
        if self.examples:
            out["examples"] = self.examples
        out |= file_stamp(self.path)
        return out

    def describe(self, top: int = 3) -> str:
        """The top quarantine reasons with counts, the column and a few raw values, e.g.
        ``120 unparseable timestamp in column 'ts' (values like '3', '7')``."""
        parts = []
        for reason, n in list(self.reasons.items())[:top]:
            text = f"{n} {reason.replace('_', ' ')}"
            ex = self.examples.get(reason)
            if ex:
                text += f" in column {ex['column']!r}"
                if ex["values"]:
                    text += f" (values like {', '.join(repr(v) for v in ex['values'])})"
            parts.append(text)
        if len(self.reasons) > top:
            parts.append(f"{sum(list(self.reasons.values())[top:])} for {len(self.reasons) - top} other reasons")
        return "; ".join(parts)


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
        reason_columns: Mapping[str, str] | None = None,
    ) -> pl.DataFrame | pl.LazyFrame:
        """Return the rows whose ``_reason`` is null, restricted to ``keep`` columns.

        Args:
            name: source name (quarantine file stem and key in meta.json).
            path: where the rows came from (file or package table), for the report.
            frame: rows with a ``_reason`` column (see :func:`hir.data.quality.with_reason`).
            raw_columns: the source's own columns, written as text for quarantined rows.
            keep: columns of the kept rows handed on.
            kind: ``events`` (counted in input/kept/quarantined rows) or ``entities``.
            reason_columns: reason -> the raw column its check reads; the report keeps a few
                of that column's values per reason, for messages (see :meth:`SourceReport.describe`).
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
        examples: dict[str, dict[str, Any]] = {}
        if n_bad:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            rows = bad.collect()
            rows.write_parquet(self.out_dir / f"{name}.parquet")
            for reason, column in (reason_columns or {}).items():
                if reason in reasons and column in rows.columns:
                    values = rows.filter(pl.col(REASON) == reason)[column].unique(maintain_order=True).head(3)
                    examples[reason] = {"column": column, "values": values.to_list()}
        report = SourceReport(
            name, str(path), total, total - n_bad, n_bad, dict(Counter(reasons).most_common()), examples
        )
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

    def empty_message(self, dataset: str) -> str:
        """Why no event row survived: per event source, its file, its row count and the top
        quarantine reasons with the column and example values."""
        lines = []
        for r in self.events.values():
            if r.kept_rows:
                continue
            if r.input_rows == 0:
                lines.append(f"{r.path} has no rows")
            else:
                lines.append(f"{r.path}: all {r.input_rows} rows quarantined: {r.describe()}")
        detail = "; ".join(lines) if lines else "the adapter produced no events"
        return (
            f"{dataset}: no event rows survived validation. {detail}. Are the columns mapped right "
            f"(data.columns.*, data.timestamp_format)? The quarantined rows are in {self.out_dir}"
        )

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
        has_timestamps: false when the source has no event times (``timestamp`` is null on every
            row): the split is then a seeded random split of the (user, entity) pairs and the
            times are synthesized (:mod:`hir.data.split`).
        heldout: events of a shipped test file (same columns as ``events``), the test split
            exactly as given; None when the split is carved from ``events`` alone.
        sources: names of the (train, held-out) event files, for messages.
    """

    events: pl.LazyFrame
    stage_order: list[str]
    entities: dict[str, pl.DataFrame] = field(default_factory=dict)
    relations: dict[str, pl.DataFrame] = field(default_factory=dict)
    derived_events: dict[str, int] = field(default_factory=dict)
    artifacts: dict[str, Path] = field(default_factory=dict)
    has_timestamps: bool = True
    heldout: pl.LazyFrame | None = None
    sources: tuple[str, str] = ("events", "heldout test events")
