"""Users without visible engagement: the knowledge view, or turned toward what is in demand now.

A user with no visible history has no spectral base; the knowledge view embeds it from its
metadata alone (a country, a segment), so it lands near one learned "typical user" direction. On
a temporal split that direction ranks by long-run taste, while a newcomer buys what everybody buys
*now*: measured on online_retail (the learner's base cell, seed 0, export stamped at the val
start), the 247 val users without train history scored masked recall@20 0.0546 with the knowledge
view and 0.0701 with the plain popularity of the last 7 days (all-time popularity: 0.0537); on
test, 0.0402 against 0.0618.

The served vector must stay an embedding (one inner-product search serves every user), so the
recent demand becomes a direction ``r`` in the user part of the space: the ridge least-squares fit

    r = argmin ||Z s - y||^2 + ridge ||s||^2,   y_e = recent_e / max(recent),  r = s / |s|

where ``Z`` (M, K) holds the candidate entities' exported ``a s`` parts (a user's score of an
entity is ``a_e s_u·s_e``, :class:`hir.nn.HirNet`) and ``recent_e`` counts the distinct visible
users whose pair with ``e`` reached the deep stage and was last active in the final ``window``
days of the visible window. A cold user then takes ``normalize(s_know + weight r)`` (its own
knowledge direction keeps users with different metadata apart). ``window`` and ``weight`` are
chosen on val among ``windows`` x ``weights``: the users of the val split that are cold here,
masked new-to-user recall@20, and the knowledge view is kept unless the best pair beats it beyond
the paired noise over those users (the lower end of the 95% interval above 0). Without val users
that are cold at export (a shipped test split exports train + val, so its val users are warm) or
without time (every visible pair of one age), the knowledge view is kept and the report says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hir.model.metrics import paired_gain, recall_of_top, top_k_rows
from hir.model.spectral import engaged_users

log = logging.getLogger(__name__)

METHODS = ("knowledge", "recent")


@dataclass
class ColdUsers:
    """How export embeds users without visible engagement (``export.cold_users``).

    method: ``recent`` (the module doc: chosen on val, the knowledge view unless it loses) or
    ``knowledge`` (the knowledge view, always); windows: days of recent demand tried; weights: the
    recent direction's weight against the user's own knowledge direction; ridge: the fit's L2."""

    method: str = "recent"
    windows: list[float] = field(default_factory=lambda: [7.0, 14.0, 28.0])
    weights: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0])
    ridge: float = 1e-3

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"export.cold_users.method={self.method!r}; expected one of {list(METHODS)}")
        if not self.windows or min(self.windows) <= 0 or not self.weights or min(self.weights) <= 0:
            raise ValueError(f"export.cold_users: windows {self.windows} and weights {self.weights} must be "
                             "non-empty lists of positive numbers")


def demand_direction(z_cands: np.ndarray, recent: np.ndarray, ridge: float) -> np.ndarray | None:
    """(K,) unit direction ``r`` whose scores ``z_cands[:, :K] @ r`` fit ``recent`` (M,) scaled to
    [0, 1] (the module doc); None when nothing is recent."""
    if recent.max(initial=0.0) <= 0:
        return None
    x = z_cands[:, :-1].astype(np.float64)  # the a s part: what a user's direction multiplies
    y = recent / recent.max()
    s = np.linalg.solve(x.T @ x + float(ridge) * np.eye(x.shape[1]), x.T @ y)
    norm = float(np.linalg.norm(s))
    return (s / norm).astype(np.float32) if norm > 0 else None


def turned(z_users: np.ndarray, r: np.ndarray, weight: float) -> np.ndarray:
    """(U, K + 1) user embeddings ``[normalize(s + weight r), 0]`` from ``z_users`` (U, K + 1)."""
    d = z_users[:, :-1].astype(np.float32) + np.float32(weight) * r[None, :]
    d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-12)
    return np.concatenate([d, np.zeros((len(d), 1), np.float32)], axis=1)


