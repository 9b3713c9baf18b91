"""The evidence gate of the user correction: which users get the learner's corrected vector.

A user's *evidence* is its history size: its engagement events in the visible splits
(:attr:`hir.model.store.GraphStore.exposure` of a user node; the train split on val, train + val
at export). The gate is one threshold ``max_events``: a user with at most that many events takes
the corrected vector, every other user its spectral base (the correction closed). ``0`` closes
the gate for everybody (a user with no event has no base and takes the knowledge view either
way); ``None`` opens it for everybody (the correction as trained).

The threshold is fit on val (:func:`choose_gate`), from each val user's recall under the
corrected model and under the same model with the correction closed. A candidate threshold is
admissible only where it reaches at least :data:`MIN_USERS` val users, the correction beats the
closed model beyond the paired noise on the users it reaches (the low end of the
paired-bootstrap 95% interval over them is above 0), and it beats it on the heaviest band it
adds (a heavy user gets the base unless the correction beats the base on val for users like
it). The admissible threshold with the largest gain over all users is taken (the gain is
measured on the val users it was chosen on: the reach test's interval is what guards against
chance); with none, the gate closes.
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


def choose_gate(full: np.ndarray, closed: np.ndarray, evidence: np.ndarray,
                steps: tuple[float | None, ...] = GATE_STEPS, n_boot: int = 1000, seed: int = 0,
                min_users: int = MIN_USERS) -> dict[str, Any]:
    """The gate's threshold fit on per-user values of val users (see the module doc).

    Args:
        full: (U,) per-user recall with the correction (NaN: a user without positives).
        closed: (U,) per-user recall of the same users with the correction closed.
        evidence: (U,) each user's events in the visible splits.
        steps: candidate thresholds, ascending (None last: everybody).
        min_users: the fewest val users (with positives) a threshold must reach.

    Returns ``max_events`` (0.0 = closed), ``gain`` with ``lo``/``hi`` (the gated model over the
    closed one, all users, relative), ``reach`` (the paired gain on the users it reaches),
    ``users_reached`` / ``users``, and ``candidates`` (each threshold's figures and why it was
    not admissible).
    """
    full, closed, evidence = (np.asarray(a, np.float64) for a in (full, closed, evidence))
    if not (len(full) == len(closed) == len(evidence)):
        raise ValueError(f"choose_gate: full ({len(full)}), closed ({len(closed)}) and evidence ({len(evidence)}) "
                         "must hold the same users")
    ok = ~(np.isnan(full) | np.isnan(closed))
    out: dict[str, Any] = {"max_events": CLOSED, "gain": 0.0, "lo": 0.0, "hi": 0.0, "reach": None,
                           "users_reached": 0, "users": int(ok.sum()), "candidates": []}
    best_gain, prev = 0.0, CLOSED
    for tau in steps:
        hit = reached(evidence, tau) & ok
        band = hit & (evidence > prev)
        prev = np.inf if tau is None else float(tau)
        if not band.any():
            continue  # no user is added by this step: the smaller threshold is the same gate
        reach = paired_gain(full[hit], closed[hit], n_boot, seed)
        band_gain = float(np.mean(full[band] - closed[band]))
        overall = paired_gain(gated(full, closed, evidence, tau)[ok], closed[ok], n_boot, seed)
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


def gate_line(gate: dict[str, Any]) -> str:
    """One log line of a gate (:func:`choose_gate`'s output, or its compact form)."""
    tau = gate.get("max_events")
    if tau is None:
        return "none (no correction to gate, or open for everybody)"
    if tau == CLOSED:
        return "closed (every user takes the base)"
    return (f"users with <= {tau:g} events get the correction ({gate.get('users_reached')} of {gate.get('users')} val "
            f"users; gated / closed {1 + gate.get('gain', 0.0):.3f} [{1 + gate.get('lo', 0.0):.3f}, "
            f"{1 + gate.get('hi', 0.0):.3f}])")
