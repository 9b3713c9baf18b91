"""The evidence gate of the user correction: which users get the learner's corrected vector.

A user's *evidence* is its history size: its engagement events in the visible splits
(:attr:`hir.model.store.GraphStore.exposure` of a user node; the train split on val, train + val
at export). The gate is one threshold ``max_events``: a user with at most that many events takes
the corrected vector, every other user its spectral base (the correction closed). ``0`` closes
the gate for everybody (a user with no event has no base and takes the knowledge view either
way); ``None`` opens it for everybody (the correction as trained).

The threshold is fit on val (:func:`choose_gate`), from each val user's recall under the
corrected model and under the same model with the correction closed, by *cross-fitting*: the val
users are split in two halves of the same history sizes (:func:`halves`); the threshold is chosen
on one and must be confirmed on the other.

- **Choice** (the selection half): a candidate threshold is admissible only where it reaches at
  least :data:`MIN_USERS` of these users, the correction beats the closed model beyond the paired
  noise on the users it reaches (the low end of the paired-bootstrap 95% interval over them is
  above 0), and it beats it on the heaviest band it adds (a heavy user gets the base unless the
  correction beats the base on val for users like it). The admissible threshold with the largest
  gain over all of the half's users is taken; with none, the gate closes.
- **Confirmation** (the held-out half, which the choice never saw): the correction must beat the
  closed model beyond the paired noise on the held-out users that threshold reaches (the
  interval's low end above 0, over at least :data:`MIN_USERS` of them); otherwise the gate
  closes.

Why the confirmation: the choice takes the best of a dozen thresholds (and training the best of
its epochs), so its own figures are biased upward: on online_retail (seed 1, 1,125 val users) a
threshold of 20 events chosen on every val user at +1.5% [+0.2, +2.8] lost 1.3% on test. The
held-out half gives an unbiased estimate of the chosen gate, which is what ``gain`` / ``lo`` /
``hi`` report.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hir.model.metrics import paired_gain

# candidate thresholds in events (a roughly geometric ladder; None: everybody)
GATE_STEPS: tuple[float | None, ...] = (1, 2, 3, 5, 8, 13, 20, 35, 60, 100, 200, 500, None)
CLOSED = 0.0
# a threshold must reach at least this many val users: the percentile bootstrap of a handful of
# users is too narrow to call a gain beyond the noise
MIN_USERS = 30


def reached(evidence: np.ndarray, max_events: float | None) -> np.ndarray:
    """(U,) bool: the users the gate ``max_events`` gives the correction (evidence (U,) events)."""
    if max_events is None:
        return np.ones(len(evidence), bool)
    return np.asarray(evidence) <= float(max_events)


def gated(full: np.ndarray, closed: np.ndarray, evidence: np.ndarray, max_events: float | None) -> np.ndarray:
    """Per-user values (U,) of the gated model: ``full`` where the gate reaches the user, else ``closed``."""
    return np.where(reached(evidence, max_events), full, closed)


def halves(evidence: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two halves of the users (index arrays) with the same history sizes: the users sorted by
    ``evidence`` (U,) (ties in a seeded random order) go to the halves in turn."""
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(len(evidence)), np.asarray(evidence)))
    return np.sort(order[0::2]), np.sort(order[1::2])


def _select(full: np.ndarray, closed: np.ndarray, evidence: np.ndarray, steps: tuple[float | None, ...],
            n_boot: int, seed: int, min_users: int) -> dict[str, Any]:
    """The choice on one set of users (no NaN): the admissible threshold with the largest gain."""
    out: dict[str, Any] = {"max_events": CLOSED, "gain": 0.0, "lo": 0.0, "hi": 0.0, "reach": None,
                           "users_reached": 0, "users": len(full), "candidates": []}
    best_gain, prev = 0.0, CLOSED
    for tau in steps:
        hit = reached(evidence, tau)
        band = hit & (evidence > prev)
        prev = np.inf if tau is None else float(tau)
        if not band.any():
            continue  # no user is added by this step: the smaller threshold is the same gate
        reach = paired_gain(full[hit], closed[hit], n_boot, seed)
        band_gain = float(np.mean(full[band] - closed[band]))
        overall = paired_gain(gated(full, closed, evidence, tau), closed, n_boot, seed)
        why = (f"it reaches {int(hit.sum())} val users (< {min_users})" if hit.sum() < min_users else
               "the correction does not beat the base beyond the noise on the users it reaches"
               if reach["lo"] <= 0 else
               "the correction does not beat the base on the heaviest band it adds" if band_gain <= 0 else None)
        out["candidates"].append({"max_events": tau, "users_reached": int(hit.sum()), "reach": reach,
                                  "band_gain": band_gain, "gain": overall["gain"], "admissible": why is None,
                                  **({"why_not": why} if why else {})})
        # the largest overall gain wins; a tie keeps the smaller (more cautious) threshold
        if why is None and overall["gain"] > best_gain:
            best_gain = overall["gain"]
            out |= {"max_events": tau, "gain": overall["gain"], "lo": overall["lo"], "hi": overall["hi"],
                    "reach": reach, "users_reached": int(hit.sum())}
    return out


