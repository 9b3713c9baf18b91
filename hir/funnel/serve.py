"""`hir recommend`'s core: a user's deep-funnel and discovery candidates, scored by the learner.

:class:`Recommender` reads a run's ``funnel/`` (hir/funnel/stage.py) and answers for one user or a
batch: candidates from the user's open funnel, from discovery (an ANN search over the published
user embedding when one is given, else the funnel's own view base) and from popular entities,
scored by the trained :class:`~hir.funnel.scorer.FunnelScorer`, each returned with its source and a
short *why* ("carted 3 days ago", "bought 4 times, last 12 days ago", "near your history").

The evaluation harness ranks test users through this same class (evaluation/retrieval/arms/
recommend.py), so the figures in the report are those of the path a user calls.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from hir.errors import OutputError
from hir.funnel.boost import BoostedScorer
from hir.funnel.candidates import FEATURES
from hir.funnel.discovery import ViewBase
from hir.funnel.fit import Candidates, FunnelConfig, FunnelTables, score_candidates, top_per_user
from hir.funnel.scorer import FunnelScorer, ScorerConfig

# a discovery search: (U,) user ids, k -> (U, k) entity ids (-1 = none) and scores, the user's
# history already removed
Discovery = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]
SOURCES = ("funnel", "discovery", "popular")


@dataclass
class Recommendations:
    """Per user of ``users`` (U,): ``ids`` (U, k) entity ids best first (-1 = none), ``scores``
    (U, k), ``sources`` (U, k) the first source of each (an index into :data:`SOURCES`; -1 none)
    and ``why`` (U lists of k strings); ``discovery`` (U, k): the discovery source's own list
    (new to the user, in its order), served beside the scored one."""

    users: np.ndarray
    ids: np.ndarray
    scores: np.ndarray
    sources: np.ndarray
    why: list[list[str]]
    discovery: np.ndarray | None = None

    def as_rows(self, user_keys: list[str] | None = None, entity_keys: list[str] | None = None) -> list[dict[str, Any]]:
        """One dict per (user, rank): user, rank, entity, score, source, why (keys when given)."""
        out = []
        for r, u in enumerate(self.users.tolist()):
            for j, e in enumerate(self.ids[r].tolist()):
                if e < 0:
                    continue
                out.append({"user": user_keys[u] if user_keys else u, "rank": j + 1,
                            "entity": entity_keys[e] if entity_keys else e, "score": round(float(self.scores[r, j]), 4),
                            "source": SOURCES[self.sources[r, j]], "why": self.why[r][j]})
        return out


def scorer_state(scorer: FunnelScorer | BoostedScorer, config: FunnelConfig, features: list[str]) -> dict[str, Any]:
    """What ``scorer.pt`` holds for either kind: the MLP's state dict and widths, or the boosted
    model pickled with its scikit-learn version (hir/funnel/boost.py), plus the config and features."""
    if isinstance(scorer, BoostedScorer):
        return scorer.state() | {"features": features, "config": asdict(config)}
    return {"kind": "mlp", "state_dict": scorer.state_dict(), "hidden": list(config.scorer.hidden),
            "features": features, "config": asdict(config)}


def load_scorer(saved: dict[str, Any], config: ScorerConfig, path: str = "scorer.pt",
                sha256: str | None = None) -> FunnelScorer | BoostedScorer:
    """The scorer of :func:`scorer_state` (a ``scorer.pt`` written before the gbdt has no kind: an
    MLP); ``sha256``: the gbdt's recorded hash (hir/funnel/boost.py), checked before it is unpickled."""
    kind = saved.get("kind", "mlp")
    if kind == "gbdt":
        return BoostedScorer.from_state(saved, path, sha256)
    if kind != "mlp":
        raise OutputError(f"{path}: unknown funnel scorer kind {kind!r}; expected mlp or gbdt (refit with `hir funnel force=true`)")
    state = saved["state_dict"]
    scorer = FunnelScorer(state["mean"].numpy(), state["std"].numpy(), list(saved["hidden"]), config.heads)
    scorer.load_state_dict(state)
    scorer.eval()
    return scorer


def _why(row: dict[str, Any], stages: list[str], target: str) -> str:
    """A short reason for one candidate row."""
    if row.get("in_funnel"):
        age = row.get("age_days")
        when = f", {age:.0f} days ago" if age is not None else ""
        if row.get("converted"):
            times = int(row.get("n_target") or 0)
            return f"{target} {times}x before{when}" if times > 1 else f"{target} before{when}"
        stage = stages[int(row["deepest"])] if row.get("deepest") is not None else "engaged"
        n = int(row.get("n_deepest") or 1)
        return f"{stage}{f' {n}x' if n > 1 else ''}, not {target} yet{when}"
    if row.get("in_discovery"):
        return f"near your history (discovery #{int(row['disc_pos'])})"
    return f"popular (#{int(row['pop_pos'])})"


