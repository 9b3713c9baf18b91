"""Pre-norm transformer blocks over bias-aware attention."""

from __future__ import annotations

from torch import Tensor, nn

from hir.nn.attention import BiasedSelfAttention


class Block(nn.Module):
    """``x + attn(LN(x))`` then ``x + MLP(LN(x))``.

    Args:
        dim: width C.
        heads: attention heads (default 4).
        mlp_ratio: hidden width of the MLP as a multiple of C (default 4).
        dropout: dropout on attention output and MLP (default 0.1).
        **attn: further arguments of :class:`BiasedSelfAttention` (bucket counts, ``bias`` terms, backend).
    """

    def __init__(self, dim: int, heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.1, **attn) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = BiasedSelfAttention(dim, heads, dropout=dropout, **attn)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.Dropout(dropout))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # zero-initialised residual branches: at init every block is the identity, so the seed
        # token's own features (content, id) reach the output intact and context is learned on top
        nn.init.zeros_(self.attn.proj.weight)
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.zeros_(self.mlp[2].bias)

    def forward(self, x: Tensor, qb: Tensor, kb: Tensor, exposure: Tensor, mask: Tensor) -> Tensor:
        """x: (B, N, C); qb, kb: (B, N) int64; exposure: (B, N); mask: (B, N) bool -> (B, N, C)."""
        x = x + self.attn(self.norm1(x), qb, kb, exposure, mask)
        return x + self.mlp(self.norm2(x))


class GraphTransformer(nn.Module):
    """A stack of :class:`Block` with a final LayerNorm.

    Args:
        dim: width C.
        depth: number of blocks (default 2).
        heads, mlp_ratio, dropout, **attn: as in :class:`Block`.
    """

    def __init__(self, dim: int, depth: int = 2, heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.1, **attn) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, dropout, **attn) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor, qb: Tensor, kb: Tensor, exposure: Tensor, mask: Tensor) -> Tensor:
        """x: (B, N, C) -> (B, N, C); see :meth:`Block.forward`."""
        for block in self.blocks:
            x = block(x, qb, kb, exposure, mask)
        return self.norm(x)
