"""Bias-aware multi-head self-attention over a token context."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hir_kernels import attention


class BiasedSelfAttention(nn.Module):
    r"""Multi-head self-attention whose score for head :math:`h`, query :math:`i`, key :math:`j` is

    .. math::
        s_h(i, j) = \frac{q_i \cdot k_j}{\sqrt{d}} + T_h[qb_i, kb_j] - \lambda_h \log(1 + e_j)

    with :math:`T` a learned ``(H, QB, KB)`` table over small query/key bucket ids and
    :math:`\lambda` a learned per-head strength of the exposure (popularity) correction
    (:math:`e_j` = how often key entity :math:`j` was shown/engaged). The bias is gathered inside
    the attention op (``hir_kernels.attention``), never stored as an N x N tensor here.

    Args:
        dim: model width C (heads * head_dim).
        heads: number of heads H (default 4).
        n_query_buckets: QB, rows of the bias table.
        n_key_buckets: KB, columns of the bias table.
        bias_table: learn ``T`` (False switches the bucket bias off; default True).
        exposure_bias: learn ``lambda`` (False switches the exposure correction off; default True).
        lam_init: initial ``lambda_h`` (default 0.1: a mild popularity discount).
        dropout: dropout on the output projection (default 0).
        backend: ``hir_kernels`` backend name (default "auto": Triton on CUDA, PyTorch on CPU).
    """

    def __init__(
        self,
        dim: int,
        heads: int = 4,
        n_query_buckets: int = 1,
        n_key_buckets: int = 1,
        bias_table: bool = True,
        exposure_bias: bool = True,
        lam_init: float = 0.1,
        dropout: float = 0.0,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.backend, self.lam_init = backend, lam_init
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        self.table = nn.Parameter(torch.empty(heads, n_query_buckets, n_key_buckets)) if bias_table else None
        self.lam = nn.Parameter(torch.empty(heads)) if exposure_bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.qkv.weight)
        nn.init.zeros_(self.qkv.bias)
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        if self.table is not None:
            # zero: the model starts as plain attention and learns which relations matter
            nn.init.zeros_(self.table)
        if self.lam is not None:
            nn.init.constant_(self.lam, self.lam_init)

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
        out = attention(
            q, k, v, self.table, qb, kb, exposure if self.lam is not None else None, self.lam,
            key_mask=key_mask, backend=self.backend,
        )  # (B, H, N, D)
        out = out.transpose(1, 2).reshape(b, n, c)  # (B, N, C)
        return self.drop(self.proj(out))

    def extra_repr(self) -> str:
        table = "off" if self.table is None else "x".join(map(str, self.table.shape))
        return f"dim={self.dim}, heads={self.heads}, table={table}, exposure={'on' if self.lam is not None else 'off'}, backend={self.backend}"
