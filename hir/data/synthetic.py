"""A deterministic synthetic marketplace with a planted interest hierarchy.

``C`` coarse interests each hold ``F`` fine interests. Products belong to one fine interest;
advertisers concentrate on 1-2 coarse interests and own products there; campaigns promote a few
products of one advertiser inside one fine interest; a category taxonomy mirrors the hierarchy
(coarse category > fine category, with a little mis-categorisation). Users hold a mixture over
1-3 coarse interests (1-2 fine ones in each) and mostly engage with products of their interests,
Zipf-popular within an interest. Product events run down the funnel
``exposure > view > click > cart > purchase`` (each stage a subset of the one before, later in
time); campaign events are exposures and clicks. A ``late_fraction`` of users, products,
advertisers and campaigns only appear in the last ``late_window`` of the period (cold start).
Text (titles, names, descriptions) is built from per-interest vocabularies, so a language model
can recover the hierarchy from content alone.

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
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

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


# Per coarse interest: name | product nouns | fine interests "name: three related words", ';'-separated.
# Real words, so a sentence encoder places related titles near each other.
VOCAB = """
footwear | shoe sneaker boot | running: trail marathon cushioned; hiking: waterproof mountain ankle; basketball: court dunk hightop; formal: leather oxford polished; sandals: beach strap summer; kids: velcro school playground; winter: insulated snow fleece; skate: suede grip vulcanized
kitchen | pan pot cookware | baking: oven cake dough; coffee: espresso grinder brew; knives: chef blade sharpening; grilling: barbecue charcoal smoker; storage: container jar lid; blender: smoothie juice pulse; tea: kettle leaf infuser; cast iron: skillet seasoned dutch
electronics | device gadget accessory | audio: headphones wireless bass; gaming: console controller joystick; camera: lens tripod mirrorless; phone: smartphone charger case; laptop: notebook keyboard ultrabook; television: screen remote hdmi; smart home: thermostat sensor hub; wearable: smartwatch tracker band
books | book paperback edition | mystery: detective crime thriller; romance: love novel passion; science fiction: space galaxy robot; history: war empire ancient; cooking: recipes cuisine homemade; children: picture bedtime fairy; biography: memoir life leader; poetry: verse poems sonnet
garden | plant seed planter | vegetables: tomato lettuce harvest; flowers: rose tulip bloom; lawn: mower grass turf; tools: shovel rake pruner; irrigation: hose sprinkler drip; houseplants: succulent fern terrarium; trees: sapling orchard fruit; pest control: organic repellent aphid
beauty | cosmetic cream kit | skincare: moisturizer serum hydrating; makeup: lipstick mascara foundation; hair: shampoo conditioner curl; fragrance: perfume cologne scent; nails: polish manicure gel; shaving: razor beard trimmer; sun care: sunscreen spf tan; bath: soap bubble lavender
toys | toy game playset | building: bricks construction creative; dolls: dollhouse doll dress; puzzles: jigsaw pieces brain; board games: dice strategy family; outdoor play: swing slide sandbox; plush: teddy bear soft; vehicles: truck racing remote; science kits: experiment chemistry microscope
sports | gear equipment accessories | yoga: mat stretch pilates; cycling: bike helmet pedal; swimming: goggles swimsuit pool; tennis: racket serve string; fitness: dumbbell kettlebell workout; camping: tent sleeping lantern; fishing: rod reel lure; golf: club putter tee
pets | pet supply companion | dogs: leash collar puppy; cats: litter scratching kitten; aquarium: fish tank filter; birds: cage perch parrot; small pets: hamster rabbit hutch; pet food: kibble treats grain; pet grooming: fur deshedding clipper; pet beds: cushion orthopedic crate
home decor | decor accent piece | lighting: lamp bulb chandelier; rugs: carpet woven runner; wall art: canvas print frame; candles: wax wick scented; curtains: drapes blackout sheer; clocks: pendulum alarm dial; vases: ceramic glass bouquet; cushions: pillow throw velvet
automotive | car vehicle auto | tires: tread wheel alloy; motor oil: synthetic filter engine; detailing: shine detailing microfiber; batteries: jumper starter terminal; interior: seat cover floor; navigation: gps dashcam mount; repair tools: wrench jack socket; lights: headlight led fog
groceries | food pack snack | dairy: milk cheese yogurt; bakery: bread bagel croissant; produce: apple banana fresh; meat: beef chicken steak; beverages: soda juice sparkling; snacks: chips cookies crackers; frozen: pizza icecream dessert; pantry: pasta rice flour
office | office supply desk | paper: ream printer sheets; pens: ballpoint ink marker; furniture: chair ergonomic standing; organization: folder binder label; printing: toner cartridge inkjet; shipping: envelope tape box; art supplies: paint brush sketch; calendars: planner agenda monthly
clothing | apparel shirt wear | denim: jeans jacket indigo; dresses: gown maxi floral; outerwear: coat parka windbreaker; activewear: leggings sweat moisture; knitwear: sweater wool cardigan; basics: socks briefs cotton; swimwear: bikini trunks lycra; formalwear: suit tie tuxedo
music | instrument music studio | guitar: acoustic strings fret; piano: keys digital grand; drums: snare cymbal drumsticks; vinyl: record turntable album; dj: mixer crossfader deck; violin: bow orchestra rosin; microphone: vocal condenser podcast; brass: trumpet saxophone horn
travel | luggage travel bag | suitcases: carryon spinner hardshell; backpacks: daypack rucksack straps; accessories: adapter neck lock; maps: guide atlas compass; toiletries: bottles pouch miniature; duffels: weekender gym duffel; packing: cubes organizer compression; passport: wallet rfid holder
"""
GENERIC = ["new", "classic", "premium", "lightweight", "durable", "compact", "deluxe", "essential", "pro", "original", "everyday", "signature", "modern", "vintage", "eco", "ultra", "plus", "mini", "max", "smart"]
# when more interests are asked for than VOCAB holds, names repeat with one of these qualifiers
QUALIFIERS = ["urban", "alpine", "coastal", "royal", "nordic", "tropical", "desert", "arctic", "lunar", "solar"]
BRAND_HEAD = ["nor", "vel", "zen", "aur", "kal", "mir", "sol", "tor", "lum", "bri", "cor", "dax", "evo", "fen", "gal", "hal"]
BRAND_TAIL = ["a", "ix", "on", "ora", "ex", "ia", "um", "ano", "ette", "ik"]
REGIONS = ["north", "south", "east", "west", "central", "coast", "mountain", "islands"]
SEASONS = ["spring", "summer", "autumn", "winter", "holiday", "weekend"]
PROMOS = ["sale", "launch", "deals", "clearance", "collection"]


def _vocab(n_coarse: int, n_fine: int) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """Names and words for every interest: coarse names, coarse nouns, fine names (global fine
    order), fine words."""
    rows = []
    for line in VOCAB.strip().splitlines():
        name, nouns, fines = (x.strip() for x in line.split("|"))
        rows.append((name, nouns.split(), [tuple(f.split(":")) for f in fines.split(";")]))
    c_names, c_nouns, f_names, f_words = [], [], [], []
    for c in range(n_coarse):
        name, nouns, fines = rows[c % len(rows)]
        qual = f"{QUALIFIERS[(c // len(rows) - 1) % len(QUALIFIERS)]} " if c >= len(rows) else ""
        c_names.append(qual + name)
        c_nouns.append(nouns)
        for j in range(n_fine):
            fname, words = fines[j % len(fines)]
            fq = f"{QUALIFIERS[(j // len(fines) - 1) % len(QUALIFIERS)]} " if j >= len(fines) else ""
            f_names.append(qual + fq + fname.strip())
            f_words.append(words.split())
    return c_names, c_nouns, f_names, f_words


def _alias(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table for weights ``q`` scaled to mean 1: (prob, alias), each (n,).

    Vectorised Vose: small cells (q < 1) take their deficit from the large cell whose
    cumulative surplus first exceeds the deficit served before them; a large cell that
    overshoots becomes small and is topped up by the next large one.
    """
    n = len(q)
    prob, alias = np.ones(n), np.arange(n)
    small = np.flatnonzero(q < 1.0)
    large = np.flatnonzero(q >= 1.0)
    if len(small) == 0 or len(large) == 0:
        return prob, alias
    deficit = np.cumsum(1.0 - q[small])  # (k,) served after each small cell
    before = deficit - (1.0 - q[small])
    surplus = np.cumsum(q[large] - 1.0)  # (m,)
    donor = np.minimum(np.searchsorted(surplus, before, side="right"), len(large) - 1)
    prob[small], alias[small] = q[small], large[donor]
    served = np.searchsorted(before, surplus, side="left")  # smalls served up to each large
    reach = np.where(served > 0, deficit[np.maximum(served - 1, 0)], 0.0)
    prob[large] = np.clip(np.where(reach > surplus, 1.0 - (reach - surplus), 1.0), 0.0, 1.0)
    alias[large[:-1]] = large[1:]
    return prob, alias


