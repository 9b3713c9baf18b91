"""Hierarchical interest tokenizer: L levels of prototypes, each fine prototype owned by one parent.

Geometry. Level 0 holds K_0 free vectors. A prototype j at level l > 0 is its parent plus a
bounded residual::

    V_l[j] = V_{l-1}[parent(j)] + radius * dmin_{l-1}(parent(j)) * r_j / max(1, |r_j|)

where ``dmin`` is the distance from the parent to its nearest other prototype on the parent's
level and ``parent(j) = j // (K_l / K_{l-1})`` (a balanced tree: every node at a level has the same
number of children). With ``radius < 1/4`` every descendant of a prototype is closer to it than
any non-descendant, so decoding a code and encoding the vector gives the code back at every level.

Free levels. The finest ``free_levels`` levels drop the bound: ``V_l[j] = V_{l-1}[parent(j)] + r_j``,
so a child may sit wherever its members are (the mean of its members, after a fit) and the tree
is still a tree: each prototype keeps its one parent ``j // (K_l / K_{l-1})``, and a parent's
probability is still the sum of its children's. What is given up is the geometric round trip above
the free levels: a coarse prototype's vector need no longer be encoded as itself, and an input's
top-1 token at a level need not be the parent of its top-1 token one level finer. The finest level
still round-trips (a prototype is its own nearest), and the tokens of a vector are whatever this
tokenizer gives it, which is all that the exported tokens and `hir refresh` rely on
(hir/export/fits.py settles the fitted tokens into the tokenizer).

Probabilities. Only the finest level has logits, ``-|x - V_{L-1}[j]|^2 / (2 tau)``; a coarser
level's probability is the sum of its children's, so the tree is consistent by construction
(a parent's probability is exactly the sum of its children's).

Contract (as in vector-quantisation libraries)::

    codes, weights, aux_loss = tokenizer(x)      # per level: (B, k) ids, (B, k) weights summing to 1
    x_hat = tokenizer.decode(codes[l], weights[l], level=l)
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.distributed as dist
from torch import Tensor, nn


def level_log_probs(log_fine: Tensor, sizes: tuple[int, ...]) -> list[Tensor]:
    """Finest-level log-probabilities (B, K_{L-1}) -> per level (B, K_l), coarse first.

    A parent's probability is the sum of its children's (children are contiguous ids).
    """
    out = [log_fine]
    for k in reversed(sizes[:-1]):
        child = out[0]
        out.insert(0, child.view(child.shape[0], k, child.shape[1] // k).logsumexp(dim=-1))  # (B, K_l)
    return out


def mean_entropy_gap(log_probs: list[Tensor]) -> Tensor:
    """Collapse guard: mean over levels of ``1 - H(mean_b p_l) / log K_l`` (0 = every prototype used
    equally across the batch, 1 = one prototype takes everything). Scalar."""
    gaps = []
    for lp in log_probs:
        p = lp.exp().mean(dim=0)  # (K_l,)
        h = -(p * p.clamp_min(1e-12).log()).sum()
        gaps.append(1.0 - h / math.log(lp.shape[1]))
    return torch.stack(gaps).mean()


class _Distances:
    """``torch.cdist(x, c)`` for a fixed x (n, d) and many c (k, d), bit for bit: the same
    matrix-product form as cdist's (aten's ``_euclidean_dist``, which it takes when n > 25 or
    k > 25), with x's half ``[-2x, |x|^2, 1]`` built once instead of on every call. Measured on
    completejourney's export (69,857 x 257, k = 8): 0.14 s a cdist call against 0.02 s, where
    the hierarchy refit makes ~330 such calls at level 0 alone."""

    def __init__(self, x: Tensor) -> None:
        self.x = x
        self.fast = x.shape[0] > 25
        if self.fast:
            norm = x.pow(2).sum(-1, keepdim=True)  # (n, 1)
            self.x_ = torch.cat([x.mul(-2), norm, torch.ones_like(norm)], -1)  # (n, d + 2)

    def __call__(self, c: Tensor) -> Tensor:
        """(n, k) Euclidean distances of x's rows to c's rows."""
        if not self.fast:
            return torch.cdist(self.x, c)  # cdist's direct path (n, k <= 25 here); same as the caller's cdist
        norm = c.pow(2).sum(-1, keepdim=True)  # (k, 1)
        c_ = torch.cat([c, torch.ones_like(norm), norm], -1)  # (k, d + 2)
        return self.x_.matmul(c_.mT).clamp_min_(0).sqrt_()


def kmeans(x: Tensor, k: int, iters: int = 25, generator: torch.Generator | None = None, n_init: int = 1) -> Tensor:
    """Plain k-means with k-means++ seeding: (n, d) points -> (k, d) centroids (n >= k); with
    ``n_init`` > 1 the best of that many seedings (lowest sum of squared distances), so two
    generators land on the same solution far more often."""
    dists = _Distances(x)
    if n_init > 1:
        runs = [_kmeans(dists, k, iters, generator) for _ in range(n_init)]
        return min(runs, key=lambda c: float(dists(c).min(dim=1).values.pow(2).sum()))
    return _kmeans(dists, k, iters, generator)


def _kmeans(dists: _Distances, k: int, iters: int, generator: torch.Generator | None) -> Tensor:
    x = dists.x
    n = x.shape[0]
    cents = [x[torch.randint(n, (1,), generator=generator)]]
    # each point's distance to its nearest seed so far, updated with the newest seed only: O(n k d)
    # (recomputing it against every seed each round was O(n k^2 d): 43 s of completejourney's export)
    dist = dists(cents[0])[:, 0]
    for _ in range(1, k):
        d2 = dist.pow(2)
        probs = d2 / d2.sum() if d2.sum() > 0 else torch.full((n,), 1.0 / n)
        cents.append(x[torch.multinomial(probs, 1, generator=generator)])
        dist = torch.minimum(dist, dists(cents[-1])[:, 0])
    c = torch.cat(cents)  # (k, d)
    for _ in range(iters):
        assign = dists(c).argmin(dim=1)
        sums = torch.zeros_like(c).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).to(x.dtype)[:, None]
        c = torch.where(counts > 0, sums / counts.clamp_min(1), c)  # an empty cluster keeps its centroid
    return c


class HierarchicalTokenizer(nn.Module):
    """Bag-of-Meaning tokenizer over a tree of prototypes.

    Args:
        dim: embedding width.
        levels: prototypes per level, coarse first, strictly increasing, each dividing the next.
        top_k: tokens kept per level.
        tau: temperature of the assignment.
        radius: residual bound as a share of the parent's nearest-neighbour distance; must be
            < 0.25 for the round-trip guarantee.
        free_levels: how many of the finest levels are free of the bound (module doc; default 0:
            every level bounded; at most ``len(levels) - 1``, level 0 having no parent).

    The values `hir train` uses are in conf/model/hir.yaml (``model.net.hierarchy``).
    """

    def __init__(self, dim: int, levels: tuple[int, ...], top_k: int, tau: float, radius: float,
                 free_levels: int = 0) -> None:
        super().__init__()
        levels = tuple(int(k) for k in levels)
        if not levels or levels[0] < 2:
            raise ValueError(f"levels={levels}: need at least one level with >= 2 prototypes")
        for lo, hi in itertools.pairwise(levels):
            if hi <= lo or hi % lo:
                raise ValueError(f"levels={levels}: each level must be a strict multiple of the one before ({lo} -> {hi})")
        if not 0 < radius < 0.25:
            raise ValueError(f"radius={radius} must be in (0, 0.25) so that codes round-trip")
        if not 0 <= int(free_levels) < len(levels):
            raise ValueError(f"free_levels={free_levels}: expected 0 .. {len(levels) - 1} (the finest levels free of "
                             f"the residual bound; levels={levels})")
        self.dim, self.levels, self.top_k, self.tau, self.radius = dim, levels, top_k, tau, radius
        self.free_levels = int(free_levels)
        self.root = nn.Parameter(torch.empty(levels[0], dim))
        self.residuals = nn.ParameterList(nn.Parameter(torch.empty(k, dim)) for k in levels[1:])
        for lvl in range(1, len(levels)):
            self.register_buffer(f"parent_{lvl}", torch.arange(levels[lvl]) // (levels[lvl] // levels[lvl - 1]),
                                 persistent=False)
        for lvl, k in enumerate(levels):
            # running share of top-1 assignments per prototype (online k-means restarts)
            self.register_buffer(f"usage_{lvl}", torch.full((k,), 1.0 / k))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.root.copy_(nn.functional.normalize(torch.randn_like(self.root), dim=-1))
            for r in self.residuals:
                r.copy_(torch.randn_like(r) / math.sqrt(self.dim))

    def parents(self, level: int) -> Tensor:
        """(K_level,) parent ids on level-1; level 0 has none (-1)."""
        if level == 0:
            return torch.full((self.levels[0],), -1, dtype=torch.long, device=self.root.device)
        return getattr(self, f"parent_{level}")

    def free(self, level: int) -> bool:
        """Whether ``level``'s prototypes are free of the residual bound (one of the finest ``free_levels``)."""
        return level >= len(self.levels) - self.free_levels

    def vectors(self) -> list[Tensor]:
        """Prototype vectors per level, coarse first: list of (K_l, dim)."""
        out = [self.root]
        for lvl, r in enumerate(self.residuals, start=1):
            prev = out[-1]
            if self.free(lvl):
                out.append(prev[self.parents(lvl)] + r)  # (K_l, dim), unbounded
                continue
            d = torch.cdist(prev.detach(), prev.detach())  # (K_{l-1}, K_{l-1})
            # the bound is a constraint, not an objective: no gradient through dmin
            dmin = d.fill_diagonal_(float("inf")).min(dim=1).values  # (K_{l-1},)
            par = self.parents(lvl)
            step = r / r.norm(dim=-1, keepdim=True).clamp_min(1.0)  # (K_l, dim), norm <= 1
            out.append(prev[par] + self.radius * dmin[par, None] * step)
        return out

    def scores(self, x: Tensor) -> Tensor:
        """(B, dim) -> (B, K_{L-1}) finest-level scores ``-|x - V|^2 / 2`` (cosine - 1 for unit vectors)."""
        v = self.vectors()[-1]
        # |x|^2 + |v|^2 - 2 x.v in float64: in float32 the expansion cancels catastrophically when
        # prototypes sit close together (codes stop round-tripping); in float64 its error (~1e-16
        # |x|^2) is below float32's rounding of the direct differences, and the product runs on
        # BLAS. Completejourney's export (69,857 x 257 against 512): 0.77 s against the direct
        # differences' 3.2 s, the largest gap 2.9e-6 (a float32 ulp of the squares).
        x64, v64 = x.double(), v.double()
        sq = x64.pow(2).sum(-1, keepdim=True) + v64.pow(2).sum(-1) - 2.0 * x64 @ v64.mT  # (B, K)
        return (-0.5 * sq.clamp_min(0.0)).to(x.dtype)

    def log_probs(self, x: Tensor, tau: float | None = None) -> list[Tensor]:
        """(B, dim) -> per level (B, K_l) log-probabilities at temperature ``tau`` (default self.tau)."""
        fine = torch.log_softmax(self.scores(x) / (tau or self.tau), dim=-1)
        return level_log_probs(fine, self.levels)

    def forward(self, x: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """(B, dim) -> (codes, weights, aux_loss).

        codes[l]: (B, k_l) int64 prototype ids at level l, most probable first (k_l = min(top_k, K_l)).
        weights[l]: (B, k_l) their probabilities renormalised to sum to 1.
        aux_loss: scalar collapse guard :func:`mean_entropy_gap`.
        """
        log_probs = self.log_probs(x)
        codes, weights = [], []
        for lp in log_probs:
            w, c = lp.exp().topk(min(self.top_k, lp.shape[1]), dim=-1)  # (B, k)
            codes.append(c)
            weights.append(w / w.sum(-1, keepdim=True).clamp_min(1e-12))
        return codes, weights, mean_entropy_gap(log_probs)

    def decode(self, codes: Tensor, weights: Tensor | None = None, level: int = 0) -> Tensor:
        """Inverse: (B, k) codes (+ (B, k) weights, default top-1 only) at ``level`` -> (B, dim) vectors."""
        v = self.vectors()[level]
        if weights is None:
            return v[codes[:, 0]]
        return (weights[..., None] * v[codes]).sum(dim=1)

    @torch.no_grad()
    def init_from_data(self, x: Tensor, iters: int = 25, generator: torch.Generator | None = None,
                       n_init: int = 1, child_n_init: int = 1) -> None:
        """Data-dependent initialisation by hierarchical k-means on embeddings x (n, dim).

        Level 0 gets the k-means centroids (the best of ``n_init`` seedings: every finer token
        inherits this split, so its stability across seeds bounds theirs); each finer prototype
        starts in the direction of a k-means centroid of its parent's members (clipped to the
        residual bound; a free level's is the centroid itself). Avoids dead prototypes and gives
        training a sensible start. Each parent's children are the best of ``child_n_init``
        seedings of its members' k-means.
        """
        self.root.copy_(kmeans(x, self.levels[0], iters, generator, n_init))
        for lvl, r in enumerate(self.residuals, start=1):
            prev = self.vectors()[lvl - 1]
            assign = torch.cdist(x, prev).argmin(dim=1)  # (n,)
            branch = self.levels[lvl] // self.levels[lvl - 1]
            d = torch.cdist(prev, prev).fill_diagonal_(float("inf")).min(dim=1).values  # (K_{l-1},)
            for p in range(self.levels[lvl - 1]):
                members = x[assign == p]
                if len(members) < branch:  # too few members: spread children around the parent
                    members = prev[p] + 0.1 * torch.randn(branch * 4, x.shape[1], generator=generator)
                cents = kmeans(members, branch, iters, generator, child_n_init)  # (branch, dim)
                scale = 1.0 if self.free(lvl) else (self.radius * d[p]).clamp_min(1e-6)
                r[p * branch:(p + 1) * branch] = (cents - prev[p]) / scale

    @torch.no_grad()
    def ema_update(self, x: Tensor, decay: float = 0.9, usage_decay: float = 0.99, dead_below: float = 0.05,
                   generator: torch.Generator | None = None) -> None:
        """Online k-means step on embeddings x (n, dim), level by level, coarse first.

        Each prototype moves towards the mean of the embeddings whose top-1 token it is
        (``v <- decay v + (1 - decay) mean``). A running share of assignments is kept per
        prototype (``usage_decay``); a prototype whose share falls under ``dead_below`` of its
        fair share 1/K_l is restarted on a random embedding of the batch. Under DDP the sums and
        counts are all-reduced and restarts drawn on rank 0, so every rank keeps the same codebook.
        """
        ddp = dist.is_available() and dist.is_initialized()
        for lvl, k in enumerate(self.levels):
            vecs = self.vectors()
            assign = self.log_probs(x)[lvl].argmax(dim=1)  # (n,) top-1 token at this level
            sums = torch.zeros(k, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, assign, x)
            counts = torch.bincount(assign, minlength=k).to(x.dtype)
            if ddp:
                dist.all_reduce(sums)
                dist.all_reduce(counts)
            usage = getattr(self, f"usage_{lvl}")
            usage.mul_(usage_decay).add_(counts / counts.sum().clamp_min(1), alpha=1 - usage_decay)
            target = torch.where((counts > 0)[:, None], sums / counts.clamp_min(1)[:, None], vecs[lvl])
            new = decay * vecs[lvl] + (1 - decay) * target  # (K_l, dim)
            dead = usage < dead_below / k
            if dead.any():
                cand = x[torch.randint(x.shape[0], (int(dead.sum()),), generator=generator).to(x.device)]
                if ddp:
                    dist.broadcast(cand, src=0)
                new[dead] = cand
                usage[dead] = 1.0 / k
            self._set_level(lvl, new, vecs)

    def _set_level(self, lvl: int, new: Tensor, vecs: list[Tensor]) -> None:
        """Set level ``lvl``'s prototype vectors to ``new`` (K_l, dim) as far as the parametrisation
        allows (a child stays within its residual bound of its parent; a free level's is set exactly)."""
        if lvl == 0:
            self.root.copy_(new)
            return
        prev = vecs[lvl - 1]
        if self.free(lvl):
            self.residuals[lvl - 1].copy_(new - prev[self.parents(lvl)])
            return
        d = torch.cdist(prev, prev).fill_diagonal_(float("inf")).min(dim=1).values  # (K_{l-1},)
        par = self.parents(lvl)
        self.residuals[lvl - 1].copy_((new - prev[par]) / (self.radius * d[par, None]).clamp_min(1e-6))

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, levels={self.levels}, top_k={self.top_k}, tau={self.tau}, radius={self.radius}, "
                f"free_levels={self.free_levels}")

    def reshaped(self, dim: int | None = None, free_levels: int | None = None) -> HierarchicalTokenizer:
        """A new tokenizer with this one's levels, top-k, temperature and bound, of width ``dim`` and
        with ``free_levels`` free levels (default: this one's); at the same width its prototypes are
        this one's vectors (as far as the new bounds allow; exactly where they only loosen) and its
        usage this one's, at another width they are fresh (a refit sets them)."""
        out = HierarchicalTokenizer(self.dim if dim is None else dim, self.levels, self.top_k, self.tau, self.radius,
                                    self.free_levels if free_levels is None else free_levels)
        if out.dim == self.dim:
            with torch.no_grad():
                vecs = [v.detach() for v in self.vectors()]
                for lvl in range(len(self.levels)):  # coarse first: a child's offset is from its new parent
                    out._set_level(lvl, vecs[lvl], [v.detach() for v in out.vectors()])
                    getattr(out, f"usage_{lvl}").copy_(getattr(self, f"usage_{lvl}"))
        return out.train(self.training)
