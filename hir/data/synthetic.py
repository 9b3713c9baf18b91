"""A deterministic synthetic marketplace with a planted interest hierarchy: the spec, the event
stream, and the files on disk (``generate``, cached by ``ensure``).

The world (entities, their planted interests and start times) is drawn by
:mod:`hir.data.synthetic_world`, and named, described and tabulated with its ground truth by
:mod:`hir.data.synthetic_tables`. Users mostly engage with products of their interests,
Zipf-popular within an interest. Product events run down the funnel
``exposure > view > click > cart > purchase`` (each stage a subset of the one before, later in
time); campaign events are exposures and clicks. Late (cold-start) entities only take part
once they exist.

Same spec, same bytes: every random draw comes from a seeded stream per chunk of events, and the
chunk size is fixed, so output never depends on the machine. Events are generated and written
chunk by chunk (row groups of one Parquet file), so memory stays flat at any size.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hir.data.synthetic_tables import entity_tables
from hir.data.synthetic_world import World, build_world
from hir.errors import HirError
from hir.progress import track

log = logging.getLogger(__name__)

# bump when the output of a given spec changes; it is part of the cache key
GENERATOR_VERSION = 2
STAGES = ("exposure", "view", "click", "cart", "purchase")
ENTITY_TYPES = ("product", "campaign")
# events per chunk (one row group); fixed so the output does not depend on the machine
CHUNK_EVENTS = 1 << 20
US_PER_S = 1_000_000
# mean delay (seconds) from the previous stage to this one
STAGE_DELAY_S = {"view": 45.0, "click": 30.0, "cart": 600.0, "purchase": 1800.0}
# engagements outside the user's interests convert this much less often down the funnel
NOISE_CONVERSION = 0.3
# the kinds of bad row `dirty_rows` injects, in turn (names match the adapter's quarantine reasons)
DIRTY_KINDS = (
    "missing_user", "missing_timestamp", "timestamp_out_of_range", "non_finite_value",
    "non_finite_quantity", "unknown_stage", "unknown_entity", "duplicate_row",
)
EVENTS_SCHEMA = pa.schema([
    ("user_id", pa.int64()),
    ("entity_type", pa.dictionary(pa.int8(), pa.string())),
    ("entity_id", pa.int64()),
    ("stage", pa.dictionary(pa.int8(), pa.string())),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("quantity", pa.float64()),
    ("value", pa.float64()),
])


@dataclass
class SyntheticSpec:
    """Every knob of the generator; the cache key is a hash of these (plus GENERATOR_VERSION)."""

    seed: int = 7
    n_events: int = 100_000
    n_users: int = 2_000
    n_products: int = 3_000
    n_advertisers: int = 100
    n_campaigns: int = 300
    n_coarse: int = 8
    n_fine: int = 4
    # at most this many coarse interests per user (1..max, uniformly)
    max_user_interests: int = 3
    # share of engagements with a random interest instead of one of the user's
    noise: float = 0.1
    # popularity exponent of products (by rank) within a fine interest
    zipf: float = 1.1
    # conversion rate of each stage from the stage before it
    conversion: dict[str, float] = field(
        default_factory=lambda: {"view": 0.4, "click": 0.25, "cart": 0.3, "purchase": 0.5}
    )
    # share of all events that are campaign events (exposures + clicks)
    campaign_share: float = 0.1
    campaign_click_rate: float = 0.05
    # share of users, products, advertisers and campaigns that appear only in the last `late_window`
    late_fraction: float = 0.05
    late_window: float = 0.08
    # share of products filed under a random fine category (taxonomies are never perfect)
    category_noise: float = 0.05
    start: str = "2024-01-01"
    days: float = 90.0
    # inject this many bad rows (cycling through DIRTY_KINDS) to exercise the quarantine
    dirty_rows: int = 0

    def __post_init__(self) -> None:
        # one canonical value per setting (YAML's 90 and Python's 90.0 must share a cache key)
        for f in fields(self):
            kind = {"int": int, "float": float, "str": str}.get(str(f.type))
            value = getattr(self, f.name)
            if kind is not None and not isinstance(value, bool):
                try:
                    setattr(self, f.name, kind(value))
                except (TypeError, ValueError):
                    raise HirError(f"synthetic data: {f.name}={value!r} must be of type {kind.__name__}") from None
        problems = []
        for name in ("n_events", "n_users", "n_advertisers", "n_campaigns", "n_coarse", "n_fine", "max_user_interests"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.n_products < self.n_coarse * self.n_fine:
            problems.append(
                f"n_products={self.n_products} must be >= n_coarse*n_fine={self.n_coarse * self.n_fine} "
                "so every fine interest has a product"
            )
        if self.n_advertisers < self.n_coarse:
            problems.append(f"n_advertisers={self.n_advertisers} must be >= n_coarse={self.n_coarse}")
        for name in ("noise", "campaign_share", "campaign_click_rate", "late_fraction", "category_noise"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1]")
        if not 0 < self.late_window < 1:
            problems.append(f"late_window={self.late_window} must be in (0, 1)")
        if self.days <= 0:
            problems.append(f"days={self.days} must be > 0")
        if sorted(self.conversion) != sorted(STAGES[1:]):
            problems.append(f"conversion has stages {sorted(self.conversion)}; expected exactly {list(STAGES[1:])}")
        elif not all(0 <= float(r) <= 1 for r in self.conversion.values()):
            problems.append(f"conversion rates {self.conversion} must be in [0, 1]")
        if self.dirty_rows < 0:
            problems.append(f"dirty_rows={self.dirty_rows} must be >= 0")
        try:
            datetime.fromisoformat(self.start)
        except ValueError:
            problems.append(f"start={self.start!r} is not an ISO date (e.g. 2024-01-01)")
        if problems:
            raise HirError("synthetic data: " + "; ".join(problems))
        self.conversion = {s: float(self.conversion[s]) for s in STAGES[1:]}  # fixed order

    @property
    def period_us(self) -> tuple[int, int]:
        """[start, end) of the period as epoch microseconds (UTC)."""
        start = datetime.fromisoformat(self.start)
        start = start.replace(tzinfo=UTC) if start.tzinfo is None else start
        lo = int(start.timestamp() * US_PER_S)
        return lo, lo + int(timedelta(days=self.days).total_seconds() * US_PER_S)

    def cache_key(self) -> str:
        blob = json.dumps({"version": GENERATOR_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def funnel_counts(n: int, rates: list[float]) -> list[int]:
    """Split ``n`` events over the funnel stages so stage k holds ``rates[k-1]`` of stage k-1.

    Exact: the counts sum to ``n`` and never grow down the funnel.
    """
    ratios = np.cumprod([1.0, *rates])
    base = n / ratios.sum()
    deeper = [int(base * r) for r in ratios[1:]]
    return [n - sum(deeper), *deeper]


def _subset(rng: np.random.Generator, weights: np.ndarray, k: int) -> np.ndarray:
    """``k`` distinct indices drawn without replacement with probability ~ ``weights``
    (Efraimidis-Spirakis keys, O(n))."""
    if k >= len(weights):
        return np.arange(len(weights))
    if k == 0:
        return np.empty(0, dtype=np.int64)
    keys = rng.exponential(size=len(weights)) / weights
    return np.argpartition(keys, k - 1)[:k]


def _later(rng: np.random.Generator, t: np.ndarray, mean_s: float, end: int) -> np.ndarray:
    """Times after ``t`` by an exponential delay; a delay past ``end`` is redrawn uniformly in the
    time left (clipping would stack events on one instant)."""
    delay = (rng.exponential(mean_s, len(t)) * US_PER_S).astype(np.int64)
    room = end - 1 - t
    late = delay > room
    delay[late] = (rng.random(int(late.sum())) * room[late]).astype(np.int64)
    return t + delay


def _product_events(w: World, rng: np.random.Generator, n: int, rates: list[float], noise: float) -> dict:
    """``n`` product events: exposures of users to products of their interests, then the funnel."""
    counts = funnel_counts(n, rates)
    n0 = counts[0]
    users = w.users.sample(rng.random(n0))
    fine = w.user_fine(users, rng.random(n0))
    off = rng.random(n0) < noise
    fine[off] = rng.integers(w.n_fine_total, size=int(off.sum()))
    items = w.products.sample(rng.random(n0), fine)
    lo = np.maximum(w.user_start[users], w.product_start[items])
    ts = lo + (rng.random(n0) * (w.end - lo)).astype(np.int64)
    weight = np.where(off, NOISE_CONVERSION, 1.0)

    rows, stage_ts, stage_code = [np.arange(n0)], [ts], [np.zeros(n0, np.int8)]
    idx, t = np.arange(n0), ts
    for k, (name, size) in enumerate(zip(STAGES[1:], counts[1:]), start=1):
        pick = _subset(rng, weight[idx], size)
        idx = idx[pick]
        t = _later(rng, t[pick], STAGE_DELAY_S[name], w.end)
        rows.append(idx)
        stage_ts.append(t)
        stage_code.append(np.full(size, k, np.int8))
    row = np.concatenate(rows)
    stage = np.concatenate(stage_code)
    purchase = stage == len(STAGES) - 1
    quantity = np.ones(len(row))
    quantity[purchase] += rng.poisson(0.3, int(purchase.sum()))
    value = np.where(purchase, w.price[items[row]] * quantity, 0.0)
    return {
        "user_id": users[row], "entity_type": np.zeros(len(row), np.int8), "entity_id": items[row],
        "stage": stage, "timestamp": np.concatenate(stage_ts), "quantity": quantity, "value": value,
    }


def _campaign_events(w: World, rng: np.random.Generator, n: int, click_rate: float, noise: float) -> dict:
    """``n`` campaign events: exposures of users to campaigns of their coarse interests, some clicked."""
    n_exp = n - round(n * click_rate / (1 + click_rate))
    users = np.empty(0, np.int64)
    camps = np.empty(0, np.int64)
    ts = np.empty(0, np.int64)
    off_all = np.empty(0, bool)
    # a user may join after a campaign ended: redraw those pairs (rejection keeps the rest unbiased)
    for _ in range(1000):
        if len(users) >= n_exp:
            break
        m = n_exp - len(users)
        u = w.users.sample(rng.random(m))
        coarse = w.user_fine(u, rng.random(m)) // w.n_fine
        off = rng.random(m) < noise
        coarse[off] = rng.integers(w.n_coarse, size=int(off.sum()))
        c = w.campaigns.sample(rng.random(m), coarse)
        lo = np.maximum(w.user_start[u], w.campaign_start[c])
        hi = w.campaign_end[c]
        ok = lo < hi
        t = lo[ok] + (rng.random(int(ok.sum())) * (hi[ok] - lo[ok])).astype(np.int64)
        users, camps, ts = np.concatenate([users, u[ok]]), np.concatenate([camps, c[ok]]), np.concatenate([ts, t])
        off_all = np.concatenate([off_all, off[ok]])
    if len(users) < n_exp:
        raise HirError(
            "synthetic data: almost no user is present while any campaign runs; lower late_fraction "
            "or raise late_window"
        )
    clicks = _subset(rng, np.where(off_all, NOISE_CONVERSION, 1.0), n - n_exp)
    click_ts = _later(rng, ts[clicks], STAGE_DELAY_S["click"], w.end)
    row = np.concatenate([np.arange(n_exp), clicks])
    return {
        "user_id": users[row], "entity_type": np.ones(len(row), np.int8), "entity_id": camps[row],
        "stage": np.concatenate([np.zeros(n_exp, np.int8), np.full(len(clicks), STAGES.index("click"), np.int8)]),
        "timestamp": np.concatenate([ts, click_ts]), "quantity": np.ones(len(row)), "value": np.zeros(len(row)),
    }


def _to_table(cols: dict, null_users: np.ndarray | None = None, null_ts: np.ndarray | None = None,
               stages: tuple[str, ...] = STAGES) -> pa.Table:
    return pa.table({
        "user_id": pa.array(cols["user_id"], pa.int64(), mask=null_users),
        "entity_type": pa.DictionaryArray.from_arrays(pa.array(cols["entity_type"], pa.int8()), list(ENTITY_TYPES)),
        "entity_id": pa.array(cols["entity_id"], pa.int64()),
        "stage": pa.DictionaryArray.from_arrays(pa.array(cols["stage"], pa.int8()), list(stages)),
        "timestamp": pa.array(cols["timestamp"], pa.int64(), mask=null_ts).cast(pa.timestamp("us", tz="UTC")),
        "quantity": pa.array(cols["quantity"], pa.float64()),
        "value": pa.array(cols["value"], pa.float64()),
    }, schema=EVENTS_SCHEMA)


def events_chunk(spec: SyntheticSpec, w: World, index: int, n: int) -> dict[str, np.ndarray]:
    """Chunk ``index`` of the event stream (``n`` events) as numpy columns.

    Rows are grouped by entity type and stage, not ordered by time (nothing downstream assumes
    an order, and sorting would double the generation time)."""
    rng = np.random.default_rng([spec.seed, 1, index])
    n_camp = round(n * spec.campaign_share) if w.n_campaigns else 0
    parts = [_product_events(w, rng, n - n_camp, list(spec.conversion.values()), spec.noise)]
    if n_camp:
        parts.append(_campaign_events(w, rng, n_camp, spec.campaign_click_rate, spec.noise))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _dirty_table(spec: SyntheticSpec, w: World, base: dict[str, np.ndarray]) -> tuple[pa.Table, dict[str, int]]:
    """``spec.dirty_rows`` bad rows, each a copy of one distinct row of the first chunk with one
    defect (so each has exactly one quarantine reason)."""
    n = min(spec.dirty_rows, len(base["user_id"]))
    cols = {k: v[:n].copy() for k, v in base.items()}
    kind = np.arange(n) % len(DIRTY_KINDS)
    null_users = kind == DIRTY_KINDS.index("missing_user")
    null_ts = kind == DIRTY_KINDS.index("missing_timestamp")
    cols["timestamp"][kind == DIRTY_KINDS.index("timestamp_out_of_range")] = w.start - 366 * 86_400 * US_PER_S
    cols["value"][kind == DIRTY_KINDS.index("non_finite_value")] = np.nan
    cols["quantity"][kind == DIRTY_KINDS.index("non_finite_quantity")] = np.inf
    cols["stage"][kind == DIRTY_KINDS.index("unknown_stage")] = len(STAGES)
    unknown = kind == DIRTY_KINDS.index("unknown_entity")
    cols["entity_type"][unknown] = 0
    cols["entity_id"][unknown] = w.n_products + np.arange(int(unknown.sum()))
    counts = {k: int((kind == i).sum()) for i, k in enumerate(DIRTY_KINDS) if (kind == i).any()}
    return _to_table(cols, null_users, null_ts, (*STAGES, "bogus")), counts


def generate(spec: SyntheticSpec, out_dir: Path | str) -> dict[str, Any]:
    """Write the dataset to ``out_dir`` (created) and return its manifest.

    Files: ``events.parquet`` (user_id i64, entity_type, entity_id i64, stage, timestamp
    Datetime(us, UTC), quantity f64, value f64), ``users``/``products``/``advertisers``/
    ``campaigns``/``categories``/``promotions.parquet`` (entity metadata, Int64 keys),
    ``truth.parquet`` (entity_type, key as text, coarse, fine, weight, late),
    ``user_interests.parquet`` (key as text, coarse, fine, weight: each user's full mixture),
    ``interests.parquet`` (fine -> coarse, with names) and ``manifest.json``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    world = build_world(spec)
    for name, table in entity_tables(spec, world).items():
        table.write_parquet(out / f"{name}.parquet")
    t_world = time.perf_counter() - t0

    t0 = time.perf_counter()
    sizes = [CHUNK_EVENTS] * (spec.n_events // CHUNK_EVENTS)
    if spec.n_events % CHUNK_EVENTS:
        sizes.append(spec.n_events % CHUNK_EVENTS)
    dirty: dict[str, int] = {}
    stage_counts = np.zeros(len(STAGES), np.int64)
    # one writer thread: numpy (generation) and Arrow (encoding) both release the GIL, so the
    # next chunk is drawn while the last one is written
    with pq.ParquetWriter(out / "events.parquet", EVENTS_SCHEMA, compression="lz4", store_schema=False) as writer, \
            ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for i, n in enumerate(track(sizes, "synthetic events (chunks)")):
            cols = events_chunk(spec, world, i, n)
            stage_counts += np.bincount(cols["stage"], minlength=len(STAGES))
            table = _to_table(cols)
            if pending is not None:
                pending.result()
            pending = pool.submit(writer.write_table, table, row_group_size=n)
            if i == 0 and spec.dirty_rows:
                bad, dirty = _dirty_table(spec, world, cols)
        if pending is not None:
            pending.result()
        if spec.dirty_rows:
            writer.write_table(bad)
    t_events = time.perf_counter() - t0
    manifest = {
        "generator_version": GENERATOR_VERSION,
        "spec": asdict(spec),
        "events": spec.n_events,
        "dirty_rows": dirty,
        "stages": {s: int(c) for s, c in zip(STAGES, stage_counts)},
        "entities": world.counts(),
        "late": world.late_counts(),
        "period": {"start": world.start, "end": world.end},
        "seconds": {"world": round(t_world, 3), "events": round(t_events, 3)},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def ensure(spec: SyntheticSpec, cache_root: Path | str) -> Path:
    """The dataset of ``spec`` under ``cache_root/<spec hash>/``, generated once.

    Generation writes a temporary sibling directory and renames it into place, so a crashed or
    concurrent run never leaves a half-written dataset that looks complete.
    """
    final = Path(cache_root) / spec.cache_key()
    if (final / "manifest.json").exists():
        log.info("synthetic data: reusing %s", final)
        return final
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    generate(spec, tmp)
    try:
        os.replace(tmp, final)
    except OSError:
        # another process finished the same spec first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("synthetic data: generated %d events in %.1fs at %s", spec.n_events, time.perf_counter() - t0, final)
    return final
