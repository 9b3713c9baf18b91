"""The gradient-boosted funnel scorer (``funnel.config.scorer.kind: gbdt``).

The MLP (hir/funnel/scorer.py) reads the same candidate features; what it extracts poorly are
thresholds and interactions: a pair one cycle overdue converts at a fraction of the rate of a due
one, a decayed trip share matters only for a converted pair. Trees split on exactly that::

    s(u, c) = sum_t f_t([x_uc, r_uc])          logit of P(c converted next period | features)
    loss    = - sum_{u,c} y_uc log sigma(s) + (1 - y_uc) log(1 - sigma(s))

pointwise on the MLP's training candidates and targets (scikit-learn's
HistGradientBoostingClassifier). ``r_uc`` are within-user ranks of a few features (``relative``):
a tree compares a candidate with a fixed threshold, never with the user's other candidates, so
"the user's most-bought item" has to be a feature of its own. Boosting grows ``trees`` rounds in
``checks`` steps; after each, the held-out users' recall@K (the same check as the MLP's, on a
later period's view when given one) decides, and the model of the best check is kept (patience as
the MLP's); ``stop_at`` grows exactly that many trees instead (the refit after a period check).

The fitted model is saved pickled, as bytes, inside ``scorer.pt`` with the scikit-learn version
that wrote it; ``scorer.pt`` itself loads with ``torch.load(weights_only=True)`` (no code runs).
:func:`BoostedScorer.from_state` unpickles the bytes only when their sha256 equals the one the
funnel stage recorded in ``meta.json`` (``scorer_sha256``), and refuses another scikit-learn
version (a pickled estimator is only guaranteed to load in the release that wrote it). The hash
stops a ``scorer.pt`` swapped or altered apart from its ``meta.json``; a funnel directory whose
every file comes from someone untrusted is as unsafe as their code.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import pickle
from typing import Any

import numpy as np
import polars as pl

from hir.errors import OutputError, OutputVersionError

log = logging.getLogger(__name__)


def relative_ranks(x: np.ndarray, offsets: np.ndarray, columns: list[int]) -> np.ndarray:
    """(n, len(columns)) float32: each row's rank within its user's candidates by each column,
    largest first (0 = the user's top; ties share the smallest rank).

    Args:
        x: (n, F) features, rows grouped by user as ``offsets`` (U + 1,) says.
        columns: indices into F.
    """
    if not columns:
        return np.zeros((len(x), 0), np.float32)
    group = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    frame = pl.DataFrame({"g": group, **{f"c{j}": x[:, c] for j, c in enumerate(columns)}})
    ranks = frame.select(pl.col(f"c{j}").rank("min", descending=True).over("g") - 1 for j in range(len(columns)))
    return ranks.to_numpy().astype(np.float32)


class BoostedScorer:
    """A fitted HistGradientBoostingClassifier over (n, F) candidate features plus the within-user
    ranks of the ``relative`` columns; :meth:`score` -> (n,) logits.

    Args:
        model: the fitted classifier.
        features: the F feature names it was fitted on (candidates.FEATURES at fit time).
        relative: names among ``features`` whose within-user rank is appended.
    """

    head = None  # no target-aware head: the serving code asks every scorer

    def __init__(self, model: Any, features: list[str], relative: list[str]) -> None:
        missing = sorted(set(relative) - set(features))
        if missing:
            raise ValueError(f"funnel.config.scorer.relative names {missing}, not scorer features; "
                             f"expected names of hir.funnel.candidates.FEATURES")
        self.model, self.features, self.relative = model, list(features), list(relative)
        self.columns = [self.features.index(n) for n in self.relative]

    def __repr__(self) -> str:
        return (f"BoostedScorer(features={len(self.features)}, relative={self.relative}, "
                f"trees={getattr(self.model, 'n_iter_', 0)})")

    def inputs(self, x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """(n, F + R) the classifier's inputs: ``x`` and the within-user ranks."""
        if x.shape[1] != len(self.features):
            raise ValueError(f"the boosted funnel scorer was fitted on {len(self.features)} features, got {x.shape[1]}; "
                             "refit it (`hir funnel force=true`) after the feature list changed")
        return np.hstack([x, relative_ranks(x, offsets, self.columns)])

    def score(self, x: np.ndarray, context: Any = None, offsets: np.ndarray | None = None) -> np.ndarray:
        """(n,) logits of (n, F) rows grouped by user as ``offsets`` (U + 1,) says (or
        ``context.offsets``; needed when ``relative`` is not empty)."""
        if offsets is None and context is not None:
            offsets = context.offsets
        if offsets is None:
            if self.columns:
                raise ValueError("the boosted funnel scorer ranks features within each user: pass the rows' offsets")
            offsets = np.array([0, len(x)])
        if len(x) == 0:
            return np.zeros(0, np.float32)
        return self.model.decision_function(self.inputs(x, offsets)).astype(np.float32)

    def state(self) -> dict[str, Any]:
        """What ``scorer.pt`` holds: the pickled model, the names and the scikit-learn version."""
        import sklearn

        return {"kind": "gbdt", "model": pickle.dumps(self.model), "features": self.features,
                "relative": self.relative, "sklearn": sklearn.__version__}

    @classmethod
    def from_state(cls, saved: dict[str, Any], path: str = "scorer.pt", sha256: str | None = None) -> BoostedScorer:
        """The scorer of :meth:`state`; unpickles the model only when its bytes hash to ``sha256``
        (the funnel meta's ``scorer_sha256``), and refuses a model pickled by another
        scikit-learn release."""
        import sklearn

        model = saved.get("model")
        if not isinstance(model, bytes):
            raise OutputError(f"{path}: the boosted funnel scorer's model is {type(model).__name__}, not pickled bytes; "
                             "refit it (`hir funnel force=true`)")
        if sha256 is None:
            raise OutputError(f"{path}: no sha256 recorded for the boosted funnel scorer (meta.json scorer_sha256), so its "
                             "pickle is not loaded; refit it (`hir funnel force=true`) to record one")
        found = model_sha256(model)
        if found != sha256:
            raise OutputError(f"{path}: the boosted funnel scorer's sha256 is {found}, meta.json records {sha256}; the "
                             "file was altered or swapped, so its pickle is not loaded. Refit (`hir funnel force=true`)")

        if saved.get("sklearn") != sklearn.__version__:
            raise OutputVersionError(f"{path}: the boosted funnel scorer was saved with scikit-learn {saved.get('sklearn')}, "
                               f"this environment has {sklearn.__version__}; install scikit-learn=={saved.get('sklearn')} "
                               "or refit it (`hir funnel force=true`)")
        return cls(pickle.loads(saved["model"]), list(saved["features"]), list(saved["relative"]))


def model_sha256(model: bytes) -> str:
    """The hex sha256 of a pickled model's bytes (what ``meta.json`` records as ``scorer_sha256``)."""
    return hashlib.sha256(model).hexdigest()


def _group_rows(offsets: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row indices of ``groups`` (indices into ``offsets``) and their (len(groups) + 1,) offsets."""
    if len(groups) == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64)
    rows = np.concatenate([np.arange(offsets[g], offsets[g + 1]) for g in groups])
    return rows, np.concatenate([[0], np.cumsum(offsets[groups + 1] - offsets[groups])]).astype(np.int64)


def fit_boosted(x: np.ndarray, y: np.ndarray, offsets: np.ndarray, total: np.ndarray, config: Any, seed: int,
                features: list[str], check_set: Any = None,
                stop_at: int | None = None) -> tuple[BoostedScorer, dict[str, object]]:
    """Fit the boosted scorer on grouped candidate rows (the MLP's inputs, :func:`fit_scorer`).

    Args:
        x: (n, F) features named ``features``; y: (n,) 1 for a target entity; offsets: (U + 1,)
            row offsets of each user's candidates; total: (U,) each user's target count.
        config: a :class:`hir.funnel.scorer.ScorerConfig` (``trees``, ``tree_lr``, ``leaves``,
            ``min_leaf``, ``l2``, ``relative``, ``holdout``, ``checks``, ``patience``, ``k``).
        check_set: a :class:`hir.funnel.scorer.CheckSet` the checks score (every training user is
            then fitted); None = a ``config.holdout`` share of the training users.
        stop_at: grow exactly this many trees, no checks (a refit at a size chosen elsewhere).
    Returns:
        The scorer at its best check and a record of the fit (checks as (trees, recall), the best
        number of trees, users).
    """
    from sklearn.ensemble import HistGradientBoostingClassifier

    from hir.funnel.scorer import recall_at

    gen = np.random.default_rng(seed)
    users = np.arange(len(offsets) - 1)
    perm = gen.permutation(users)
    n_hold = 0 if check_set is not None or stop_at is not None else round(config.holdout * len(users))
    hold, fit_users = np.sort(perm[:n_hold]), np.sort(perm[n_hold:])
    fit_rows, fit_off = _group_rows(offsets, fit_users)
    if not y[fit_rows].any():
        raise ValueError("the boosted funnel scorer has no training user with a target among its candidates; "
                         "the candidate sources reach none of the next period's conversions")
    shell = BoostedScorer(None, features, list(config.relative))
    xf = shell.inputs(x[fit_rows], fit_off)
    if check_set is not None:
        xh, yh, hold_off, th = shell.inputs(check_set.x, check_set.offsets), check_set.y, check_set.offsets, check_set.total
    else:
        hold_rows, hold_off = _group_rows(offsets, hold)
        xh, yh, th = shell.inputs(x[hold_rows], hold_off), y[hold_rows], total[hold]
    model = HistGradientBoostingClassifier(
        learning_rate=config.tree_lr, max_iter=0, max_leaf_nodes=config.leaves, min_samples_leaf=config.min_leaf,
        l2_regularization=config.l2, early_stopping=False, warm_start=True, random_state=seed)
    # per_user: every user's rows weigh 1 / its target count, as recall averages over users (a user
    # with 40 next-period conversions would otherwise outweigh 40 users with one each)
    weight = None
    if config.per_user:
        per_row = np.repeat(1.0 / np.maximum(total[fit_users], 1.0), np.diff(fit_off))
        weight = per_row / per_row.mean()
    if stop_at is not None:
        if not 1 <= stop_at <= config.trees:
            raise ValueError(f"boosted funnel scorer: stop_at={stop_at} outside 1..{config.trees} trees")
        model.set_params(max_iter=stop_at)
        model.fit(xf, y[fit_rows], sample_weight=weight)
        return BoostedScorer(model, features, list(config.relative)), {
            "checks": [], "best_step": int(model.n_iter_), "best_recall": None, "fit_users": len(fit_users),
            "holdout_users": 0, "fit_rows": len(fit_rows)}
    every = max(config.trees // config.checks, 1)
    history: list[tuple[int, float]] = []
    best: tuple[float, int, Any] = (-1.0, 0, None)
    for trees in range(every, config.trees + every, every):
        model.set_params(max_iter=min(trees, config.trees))
        model.fit(xf, y[fit_rows], sample_weight=weight)
        value = recall_at(model.decision_function(xh), yh, hold_off, config.k, th) \
            if len(hold_off) > 1 else float(model.n_iter_)
        history.append((int(model.n_iter_), value))
        log.info("boosted funnel scorer: %d trees, held-out recall@%d %.4f", model.n_iter_, config.k, value)
        if value > best[0]:
            best = (value, int(model.n_iter_), copy.deepcopy(model))
        elif len(history) - 1 - [t for t, _ in history].index(best[1]) >= config.patience:
            log.info("boosted funnel scorer: no better check in %d, stopped at %d trees", config.patience, model.n_iter_)
            break
        if model.n_iter_ >= config.trees:
            break
    scorer = BoostedScorer(best[2], features, list(config.relative))
    return scorer, {"checks": history, "best_step": best[1], "best_recall": best[0], "fit_users": len(fit_users),
                    "holdout_users": len(hold), "check_users": len(hold_off) - 1, "fit_rows": len(fit_rows)}
