"""HirNet: context tokens -> one universal embedding per seed entity, plus its interest tokens."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir.nn.buckets import PRIMITIVE, BucketVocab
from hir.nn.features import TokenEncoder
from hir.nn.hierarchy import HierarchicalTokenizer
from hir.nn.transformer import GraphTransformer

# the options of the attention bias terms (``bias``)
USER_TYPE = 0  # hir.data.schema.ENTITY_TYPES[0]: users are the query side of the space
# the keys of a view shared by its rows (per content row, (U, ...)); every other key is (B, N)
SHARED_KEYS = frozenset({"content", "base", "base_logit"})


class HirNet(nn.Module):
    """Bias-aware graph transformer over a seed's context, refining a spectral base, with a
    hierarchical tokenizer on top.

    A context (B, N) is embedded by :class:`TokenEncoder` (each token carries its unit spectral
    base vector ``b_hat``, :mod:`hir.model.spectral`); the level-0 interest prototypes are
    appended as M shared *primitive* tokens (the global, long-range view every context attends
    to); :class:`GraphTransformer` runs attention with score

        s_h(i, j) = q_i·k_j / sqrt(d) + T_h[qb_i, kb_j] - lambda_h * log(1 + exposure_j)

    and the seed token's output ``h`` gives a direction ``s`` (K dims, unit) and, for entities,
    a scale ``a`` in (0, 1):

        engagement view, user:     s = normalize(b_hat_seed + gamma W_s h)
        engagement view, entity:   s = b_hat_seed,                  a = sigmoid(g_seed)
        knowledge view:            s = normalize(W_k h),            a = sigmoid(w_k·h + o_type)

    (a seed without a base, i.e. without engagement, takes the knowledge form in both views).
    The transformer refines the query side: a user's embedding is a learned, context-aware
    correction of its spectral fold-in (which of its engagements matter, by funnel stage,
    recency and content), trained against the whole catalogue of entity bases
    (:class:`hir.nn.CatalogueLoss`; a catalogue entity without a base is ranked there by its
    knowledge view); warm entities keep their base, cold ones get the knowledge view, which is
    trained to land where the base would be (cross-view distillation) and, through the cold
    catalogue entities, where the users' targets are.

    ``g_seed`` is the logit of the seed's base scale (popularity, from the base norm). The gate
    ``gamma`` starts at zero, so before training the engagement view *is* the spectral base and
    training learns the correction on top; the training loss penalises the correction's size
    (``anchor``), so it stays at the base unless the data says otherwise. A user without a base
    (no visible history) takes the knowledge direction: the learned fallback. The universal embedding is unit-norm with K + 1
    coordinates:

        entity:  z = [a s, sqrt(1 - a^2)]        user:  z = [s, 0]

    so the cosine (= inner product) of a user and an entity is ``a_e s_u·s_e``: a plain cosine
    search (Milvus) ranks by the learned affinity times the entity's learned scale, the exact
    form of a spectral score ``b_u·b_e`` (norm = popularity). The last coordinate is a slack
    that users never weigh. The hierarchy works on the direction ``s`` alone (:meth:`semantic`),
    so tokens describe what an entity is about, not how popular it is.

    Args (keyword only; the values `hir train` uses are in conf/model/hir.yaml, ``model.net``, and
    the sizes come from the snapshot):
        n_types: entity types of the snapshot.
        n_stages: funnel stages of the snapshot.
        content_dim: width of the content rows fed by the sampler.
        base_dim: width K of the spectral base (the embedding has K + 1 coordinates).
        n_recency: recency buckets.
        width: transformer width C.
        depth: transformer blocks.
        heads: attention heads.
        mlp_ratio: MLP width / C.
        dropout: dropout in blocks.
        base_dropout: per-token base dropout while training (see :class:`TokenEncoder`).
        attention_backend: ``hir_kernels`` backend ("auto": Triton on CUDA, PyTorch on CPU).
        bias: the attention bias terms switched on (``table``, ``exposure``, ... -> bool; any term
            registered in :mod:`hir.nn.attention`) with their options (``lam_init``), and
            ``buckets`` (component -> bool, see :class:`BucketVocab`).
        hierarchy: keyword arguments of :class:`HierarchicalTokenizer` (levels, top_k, tau, radius).
        primitive_tokens: append the level-0 prototypes as context tokens.
        transformer: use the transformer's correction. False = the engagement view is the
            spectral base alone (the ablation "no transformer").
        content: feed the content rows (text, attributes) to the tokens. False = ids only (the
            ablation "no content"): the knowledge view sees types, roles and counts alone.

    ``config`` holds these arguments as plain values: ``HirNet(**net.config)`` rebuilds the network
    (checkpoints store it).
    """

    def __init__(
        self,
        *,
        n_types: int,
        n_stages: int,
        content_dim: int,
        base_dim: int,
        n_recency: int,
        width: int,
        depth: int,
        heads: int,
        mlp_ratio: float,
        dropout: float,
        base_dropout: float,
        attention_backend: str,
        bias: dict[str, Any],
        hierarchy: dict[str, Any],
        primitive_tokens: bool,
        transformer: bool,
        content: bool,
    ) -> None:
        super().__init__()
        if "buckets" not in bias:
            raise ValueError(f"bias options {sorted(bias)} lack 'buckets' (conf/model/hir.yaml, model.net.bias); "
                             "the attention layer checks the term names and options")
        self.config: dict[str, Any] = {
            "n_types": int(n_types), "n_stages": int(n_stages), "content_dim": int(content_dim),
            "base_dim": int(base_dim), "n_recency": int(n_recency), "width": int(width), "depth": int(depth),
            "heads": int(heads), "mlp_ratio": float(mlp_ratio), "dropout": float(dropout),
            "base_dropout": float(base_dropout), "attention_backend": str(attention_backend), "bias": dict(bias),
            "hierarchy": dict(hierarchy), "primitive_tokens": bool(primitive_tokens),
            "transformer": bool(transformer), "content": bool(content),
        }
        self.n_types, self.width, self.base_dim = n_types, width, int(base_dim)
        self.dim = self.base_dim + 1  # the universal embedding's width
        self.use_transformer = bool(transformer)
        self.buckets = BucketVocab(n_types, n_stages, n_recency, bias["buckets"])
        self.encoder = TokenEncoder(width, n_types, n_stages, content_dim, self.base_dim, base_dropout, content)
        self.transformer = GraphTransformer(
            width, depth, heads, mlp_ratio, dropout,
            n_query_buckets=self.buckets.n_query, n_key_buckets=self.buckets.n_key,
            bias={k: v for k, v in bias.items() if k != "buckets"}, backend=attention_backend,
        )
        # engagement view: the zero-initialised correction of a user's base direction
        self.head = nn.Linear(width, self.base_dim)
        self.gate = nn.Parameter(torch.zeros(()))
        # the last engagement-view forward's user corrections (B, K), zero rows for entities, for
        # the anchor penalty of the training step (None without the transformer)
        self.last_correction: Tensor | None = None
        # knowledge view: direction and scale from content and metadata alone
        self.know_head = nn.Linear(width, self.base_dim)
        self.know_scale = nn.Linear(width, 1)
        self.know_offset = nn.Parameter(torch.zeros(n_types))
        self.tokenizer = HierarchicalTokenizer(self.base_dim, **dict(hierarchy))
        self.primitive = nn.Linear(self.base_dim, width) if primitive_tokens else None
        self.reset_parameters()
        if not self.use_transformer:
            # without the transformer the correction (head, gate) and the base projection of the
            # tokens are never used: frozen, so DDP waits for no gradient of theirs
            for p in (*self.head.parameters(), self.gate, *self.encoder.base.parameters()):
                p.requires_grad_(False)

    def reset_parameters(self) -> None:
        # the gate starts closed (the base exactly); the head starts random so the gate's gradient
        # is not zero
        self.head.reset_parameters()
        nn.init.zeros_(self.gate)
        self.know_head.reset_parameters()
        nn.init.normal_(self.know_scale.weight, std=0.01)
        nn.init.zeros_(self.know_scale.bias)
        # a content-only entity starts at a low scale (sigmoid(-4) ~ 0.02): unknown popularity
        nn.init.constant_(self.know_offset, -4.0)

    def _append_primitives(self, h: Tensor, view: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Append the M level-0 prototypes as tokens to every context: (B, N, C) -> (B, N+M, C)."""
        b = h.shape[0]
        protos = self.tokenizer.vectors()[0]  # (M, K)
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

    def _knowledge(self, view: dict[str, Tensor], use_ids: bool, return_hidden: bool = False) -> Any:
        """A batch of contexts -> the transformer's (direction (B, K), scale logit (B,)) before any
        base (the knowledge form), and with ``return_hidden`` the seed's output (B, C)."""
        seed_type = view["type"][:, 0]
        h = self.encoder(view, use_ids)  # (B, N, C)
        if self.primitive is not None:
            h, view = self._append_primitives(h, view)  # (B, N+M, C)
        qb, kb = self.buckets(view["type"], view["relation"], view["hop"], view["stage"], view["recency"])
        h = self.transformer(h, qb, kb, view["exposure"].float(), view["mask"])[:, 0]  # (B, C) the seed's output
        d = self.know_head(h).float()  # (B, K)
        g = self.know_scale(h).float().squeeze(-1) + self.know_offset[seed_type]  # (B,)
        return (d, g, h) if return_hidden else (d, g)

    def encode(self, view: dict[str, Tensor], use_ids: bool = True) -> tuple[Tensor, Tensor]:
        """A batch of contexts -> (direction (B, K) unit, scale logit (B,)); see :meth:`forward`."""
        seed_type = view["type"][:, 0]
        row0 = view["row"][:, 0].clamp_min(0)
        if use_ids and "base" not in view:
            raise ValueError("the engagement view needs the batch's spectral base rows (view['base'])")
        if not self.use_transformer and use_ids:
            self.last_correction = None
            base = view["base"][row0].float()  # (B, K)
            d, g = F.normalize(base, dim=-1), view["base_logit"][row0].float()
            none = base.norm(dim=-1) == 0  # (B,)
            if none.any():
                # a seed without a base takes the knowledge form, as with the transformer on (its
                # correction is zero there); its zero base would give every such seed one
                # direction-free vector (validate's collapse gate: all parent categories alike)
                # (from its context's content, without ids: the base projection stays unused, so
                # every step trains the same parameters, as DDP requires)
                sub = {k: v if k in SHARED_KEYS else v[none] for k, v in view.items()}
                dk, gk = self._knowledge(sub, use_ids=False)
                d, g = d.index_put((none,), F.normalize(dk, dim=-1)), g.index_put((none,), gk)
            return d, g
        d, g, h = self._knowledge(view, use_ids, return_hidden=True)
        if use_ids:
            base = view["base"][row0].float()  # (B, K)
            # a seed without a base (no engagement: cold start) keeps the knowledge direction
            has = (base.norm(dim=-1) > 0)[:, None]
            # the transformer refines users (the query side); an entity keeps its base
            refine = (seed_type == USER_TYPE)[:, None].float()
            corr = refine * has * self.gate * self.head(h).float()  # (B, K)
            self.last_correction = corr
            d = torch.where(has, F.normalize(base, dim=-1) + corr, d)
            g = torch.where(has[:, 0], view["base_logit"][row0].float(), g)
        return F.normalize(d, dim=-1), g

    def forward(self, view: dict[str, Tensor], use_ids: bool = True) -> Tensor:
        """A batch of contexts -> (B, K + 1) unit universal embeddings.

        ``view``: see :meth:`TokenEncoder.forward`, plus ``recency`` (B, N) int64, ``mask``
        (B, N) bool (token 0 = the seed) and, for the engagement view, ``base`` (U, K) and
        ``base_logit`` (U,) per content row. ``use_ids`` selects the view: True = engagement
        view (base on), False = knowledge view.
        """
        s, g = self.encode(view, use_ids)
        return self.pack(s, g, view["type"][:, 0])

    @staticmethod
    def pack(s: Tensor, logit: Tensor, seed_type: Tensor) -> Tensor:
        """direction (B, K), scale logit (B,), seed type (B,) -> (B, K + 1) unit embeddings."""
        a, slack = HirNet.pack_scale(logit, seed_type)
        return torch.cat([s * a[:, None], slack[:, None]], dim=-1)

    @staticmethod
    def pack_scale(logit: Tensor, seed_type: Tensor) -> tuple[Tensor, Tensor]:
        """scale logit (B,), seed type (B,) -> (scale ``a`` (B,), slack ``sqrt(1 - a^2)`` (B,)) of
        :meth:`pack` (``a`` is 1 for users): the packed embedding is ``[s a, slack]``."""
        a = torch.where(seed_type == USER_TYPE, torch.ones_like(logit), torch.sigmoid(logit))  # (B,)
        return a, torch.sqrt((1 - a * a).clamp_min(0))

    def semantic(self, z: Tensor) -> Tensor:
        """Universal embeddings (..., K + 1) -> their unit direction (..., K): the tokenizer's input."""
        return F.normalize(z[..., : self.base_dim], dim=-1)

    def scale_of(self, z: Tensor) -> Tensor:
        """Universal embeddings (..., K + 1) -> their scale ``a`` (...) (1 for users)."""
        return z[..., : self.base_dim].norm(dim=-1)

    def tokens(self, z: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """Universal embeddings (B, K + 1) -> Bag-of-Meaning (codes, weights, aux) of their
        direction; see :meth:`HierarchicalTokenizer.forward`."""
        return self.tokenizer(self.semantic(z))

    @property
    def corrects(self) -> bool:
        """Whether the engagement view differs from the spectral base: the transformer is on and
        its gate ``gamma`` is open. False at step 0 and for a checkpoint whose correction was
        rejected (:func:`close_correction`): such a network's engagement view *is* the base."""
        return self.use_transformer and bool(self.gate.detach() != 0)

    def extra_repr(self) -> str:
        return (f"n_types={self.n_types}, base_dim={self.base_dim}, width={self.width}, "
                f"primitives={self.primitive is not None}, transformer={self.use_transformer}")


# the state-dict keys of the correction's gate (``HirNet.gate``): a bare network's, and the
# student's and the EMA teacher's in a training checkpoint (hir.train.module.HirModule)
GATE_KEYS = ("gate", "net.gate", "teacher.gate")


def close_correction(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A copy of a (module's) state dict with every :class:`HirNet`'s gate ``gamma`` at 0: the
    engagement view becomes the spectral base exactly (the user correction is ``gamma W_s h``),
    and everything else trained (the knowledge view, the prototypes, the scale heads) stays."""
    out = dict(state_dict)
    gates = [k for k in GATE_KEYS if k in out]
    if not gates:
        raise ValueError(f"none of the gate keys {list(GATE_KEYS)} in the state dict (keys {sorted(out)[:6]}, ...): "
                         "not a HirNet or hir training checkpoint")
    for k in gates:
        out[k] = torch.zeros_like(out[k])
    return out
