"""HirNet: context tokens -> one universal embedding per seed entity, plus its interest tokens."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir.nn.buckets import PRIMITIVE, BucketVocab
from hir.nn.features import TokenEncoder
from hir.nn.hierarchy import HierarchicalTokenizer
from hir.nn.norm import GroupedBatchNorm
from hir.nn.transformer import GraphTransformer

DEFAULT_BIAS: dict[str, Any] = {"table": True, "exposure": True, "lam_init": 0.1, "buckets": {}}
# pre-tanh start of every group's prior coordinate: non-zero, so that the user-side and the
# entity-side priors both get a gradient at step 0 (at 0 their product has a saddle point)
PRIOR_INIT = 0.5


class HirNet(nn.Module):
    """Bias-aware graph transformer over a seed's context, with a hierarchical tokenizer on top.

    A context (B, N) is embedded by :class:`TokenEncoder`; the level-0 interest prototypes are
    appended as M shared *primitive* tokens (the global, long-range view every context attends
    to); :class:`GraphTransformer` runs attention with score

        s_h(i, j) = q_i·k_j / sqrt(d) + T_h[qb_i, kb_j] - lambda_h * log(1 + exposure_j)

    and the seed token's output, projected and L2-normalised, is the universal embedding (one
    space for every entity type). :attr:`tokenizer` maps embeddings to Bag-of-Meaning tokens.

    Prior coordinate (``prior_max > 0``). The output is standardised per (seed type, view)
    (:class:`GroupedBatchNorm`), which removes every direction that all users share: on its own,
    no entity can score high for every user, i.e. cosine retrieval cannot express popularity.
    So the last coordinate is a learned, un-normalised *prior* ``p = prior_max * tanh(.)``:

        z = [sqrt(1 - p^2) * s, p]        (s: the standardised, unit "semantic" part, C - 1 dims)

    ``z`` stays unit-norm, so an inner product / cosine search (Milvus) scores
    ``sqrt(1-p_u^2) sqrt(1-p_e^2) s_u.s_e + p_u p_e``: an entity's ``p_e`` acts as a learned
    popularity bias, weighed by the user's ``p_u``. Entity-entity cosine also gets the ``p p``
    term (popular entities look a bit alike). The hierarchy works on the semantic part alone
    (:meth:`semantic`), so tokens describe what an entity is about, not how popular it is.

    Args:
        n_types: entity types of the snapshot.
        n_stages: funnel stages of the snapshot.
        content_dim: width of the content rows fed by the sampler.
        n_recency: recency buckets (default 4).
        dim: embedding width C (default 64).
        depth: transformer blocks (default 2).
        heads: attention heads (default 4).
        mlp_ratio: MLP width / C (default 4).
        dropout: dropout in blocks (default 0.1).
        id_buckets: most rows of the id table: one row per node when ``n_nodes`` fit, else two
            hashes into this many rows (default 65536; see :class:`TokenEncoder`).
        id_dropout: per-token id dropout while training (default 0.3).
        attention_backend: ``hir_kernels`` backend (default "auto").
        bias: ``table`` (bool), ``exposure`` (bool), ``lam_init`` (float), ``buckets``
            (component -> bool, see :class:`BucketVocab`). Default: everything on.
        hierarchy: keyword arguments of :class:`HierarchicalTokenizer` (levels, top_k, tau, radius).
        primitive_tokens: append the level-0 prototypes as context tokens (default True).
        n_nodes: nodes of the snapshot (global ids 0..n_nodes-1; None = unknown, ids hashed).
        prior_max: bound of the prior coordinate (0 = none: the whole embedding is semantic;
            default 0.7).
    """

    def __init__(
        self,
        n_types: int,
        n_stages: int,
        content_dim: int,
        n_recency: int = 4,
        dim: int = 64,
        depth: int = 2,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout: float = 0.1,
        id_buckets: int = 65536,
        id_dropout: float = 0.3,
        attention_backend: str = "auto",
        bias: dict[str, Any] | None = None,
        hierarchy: dict[str, Any] | None = None,
        primitive_tokens: bool = True,
        prior_max: float = 0.7,
        n_nodes: int | None = None,
    ) -> None:
        super().__init__()
        bias = DEFAULT_BIAS | dict(bias or {})
        unknown = sorted(set(bias) - set(DEFAULT_BIAS))
        if unknown:
            raise ValueError(f"unknown bias options {unknown}; expected {sorted(DEFAULT_BIAS)}")
        if not 0.0 <= prior_max < 1.0:
            raise ValueError(f"prior_max={prior_max} must be in [0, 1): the semantic part needs a share of the unit norm")
        self.n_types, self.dim, self.prior_max = n_types, dim, float(prior_max)
        # width of the semantic part (the tokenizer's space)
        self.sem_dim = dim - 1 if self.prior_max > 0 else dim
        self.buckets = BucketVocab(n_types, n_stages, n_recency, bias["buckets"])
        self.encoder = TokenEncoder(dim, n_types, n_stages, content_dim, id_buckets, id_dropout, n_nodes)
        self.transformer = GraphTransformer(
            dim, depth, heads, mlp_ratio, dropout,
            n_query_buckets=self.buckets.n_query, n_key_buckets=self.buckets.n_key,
            bias_table=bool(bias["table"]), exposure_bias=bool(bias["exposure"]),
            lam_init=float(bias["lam_init"]), backend=attention_backend,
        )
        self.head = nn.Linear(dim, self.sem_dim)
        # the seed's own id embedding also reaches the output directly: a free per-entity vector
        # on top of the contextual one (collaborative structure needs no trip through attention)
        self.id_skip = nn.Linear(dim, self.sem_dim, bias=False)
        with torch.no_grad():
            self.id_skip.weight.copy_(torch.eye(self.sem_dim, dim))
        # standardise the output per (seed type, view): embeddings spread over the sphere instead
        # of a narrow cone, and the shared prototypes cannot just encode "user vs product"
        self.out_norm = GroupedBatchNorm(2 * n_types, self.sem_dim)
        if self.prior_max > 0:
            self.prior = nn.Linear(dim, 1)
            # one learned offset per (seed type, view) group, like the normalisation's groups
            self.prior_offset = nn.Parameter(torch.full((2 * n_types,), PRIOR_INIT))
            nn.init.normal_(self.prior.weight, std=0.01)
            nn.init.zeros_(self.prior.bias)
        else:
            self.prior, self.prior_offset = None, None
        self.tokenizer = HierarchicalTokenizer(self.sem_dim, **dict(hierarchy or {}))
        self.primitive = nn.Linear(self.sem_dim, dim) if primitive_tokens else None

    def _append_primitives(self, h: Tensor, view: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Append the M level-0 prototypes as tokens to every context: (B, N, C) -> (B, N+M, C)."""
        b = h.shape[0]
        protos = self.tokenizer.vectors()[0]  # (M, C)
        p = self.encoder.norm(self.primitive(protos) + self.encoder.types.weight[self.n_types])  # (M, C)
        m = p.shape[0]
        h = torch.cat([h, p[None].expand(b, m, -1)], dim=1)  # (B, N+M, C)

        def ext(x: Tensor, value: float | int | bool) -> Tensor:
            return torch.cat([x, x.new_full((b, m), value)], dim=1)

        view = dict(view)
        view["type"] = ext(view["type"], self.n_types)
        view["relation"] = ext(view["relation"], PRIMITIVE)
        for name in ("hop", "stage", "recency"):
            view[name] = ext(view[name], 0)
        view["exposure"] = ext(view["exposure"], 0.0)
        view["mask"] = ext(view["mask"], True)
        return h, view

    def forward(self, view: dict[str, Tensor], use_ids: bool = True) -> Tensor:
        """A batch of contexts (see :meth:`TokenEncoder.forward`; plus ``recency`` (B, N) int64 and
        ``mask`` (B, N) bool, token 0 = the seed) -> (B, C) L2-normalised seed embeddings.

        ``use_ids`` selects the view: True = engagement view (ids on), False = knowledge view.
        """
        h, ids = self.encoder(view, use_ids, return_ids=True)  # (B, N, C) x 2
        if self.primitive is not None:
            h, view = self._append_primitives(h, view)  # (B, N+M, C)
        qb, kb = self.buckets(view["type"], view["relation"], view["hop"], view["stage"], view["recency"])
        h = self.transformer(h, qb, kb, view["exposure"].float(), view["mask"])  # (B, N', C)
        group = view["type"][:, 0] * 2 + int(use_ids)  # (B,) seed type x view
        pre = self.head(h[:, 0]) + self.id_skip(ids[:, 0])  # (B, C')
        sem = F.normalize(self.out_norm(pre, group), dim=-1)  # (B, C') unit
        if self.prior is None:
            return sem
        p = self.prior_max * torch.tanh(self.prior(h[:, 0]).float().squeeze(-1) + self.prior_offset[group])  # (B,)
        return torch.cat([sem * torch.sqrt(1 - p * p)[:, None], p[:, None]], dim=-1)  # (B, C) unit

    def semantic(self, z: Tensor) -> Tensor:
        """Universal embeddings (..., C) -> their unit semantic part (..., C'): the tokenizer's
        input. Without a prior coordinate, ``z`` itself."""
        if self.prior is None:
            return z
        return F.normalize(z[..., : self.sem_dim], dim=-1)

    def prior_of(self, z: Tensor) -> Tensor:
        """Universal embeddings (..., C) -> their prior coordinate (...) (zeros without one)."""
        return z[..., -1] if self.prior is not None else z.new_zeros(z.shape[:-1])

    def tokens(self, z: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """Universal embeddings (B, C) -> Bag-of-Meaning (codes, weights, aux) of their semantic part;
        see :meth:`HierarchicalTokenizer.forward`."""
        return self.tokenizer(self.semantic(z))

    def extra_repr(self) -> str:
        return (f"n_types={self.n_types}, dim={self.dim}, primitives={self.primitive is not None}, "
                f"prior_max={self.prior_max}")
