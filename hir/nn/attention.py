"""Bias-aware multi-head self-attention over a token context, and its bias terms.

The bias terms are a registry, so that a new term costs one function here plus one config entry.
The score of head h, query i, key j is ``q_i·k_j / sqrt(d)`` plus every term switched on in the
``bias:`` block of conf/model/hir.yaml (``<name>: true``). A term is a function ``part(params, feats)``
registered with :func:`bias_term` under its config name, with the initial value of each of its
learned parameters:

  * ``params``: the term's parameters by name. They live on :class:`BiasedSelfAttention` under
    these names (``layer.lam``; None while the term is off), so checkpoints name them as before.
  * ``feats``: the context's per-token features, each (B, N): ``qb`` and ``kb`` (query / key bucket
    ids, :class:`hir.nn.buckets.BucketVocab`) and ``exposure`` (float >= 0).
  * It returns one part of a :class:`hir_kernels.Bias`: a :class:`hir_kernels.Table` (an
    (H, QB, KB) table gathered over bucket ids inside the attention op) or a (B, H or 1, N) column
    added to every query's score of key j. Every backend (Triton, SDPA, FlexAttention, reference)
    then computes it; the Triton kernels take any number of tables and columns.

An initial value is a function whose parameter names say what it needs: the layer's ``heads``,
``n_query_buckets``, ``n_key_buckets``, or an option of the ``bias:`` block (``lam_init``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from hir_kernels import Bias, Table, attention

LAYER_SETTINGS = ("heads", "n_query_buckets", "n_key_buckets")


@dataclasses.dataclass(frozen=True)
class BiasTerm:
    """A registered term: ``part(params, feats) -> Table | Tensor`` and its parameters' initial values."""

    part: Callable[[Mapping[str, Tensor], Mapping[str, Tensor]], Table | Tensor]
    params: Mapping[str, Callable[..., Tensor]]


BIAS_TERMS: dict[str, BiasTerm] = {}


def bias_term(name: str, **params: Callable[..., Tensor]) -> Callable:
    """Register the decorated ``part(params, feats)`` as the bias term ``name``; each keyword is one
    learned parameter and the function giving its initial value (see the module docstring)."""

    def register(part: Callable) -> Callable:
        taken = {p: n for n, t in BIAS_TERMS.items() for p in t.params}
        clash = {p: taken[p] for p in params if p in taken}
        if name in BIAS_TERMS or clash:
            raise ValueError(
                f"bias term {name!r} clashes with the registry: term names {sorted(BIAS_TERMS)}, "
                f"parameters already owned {clash}; pick new names"
            )
        BIAS_TERMS[name] = BiasTerm(part, dict(params))
        return part

    return register


def _options() -> set[str]:
    """Every setting some registered term's initial values ask for, beyond the layer's own."""
    wanted = {p for t in BIAS_TERMS.values() for init in t.params.values() for p in inspect.signature(init).parameters}
    return wanted - set(LAYER_SETTINGS)


def _switched_on(bias: Mapping[str, Any]) -> list[str]:
    """The registered terms ``bias`` switches on, in registry order; raises for an unknown entry."""
    unknown = sorted(set(bias) - set(BIAS_TERMS) - _options())
    if unknown:
        raise ValueError(
            f"unknown bias entries {unknown}; expected a term of {sorted(BIAS_TERMS)} (true/false) "
            f"or an option of one {sorted(_options())}"
        )
    return [name for name in BIAS_TERMS if bool(bias.get(name, False))]


def _initial_params(name: str, settings: Mapping[str, Any]) -> dict[str, Tensor]:
    """Initial values of term ``name``'s parameters from the layer's settings and the bias options."""
    out = {}
    for param, init in BIAS_TERMS[name].params.items():
        wants = list(inspect.signature(init).parameters)
        missing = [w for w in wants if w not in settings]
        if missing:
            raise ValueError(f"bias term {name!r} needs {missing} in the bias config; got {sorted(settings)}")
        out[param] = init(**{w: settings[w] for w in wants})
    return out


@bias_term("table", table=lambda heads, n_query_buckets, n_key_buckets: torch.zeros(heads, n_query_buckets, n_key_buckets))
def bucket_table(params: Mapping[str, Tensor], feats: Mapping[str, Tensor]) -> Table:
    """``T_h[qb_i, kb_j]``: a learned (H, QB, KB) table over the query / key bucket ids. Zero at
    init: the model starts as plain attention and learns which relations matter."""
    return Table(params["table"], feats["qb"], feats["kb"])


