"""`hir recommend`: discovery and the user's open funnel side by side, scored by the learner.

    hir recommend 1234 2001 --data completejourney           # the live version's store
    hir recommend 1234 --funnel outputs/online_retail/default/funnel --discovery base --json

    from hir.publish.recommend import open_recommender
    rec = open_recommender(data="completejourney")
    rec.recommend_keys(["1234"], k=10)                        # [{user, rank, entity, score, source, why}, ...]

The funnel outputs (``funnel/``) of the run the live version was published from are found through
its manifest (the run's snapshot dir sits beside them), or named with ``funnel`` (a funnel of the
same snapshot). Discovery candidates (``--discovery``) are the user's published embedding (Feast)
and its nearest entities, the user's history left out, searched

- ``exact``: in this process over the vectors the version put in Milvus (hir/publish/exact.py):
  the lists a Milvus exact search returns, without Milvus Lite's per-search Python loop over
  every row (docs/serving.md, "Latency of hir recommend");
- ``milvus``: in Milvus, the version's own collection;
- ``auto`` (default): ``exact`` when the version's Milvus is an embedded Lite dir, ``milvus`` when
  it is a server URI; ``base`` without a published version (``--funnel`` alone);
- ``base``: the funnel's own view base (no published version needed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import scipy.sparse as sp

from hir.errors import HirError
from hir.funnel.serve import Discovery, Recommender


def _keys(graph_dir: Path, entity_type: str) -> list[str]:
    """The snapshot's original ids of ``entity_type`` by dense node id."""
    nodes = pl.read_parquet(graph_dir / "nodes" / f"{entity_type}.parquet", columns=["node_id", "key"]).sort("node_id")
    return nodes["key"].cast(pl.String).to_list()


DISCOVERY = ("auto", "exact", "milvus", "base")


