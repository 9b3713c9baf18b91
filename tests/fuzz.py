"""Seeded fuzzers for the files an operator hands hir: Parquet event files (`hir prepare
data=events_csv`, the generic adapter) and `hir refresh` deltas (CSV and Parquet).

A case starts from a small valid file and applies one to three seeded mutations: truncation,
flipped bytes, wrong column types, NUL bytes, byte-order marks, huge cells, shuffled or
duplicated headers, dropped columns, nulls, odd numbers, empty and header-only files. The
checker runs the real reader on it and classifies the outcome:

- ``refused``: an :class:`~hir.errors.HirError` whose message is one line;
- ``kept``: the file was read and every row is accounted for (events: input rows = kept +
  quarantined, every quarantined row with a reason; a delta: every data row is in the result);
- ``fault``: anything else: another exception (a traceback for the operator), a multi-line
  message, or rows lost. A fault is a bug.

tests/data/test_fuzz_events.py and tests/publish/test_fuzz_delta.py run a few cases by default
and 1,000 with ``-m slow``; benchmarks/faults.py runs the full counts into faults.json.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# table mutations (column-level), then byte mutations (applied to the written file)
TABLE_MUTATIONS = ("wrong_type", "nul", "bom", "huge_cell", "shuffle_header", "duplicate_header", "drop_column",
                   "nulls", "odd_numbers", "header_only", "unicode")
BYTE_MUTATIONS = ("truncate", "flip_bytes", "empty", "csv_bom")
HUGE = 1 << 20  # a 1 MiB cell


@dataclass
class Case:
    """One fuzzed file: ``rows`` data rows were written (None when bytes were cut or flipped)."""

    seed: int
    path: Path
    mutations: list[str]
    rows: int | None


@dataclass
class Outcome:
    case: Case
    kind: str  # refused | kept | fault
    message: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"seed": self.case.seed, "file": self.case.path.name, "mutations": self.case.mutations,
                "outcome": self.kind, "message": self.message[:400], **self.detail}


def _cell_mutation(rng: random.Random, table: pa.Table, column: str, fn: Callable[[Any], Any]) -> pa.Table:
    """``table`` with ``fn`` applied to a few random non-null cells of string ``column``."""
    values = table[column].to_pylist()
    for i in rng.sample(range(len(values)), k=min(len(values), rng.randint(1, 3))):
        if values[i] is not None:
            values[i] = fn(str(values[i]))
    return table.set_column(table.column_names.index(column), column, pa.array(values, pa.string()))


def _wrong_type(rng: random.Random, table: pa.Table, i: int) -> pa.Table:
    n = table.num_rows
    kind = rng.choice(["float", "bool", "int", "list", "struct", "binary", "date", "ts_ns", "null", "decimal",
                       "dictionary", "big_int"])
    arrays = {
        "float": lambda: pa.array([rng.uniform(-1e12, 1e12) for _ in range(n)]),
        "bool": lambda: pa.array([rng.random() < 0.5 for _ in range(n)]),
        "int": lambda: pa.array([rng.randint(-5, 10**6) for _ in range(n)]),
        "list": lambda: pa.array([[rng.randint(0, 9)] * rng.randint(0, 3) for _ in range(n)]),
        "struct": lambda: pa.array([{"a": rng.randint(0, 9), "b": "x"} for _ in range(n)]),
        "binary": lambda: pa.array([bytes(rng.getrandbits(8) for _ in range(4)) for _ in range(n)], pa.binary()),
        "date": lambda: pa.array([rng.randint(-40000, 40000) for _ in range(n)], pa.date32()),
        "ts_ns": lambda: pa.array([rng.randint(-(2**62), 2**62) for _ in range(n)], pa.timestamp("ns")),
        "null": lambda: pa.nulls(n),
        "decimal": lambda: pa.array([rng.randint(0, 10**9) for _ in range(n)], pa.int64()).cast(pa.decimal128(22, 3)),
        "dictionary": lambda: pa.array([rng.choice(["a", "b", "pv"]) for _ in range(n)]).dictionary_encode(),
        "big_int": lambda: pa.array([rng.choice([2**63 - 1, -(2**63), 0]) for _ in range(n)], pa.int64()),
    }
    return table.set_column(i, table.column_names[i], arrays[kind]())


def mutate_table(rng: random.Random, table: pa.Table, name: str, string_columns: list[str]) -> pa.Table:
    """One column-level mutation ``name`` of ``table``."""
    cols = table.column_names
    if name == "wrong_type":
        return _wrong_type(rng, table, rng.randrange(len(cols)))
    if name == "nul":
        return _cell_mutation(rng, table, rng.choice(string_columns),
                              lambda v: v[: len(v) // 2] + "\x00" + v[len(v) // 2:])
    if name == "bom":  # a BOM on the first header (how Excel writes UTF-8) or in cells
        if rng.random() < 0.5:
            return table.rename_columns(["\ufeff" + cols[0], *cols[1:]])
        return _cell_mutation(rng, table, rng.choice(string_columns), lambda v: "\ufeff" + v)
    if name == "huge_cell":
        return _cell_mutation(rng, table, rng.choice(string_columns), lambda v: v + "x" * HUGE)
    if name == "shuffle_header":  # the columns in another order (names stay with their data)
        order = list(range(len(cols)))
        rng.shuffle(order)
        return table.select(order)
    if name == "duplicate_header":
        i, j = rng.sample(range(len(cols)), 2)
        return table.rename_columns([cols[j] if k == i else c for k, c in enumerate(cols)])
    if name == "drop_column":
        return table.remove_column(rng.randrange(len(cols)))
    if name == "nulls":
        c = rng.randrange(len(cols))
        values = table.column(c).to_pylist()
        for i in rng.sample(range(len(values)), k=max(1, len(values) // rng.randint(1, 4))) if values else []:
            values[i] = None
        return table.set_column(c, cols[c], pa.array(values, table.schema.field(c).type))
    if name == "odd_numbers":  # numbers as text: NaN, inf, negative, huge, empty, words
        c = rng.randrange(len(cols))
        odd = ["nan", "inf", "-inf", "-1", "1e400", "", " ", "0x1F", "1,5", "NULL", "-0", "9" * 40]
        values = [rng.choice(odd) if rng.random() < 0.3 else (None if v is None else str(v))
                  for v in table.column(c).to_pylist()]
        return table.set_column(c, cols[c], pa.array(values, pa.string()))
    if name == "header_only":
        return table.slice(0, 0)
    if name == "unicode":  # right-to-left marks, emoji, combining characters, line breaks in cells
        odd = ["\u202e", "😀", "e\u0301", "\n", "\r\n", '"', ",", "\t", "\u2028"]
        return _cell_mutation(rng, table, rng.choice(string_columns), lambda v: v + rng.choice(odd))
    raise ValueError(f"unknown table mutation {name!r}; expected one of {TABLE_MUTATIONS}")


def mutate_bytes(rng: random.Random, path: Path, name: str) -> None:
    """One byte-level mutation ``name`` of the written file."""
    data = path.read_bytes()
    if name == "truncate":
        path.write_bytes(data[: rng.randint(0, max(len(data) - 1, 0))])
    elif name == "flip_bytes":
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            if buf:
                buf[rng.randrange(len(buf))] = rng.getrandbits(8)
        path.write_bytes(bytes(buf))
    elif name == "empty":
        path.write_bytes(b"")
    elif name == "csv_bom":
        path.write_bytes(b"\xef\xbb\xbf" + data)
    else:
        raise ValueError(f"unknown byte mutation {name!r}; expected one of {BYTE_MUTATIONS}")


def write(table: pa.Table, path: Path) -> None:
    """``table`` as Parquet or CSV by ``path``'s suffix (CSV through pyarrow: every cell as text)."""
    if path.suffix == ".parquet":
        pq.write_table(table, path)
        return
    import pyarrow.csv as pacsv

    plain = table.cast(pa.schema([pa.field(f.name, pa.string()) for f in table.schema]), safe=False) \
        if all(pa.types.is_string(f.type) or pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
               or pa.types.is_boolean(f.type) or pa.types.is_null(f.type) for f in table.schema) else None
    if plain is None:  # nested or binary columns: write their text form
        plain = pa.table({f"c{i}": pa.array([None if v is None else str(v) for v in table.column(i).to_pylist()],
                                            pa.string()) for i in range(table.num_columns)})
        plain = plain.rename_columns(table.column_names)
    pacsv.write_csv(plain, path)