@dataclass
class Sampler:
    """Draws items with probability ~ weight, within a group when asked, in O(1) per draw.

    Items are laid out grouped (``order``); each group has its own alias table over its slice
    ``[offset, offset + size)``. A group without items draws from all items.
    """

    order: np.ndarray  # (n,) item ids, grouped
    offset: np.ndarray  # (G,) first position of each group
    size: np.ndarray  # (G,) items per group
    prob: np.ndarray  # (n,) keep probability of each cell
    alias: np.ndarray  # (n,) position drawn instead

    @classmethod
    def build(cls, weights: np.ndarray, groups: np.ndarray | None = None, n_groups: int = 1) -> Sampler:
        groups = np.zeros(len(weights), np.int64) if groups is None else groups.astype(np.int64)
        order = np.argsort(groups, kind="stable")
        w = weights[order].astype(np.float64)
        size = np.bincount(groups, minlength=n_groups)
        offset = np.r_[0, np.cumsum(size)[:-1]]
        prob, alias = np.ones(len(w)), np.arange(len(w))
        for g in np.flatnonzero(size):  # a loop over groups, not items
            sl = slice(offset[g], offset[g] + size[g])
            q = w[sl] * (size[g] / w[sl].sum())
            prob[sl], a = _alias(q)
            alias[sl] = a + offset[g]
        offset[size == 0], size[size == 0] = 0, len(w)
        return cls(order, offset, size, prob, alias)

    def sample(self, u: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
        """``u``: (n,) uniforms in [0, 1); ``groups``: (n,) group per draw. Returns (n,) item ids.

        One uniform serves both steps: its integer part (scaled) picks the cell, the fraction
        decides between the cell and its alias.
        """
        size = self.size[0] if groups is None else self.size[groups]
        x = u * size
        cell = np.minimum(x.astype(np.int64), size - 1)
        pos = cell + (self.offset[0] if groups is None else self.offset[groups])
        pos = np.where(x - cell < self.prob[pos], pos, self.alias[pos])
        return self.order[pos]


@dataclass
class World:
    """Everything but the events: entities, their interests and start times (epoch us)."""

    start: int
    end: int
    late_start: int
    n_coarse: int
    n_fine: int
    n_products: int
    n_campaigns: int
    users: Sampler  # by activity x time present
    user_start: np.ndarray  # (n_users,)
    slot_fine: np.ndarray  # (n_users, S) global fine id per interest slot
    slot_weight: np.ndarray  # (n_users, S) mixture weight (0 for unused slots), rows sum to 1
    slot_cum: np.ndarray  # (n_users, S) cumulative weights, last column exactly 1
    user_age: np.ndarray
    user_region: np.ndarray
    products: Sampler  # grouped by fine interest, Zipf within
    product_fine: np.ndarray
    product_category: np.ndarray  # fine category (with category noise)
    product_advertiser: np.ndarray
    product_start: np.ndarray
    price: np.ndarray
    adv_primary: np.ndarray
    adv_start: np.ndarray
    campaigns: Sampler  # grouped by coarse interest
    campaign_fine: np.ndarray
    campaign_advertiser: np.ndarray
    campaign_start: np.ndarray
    campaign_end: np.ndarray
    promotions: np.ndarray  # (n_pairs, 2) campaign, product

    @property
    def n_fine_total(self) -> int:
        return self.n_coarse * self.n_fine

    def user_fine(self, users: np.ndarray, u: np.ndarray) -> np.ndarray:
        """One fine interest per draw from each user's mixture. users, u: (n,) -> (n,)."""
        slot = (self.slot_cum[users] < u[:, None]).sum(axis=1)  # (n,)
        return self.slot_fine[users, np.minimum(slot, self.slot_fine.shape[1] - 1)]

    def counts(self) -> dict[str, int]:
        return {
            "user": len(self.user_start), "product": self.n_products, "advertiser": len(self.adv_start),
            "campaign": self.n_campaigns, "category": self.n_coarse + self.n_fine_total,
        }

    def late_counts(self) -> dict[str, int]:
        starts = {"user": self.user_start, "product": self.product_start, "advertiser": self.adv_start,
                  "campaign": self.campaign_start}
        return {k: int((v >= self.late_start).sum()) for k, v in starts.items()}


def _late(rng: np.random.Generator, n: int, frac: float, keep_early: int = 0) -> np.ndarray:
    """(n,) bool: exactly round(frac * n) entities (at least one when frac > 0), never among the
    first ``keep_early``, are late."""
    k = min(max(round(frac * n), 1 if frac > 0 else 0), n - keep_early)
    mask = np.zeros(n, bool)
    mask[keep_early + rng.choice(n - keep_early, size=max(k, 0), replace=False)] = True
    return mask


def _starts(rng: np.random.Generator, n: int, frac: float, start: int, late: int, end: int,
            keep_early: int = 0) -> np.ndarray:
    """Start time per entity: the period start, or for the late ones a time in the first half of
    the late window (so they still gather events before the period ends)."""
    out = np.full(n, start, np.int64)
    is_late = _late(rng, n, frac, keep_early)
    out[is_late] = late + (rng.random(int(is_late.sum())) * (end - late) / 2).astype(np.int64)
    return out


def build_world(spec: SyntheticSpec) -> World:
    """Draw every entity of ``spec`` (deterministic in ``spec.seed``)."""
    rng = np.random.default_rng([spec.seed, 0])
    C, F = spec.n_coarse, spec.n_fine
    FT = C * F
    start, end = spec.period_us
    late = end - int(spec.late_window * (end - start))
    present = lambda s: (end - s) / (end - start)  # noqa: E731 - share of the period an entity exists

    # advertisers: a primary coarse interest (every interest has one), some a second one
    n_adv = spec.n_advertisers
    primary = np.r_[np.arange(C), rng.integers(C, size=n_adv - C)]
    second = np.where(rng.random(n_adv) < 0.3, (primary + 1 + rng.integers(max(C - 1, 1), size=n_adv)) % C, -1)
    second[second == primary] = -1
    adv_size = rng.lognormal(0, 1, n_adv)
    adv_start = _starts(rng, n_adv, spec.late_fraction, start, late, end, keep_early=C)

    # products: every fine interest gets one, the rest spread by a per-interest size
    n_p = spec.n_products
    fine_size = rng.lognormal(0, 0.5, FT)
    p_fine = np.r_[np.arange(FT), rng.choice(FT, n_p - FT, p=fine_size / fine_size.sum())]
    p_adv = np.empty(n_p, np.int64)
    for c in range(C):  # a loop over interests, not rows
        elig = np.flatnonzero((primary == c) | (second == c))
        w = adv_size[elig] * np.where(primary[elig] == c, 1.0, 0.5)
        mine = np.flatnonzero(p_fine // F == c)
        p_adv[mine] = elig[Sampler.build(w).sample(rng.random(len(mine)))]
    p_start = np.maximum(_starts(rng, n_p, spec.late_fraction, start, late, end), adv_start[p_adv])
    rank_order = np.lexsort((rng.random(n_p), p_fine))
    rank = np.empty(n_p, np.int64)
    group_first = np.searchsorted(p_fine[rank_order], p_fine[rank_order])
    rank[rank_order] = np.arange(n_p) - group_first
    popularity = (rank + 1.0) ** -spec.zipf * present(p_start)
    p_cat = C + p_fine
    mis = rng.random(n_p) < spec.category_noise
    p_cat[mis] = C + rng.integers(FT, size=int(mis.sum()))
    price = np.round(np.exp(2.5 + 2.0 * ((p_fine // F) * 0.37 % 1) + rng.normal(0, 0.5, n_p)), 2)

    # campaigns: one advertiser, 1-4 of its products inside one fine interest
    group_key = p_adv * FT + p_fine
    keys, inverse, sizes = np.unique(group_key, return_inverse=True, return_counts=True)
    by_group = np.argsort(inverse, kind="stable")
    g_first = np.r_[0, np.cumsum(sizes)[:-1]]
    n_c = spec.n_campaigns
    g = rng.choice(len(keys), n_c, p=sizes / sizes.sum())
    k = np.minimum(1 + rng.integers(4, size=n_c), sizes[g])
    camp_of = np.repeat(np.arange(n_c), k)
    prod = by_group[g_first[g][camp_of] + (rng.random(len(camp_of)) * sizes[g][camp_of]).astype(np.int64)]
    promotions = np.unique(np.c_[camp_of, prod], axis=0)
    c_adv, c_fine = keys[g] // FT, keys[g] % FT
    lo = np.maximum(adv_start[c_adv], start)
    np.maximum.at(lo, promotions[:, 0], p_start[promotions[:, 1]])
    is_late = _late(rng, n_c, spec.late_fraction)
    lo[is_late] = np.maximum(lo[is_late], late)
    dur = (rng.uniform(0.08, 0.33, n_c) * (end - start)).astype(np.int64)
    c_start = lo + (rng.random(n_c) * np.maximum(end - dur - lo, 0)).astype(np.int64)
    c_end = np.minimum(c_start + dur, end)
    c_start = np.minimum(c_start, end - 1)

    # users: 1..max coarse interests with Dirichlet weights, 1-2 fine interests inside each
    n_u = spec.n_users
    m = min(spec.max_user_interests, C)
    k_c = 1 + rng.integers(m, size=n_u)
    coarse = np.argsort(rng.random((n_u, C), dtype=np.float32), axis=1)[:, :m]  # (n_u, m) distinct
    cw = rng.gamma(1.0, size=(n_u, m)) * (np.arange(m) < k_c[:, None])
    j1 = rng.integers(F, size=(n_u, m))
    j2 = (j1 + 1 + rng.integers(max(F - 1, 1), size=(n_u, m))) % F
    split = np.where((rng.random((n_u, m)) < 0.5) & (F > 1), rng.uniform(0.5, 0.9, (n_u, m)), 1.0)
    slot_fine = np.concatenate([coarse * F + j1, coarse * F + j2], axis=1)  # (n_u, 2m)
    slot_w = np.concatenate([cw * split, cw * (1 - split)], axis=1)
    slot_w /= slot_w.sum(axis=1, keepdims=True)
    slot_cum = np.cumsum(slot_w, axis=1)
    slot_cum[:, -1] = 1.0
    u_start = _starts(rng, n_u, spec.late_fraction, start, late, end)
    main = coarse[np.arange(n_u), cw.argmax(axis=1)]
    age = np.clip(np.round(rng.normal(24 + (main * 13 % 30), 7)), 16, 85)

    return World(
        start=start, end=end, late_start=late, n_coarse=C, n_fine=F, n_products=n_p, n_campaigns=n_c,
        users=Sampler.build(rng.lognormal(0, 1, n_u) * present(u_start)), user_start=u_start,
        slot_fine=slot_fine, slot_weight=slot_w, slot_cum=slot_cum, user_age=age,
        user_region=rng.integers(len(REGIONS), size=n_u),
        products=Sampler.build(popularity, p_fine, FT), product_fine=p_fine, product_category=p_cat,
        product_advertiser=p_adv, product_start=p_start, price=price, adv_primary=primary, adv_start=adv_start,
        campaigns=Sampler.build(rng.lognormal(0, 1, n_c) * (c_end - c_start), c_fine // F, C),
        campaign_fine=c_fine, campaign_advertiser=c_adv, campaign_start=c_start, campaign_end=c_end,
        promotions=promotions,
    )


def _words(rng: np.random.Generator, lists: list[list[str]], which: np.ndarray) -> pl.Series:
    """One random word of ``lists[which[i]]`` per row (vectorised through a flat vocabulary)."""
    flat = [w for ws in lists for w in ws]
    first = np.cumsum([0, *map(len, lists)])[:-1]
    lens = np.array([len(ws) for ws in lists])
    return pl.Series(flat).gather(first[which] + (rng.random(len(which)) * lens[which]).astype(np.int64))


def _concat(parts: list[pl.Series | str]) -> pl.Series:
    """Space-joined text from word columns (Series) and literal words (str)."""
    frame = pl.DataFrame({f"w{i}": p for i, p in enumerate(parts) if isinstance(p, pl.Series)})
    exprs = [pl.col(f"w{i}") if isinstance(p, pl.Series) else pl.lit(p) for i, p in enumerate(parts)]
    return frame.select(pl.concat_str(exprs, separator=" ").alias("text")).to_series()


def entity_tables(spec: SyntheticSpec, w: World) -> dict[str, pl.DataFrame]:
    """Metadata tables (Int64 keys) and the ground truth, from the world of ``spec``."""
    rng = np.random.default_rng([spec.seed, 2])
    C, F = w.n_coarse, w.n_fine
    c_names, c_nouns, f_names, f_words = _vocab(C, F)
    pick = lambda seq, idx: pl.Series(list(seq)).gather(idx)  # noqa: E731
    brand = [
        (BRAND_HEAD[a % 16] + BRAND_TAIL[(a // 16) % 10]).capitalize() + (str(a // 160) if a >= 160 else "")
        for a in range(len(w.adv_start))
    ]
    pf, pc = w.product_fine, w.product_fine // F
    products = pl.DataFrame({
        "key": np.arange(w.n_products),
        "text": _concat([
            _words(rng, f_words, pf), pick(f_names, pf), _words(rng, c_nouns, pc),
            pick(GENERIC, rng.integers(len(GENERIC), size=w.n_products)),
        ]),
        "attr_price": w.price,
        "advertiser": w.product_advertiser,
        "category": w.product_category,
    })
    advertisers = pl.DataFrame({
        "key": np.arange(len(w.adv_start)),
        "text": _concat([pl.Series(brand), pick(c_names, w.adv_primary)]),
    })
    cf = w.campaign_fine
    campaigns = pl.DataFrame({
        "key": np.arange(w.n_campaigns),
        "text": _concat([
            pick(brand, w.campaign_advertiser), pick(SEASONS, rng.integers(len(SEASONS), size=len(cf))),
            pick(PROMOS, rng.integers(len(PROMOS), size=len(cf))), "on", _words(rng, f_words, cf),
            pick(f_names, cf), _words(rng, c_nouns, cf // F),
        ]),
        "advertiser": w.campaign_advertiser,
        "start": w.campaign_start, "end": w.campaign_end,
    }).with_columns(pl.col("start", "end").cast(pl.Datetime("us")).dt.replace_time_zone("UTC"))
    fine_ids = np.arange(C * F)
    categories = pl.DataFrame({
        "key": np.r_[np.arange(C), C + fine_ids],
        "text": [*c_names, *(f"{c_names[f // F]} > {f_names[f]}" for f in fine_ids)],
        "attr_level": np.r_[np.ones(C), np.full(C * F, 2.0)],
        "parent": pl.Series(np.r_[np.full(C, -1), fine_ids // F]).replace(-1, None),
    })
    n_u = len(w.user_start)
    users = pl.DataFrame({"key": np.arange(n_u), "attr_age": w.user_age, "attr_region": pick(REGIONS, w.user_region)})
    slots = w.slot_weight.shape[1]
    mixture = pl.DataFrame({
        "user": np.repeat(np.arange(n_u), slots), "fine": w.slot_fine.ravel(), "weight": w.slot_weight.ravel(),
    }).filter(pl.col("weight") > 0).with_columns((pl.col("fine") // F).alias("coarse"))
    return {
        "products": products, "advertisers": advertisers, "campaigns": campaigns, "categories": categories,
        "users": users,
        "promotions": pl.DataFrame({"campaign": w.promotions[:, 0], "product": w.promotions[:, 1]}),
        # keys as text and interests as Int32, like truth.parquet, so the three join to graph/nodes
        "user_interests": mixture.select(
            pl.col("user").cast(pl.String).alias("key"), pl.col("coarse", "fine").cast(pl.Int32), "weight"
        ),
        "interests": pl.DataFrame({
            "fine": fine_ids, "coarse": fine_ids // F, "fine_name": f_names, "coarse_name": pick(c_names, fine_ids // F),
        }).with_columns(pl.col("fine", "coarse").cast(pl.Int32)),
        "truth": _truth(w, mixture),
    }


def _truth(w: World, mixture: pl.DataFrame) -> pl.DataFrame:
    """entity_type, key (text, as in graph/nodes), coarse, fine (null where not defined), weight
    (share of the entity's mass in that interest), late (appears in the late window)."""
    F = w.n_fine
    # main interest: the heaviest coarse interest, then the heaviest fine one inside it (ties: lowest id)
    main_coarse = (
        mixture.group_by("user", "coarse").agg(pl.col("weight").sum())
        .sort("user", "weight", "coarse", descending=[False, True, False]).unique("user", keep="first")
    )
    main_fine = (
        mixture.join(main_coarse.select("user", "coarse"), on=["user", "coarse"])
        .sort("user", "weight", "fine", descending=[False, True, False]).unique("user", keep="first")
    )
    users = main_coarse.join(main_fine.select("user", "fine"), on="user").sort("user").select(
        pl.lit("user").alias("entity_type"), pl.col("user").alias("key"), "coarse", "fine", "weight",
        pl.Series(w.user_start >= w.late_start).alias("late"),
    )
    adv = pl.DataFrame({"a": w.product_advertiser, "coarse": w.product_fine // F}).group_by("a", "coarse").len()
    adv = adv.with_columns((pl.col("len") / pl.col("len").sum().over("a")).alias("weight")).sort(
        "a", "weight", "coarse", descending=[False, True, False]).unique("a", keep="first")
    advertisers = pl.DataFrame({"key": np.arange(len(w.adv_start)), "primary": w.adv_primary,
                                "late": w.adv_start >= w.late_start}).join(adv, left_on="key", right_on="a", how="left")
    C = w.n_coarse
    parts = [
        pl.DataFrame({"entity_type": "product", "key": np.arange(w.n_products), "coarse": w.product_fine // F,
                      "fine": w.product_fine, "weight": 1.0, "late": w.product_start >= w.late_start}),
        users,
        advertisers.select(pl.lit("advertiser").alias("entity_type"), "key",
                           pl.coalesce("coarse", "primary").alias("coarse"), pl.lit(None, pl.Int64).alias("fine"),
                           pl.col("weight").fill_null(0.0), "late"),
        pl.DataFrame({"entity_type": "campaign", "key": np.arange(w.n_campaigns), "coarse": w.campaign_fine // F,
                      "fine": w.campaign_fine, "weight": 1.0, "late": w.campaign_start >= w.late_start}),
        pl.DataFrame({"entity_type": "category", "key": np.arange(C + C * F),
                      "coarse": np.r_[np.arange(C), np.arange(C * F) // F],
                      "fine": pl.Series(np.r_[np.full(C, -1), np.arange(C * F)]).replace(-1, None),
                      "weight": 1.0, "late": False}),
    ]
    schema = {"entity_type": pl.String, "key": pl.String, "coarse": pl.Int32, "fine": pl.Int32,
              "weight": pl.Float64, "late": pl.Boolean}
    return pl.concat([p.select(pl.col(c).cast(t) for c, t in schema.items()) for p in parts])


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
