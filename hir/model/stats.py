"""What the network's inputs look like on a store: the figures that show training, validation and
export feed it the same distribution (the training task's view is a smaller window than export's)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from hir.model.context import ContextSampler
from hir.model.metrics import chunk_topk
from hir.model.spectral import SpectralBase
from hir.model.store import GraphStore
from hir.model.valset import ValSet
from hir.nn.buckets import ENGAGEMENT


def input_stats(store: GraphStore, base: SpectralBase, sampler: ContextSampler, users: ValSet | np.ndarray,
                seed: int, sample: int = 2000, k: int = 20) -> dict[str, Any]:
    """Input distribution of (a seeded sample of at most ``sample`` of) ``users``:

    - ``user_base_norm``: median and 90th percentile of the users' base norms, and the share of
      users without a base (no visible history: the network's fallback);
    - ``top_score``: mean of the users' top-``k`` scores ``b_u/|b_u| . b_e`` over the entities of the
      deep stage's types (the score scale the catalogue loss and retrieval see);
    - ``context``: mean valid tokens of the users' engagement contexts, and of their engagement
      segment alone (history length, capped by the sampler).
    """
    ids = users.users if isinstance(users, ValSet) else np.asarray(users, np.int64)
    if len(ids) == 0:
        return {}
    rng = np.random.default_rng([seed, 17])
    ids = np.sort(rng.choice(ids, min(sample, len(ids)), replace=False))
    b = base.vectors[ids].astype(np.float64)
    norm = np.linalg.norm(b, axis=1)
    has = norm > 0
    types = np.unique(store.node_type[store.deep_pairs[:, 1]]) if len(store.deep_pairs) else np.zeros(0, int)
    ents = np.flatnonzero(np.isin(store.node_type, types))
    top = float("nan")
    if has.any() and len(ents):
        # float32 in user chunks: a (users x entities) float64 matrix was 1.5 GB and ~20 s on
        # completejourney for one diagnostic number. The entities' rows are a view where they are
        # one run of ids (node ids are grouped by type), not an (entities x K) copy, and each
        # chunk's top-k values come a block of entities at a time (chunk_topk: the same values
        # as the chunk's whole score matrix gives)
        run = ents[-1] - ents[0] + 1 == len(ents)
        rows = base.vectors[ents[0]:ents[-1] + 1] if run else base.vectors[ents]
        with warnings.catch_warnings():  # a read-only (mapped) base: only read here
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            ev = torch.from_numpy(np.ascontiguousarray(rows, np.float32))
        uv = (b[has] / norm[has, None]).astype(np.float32)
        kk = min(k, len(ents))
        sums = [float(chunk_topk(torch.from_numpy(uv[lo:lo + 256]), ev, [()] * len(uv[lo:lo + 256]), kk)[0]
                      .double().sum()) for lo in range(0, len(uv), 256)]
        top = sum(sums) / (len(uv) * kk)
    ctx = sampler.engagement(ids, np.random.default_rng([seed, 18]))
    valid = ctx["node"] >= 0
    return {
        "users": len(ids),
        "user_base_norm": {"median": round(float(np.median(norm[has])), 5) if has.any() else 0.0,
                           "p90": round(float(np.quantile(norm[has], 0.9)), 5) if has.any() else 0.0,
                           "no_base_share": round(float(1 - has.mean()), 4)},
        "top_score": round(top, 5),
        "context": {"tokens": round(float(valid.sum(1).mean()), 3),
                    "engagement": round(float((valid & (ctx["relation"] == ENGAGEMENT) & (ctx["hop"] != 2)).sum(1)
                                              .mean()), 3)},
    }
