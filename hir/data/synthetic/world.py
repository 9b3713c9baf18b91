"""The synthetic marketplace's world: every entity, its planted interests and when it exists.

``C`` coarse interests each hold ``F`` fine interests. Products belong to one fine interest;
advertisers concentrate on 1-2 coarse interests and own products there; campaigns promote a few
products of one advertiser inside one fine interest; a category taxonomy mirrors the hierarchy
(coarse category > fine category, with a little mis-categorisation). Users hold a mixture over
1-3 coarse interests (1-2 fine ones in each), and weighted alias samplers let the event stream
(:mod:`hir.data.synthetic.events`) draw users, and products or campaigns within an interest, in O(1).
A ``late_fraction`` of users, products, advertisers and campaigns only appear in the last
``late_window`` of the period (cold start).

Everything here is drawn from one seeded stream (``[seed, 0]``), so a spec always builds the
same world. Names and text for these entities live in :mod:`hir.data.synthetic.tables`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hir.data.synthetic.spec import SyntheticSpec

# user regions: the world draws an index, tables.py names it
REGIONS = ["north", "south", "east", "west", "central", "coast", "mountain", "islands"]


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