def make_case(rng_seed: int, base: pa.Table, path: Path, string_columns: list[str], csv: bool = False) -> Case:
    """A fuzzed file at ``path`` from ``base``: 1-3 mutations, at most one of them byte-level."""
    rng = random.Random(rng_seed)
    pool_bytes = [m for m in BYTE_MUTATIONS if csv or m != "csv_bom"]
    names = rng.sample(TABLE_MUTATIONS, k=rng.randint(1, 2))
    byte = rng.choice(pool_bytes) if rng.random() < 0.3 else None
    table = base
    for name in names:
        unique = [f.name for f in table.schema if pa.types.is_string(f.type) and table.column_names.count(f.name) == 1]
        live_strings = [c for c in string_columns if c in unique] or unique
        if name in ("nul", "bom", "huge_cell", "unicode") and not live_strings:
            continue
        table = mutate_table(rng, table, name, live_strings)
    write(table, path)
    if byte:
        mutate_bytes(rng, path, byte)
    rows = None if byte in ("truncate", "flip_bytes") else (0 if byte == "empty" else table.num_rows)
    return Case(rng_seed, path, [*names, *([byte] if byte else [])], rows)


def classify(case: Case, run: Callable[[Path], int]) -> Outcome:
    """Run ``run(path) -> rows accounted for`` on the case: one-line user error, every row
    accounted for, or a fault."""
    from hir.errors import HirError

    try:
        accounted = run(case.path)
    except HirError as err:
        msg = str(err)
        if "\n" in msg.strip():
            return Outcome(case, "fault", msg, {"why": "multi-line message"})
        return Outcome(case, "refused", msg)
    except Exception as err:
        tb = traceback.format_exception(err)
        return Outcome(case, "fault", f"{type(err).__name__}: {err}", {"why": "traceback", "where": tb[-2][-300:]})
    if case.rows is not None and accounted != case.rows:
        return Outcome(case, "fault", f"{case.rows} rows written, {accounted} accounted for", {"why": "rows lost"})
    return Outcome(case, "kept", "", {"rows": accounted})


