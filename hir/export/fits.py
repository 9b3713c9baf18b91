"""Token trees fitted beyond the refit (``export.hierarchy_fit``), each judged on held-out pairs
(hir/export/heldout.py, benchmarks/hierarchy.py):

- :func:`coengage_refine` (``coengage``): the refit tree's tokens refined top down by co-engagement;
- :func:`bottomup_tokens` (``bottomup``): level 1 a flat k-means, level 0 its tokens grouped by
  co-engagement into equal groups (:func:`group_balanced`), finer levels split within their parent;
- :func:`fit_tree`: either fit, then the tokenizer settles into it (:func:`follow_tokens`), so the
  exported tokens stay the saved tokenizer's (`hir refresh`).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from hir.nn.hierarchy import HierarchicalTokenizer


def coengage_refine(tokens: list[np.ndarray], levels: tuple[int, ...], pairs: tuple[np.ndarray, np.ndarray],
                    n_users: int, n_entities: int, iters: int = 5, alpha: float = 5.0) -> list[np.ndarray]:
    """The tree's tokens refined by co-engagement on ``pairs`` (the history only), top down.

    An entity with history users U moves to the token t maximising sum_{u in U} log(p_u(t) / q(t)),
    p_u the user's smoothed token distribution ((counts + alpha q) / (n_u + alpha)) and q the
    tokens' share of pairs: the token its users over-engage relative to its size, so a big token
    does not pull everything. Level 0 chooses among all its tokens; a finer level only among the
    children of the entity's (refined) parent (children of p are p*b .. p*b + b - 1), so the tree
    holds. Entities without history keep their tokens. ``iters`` rounds per level.
    """
    users, ents = pairs
    inc = sp.csr_matrix((np.ones(len(users), np.float32), (ents, users)), shape=(n_entities, n_users))
    rows = np.flatnonzero(np.asarray(inc.sum(1)).ravel() > 0)
    out: list[np.ndarray] = []
    for lvl, k in enumerate(levels):
        t = tokens[lvl].copy()
        branch = k // levels[lvl - 1] if lvl else k
        parent = out[-1] if lvl else None
        for _ in range(iters):
            c = np.zeros((n_users, k), np.float32)
            np.add.at(c, (users, t[ents]), 1.0)
            q = (c.sum(0) + 1) / (c.sum() + k)
            # (n_users, k), its steps in place: one (users, k) array, not four (1.6 GB at 200,000 users
            # and 512 tokens; each step is the same float32 operation as written out whole)
            lift = c + alpha * q
            lift /= c.sum(1, keepdims=True) + alpha
            lift /= q
            np.log(lift, out=lift)
            new = t.copy()
            for lo in range(0, len(rows), 4096):
                r = rows[lo:lo + 4096]
                score = np.asarray(inc[r] @ lift)  # (chunk, k)
                if parent is not None:
                    first = parent[r] * branch  # the entity may only take a child of its parent
                    score = np.take_along_axis(score, first[:, None] + np.arange(branch)[None, :], 1)
                    new[r] = first + score.argmax(1)
                else:
                    new[r] = score.argmax(1)
            moved = int((new != t).sum())
            t = new
            if moved == 0:
                break
        if parent is not None:  # entities without history: their token under the parent they have
            t = np.where(t // branch == parent, t, parent * branch + t % branch)
        out.append(t)
    return out


@torch.no_grad()
def follow_tokens(tokenizer: HierarchicalTokenizer, directions: np.ndarray, top1: list[np.ndarray]) -> None:
    """Move each prototype to the unit mean of its members' ``directions`` (n, dim) under ``top1``
    (per level (n,)), coarse first and within the residual bound, in place: the labels and the
    tokens of entities placed later (`hir refresh`) then follow the refined tokens. A prototype
    without members keeps its vector."""
    x = torch.from_numpy(np.ascontiguousarray(directions, np.float32))
    for lvl, k in enumerate(tokenizer.levels):
        vecs = tokenizer.vectors()
        t = torch.from_numpy(top1[lvl].astype(np.int64))
        sums = torch.zeros(k, x.shape[1]).index_add_(0, t, x)
        counts = torch.bincount(t, minlength=k)[:, None]
        new = torch.where(counts > 0, torch.nn.functional.normalize(sums, dim=-1), vecs[lvl].detach())
        tokenizer._set_level(lvl, new, [v.detach() for v in vecs])


def group_balanced(feat: np.ndarray, sizes: np.ndarray, k: int, seed: int, iters: int = 10) -> np.ndarray:
    """(m, f) points (weighted by ``sizes`` (m,)) -> (m,) ids of k groups of exactly m / k points:
    a weighted k-means start, then rounds of an optimal assignment of the points to k x (m / k)
    slots (Hungarian on cosine similarity to the groups' weighted means)."""
    from scipy.optimize import linear_sum_assignment
    from sklearn.cluster import KMeans

    m = len(feat)
    if m % k:
        raise ValueError(f"{m} points do not split into {k} equal groups; levels must be multiples of each other")
    branch = m // k
    x = feat / np.maximum(np.linalg.norm(feat, axis=1, keepdims=True), 1e-12)
    g = KMeans(k, n_init=5, random_state=seed).fit(x, sample_weight=sizes + 1e-9).cluster_centers_
    a = np.full(m, -1, np.int64)
    for _ in range(iters):
        rows, slots = linear_sum_assignment(-(x @ np.repeat(g, branch, axis=0).T))  # slot j is group j // branch
        new = np.empty(m, np.int64)
        new[rows] = slots // branch
        if (new == a).all():
            break
        a = new
        g = np.stack([np.average(x[a == j], axis=0, weights=sizes[a == j] + 1e-9) for j in range(k)])
    return a


def bottomup_tokens(directions: np.ndarray, levels: tuple[int, ...], pairs: tuple[np.ndarray, np.ndarray],
                    n_users: int, seed: int) -> list[np.ndarray]:
    """A balanced token tree built from its second level outwards (``export.hierarchy_fit=bottomup``).

    Level 1 is a plain k-means of the directions (the level where a flat k-means held interest
    best on held-out pairs); level 0 groups level 1's tokens into K_0 equal groups of children
    by co-engagement (each level-1 token as its share of every user's engagement on ``pairs``,
    :func:`group_balanced`); each finer level splits each token by k-means into its children.
    Token ids follow the tokenizer's tree (children of p are p*b .. p*b + b - 1).

    Args:
        directions: (m, dim) unit directions of the entities fitted.
        pairs: (users, rows into directions) the engagement the grouping may see (the visible pairs).
    Returns:
        per level (m,) every fitted entity's token.
    """
    from sklearn.cluster import KMeans

    if len(directions) < levels[min(1, len(levels) - 1)]:
        raise ValueError(f"hierarchy_fit=bottomup: {len(directions)} warm entities for {levels[min(1, len(levels) - 1)]} "
                         "level-1 tokens; set export.hierarchy_fit=entities or lower model.net.hierarchy.levels")
    if len(levels) < 2:
        return [KMeans(levels[0], n_init=3, random_state=seed).fit_predict(directions).astype(np.int64)]
    l1 = KMeans(levels[1], n_init=3, random_state=seed).fit_predict(directions).astype(np.int64)
    users, rows = pairs
    profile = np.zeros((levels[1], n_users), np.float64)
    np.add.at(profile, (l1[rows], users), 1.0)
    # a user's share of their engagement on each token (heavy users do not dominate); sqrt damps
    profile = np.sqrt(profile / np.maximum(profile.sum(0, keepdims=True), 1.0))
    parent = group_balanced(profile, np.bincount(l1, minlength=levels[1]).astype(np.float64), levels[0], seed)
    branch = levels[1] // levels[0]
    renumber = np.empty(levels[1], np.int64)
    for p in range(levels[0]):
        kids = np.flatnonzero(parent == p)
        renumber[kids] = p * branch + np.arange(branch)
    out = [renumber[l1] // branch, renumber[l1]]
    for lvl in range(2, len(levels)):
        b = levels[lvl] // levels[lvl - 1]
        t = np.zeros(len(directions), np.int64)
        for c in range(levels[lvl - 1]):
            idx = np.flatnonzero(out[-1] == c)
            if len(idx) <= b:  # too few members to split: one child each
                t[idx] = c * b + np.arange(len(idx))
                continue
            t[idx] = c * b + KMeans(b, n_init=3, random_state=seed).fit_predict(directions[idx])
        out.append(t)
    return out


@torch.no_grad()
def top1_of(tokenizer: HierarchicalTokenizer, directions: np.ndarray, chunk: int = 8192) -> list[np.ndarray]:
    """Per level (n,) the tokenizer's top-1 token of each of ``directions`` (n, dim), ``chunk``
    rows at a time as :meth:`hir.export.embed.Embedder.tokens` reads them: the scores are float64
    (:meth:`HierarchicalTokenizer.scores`), and over every row at once their (n, dim) copies were
    the export's peak (about 6 GB for 247,877 entities at rank 1024). A row's tokens are its own."""
    out: list[list[np.ndarray]] = [[] for _ in tokenizer.levels]
    for lo in range(0, len(directions), chunk):
        x = torch.from_numpy(np.ascontiguousarray(directions[lo:lo + chunk], np.float32))
        for lvl, lp in enumerate(tokenizer.log_probs(x)):
            out[lvl].append(lp.argmax(1).numpy().astype(np.int64))
    return [np.concatenate(o) if o else np.zeros(0, np.int64) for o in out]


def fit_tree(tokenizer: HierarchicalTokenizer, directions: np.ndarray, fit: str, pairs: tuple[np.ndarray, np.ndarray],
             n_users: int, seed: int, rounds: int = 5) -> list[np.ndarray]:
    """Fit ``tokenizer``'s tree in place to ``fit`` (``coengage`` or ``bottomup``) on the entities'
    ``directions`` (m, dim) and their engagement ``pairs`` (users, rows into directions), then let
    it settle into its own geometry: ``rounds`` of (prototypes <- their members' mean direction;
    members <- the tokenizer's nearest prototypes). The fitted tokens alone are not the nearest
    prototypes of the tree (its residual bound keeps a child near its parent; on online_retail
    bottomup's kept 0.79 / 0.72 / 0.73 of its top-1 tokens re-tokenised); after settling, the
    exported tokens are exactly what the saved tokenizer gives, so `hir refresh` places a new
    entity as its twin was placed. A level free of the bound (``export.hierarchy_free_levels``)
    puts each prototype at its members' mean exactly. Returns per level (m,) the settled top-1
    tokens."""
    levels = tokenizer.levels
    if fit == "coengage":
        fitted = coengage_refine(top1_of(tokenizer, directions), levels, pairs, n_users, len(directions))
    elif fit == "bottomup":
        fitted = bottomup_tokens(directions, levels, pairs, n_users, seed)
    else:
        raise ValueError(f"fit_tree: fit={fit!r}; expected 'coengage' or 'bottomup'")
    for _ in range(rounds + 1):
        follow_tokens(tokenizer, directions, fitted)
        fitted = top1_of(tokenizer, directions)
    return fitted
