"""The additive attention bias as one object, taken by every backend of :func:`hir_kernels.attention`.

Score for head h, query i, key j (natural-log units):

    s_h(i, j) = q_i·k_j * scale  +  sum_t T_t[h, qb_t(i), kb_t(j)]  +  sum_c col_c[b, h, j]

and -inf where ``key_mask`` is False; a query row with no real key returns 0. A bias has two kinds
of parts, and a kernel sees nothing else:

  * :class:`Table` parts: a learned (H, QB, KB) table over small integer query/key bucket ids,
    gathered inside the op (never an N x N tensor);
  * column parts: any (B, H or 1, Nk) tensor added to the score of key j for every query, built
    with torch ops by the caller, so its gradient flows on by autograd (the exposure correction
    ``-lam[h] * log1p(exposure_j)`` is one).

The model's bias terms (``hir.nn.attention``) each return one part; this module knows no term by
name. :meth:`Bias.score_mod` is the FlexAttention form of the maths, :meth:`Bias.dense` the
materialised one the PyTorch reference and SDPA paths add to the scores, :meth:`Bias.column` the
per-key vector the Triton kernels add.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import torch
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class Table:
    """A table-gathered part ``T[h, qb_i, kb_j]``.

    Args:
        table: (H, QB, KB) float, usually a learned parameter.
        qb: (B, Nq) int query bucket ids in [0, QB).
        kb: (B, Nk) int key bucket ids in [0, KB).
    """

    table: Tensor
    qb: Tensor
    kb: Tensor


@dataclasses.dataclass(frozen=True)
class Bias:
    """Everything added to ``q·k * scale`` before the softmax.

    Args:
        tables: :class:`Table` parts (default none).
        columns: per-key parts, each (B, H, Nk) or (B, 1, Nk) float (default none).
        key_mask: (B, Nk) bool, True for real keys, or None (every key is real).
    """

    tables: tuple[Table, ...] = ()
    columns: tuple[Tensor, ...] = ()
    key_mask: Tensor | None = None

    @classmethod
    def of(cls, parts: Iterable[Table | Tensor], key_mask: Tensor | None = None) -> Bias:
        """A bias from the parts the bias terms returned, in order (tables and columns may mix)."""
        parts = list(parts)
        return cls(
            tables=tuple(p for p in parts if isinstance(p, Table)),
            columns=tuple(p for p in parts if not isinstance(p, Table)),
            key_mask=key_mask,
        )

    def check(self, b: int, h: int, nq: int, nk: int) -> None:
        """Raise with the offending shape when a part does not fit q (B, H, Nq, D) and k (B, H, Nk, D)."""
        for n, t in enumerate(self.tables):
            if t.table.dim() != 3 or t.table.shape[0] != h or not t.table.is_floating_point():
                raise ValueError(f"table {n} must be float (H={h}, QB, KB); got {t.table.dtype} {tuple(t.table.shape)}")
            for name, ids, want in (("qb", t.qb, (b, nq)), ("kb", t.kb, (b, nk))):
                if not isinstance(ids, Tensor) or ids.shape != want or ids.is_floating_point():
                    got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else repr(ids)
                    raise ValueError(f"table {n} needs {name} as int ids of shape {want}; got {got}")
        for n, c in enumerate(self.columns):
            if c.dim() != 3 or c.shape[0] != b or c.shape[1] not in (1, h) or c.shape[2] != nk:
                raise ValueError(f"column {n} must be (B, H or 1, Nk) = ({b}, {h} or 1, {nk}); got {tuple(c.shape)}")
        km = self.key_mask
        if km is not None and (km.shape != (b, nk) or km.dtype != torch.bool):
            raise ValueError(f"key_mask must be bool (B, Nk) = ({b}, {nk}); got {km.dtype} {tuple(km.shape)}")

    def column(self, b: int, nk: int, device: torch.device) -> Tensor:
        """The column parts summed in fp32 and -inf on masked keys: (B, H, Nk), or (B, 1, Nk) when no
        part is per head; differentiable in every column part."""
        col = None
        for c in self.columns:
            col = c.float() if col is None else col + c.float()
        if col is None:
            col = torch.zeros(b, 1, nk, device=device)  # (B, 1, Nk)
        if self.key_mask is not None:
            col = col.masked_fill(~self.key_mask[:, None, :], float("-inf"))
        return col

    def dense(self) -> Tensor | None:
        """Every part as one fp32 tensor broadcastable to (B, H, Nq, Nk), key mask excluded, or None
        without parts: (B, H, Nq, Nk) with a table, else (B, H or 1, 1, Nk). Differentiable."""
        out = None
        for t in self.tables:
            g = t.table.float()[:, t.qb[:, :, None], t.kb[:, None, :]].permute(1, 0, 2, 3)  # (B, H, Nq, Nk)
            out = g if out is None else out + g
        for c in self.columns:
            c = c.float()[:, :, None, :]  # (B, H|1, 1, Nk)
            out = c if out is None else out + c
        return out

    def score_mod(self, b: int, nk: int, device: torch.device) -> Callable[..., Tensor]:
        """The bias as a FlexAttention ``score_mod``, the spec the fused kernel is checked against:

            score_mod(score, b, h, i, j) = score + sum_t T_t[h, qb_t[b, i], kb_t[b, j]] + col[b, h, j]

        with ``col`` = :meth:`column` (-inf on masked keys; FlexAttention returns 0 for a row with
        no finite score).
        """
        col = self.column(b, nk, device)  # (B, H|1, Nk)
        per_head = col.shape[1] != 1
        tables = [(t.table.float(), t.qb.long(), t.kb.long()) for t in self.tables]

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            for table, qb, kb in tables:
                score = score + table[h, qb[b, q_idx], kb[b, kv_idx]]
            return score + (col[b, h, kv_idx] if per_head else col[b, 0, kv_idx])

        return score_mod


__all__ = ["Bias", "Table"]