# --- Parquet event files (the generic adapter) ------------------------------------------------

EVENT_COLUMNS = {"user": "uid", "item": "iid", "stage": "behavior", "timestamp": "ts", "quantity": "qty"}
EVENT_STAGES = {"pv": "view", "fav": "save", "cart": "cart", "buy": "purchase"}


def event_table(rng: random.Random, n: int = 40) -> pa.Table:
    """A valid event table: users, items, behaviours and epoch-second times."""
    return pa.table({
        "uid": [f"u{rng.randint(0, 12)}" for _ in range(n)],
        "iid": [f"i{rng.randint(0, 20)}" for _ in range(n)],
        "behavior": [rng.choice(list(EVENT_STAGES)) for _ in range(n)],
        "ts": [1_570_000_000 + rng.randint(0, 90 * 86400) for _ in range(n)],
        "qty": [rng.randint(1, 4) for _ in range(n)],
    })


def event_case(seed: int, out_dir: Path) -> Case:
    rng = random.Random(seed)
    return make_case(seed, event_table(rng), out_dir / f"events_{seed}.parquet", ["uid", "iid", "behavior"])


def run_events(path: Path, work: Path) -> int:
    """`hir prepare data=events_csv` on ``path`` (the adapter and the snapshot build); returns
    input rows when every one is kept or quarantined with a reason."""
    import shutil

    import polars as pl

    from hir.data.adapters import events_csv
    from hir.data.prepare import build_snapshot
    from hir.data.raw import Quarantine
    from hir.data.split import SplitSpec

    shutil.rmtree(work, ignore_errors=True)
    q = Quarantine(work / "graph" / "quarantine")
    raw = events_csv.load(q, str(path), columns=dict(EVENT_COLUMNS), stages=dict(EVENT_STAGES))
    meta = build_snapshot(raw, q, work / "graph", "fuzz", SplitSpec(val_fraction=0.2, test_fraction=0.2))
    if meta["input_rows"] != meta["kept_rows"] + meta["quarantined_rows"]:
        raise AssertionError(f"rows lost: {meta['input_rows']} in, {meta['kept_rows']} kept, "
                             f"{meta['quarantined_rows']} quarantined")
    reasons = 0
    for f in (work / "graph" / "quarantine").rglob("*.parquet"):
        qf = pl.read_parquet(f)
        if "reason" in qf.columns and qf["reason"].null_count():
            raise AssertionError(f"{f}: quarantined rows without a reason")
        reasons += qf.height
    if meta["quarantined_rows"] and reasons < meta["quarantined_rows"]:
        raise AssertionError(f"{meta['quarantined_rows']} quarantined but {reasons} rows with reasons in {work}")
    return int(meta["input_rows"])


