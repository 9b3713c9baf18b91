"""The synthetic marketplace's event stream, chunk by chunk.

Users mostly engage with products of their interests, Zipf-popular within an interest. Product
events run down the funnel ``exposure > view > click > cart > purchase`` (each stage a subset of
the one before, later in time); campaign events are exposures and clicks. Late (cold-start)
entities only take part once they exist. Chunk ``index`` is drawn from its own seeded stream
(``[seed, 1, index]``), so a chunk never depends on the machine or on the chunks before it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from hir.data.synthetic.spec import ENTITY_TYPES, STAGES, US_PER_S, SyntheticSpec
from hir.data.synthetic.world import World
from hir.errors import HirError

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


def to_table(cols: dict[str, np.ndarray], null_users: np.ndarray | None = None, null_ts: np.ndarray | None = None,
             stages: tuple[str, ...] = STAGES) -> pa.Table:
    """Numpy columns (as :func:`events_chunk` returns them; ``entity_type`` and ``stage`` as int8
    codes into ``ENTITY_TYPES`` and ``stages``) as an Arrow table of ``EVENTS_SCHEMA``; the masks
    null those rows' user or timestamp."""
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


def dirty_table(spec: SyntheticSpec, w: World, base: dict[str, np.ndarray]) -> tuple[pa.Table, dict[str, int]]:
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
    return to_table(cols, null_users, null_ts, (*STAGES, "bogus")), counts