def choose_gate(full: np.ndarray, closed: np.ndarray, evidence: np.ndarray,
                steps: tuple[float | None, ...] = GATE_STEPS, n_boot: int = 1000, seed: int = 0,
                min_users: int = MIN_USERS) -> dict[str, Any]:
    """The gate's threshold, chosen on one half of the val users and confirmed on the other (see
    the module doc).

    Args:
        full: (U,) per-user recall with the correction (NaN: a user without positives).
        closed: (U,) per-user recall of the same users with the correction closed.
        evidence: (U,) each user's events in the visible splits.
        steps: candidate thresholds, ascending (None last: everybody).
        n_boot, seed: the paired bootstrap's resamples and seed (the seed also splits the users).
        min_users: the fewest val users (with positives) a threshold must reach, in each half.

    Returns ``max_events`` (0.0 = closed); ``gain`` with ``lo``/``hi`` (the gated model over the
    closed one on every held-out user, relative: the unbiased estimate) and ``reach`` (the paired
    gain on the held-out users it reaches), ``users_reached`` / ``users`` (held-out), ``select``
    (the choice on the selection half: its gain, interval, reach and ``candidates``, each
    threshold's figures and why it was not admissible) and ``why_closed`` where the choice was not
    confirmed.
    """
    full, closed, evidence = (np.asarray(a, np.float64) for a in (full, closed, evidence))
    if not (len(full) == len(closed) == len(evidence)):
        raise ValueError(f"choose_gate: full ({len(full)}), closed ({len(closed)}) and evidence ({len(evidence)}) "
                         "must hold the same users")
    ok = np.flatnonzero(~(np.isnan(full) | np.isnan(closed)))
    pick, hold = (ok[h] for h in halves(evidence[ok], seed))
    select = _select(full[pick], closed[pick], evidence[pick], steps, n_boot, seed, min_users)
    out: dict[str, Any] = {"max_events": CLOSED, "gain": 0.0, "lo": 0.0, "hi": 0.0, "reach": None,
                           "users_reached": 0, "users": len(hold), "select": select}
    tau = select["max_events"]
    if tau == CLOSED:
        return out
    f, c, e = full[hold], closed[hold], evidence[hold]
    hit = reached(e, tau)
    reach = paired_gain(f[hit], c[hit], n_boot, seed)  # (zeros where it reaches nobody)
    overall = paired_gain(gated(f, c, e, tau), c, n_boot, seed)
    why = (f"it reaches {int(hit.sum())} held-out val users (< {min_users})" if hit.sum() < min_users else
           f"not confirmed on the held-out val users: the correction gains {100 * reach['gain']:+.2f}% "
           f"[{100 * reach['lo']:+.2f}, {100 * reach['hi']:+.2f}] on the {int(hit.sum())} it reaches"
           if reach["lo"] <= 0 else None)
    if why:
        return out | {"why_closed": why, "confirm": {"max_events": tau, "reach": reach, **overall,
                                                     "users_reached": int(hit.sum())}}
    return out | {"max_events": tau, "gain": overall["gain"], "lo": overall["lo"], "hi": overall["hi"],
                  "reach": reach, "users_reached": int(hit.sum())}


def gate_users(z: np.ndarray, base_vectors: np.ndarray, is_user: np.ndarray, evidence: np.ndarray,
               max_events: float | None) -> np.ndarray:
    """Exported embeddings with the gate applied: a user the gate does not reach, with a base,
    takes its closed vector ``[normalize(b_u), 0]`` (what :class:`hir.nn.HirNet` gives with its
    correction closed); every other row is kept.

    Args:
        z: (n, K + 1) embeddings of the nodes, the corrected users among them.
        base_vectors: (n, K) the nodes' spectral base (zero rows: no base).
        is_user: (n,) bool, the user rows.
        evidence: (n,) events of each node in the visible splits.
        max_events: the gate (:func:`choose_gate`); None leaves every row as it is.
    """
    if max_events is None:
        return z
    norm = np.linalg.norm(base_vectors, axis=1)
    closed = is_user & (norm > 0) & ~reached(evidence, max_events)
    out = z.copy()
    out[closed, :-1] = base_vectors[closed] / norm[closed, None]
    out[closed, -1] = 0.0
    return out


def compact(gate: dict[str, Any]) -> dict[str, Any]:
    """A gate (:func:`choose_gate`'s output) without its per-threshold ``candidates`` (what a
    checkpoint and the training summary keep)."""
    out = {k: v for k, v in gate.items() if k != "candidates"}
    if isinstance(out.get("select"), dict):
        out["select"] = {k: v for k, v in out["select"].items() if k != "candidates"}
    return out


def gate_line(gate: dict[str, Any]) -> str:
    """One log line of a gate (:func:`choose_gate`'s output, or its compact form)."""
    tau = gate.get("max_events")
    if tau is None:
        return "none (no correction to gate, or open for everybody)"
    if tau == CLOSED:
        return "closed (every user takes the base" + (f"; {gate['why_closed']})" if gate.get("why_closed") else ")")
    return (f"users with <= {tau:g} events get the correction ({gate.get('users_reached')} of {gate.get('users')} "
            f"held-out val users; gated / closed {1 + gate.get('gain', 0.0):.3f} [{1 + gate.get('lo', 0.0):.3f}, "
            f"{1 + gate.get('hi', 0.0):.3f}])")
