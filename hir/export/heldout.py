"""Tokens judged on engagement they never saw: the held-out measures of issue 34.

Every function is pure (arrays in, numbers out). A tokenization is, per level, ``top1``: (n_nodes,)
every node's top-1 token in global-id order (-1 = none). Pairs are distinct (user id, global
entity id) arrays of one period.

- :func:`heldout_concentration`: the test period's distinct user-token edges over those of a
  random assignment with the same token sizes and popularity-matched entities (tokens permuted
  only among entities of about the same test-period degree), so a tokenization that merely puts
  popular entities together gains nothing.
- :func:`token_prediction`: a user's history token distribution (smoothed towards the tokens'
  popularity, the smoothing chosen on val) predicting the tokens of their next-period new
  entities: log-loss and recall of the top tokens, beside the popularity predictor on the same tokens.
- :func:`token_coverage`: the seed's super-graph claim on held-out pairs: the share of the test
  period's user-token edges already in the history's user-token graph, against the same share of
  raw user-entity edges.
- :func:`taxonomy_purity`: share of labelled entities whose token's majority class is their own.
- :func:`aligned_agreement`: top-1 agreement of two tokenizations after matching their prototypes
  one to one (Hungarian on prototype cosine similarity).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from hir.export.supergraph import distinct, member, n_distinct

ALPHAS = (1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)  # smoothing grid of token_prediction (pseudo-events)


def degree_matched_permutation(entities: np.ndarray, degree: np.ndarray, rng: np.random.Generator,
                               bins: int = 20) -> np.ndarray:
    """A permutation of ``entities`` (m,) that moves each entity only among entities of about the
    same ``degree`` (m,): the entities sorted by degree (ties at random) are cut into ``bins``
    equal runs and shuffled within each run. Returns (m,) the entity each position takes its
    token from."""
    order = np.lexsort((rng.random(len(entities)), degree))
    out = entities.copy()
    for run in np.array_split(order, max(1, min(bins, len(entities)))):
        out[run] = entities[rng.permutation(run)]
    return out


def heldout_concentration(users: np.ndarray, entities: np.ndarray, top1: Sequence[np.ndarray],
                          levels: Sequence[int], shuffles: int = 5, bins: int = 20, seed: int = 0) -> list[dict[str, Any]]:
    """Per level, distinct user-token edges of the pairs / those of popularity-matched random
    assignments (mean over ``shuffles``); below 1 when a user's held-out entities share tokens
    more than entities of the same popularity would.

    Args:
        users, entities: (E,) distinct held-out pairs (user id, global entity id).
        top1: per level (n_nodes,) top-1 token; levels: K_l per level.
    """
    ents, inverse, degree = np.unique(entities, return_inverse=True, return_counts=True)
    rng = np.random.default_rng(seed)
    perms = [degree_matched_permutation(ents, degree, rng, bins)[inverse] for _ in range(shuffles)]
    out = []
    for lvl, k in enumerate(levels):
        edges = n_distinct(users * k + top1[lvl][entities])
        rand = np.array([n_distinct(users * k + top1[lvl][p]) for p in perms], np.float64)
        out.append({"level": lvl, "prototypes": int(k), "pairs": len(users), "edges": edges,
                    "random_edges": float(rand.mean()), "concentration": edges / rand.mean(),
                    "random_sd": float((edges / rand).std())})
    return out


def _rank(p: np.ndarray, r: np.ndarray, pt: np.ndarray) -> np.ndarray:
    """(c,) the rank of ``pt`` (c,) in row ``r`` (c,) of ``p`` (n, k): the row's entries >= pt, minus 1
    (0 = the most probable; ties count against it), i.e. ``(p[r] >= pt[:, None]).sum(1) - 1`` without
    the (c, k) matrix. Every value is replaced by its rank among all of them (exact, ties kept), so
    the rows, each sorted, lie in one sorted array of keys ``row * n_values + rank``."""
    n, k = p.shape
    _, dense = np.unique(np.concatenate([np.sort(p, axis=1).ravel(), pt]), return_inverse=True)
    width = len(dense)
    rows = np.repeat(np.arange(n, dtype=np.int64), k)
    keys = rows * width + dense[:n * k]  # sorted: rows in order, each row's values ascending
    below = np.searchsorted(keys, r * width + dense[n * k:]) - r * k  # the row's entries < pt
    return k - below - 1


def _predict(hist_users: np.ndarray, hist_tokens: np.ndarray, pop: np.ndarray, alphas: Sequence[float],
             users: np.ndarray, tokens: np.ndarray, tops: Sequence[int], block: int = 4096) -> list[dict[str, float]]:
    """Log-loss and recall@m of p_u = (counts_u + alpha pop) / (n_u + alpha) on (user, token) pairs,
    one dict per alpha of ``alphas`` (the counts are gathered once).

    Args:
        hist_users, hist_tokens: (H,) the history pairs' users and tokens.
        pop: (k,) token popularity (sums to 1); alphas: pseudo-events of popularity per user.
        users, tokens: (E,) the pairs to predict.
        tops: the m of recall@m (none: the log-loss alone, and no (users, k) matrix is formed).
        block: users whose (block, k) counts are held at once (memory stays bounded on
            datasets with many users).
    """
    if not len(users):
        return [{"log_loss": float("nan"), **{f"recall@{m}": float("nan") for m in tops}} for _ in alphas]
    ids, row = np.unique(users, return_inverse=True)
    hrow = np.searchsorted(ids, hist_users)
    known = (hrow < len(ids)) & (ids[np.minimum(hrow, len(ids) - 1)] == hist_users)
    hrow, htok = hrow[known], hist_tokens[known]
    k = len(pop)
    loss, hits = np.zeros(len(alphas)), np.zeros((len(alphas), len(tops)))
    for lo in range(0, len(ids), block):
        hi = min(lo + block, len(ids))
        sel = (hrow >= lo) & (hrow < hi)
        # bincount, not np.add.at (~15 s of completejourney's export)
        counts = np.bincount((hrow[sel] - lo) * k + htok[sel],
                             minlength=(hi - lo) * k).reshape(hi - lo, k).astype(np.float64)
        n_u = counts.sum(1)  # (block,), exact: sums of whole numbers
        at = (row >= lo) & (row < hi)
        r, t = row[at] - lo, tokens[at]
        c_rt, pop_t, n_r = counts[r, t], pop[t], n_u[r]  # (c,)
        for i, alpha in enumerate(alphas):
            # p[r, t] elementwise as the (block, k) matrix below has it: the same operations, the same value
            pt = (c_rt + alpha * pop_t) / (n_r + alpha)
            loss[i] -= np.log(pt).sum()
            if tops:
                p = (counts + alpha * pop[None, :]) / (n_u[:, None] + alpha)  # (block, k)
                rank = _rank(p, r, pt)
                hits[i] += [(rank < m).sum() for m in tops]
    return [{"log_loss": float(loss[i] / len(users)),
             **{f"recall@{m}": float(h / len(users)) for m, h in zip(tops, hits[i])}} for i in range(len(alphas))]


def token_prediction(history: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray],
                     val_history: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                     top1: Sequence[np.ndarray], levels: Sequence[int], tops: Sequence[int] = (1, 5)) -> list[dict[str, Any]]:
    """Per level, how well a user's history tokens predict the tokens of their next-period new
    entities, beside the tokens' popularity alone (the same for every user).

    The smoothing ``alpha`` (pseudo-events of popularity added to a user's history) is chosen per
    tokenization and level by val log-loss (``val_history`` predicting ``val``) from ``ALPHAS``,
    then ``history`` predicts ``test``. Only pairs new to the user and users with a history count.

    Args:
        history, val_history: (users, global entity ids) the engagement before test / before val.
        val, test: (users, global entity ids) distinct pairs of the val / test period.
        top1: per level (n_nodes,) top-1 token; levels: K_l per level.
    Returns:
        per level ``{level, pairs, users, alpha, hir: {log_loss, recall@m}, popularity: {...}}``
        (``hir`` = this tokenization's user-history predictor).
    """
    def new_pairs(hist: tuple[np.ndarray, np.ndarray], pairs: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        width = int(max(hist[1].max(initial=0), pairs[1].max(initial=0))) + 1
        seen = member(pairs[0] * width + pairs[1], hist[0] * width + hist[1])
        keep = ~seen & member(pairs[0], hist[0])
        return pairs[0][keep], pairs[1][keep]

    val_u, val_e = new_pairs(val_history, val)
    test_u, test_e = new_pairs(history, test)
    out = []
    for lvl, k in enumerate(levels):
        t = top1[lvl]
        row: dict[str, Any] = {"level": lvl, "prototypes": int(k), "pairs": len(test_u), "users": len(np.unique(test_u))}
        row["alpha"] = 1.0
        if len(val_u):
            vpop = (np.bincount(t[val_history[1]], minlength=k) + 1) / (len(val_history[1]) + k)
            losses = [f["log_loss"] for f in _predict(val_history[0], t[val_history[1]], vpop, ALPHAS, val_u, t[val_e], ())]
            row["alpha"] = ALPHAS[int(np.argmin(losses))]
        # Laplace: a token unseen in the history keeps a chance
        pop = (np.bincount(t[history[1]], minlength=k) + 1) / (len(history[1]) + k)
        row["hir"] = _predict(history[0], t[history[1]], pop, (row["alpha"],), test_u, t[test_e], tops)[0]
        none = np.zeros(0, np.int64)
        row["popularity"] = _predict(none, none, pop, (1.0,), test_u, t[test_e], tops)[0]
        out.append(row)
    return out


def token_coverage(history: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                   top1: Sequence[np.ndarray], levels: Sequence[int], degree_bins: int = 20,
                   seed: int = 0) -> dict[str, Any]:
    """The super-graph's density where it counts: the share of the test period's distinct user-token
    edges that the history's user-token graph already holds, per level, against the share of the
    test's raw user-entity edges the raw history holds (``raw``), and against a popularity-matched
    random assignment of the same token sizes (``random``, one shuffle over all entities of either
    period).

    Args:
        history, test: (users, global entity ids) distinct pairs.
        top1: per level (n_nodes,) top-1 token; levels: K_l per level.
    """
    hu, he = history
    tu, te = test
    width = int(max(he.max(initial=0), te.max(initial=0))) + 1
    raw = float(member(tu * width + te, hu * width + he).mean()) if len(tu) else float("nan")
    ents, inverse = np.unique(np.concatenate([he, te]), return_inverse=True)
    degree = np.bincount(inverse, minlength=len(ents))
    perm = degree_matched_permutation(ents, degree, np.random.default_rng(seed), degree_bins)
    source = np.full(width, -1, np.int64)
    source[ents] = perm  # entity -> the entity whose token it takes in the random assignment
    levels_out = []
    for lvl, k in enumerate(levels):
        t = top1[lvl]
        cov = {}
        for name, tok in (("tokens", t), ("random", None)):
            h_tok = t[source[he]] if tok is None else tok[he]
            t_tok = t[source[te]] if tok is None else tok[te]
            test_edges = distinct(tu * k + t_tok)
            cov[name] = float(member(test_edges, hu * k + h_tok).mean()) if len(test_edges) else float("nan")
        levels_out.append({"level": lvl, "prototypes": int(k), "coverage": cov["tokens"],
                           "random_coverage": cov["random"], "gain_over_raw": cov["tokens"] / raw if raw else None})
    return {"raw_coverage": raw, "test_pairs": len(tu), "levels": levels_out}


def taxonomy_purity(classes: np.ndarray, tokens: np.ndarray) -> float:
    """Share of entities whose token's most frequent class is their own class.

    Args:
        classes, tokens: (n,) a class (>= 0) and a token per labelled entity."""
    if not len(classes):
        return float("nan")
    _, ci = np.unique(classes, return_inverse=True)
    _, ti = np.unique(tokens, return_inverse=True)
    table = np.zeros((ti.max() + 1, ci.max() + 1), np.int64)
    np.add.at(table, (ti, ci), 1)
    return float(table.max(1).sum() / len(classes))


def prototypes_of(x: np.ndarray, tokens: np.ndarray, k: int) -> np.ndarray:
    """(k, dim) the unit mean of each token's member rows of x (n, dim); a token without members is 0."""
    sums = np.zeros((k, x.shape[1]), np.float64)
    np.add.at(sums, tokens, x)
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return sums / np.where(norms > 0, norms, 1.0)


def aligned_agreement(tokens_a: np.ndarray, tokens_b: np.ndarray, protos_a: np.ndarray,
                      protos_b: np.ndarray) -> float:
    """Top-1 agreement of two tokenizations of the same entities after matching b's prototypes to
    a's one to one by the Hungarian algorithm on cosine similarity.

    Args:
        tokens_a, tokens_b: (n,) top-1 tokens; protos_a, protos_b: (K, dim) prototype vectors.
    """
    na = protos_a / np.maximum(np.linalg.norm(protos_a, axis=1, keepdims=True), 1e-12)
    nb = protos_b / np.maximum(np.linalg.norm(protos_b, axis=1, keepdims=True), 1e-12)
    rows, cols = linear_sum_assignment(-(nb @ na.T))  # b's prototype rows[i] <-> a's cols[i]
    to_a = np.full(len(protos_b), -1, np.int64)
    to_a[rows] = cols
    return float((to_a[tokens_b] == tokens_a).mean()) if len(tokens_a) else float("nan")