def place_cold_users(z: np.ndarray, store: Any, valset: Any, cfg: ColdUsers,
                     inplace: bool = False) -> tuple[np.ndarray, dict[str, Any]]:
    """Cold users of ``z`` (n_nodes, K + 1) embedded as the module doc says; returns the new
    embeddings and a report (method used, the chosen window and weight, the direction, the val
    table). ``valset``: the export's masked new-to-user :class:`hir.model.ValSet`, or None.
    ``inplace``: the turned rows are written into ``z`` itself rather than a copy (export, whose
    ``z`` nothing else keeps: no second (n_nodes, K + 1) array; a caller that compares the array
    before and after keeps the default)."""
    report: dict[str, Any] = {"method": "knowledge", "configured": cfg.method}
    lo, hi = store.type_range("user")
    cold = lo + np.flatnonzero(~store.warm[lo:hi])
    report["cold_users"] = len(cold)
    if cfg.method == "knowledge" or not len(cold):
        return z, report | {"why": "export.cold_users.method=knowledge" if len(cold) else "no cold user"}
    if valset is None or not len(valset):
        return z, report | {"why": "no validation users"}
    val_rows = np.flatnonzero(np.isin(valset.users, cold))
    if not len(val_rows):
        return z, report | {"why": "no val user is cold at export (its val split is visible)"}
    users = valset.users[val_rows]
    pos = [valset.positives[i] for i in val_rows]
    masked = [valset.masked[i] for i in val_rows]
    cands = z[valset.cands]

    def recall(zu: np.ndarray) -> np.ndarray:
        return recall_of_top(top_k_rows(zu, cands, masked, 20), pos, 20)

    known = recall(z[users])
    table: dict[str, Any] = {"knowledge": {"recall@20": round(float(np.nanmean(known)), 5)}}
    best: tuple[float, float, np.ndarray, np.ndarray] | None = None
    for days in cfg.windows:
        # recent demand: distinct users per entity whose pair reached the deep stage and was last
        # active in the final `days` of the visible window
        recent, _, timed = engaged_users(store, float(days), deep_only=True)
        if not timed:
            return z, report | {"why": "the visible engagement has no time (one age for every pair)"}
        r = demand_direction(cands, recent[valset.cands], cfg.ridge)
        if r is None:
            continue
        for w in cfg.weights:
            got = recall(turned(z[users], r, float(w)))
            g = paired_gain(got, known)
            table[f"{days:g}d x {w:g}"] = {"recall@20": round(float(np.nanmean(got)), 5),
                                           **{k: round(float(g[k]), 4) for k in ("gain", "lo", "hi")}}
            if best is None or np.nanmean(got) > np.nanmean(best[2]):
                best = (float(days), float(w), got, r)
    report |= {"val_users": len(users), "val_recall@20": table}
    if best is None:
        return z, report | {"why": "nothing engaged in any window"}
    days, w, got, r = best
    gain = paired_gain(got, known)
    if gain["lo"] <= 0:
        log.info("cold users: the knowledge view kept (%d users; the best recent direction, %g d x %g, %+.1f%% "
                 "[%+.1f, %+.1f] on %d val users: not beyond the noise)", len(cold), days, w, 100 * gain["gain"],
                 100 * gain["lo"], 100 * gain["hi"], len(users))
        return z, report | {"why": "no window beats the knowledge view beyond the paired noise on val"}
    out = z if inplace else z.copy()
    out[cold] = turned(z[cold], r, w)  # z[cold] is read (a copy) before the rows are written
    log.info("cold users: %d turned toward the last %g days' demand (weight %g): val recall@20 %+.1f%% [%+.1f, %+.1f] "
             "on %d val users", len(cold), days, w, 100 * gain["gain"], 100 * gain["lo"], 100 * gain["hi"], len(users))
    return out, report | {"method": "recent", "window_days": days, "weight": w,
                          "direction": [round(float(x), 7) for x in r]}


def turn_like_export(plan: dict[str, Any], z_new: np.ndarray) -> np.ndarray:
    """New users (``z_new`` (n, K + 1), the knowledge view) turned as the export turned its cold
    users (its ``cold_placement.users`` in meta.json); unchanged when it kept the knowledge view."""
    if (plan or {}).get("method") != "recent" or not len(z_new):
        return z_new
    r = np.asarray(plan["direction"], np.float32)
    if r.shape[0] != z_new.shape[1] - 1:
        return z_new
    return turned(z_new, r, float(plan["weight"]))
