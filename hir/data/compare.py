"""Compare two graph snapshots (e.g. the Polars and the Spark engine's) table by table."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from hir.data.snapshot import EVENTS_FILE, Snapshot, load_snapshot

# meta.json keys that describe the data (not the run: timings, engine, created)
META_COUNTS = (
    "input_rows", "kept_rows", "quarantined_rows", "events", "nodes", "edges", "stages", "splits",
    "stages_per_split", "split_bounds", "split", "cold_start", "category_levels", "stage_order", "deep_stage",
)


def table_difference(a: pl.DataFrame, b: pl.DataFrame, rel_tol: float = 1e-9) -> str | None:
    """None when the tables hold the same rows (order ignored; Float64 columns equal within
    ``rel_tol``, since sums of event values depend on the order they are added in), else why not."""
    if a.schema != b.schema:
        return f"schema {dict(a.schema)} != {dict(b.schema)}"
    if a.height != b.height:
        return f"{a.height} rows != {b.height} rows"
    floats = [c for c, t in a.schema.items() if t == pl.Float64]
    exact = [c for c in a.columns if c not in floats]
    a, b = a.sort(exact + floats, nulls_last=True), b.sort(exact + floats, nulls_last=True)
    if not a.select(exact).equals(b.select(exact)):
        return f"rows differ in columns {exact}"
    for c in floats:
        bad = ((a[c] - b[c]).abs() > rel_tol * (1 + b[c].abs())).sum()
        if bad:
            return f"{bad} values of {c} differ by more than {rel_tol} (relative)"
    return None


def _tables(snap: Snapshot) -> dict[str, Path]:
    """``{"nodes/<type>.parquet" | "edges/<rel>.parquet": file}`` of the tables ``snap`` has,
    node tables first, each kind in file-name order."""
    files = [*map(snap.node_path, snap.node_types()), *map(snap.edge_path, snap.relations())]
    return {p.relative_to(snap.dir).as_posix(): p for p in files}


def snapshot_differences(a: Path | str, b: Path | str, events: bool = True) -> list[str]:
    """What differs between two ``graph/`` directories: the data keys of meta.json, every node and
    edge table (sorted), and ``events.parquet`` unless ``events`` is false. Empty when equal."""
    sa, sb = load_snapshot(a), load_snapshot(b)
    ma, mb = sa.meta, sb.meta
    out = [f"meta.json {k}: {ma.get(k)!r} != {mb.get(k)!r}" for k in META_COUNTS if ma.get(k) != mb.get(k)]
    ta, tb = _tables(sa), _tables(sb)
    if list(ta) != list(tb):
        out.append(f"tables {list(ta)} != {list(tb)}")
    pairs = [(name, path, tb.get(name)) for name, path in ta.items()]
    if events:
        pairs.append((EVENTS_FILE, sa.events_path, sb.events_path))
    for name, path_a, path_b in pairs:
        if path_b is not None and path_b.exists():
            why = table_difference(pl.read_parquet(path_a), pl.read_parquet(path_b))
            if why:
                out.append(f"{name}: {why}")
    return out
