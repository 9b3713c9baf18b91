"""Bias-aware multi-head self-attention over a token context."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from hir.nn.bias_terms import BIAS_TERMS, initial_params, switched_on
from hir_kernels import Bias, attention


class BiasedSelfAttention(nn.Module):
    r"""Multi-head self-attention whose score for head :math:`h`, query :math:`i`, key :math:`j` is

    .. math::
        s_h(i, j) = \frac{q_i \cdot k_j}{\sqrt{d}} + T_h[qb_i, kb_j] - \lambda_h \log(1 + e_j)

    with the bias terms of the default config (:mod:`hir.nn.bias_terms`): :math:`T` a learned
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
        self.terms = switched_on(bias)
        self._settings = {"heads": heads, "n_query_buckets": n_query_buckets, "n_key_buckets": n_key_buckets, **bias}
        for name, term in BIAS_TERMS.items():  # every term's parameters, None while it is off
            values = initial_params(name, self._settings) if name in self.terms else dict.fromkeys(term.params)
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
                for param, value in initial_params(name, self._settings).items():
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