# --- refresh deltas (CSV and Parquet) ---------------------------------------------------------

def delta_table(rng: random.Random, snap: Any, n: int = 12) -> pa.Table:
    """A valid delta of new products: entity_id, text, a category link, a timestamp and the
    snapshot's product attributes (numbers as numbers)."""
    cats = snap.keys("category").to_list() if snap.has_nodes("category") else []
    cols: dict[str, Any] = {
        "entity_id": [f"new{rng.randint(0, 10**6)}" for _ in range(n)],
        "entity_type": ["product"] * n,
        "text": [f"product {rng.randint(0, 999)} {rng.choice(['red', 'blue', 'wool'])}" for _ in range(n)],
        "timestamp": [f"2026-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T10:00:00Z" for _ in range(n)],
    }
    if cats:
        cols["category"] = [rng.choice(cats) for _ in range(n)]
    for col, dtype in snap.node_schema("product").items():
        if col.startswith("attr_"):
            cols[col] = [rng.uniform(1, 100) for _ in range(n)] if dtype.is_numeric() else \
                [rng.choice(["a", "b", "c"]) for _ in range(n)]
    # one entity per row, unique keys
    cols["entity_id"] = [f"new{seed_i}_{k}" for k, seed_i in enumerate(cols["entity_id"])]
    return pa.table(cols)


def delta_case(seed: int, out_dir: Path, snap: Any) -> Case:
    rng = random.Random(seed)
    suffix = ".csv" if seed % 2 else ".parquet"
    return make_case(seed, delta_table(rng, snap), out_dir / f"delta_{seed}{suffix}",
                     ["entity_id", "text", "entity_type", "timestamp"], csv=suffix == ".csv")


def run_delta(path: Path, snap: Any) -> int:
    """`hir refresh`'s reading and checking of ``path`` against ``snap``; returns the data rows
    in the result when every row of the file is in it."""
    from hir.publish.delta import read_delta

    types = ["user", "product", "advertiser", "campaign", "category"]
    delta = read_delta(path, "product", [t for t in types if snap.has_nodes(t)], snap)
    in_entities = sum(int(f["_row"].len()) for f in delta.entities.values())
    keys = {k for f in delta.entities.values() for k in f["key"].to_list()}
    if delta.rows and not keys:
        raise AssertionError(f"{delta.rows} rows read, no entity kept")
    if in_entities > delta.rows:
        raise AssertionError(f"{in_entities} entities from {delta.rows} rows")
    return int(delta.rows)