class SearchDiscovery:
    """Discovery through the published version: the user's embedding from Feast, its nearest
    entities from ``retriever`` (Milvus, or the in-process exact search) with the user's history
    left out inside the search (a filter on the ids).

    Why a filter and not an over-fetch of ``k`` + history hits: Milvus Lite turns every hit into a
    Python record, so a household with 1,000 engaged products cost 1,000 records per request;
    the filter returns exactly ``k`` (benchmarks/results/recommend.json).

    Args:
        retriever: a :class:`hir.publish.retrieval.Retriever` or
            :class:`hir.publish.exact.ExactSearch` of the version (``embeddings``, ``search``).
        user_keys, entity_keys: original ids by dense id; history: (users, entities) CSR of each
            user's engaged pairs (what discovery removes).
    """

    def __init__(self, retriever: Any, user_keys: list[str], entity_keys: list[str], history: sp.csr_matrix,
                 entity_type: str = "product") -> None:
        self.retriever, self.user_keys, self.history, self.entity_type = retriever, user_keys, history, entity_type
        self.entity_keys = entity_keys
        self.entity_index = {k: i for i, k in enumerate(entity_keys)}

    def __call__(self, users: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(len(users), k) dense entity ids (-1 pads) and their cosines (-inf pads)."""
        ids = np.full((len(users), k), -1, np.int64)
        scores = np.full((len(users), k), -np.inf, np.float32)
        vectors = self.retriever.embeddings("user", [self.user_keys[u] for u in users.tolist()])
        h = self.history
        exclude = [[self.entity_keys[e] for e in h.indices[h.indptr[u]:h.indptr[u + 1]].tolist()] for u in users.tolist()]
        hits = self.retriever.search(vectors, self.entity_type, k, exclude=exclude)
        for r, row_hits in enumerate(hits):
            kept = [(self.entity_index[key], s) for key, s in row_hits if key in self.entity_index][:k]
            if kept:
                ids[r, : len(kept)] = [e for e, _ in kept]
                scores[r, : len(kept)] = [s for _, s in kept]
        return ids, scores


class KeyedRecommender:
    """A :class:`Recommender` spoken to in the dataset's original ids."""

    def __init__(self, recommender: Recommender, user_keys: list[str], entity_keys: list[str]) -> None:
        self.recommender, self.user_keys, self.entity_keys = recommender, user_keys, entity_keys
        self.user_index = {k: i for i, k in enumerate(user_keys)}

    def recommend_keys(self, users: list[str], k: int = 20) -> list[dict[str, Any]]:
        """Rows {user, rank, entity, score, source, why} for every known user of ``users``."""
        return self.recommend_both(users, k)[0]

    def recommend_both(self, users: list[str], k: int = 20) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
        """The scored rows (:meth:`recommend_keys`) and, side by side, each user's discovery list
        (entity keys, new to the user)."""
        unknown = [u for u in users if u not in self.user_index]
        if unknown:
            raise HirError(f"unknown user ids {unknown[:5]}: not in the snapshot the funnel was built from")
        rec = self.recommender.recommend(np.array([self.user_index[u] for u in users]), k)
        assert rec.discovery is not None
        discovery = {self.user_keys[u]: [self.entity_keys[e] for e in row.tolist() if e >= 0]
                     for u, row in zip(rec.users.tolist(), rec.discovery, strict=True)}
        return rec.as_rows(self.user_keys, self.entity_keys), discovery


def _same_snapshot(funnel: Path, manifest: dict[str, Any]) -> None:
    """Refuse a ``funnel`` dir whose snapshot is not the one the version was published from: its
    dense ids would name other entities."""
    published = manifest.get("source", {}).get("graph_dir")
    mine, theirs = funnel.parent / "graph" / "meta.json", Path(published or "") / "meta.json"
    if published and theirs.exists() and mine.exists() and mine.read_bytes() != theirs.read_bytes():
        raise HirError(f"{funnel} was fitted on the snapshot {funnel.parent / 'graph'}, not on {published}, which "
                       f"version {manifest['version']!r} was published from; pass that run's funnel/")


def open_recommender(data: str | None = "completejourney", store: str | Path | None = None,
                     funnel: str | Path | None = None, discovery: str = "auto") -> KeyedRecommender:
    """The recommender of a live version (``store``, else ``outputs/serving/<data>`` unless only
    ``funnel`` is given) and of a ``funnel`` dir (default: the one beside the version's snapshot);
    ``discovery``: auto | exact | milvus | base (module doc)."""
    from hir.stages import ROOT

    if discovery not in DISCOVERY:
        raise HirError(f"--discovery {discovery!r}; expected one of {', '.join(DISCOVERY)}")
    manifest, store_dir = None, None  # the live version's manifest and its store (None: --funnel only)
    if funnel is None or store is not None:
        from hir.serving import live_manifest

        store_dir = Path(store) if store else ROOT / "outputs" / "serving" / str(data)
        if not store_dir.exists():
            raise HirError(f"no serving store at {store_dir}; run `hir publish` (or `make run`) first, or pass --funnel DIR")
        manifest = live_manifest(store_dir)
        if funnel is None:
            graph = manifest.get("source", {}).get("graph_dir")
            if not graph:
                raise HirError(f"the live manifest of {store_dir} names no graph_dir; pass --funnel DIR")
            funnel = Path(graph).parent / "funnel"
    funnel = Path(funnel)
    if not (funnel / "meta.json").exists():
        raise HirError(f"no funnel output at {funnel}; run `hir funnel` for that run (pipeline.stages has it after export)")
    if manifest is not None:
        _same_snapshot(funnel, manifest)
    meta = json.loads((funnel / "meta.json").read_text())
    graph_dir = funnel.parent / "graph"
    user_keys, entity_keys = _keys(graph_dir, "user"), _keys(graph_dir, meta["entity_type"])
    if discovery == "auto":
        from hir.publish.milvus_store import is_lite

        discovery = "base" if manifest is None else "exact" if is_lite(str(manifest["milvus"]["uri"])) else "milvus"
    search: Discovery | None = None
    if discovery in ("exact", "milvus"):
        if manifest is None:
            raise HirError(f"--discovery {discovery} needs a published version (--store or --data), not --funnel alone")
        if discovery == "exact":
            from hir.publish.exact import ExactSearch

            retriever: Any = ExactSearch(manifest, store_dir=store_dir)
        else:
            from hir.publish.retrieval import Retriever

            retriever = Retriever(manifest, store_dir=store_dir)
        source = pl.read_parquet(funnel / "open_funnel.parquet", columns=["user_id", "entity_id"])
        history = sp.csr_matrix((np.ones(source.height, np.float32), (source["user_id"].to_numpy(), source["entity_id"].to_numpy())),
                                shape=(len(user_keys), len(entity_keys)))
        search = SearchDiscovery(retriever, user_keys, entity_keys, history, meta["entity_type"])
    return KeyedRecommender(Recommender(funnel, search), user_keys, entity_keys)


def main(argv: list[str]) -> None:
    """`hir recommend USER [USER ...] [--k K] [--data NAME | --store DIR | --funnel DIR] [--discovery D] [--json]`."""
    ap = argparse.ArgumentParser(prog="hir recommend", description=__doc__.split("\n\n")[0])
    ap.add_argument("users", nargs="+", help="users' original ids (e.g. completejourney household keys)")
    ap.add_argument("--k", type=int, default=10, help="recommendations per user (default 10)")
    ap.add_argument("--data", default="completejourney", help="dataset whose live store to read: outputs/serving/<data>")
    ap.add_argument("--store", default=None, help="the serving store dir (publish.store_dir); overrides --data")
    ap.add_argument("--funnel", default=None,
                    help="a run's funnel/ dir, read directly (alone: no published version needed; with --store: "
                         "that version's discovery, this funnel of the same snapshot)")
    ap.add_argument("--discovery", default="auto",
                    help="auto (exact on a Milvus Lite store, milvus on a server, base without a store) | exact | "
                         "milvus | base")
    ap.add_argument("--json", action="store_true", help="print JSON rows")
    ap.add_argument("--with-discovery", action="store_true",
                    help="also print each user's discovery list (new to the user) beside the scored one")
    args = ap.parse_args(argv)
    try:
        rows, discovery = open_recommender(args.data, args.store, args.funnel, args.discovery).recommend_both(args.users, args.k)
    except HirError as err:
        print(f"hir recommend: {err}", file=sys.stderr)
        sys.exit(2)
    if args.json:
        print(json.dumps({"recommended": rows, "discovery": discovery} if args.with_discovery else rows, indent=1))
        return
    for row in rows:
        print(f"{row['user']:>10}  {row['rank']:>3}  {row['entity']:<14} {row['score']:>8.3f}  {row['source']:<9}  {row['why']}")
    if args.with_discovery:
        for user, items in discovery.items():
            print(f"{user:>10}  discover: {' '.join(items)}")
