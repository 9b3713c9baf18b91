"""The synthetic marketplace's spec: every knob of the generator, checked, and its cache key.

A spec fixes the dataset: the world (:mod:`hir.data.synthetic.world`), its tables
(:mod:`hir.data.synthetic.tables`) and the event stream (:mod:`hir.data.synthetic.events`) are all
drawn from seeded streams of ``seed``, so the same spec always writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta

from hir.errors import HirError

# bump when the output of a given spec changes; it is part of the cache key
GENERATOR_VERSION = 2
STAGES = ("exposure", "view", "click", "cart", "purchase")
ENTITY_TYPES = ("product", "campaign")
US_PER_S = 1_000_000


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
