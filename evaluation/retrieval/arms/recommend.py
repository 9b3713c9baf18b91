"""`hir recommend` as a retrieval arm: the path a user calls, scored in batches.

Candidates and scores come from :class:`hir.funnel.serve.Recommender` over the run's ``funnel/``
(beside the snapshot); discovery candidates are the HIR search's own new-to-user lists (the
published embedding in Milvus, or the export files: ``ctx.hir``) when that arm can run, else the
funnel's view base. Each protocol's list is the recommender's ranking with that protocol's
history removed, so nothing the protocol masks is counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from hir_evaluation.retrieval.rank import Ranked
from hir_evaluation.retrieval.registry import ArmInfo, RetrievalContext


def _drop(lists: np.ndarray, users: np.ndarray, pairs: pl.DataFrame | None, k: int) -> np.ndarray:
    """(U, k) of ``lists`` (U, L) with each user's ``pairs`` entities removed (None: none)."""
    out = np.full((len(users), k), -1, np.int64)
    masked: dict[int, set[int]] = {}
    if pairs is not None:
        grouped = pairs.group_by("user_id").agg("entity_id")
        masked = {u: set(e) for u, e in zip(grouped["user_id"].to_list(), grouped["entity_id"].to_list(), strict=True)}
    for r, u in enumerate(users.tolist()):
        seen = masked.get(u, set())
        kept = [e for e in lists[r].tolist() if e >= 0 and e not in seen][:k]
        out[r, : len(kept)] = kept
    return out


@dataclass(frozen=True)
class Recommend:
    """The learned deep-funnel recommender (``hir recommend``); ``batch``: users per call;
    ``extra``: candidates ranked beyond k, so a protocol's masking still leaves k."""

    batch: int = 512
    extra: int = 300
    # needs the HIR search: its discovery lists are the published embedding's, and an arm that reads
    # the run's outputs is never cached under the snapshot's hash nor fitted in the background
    info: ClassVar[ArmInfo] = ArmInfo(role="model", needs=("hir",))

    def topk(self, ctx: RetrievalContext, k: int) -> Ranked:
        from hir.funnel.serve import Recommender

        data = ctx.test
        funnel_dir = ctx.snap.dir.parent / "funnel"
        if not (funnel_dir / "meta.json").exists():
            empty = np.full((len(data.users), k), -1, np.int64)
            return Ranked(empty, empty.copy(), {"skipped": f"no funnel output at {funnel_dir} (funnel.enabled=false, "
                                                           "or `hir funnel` not run for this run dir)"})
        rec = Recommender(funnel_dir)
        if ctx.hir is not None:
            hir_lists = ctx.hir(data, rec.config.discovery).masked
            if hir_lists is not None:
                row = {u: i for i, u in enumerate(data.users.tolist())}
                base = rec.tables.base

                def discovery(users: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
                    ids = hir_lists[[row[u] for u in users.tolist()], :d]
                    scores = base.pair_scores(np.repeat(users, ids.shape[1]), np.maximum(ids, 0).reshape(-1))
                    return ids, np.where(ids >= 0, scores.reshape(ids.shape), -np.inf).astype(np.float32)

                rec.discovery = discovery
        lists = np.full((len(data.users), k + self.extra), -1, np.int64)
        for lo in range(0, len(data.users), self.batch):
            users = data.users[lo:lo + self.batch]
            out = rec.recommend(users, k + self.extra)  # rows in sorted user order
            order = np.searchsorted(out.users, users)
            lists[lo:lo + len(users)] = out.ids[order]
        full = _drop(lists, data.users, None, k)
        masked = _drop(lists, data.users, data.history.select("user_id", "entity_id"), k)
        deep = None if data.deep_history is None else \
            _drop(lists, data.users, data.deep_history.select("user_id", "entity_id"), k)
        return Ranked(full, masked, {"funnel_dir": str(funnel_dir), "asof": rec.meta["asof"],
                                     "discovery": "hir" if rec.discovery is not None else "view base"}, deep=deep)
