"""Token features: spectral base projection + type + role + content projection + numeric encodings."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir.nn.buckets import RELATIONS

N_NUMERIC = 3  # log1p(count), scaled age of the linking edge, log1p(exposure)


class TokenEncoder(nn.Module):
    """Embeds every token of a context.

    ``h = drop(W_b b_hat) + type_emb + role_emb(relation, hop) + stage_emb + W_c content +
    W_n numeric``, where ``b_hat`` is the token's unit *spectral base* vector (its collaborative
    identity, :mod:`hir.model.spectral`; zero for a node without one). The base term is dropped
    per token with probability ``base_dropout`` during training and always absent in the
    knowledge view, so content and graph context must carry the representation too.

    Args:
        dim: width C.
        n_types: entity types (an extra type id ``n_types`` marks interest-primitive tokens).
        n_stages: funnel stages (stage 0 = none).
        content_dim: width of a node's content row (text vector, attribute blocks, has-text flag).
        base_dim: width K of the spectral base rows.
        base_dropout: per-token base dropout while training.
        use_content: add the content projection (False = the ids-only ablation).
    """

    def __init__(self, dim: int, n_types: int, n_stages: int, content_dim: int, base_dim: int,
                 base_dropout: float, use_content: bool) -> None:
        super().__init__()
        self.dim, self.base_dim, self.base_dropout = dim, base_dim, base_dropout
        self.use_content = bool(use_content)
        self.base = nn.Linear(base_dim, dim, bias=False)
        self.types = nn.Embedding(n_types + 1, dim)
        self.roles = nn.Embedding(len(RELATIONS) * 3, dim)
        self.stages = nn.Embedding(n_stages + 1, dim)
        self.content = nn.Linear(content_dim, dim)
        self.numeric = nn.Linear(N_NUMERIC, dim)
        self.norm = nn.LayerNorm(dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for emb in (self.types, self.roles, self.stages):
            nn.init.normal_(emb.weight, std=0.02)
        # an orthogonal-ish projection: unit base rows map to tokens of comparable norm
        nn.init.normal_(self.base.weight, std=1.0 / math.sqrt(self.base_dim))
        self.content.reset_parameters()
        # small: log-counts reach ~10 and would otherwise drown the content signal at init
        nn.init.normal_(self.numeric.weight, std=0.02)
        nn.init.zeros_(self.numeric.bias)
        self.norm.reset_parameters()

    def forward(self, view: dict[str, Tensor], use_ids: bool) -> Tensor:
        """
        Args:
            view: ``row`` (B, N) int64 row of ``content`` / ``base`` or -1; ``content``
                (U, content_dim) float; ``base`` (U, K) float (engagement view only); ``type``,
                ``relation``, ``hop``, ``stage`` (B, N) int64; ``count``, ``age``, ``exposure``
                (B, N) float.
            use_ids: add the base term (engagement view) or not (knowledge view).

        Returns:
            (B, N, C) token embeddings.
        """
        h = self.types(view["type"]) + self.roles(view["relation"] * 3 + view["hop"]) + self.stages(view["stage"])
        row = view["row"]
        real = (row >= 0)[..., None]
        if self.use_content:
            content = self.content(view["content"].float())  # (U, C): each distinct node projected once
            h = h + content[row.clamp_min(0)] * real  # (B, N, C)
        numeric = torch.stack([view["count"], view["age"], torch.log1p(view["exposure"])], dim=-1)  # (B, N, 3)
        h = h + self.numeric(numeric.float())
        if use_ids and "base" in view:
            base = self.base(F.normalize(view["base"].float(), dim=-1))  # (U, C); zero rows stay zero
            tok = base[row.clamp_min(0)] * real  # (B, N, C)
            if self.training and self.base_dropout > 0:
                keep = torch.rand(tok.shape[:2], device=tok.device) >= self.base_dropout  # (B, N)
                tok = tok * keep[..., None]
            h = h + tok
        return self.norm(h)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base_dim={self.base_dim}, base_dropout={self.base_dropout}"