@bias_term("exposure", lam=lambda heads, lam_init: torch.full((heads,), float(lam_init)))
def exposure(params: Mapping[str, Tensor], feats: Mapping[str, Tensor]) -> Tensor:
    """``-lambda_h log(1 + exposure_j)``, a (B, H, N) column: a learned per-head discount of what was
    merely shown most, so attention does not follow popularity (lambda_h < 0 would favour it)."""
    return -params["lam"][None, :, None] * torch.log1p(feats["exposure"].float())[:, None, :]


class BiasedSelfAttention(nn.Module):
    r"""Multi-head self-attention whose score for head :math:`h`, query :math:`i`, key :math:`j` is

    .. math::
        s_h(i, j) = \frac{q_i \cdot k_j}{\sqrt{d}} + T_h[qb_i, kb_j] - \lambda_h \log(1 + e_j)

    with the bias terms of the default config (the registry above): :math:`T` a learned
    ``(H, QB, KB)`` table over small query/key bucket ids (``table``) and :math:`\lambda` a learned
    per-head strength of the exposure (popularity) correction (``exposure``; :math:`e_j` = how often
    key entity :math:`j` was shown/engaged). Each term switched on adds its part; the bias is
    gathered inside the attention op (``hir_kernels.attention``), never stored as an N x N tensor.

    Args:
        dim: model width C (heads * head_dim).
        heads: number of heads H (default 4).
        n_query_buckets: QB, rows of the bucket table.
        n_key_buckets: KB, columns of the bucket table.
        bias: the ``bias:`` block of the model config without ``buckets``: each registered term
            name -> bool (on/off) and the terms' options, e.g. ``{"table": True, "exposure": True,
            "lam_init": 0.1}``. Default None: no bias terms (plain attention).
        dropout: dropout on the output projection (default 0).
        backend: ``hir_kernels`` backend name (default "auto": Triton on CUDA, PyTorch on CPU).
    """

    def __init__(
        self,
        dim: int,
        heads: int = 4,
        n_query_buckets: int = 1,
        n_key_buckets: int = 1,
        bias: Mapping[str, Any] | None = None,
        dropout: float = 0.0,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.backend = backend
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        bias = dict(bias or {})
        self.terms = _switched_on(bias)
        self._settings = {"heads": heads, "n_query_buckets": n_query_buckets, "n_key_buckets": n_key_buckets, **bias}
        for name, term in BIAS_TERMS.items():  # every term's parameters, None while it is off
            values = _initial_params(name, self._settings) if name in self.terms else dict.fromkeys(term.params)
            for param, value in values.items():
                if hasattr(self, param) and param not in self._parameters:
                    raise ValueError(f"bias term {name!r} parameter {param!r} clashes with an attribute of the layer")
                self.register_parameter(param, None if value is None else nn.Parameter(value))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.qkv.weight)
        nn.init.zeros_(self.qkv.bias)
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        with torch.no_grad():
            for name in self.terms:
                for param, value in _initial_params(name, self._settings).items():
                    getattr(self, param).copy_(value)

    def forward(self, x: Tensor, qb: Tensor, kb: Tensor, exposure: Tensor, key_mask: Tensor) -> Tensor:
        """
        Args:
            x: (B, N, C) token states.
            qb, kb: (B, N) int64 query / key bucket ids.
            exposure: (B, N) float >= 0 exposure count of each token's entity.
            key_mask: (B, N) bool, True for real tokens.

        Returns:
            (B, N, C).
        """
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D)
        feats = {"qb": qb, "kb": kb, "exposure": exposure}
        parts = [BIAS_TERMS[t].part({p: getattr(self, p) for p in BIAS_TERMS[t].params}, feats) for t in self.terms]
        out = attention(q, k, v, Bias.of(parts, key_mask), backend=self.backend)  # (B, H, N, D)
        out = out.transpose(1, 2).reshape(b, n, c)  # (B, N, C)
        return self.drop(self.proj(out))

    def extra_repr(self) -> str:
        sizes = {t: "x".join(str(s) for p in BIAS_TERMS[t].params for s in getattr(self, p).shape) for t in self.terms}
        terms = ", ".join(f"{t} {s}" if s else t for t, s in sizes.items())
        return f"dim={self.dim}, heads={self.heads}, bias=[{terms}], backend={self.backend}"