class Recommender:
    """Scores users' candidates with a run's trained funnel scorer.

    Args:
        funnel_dir: a ``funnel/`` directory (all of hir/funnel/stage.py's files).
        discovery: the discovery search; None = the funnel's view base (exact, in memory).
        now: the request time; ages are those of the funnel's cut-off plus (now - cut-off), so a
            source written yesterday serves today's recency (None = the cut-off itself).
    """

    def __init__(self, funnel_dir: str | Path, discovery: Discovery | None = None, now: datetime | None = None) -> None:
        import torch

        self.dir = Path(funnel_dir)
        meta_path = self.dir / "meta.json"
        if not meta_path.exists():
            raise OutputError(f"no funnel output at {self.dir} (meta.json missing); run `hir funnel` first")
        self.meta = json.loads(meta_path.read_text())
        path = self.dir / "scorer.pt"
        try:  # tensors and plain values only: loading runs no code (the gbdt's pickle stays bytes)
            saved = torch.load(path, weights_only=True)
        except pickle.UnpicklingError as err:
            raise OutputError(f"{path} holds more than tensors and plain values (written by an older hir?); it is not "
                             f"loaded: refit it (`hir funnel force=true`). {str(err).splitlines()[0]}") from err
        if "features" in saved and list(saved["features"]) != list(FEATURES):
            missing = [f for f in FEATURES if f not in saved["features"]]
            raise OutputError(f"{path} was fitted on other scorer inputs than this hir computes ({len(saved['features'])} "
                             f"against {len(FEATURES)}; new here: {missing}); refit it: `hir funnel force=true`")
        cfg = dict(saved["config"])
        cfg["scorer"] = ScorerConfig(**cfg["scorer"])
        self.config = FunnelConfig(**cfg)
        self.scorer = load_scorer(saved, self.config.scorer, str(path), self.meta.get("scorer_sha256"))
        base = np.load(self.dir / "base.npz")
        source = pl.read_parquet(self.dir / "open_funnel.parquet").drop("pos", "event_timestamp", strict=False)
        user_table = pl.read_parquet(self.dir / "users.parquet")
        entities = pl.read_parquet(self.dir / "entities.parquet")
        asof = datetime.fromisoformat(self.meta["asof"])
        if now is not None and now > asof:
            shift = (now - asof).total_seconds() / 86_400
            source = source.with_columns(pl.col("age_days", "target_age_days") + shift)
            user_table = user_table.with_columns(pl.col("user_last_days") + shift)
            if "entity_last_days" in entities.columns:  # a funnel/ written before hir/funnel/cycle.py has none
                entities = entities.with_columns(pl.col("entity_last_days") + shift)
        self.tables = FunnelTables(source=source, entities=entities, users=user_table,
                                   base=ViewBase(base["users"], base["entities"]), popular=base["popular"],
                                   use_time=bool(self.meta.get("use_time", True)))
        self.discovery = discovery
        self.stages = list(self.meta["stage_order"])
        self.target = str(self.meta["target_stage"])
        # a request reads its users' open-funnel rows and its candidates' entities only
        # (:meth:`request_tables`): the open funnel is sorted by user, so its rows are a slice
        uid = self.tables.source["user_id"].to_numpy()
        self._source_users = uid
        self._entity_ids = self.tables.entities["entity_id"].to_numpy()
        self.narrow = (self.config.neighbours == 0 and bool(np.all(uid[1:] >= uid[:-1]))
                       and bool(np.all(np.diff(self._entity_ids) > 0)))

    def __repr__(self) -> str:
        return f"Recommender({str(self.dir)!r}, pairs={self.meta['pairs']}, asof={self.meta['asof']})"

    def request_tables(self, users: np.ndarray, discovery: tuple[np.ndarray, np.ndarray]) -> tuple[FunnelTables, np.ndarray]:
        """The tables of one request: ``users``' open-funnel rows and the entities they, the
        discovery lists (U, D) and the popular list name, renumbered 0..n-1 in id order; returns
        them and ``keep`` (n,), the original id of each new one.

        Why: every candidate feature is a function of the user's own rows and of the candidate's
        and the context entities' rows, so the narrowed tables give the same values, in the same
        order (the renumbering keeps the id order every sort and tie-break reads), while the
        whole tables cost a scan of every open-funnel row (1.25M on completejourney) and a
        normalisation of every entity vector (92k x 256) per request. Not used with the neighbour
        inputs, which read every user's rows."""
        t = self.tables
        lo = np.searchsorted(self._source_users, users, side="left")
        hi = np.searchsorted(self._source_users, users, side="right")
        source = pl.concat([t.source.slice(int(a), int(b - a)) for a, b in zip(lo, hi, strict=True)])
        ids = discovery[0][discovery[0] >= 0]
        keep = np.unique(np.concatenate([source["entity_id"].to_numpy(), ids, t.popular]).astype(np.int64))  # (n,)
        at = np.searchsorted(self._entity_ids, keep).clip(max=max(len(self._entity_ids) - 1, 0))
        known = self._entity_ids[at] == keep if len(self._entity_ids) else np.zeros(len(keep), bool)
        dtype = t.source.schema["entity_id"]

        def renumbered(frame: pl.DataFrame) -> pl.DataFrame:
            return frame.with_columns(pl.Series("entity_id", np.searchsorted(keep, frame["entity_id"].to_numpy())).cast(dtype))

        entities = t.entities[at[known]].with_columns(pl.Series("entity_id", np.flatnonzero(known))
                                                      .cast(t.entities.schema["entity_id"]))
        return FunnelTables(source=renumbered(source), entities=entities, users=t.users,
                            base=ViewBase(t.base.users, t.base.entities[keep]), popular=np.searchsorted(keep, t.popular),
                            use_time=t.use_time), keep

    def candidates(self, users: np.ndarray) -> Candidates:
        """Every candidate of ``users`` (sorted, unique ids) with its scorer inputs."""
        t = self.tables
        if self.discovery is not None:
            disc = self.discovery(users, self.config.discovery)
        else:
            disc = t.base_discovery(users, self.config.discovery)
        if not self.narrow or not len(users):
            return t.candidates(users, self.config, discovery=disc)
        tables, keep = self.request_tables(users, disc)
        cands = tables.candidates(users, self.config,
                                  discovery=(np.where(disc[0] >= 0, np.searchsorted(keep, disc[0]), -1), disc[1]))
        # back to the snapshot's ids (the head's context keeps the request's, with its vectors)
        cands.rows = cands.rows.with_columns(pl.Series("entity_id", keep[cands.rows["entity_id"].to_numpy()])
                                             .cast(cands.rows.schema["entity_id"]))
        return cands

    def recommend(self, users: np.ndarray | list[int], k: int = 20) -> Recommendations:
        """The top ``k`` of each user (ids of the snapshot; unknown users get popular entities)."""
        users = np.unique(np.asarray(users, dtype=np.int64))
        cands = self.candidates(users)
        scores = score_candidates(self.scorer, cands)
        ids, vals = top_per_user(cands, scores, k)
        # the row of each chosen candidate, for its source and reason: rows are sorted by (user,
        # entity), so it is found by bisection in the user's block; only those rows become dicts
        ent = cands.rows["entity_id"].to_numpy()
        at = np.full(ids.shape, -1, np.int64)  # (U, k)
        for r in range(len(cands.users)):
            lo, hi = cands.offsets[r], cands.offsets[r + 1]
            chosen = ids[r] >= 0
            at[r, chosen] = lo + np.searchsorted(ent[lo:hi], ids[r, chosen])
        cols = ["in_funnel", "in_discovery", "in_popular", "converted", "deepest", "n_deepest", "n_target", "age_days",
                "disc_pos", "pop_pos"]
        table = iter(cands.rows[at[at >= 0]].select(cols).to_dicts())  # row-major over (user, rank)
        sources = np.full(ids.shape, -1, np.int8)
        why: list[list[str]] = []
        for r in range(len(cands.users)):
            reasons = []
            for j, e in enumerate(ids[r].tolist()):
                if e < 0:
                    reasons.append("")
                    continue
                row = next(table)
                sources[r, j] = 0 if row["in_funnel"] else 1 if row["in_discovery"] else 2
                reasons.append(_why(row, self.stages, self.target))
            why.append(reasons)
        disc_pos = cands.rows["disc_pos"].fill_null(0).to_numpy()
        disc = top_per_user(cands, np.where(disc_pos > 0, -disc_pos.astype(np.float64), -np.inf), k)
        discovery = np.where(np.isfinite(disc[1]), disc[0], -1)
        return Recommendations(cands.users, ids, vals, sources, why, discovery)
