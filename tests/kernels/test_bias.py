"""Bias: its parts, and its three forms (dense for reference/SDPA, column for Triton, score_mod for flex)."""

from __future__ import annotations

import torch

from hir_kernels import Bias, Table

from .cases import CASES, bias_of, make_inputs


def _small() -> Bias:
    table = torch.tensor([[[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]]])  # (H=1, QB=2, KB=3)
    qb, kb = torch.tensor([[1, 0]]), torch.tensor([[2, 0, 1]])  # (B=1, Nq=2), (B=1, Nk=3)
    col = torch.tensor([[[0.5, -0.5, 0.25]]])  # (B=1, 1, Nk=3)
    return Bias.of([Table(table, qb, kb), col], key_mask=torch.tensor([[True, False, True]]))


def test_of_sorts_parts_by_kind_and_keeps_their_order() -> None:
    t1, t2 = (Table(torch.zeros(1, 1, 1), torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long))
              for _ in range(2))
    c1, c2 = torch.zeros(1, 1, 1), torch.ones(1, 1, 1)
    bias = Bias.of([c1, t1, c2, t2])
    assert bias.tables == (t1, t2) and bias.columns[0] is c1 and bias.columns[1] is c2 and bias.key_mask is None


def test_dense_is_table_gathered_plus_column_without_the_mask() -> None:
    expected = torch.tensor([[[[30.5, 9.5, 20.25], [3.5, 0.5, 2.25]]]])  # T[qb_i, kb_j] + col_j, (1, 1, 2, 3)
    torch.testing.assert_close(_small().dense(), expected)
    assert Bias().dense() is None


def test_column_is_the_column_sum_with_masked_keys_at_minus_inf() -> None:
    col = _small().column(1, 3, torch.device("cpu"))
    torch.testing.assert_close(col, torch.tensor([[[0.5, float("-inf"), 0.25]]]))
    torch.testing.assert_close(Bias().column(2, 4, torch.device("cpu")), torch.zeros(2, 1, 4))


def test_score_mod_adds_dense_and_mask_at_every_pair() -> None:
    """The FlexAttention form agrees with the dense form at every (b, h, i, j), on two tables and two columns."""
    x = make_inputs(CASES["two_tables_and_columns"], torch.float32, torch.device("cpu"))
    bias = bias_of(x)
    b, h, nq, nk = 2, 2, x["q"].shape[2], x["k"].shape[2]
    idx = torch.meshgrid(*(torch.arange(n) for n in (b, h, nq, nk)), indexing="ij")
    got = bias.score_mod(b, nk, torch.device("cpu"))(torch.zeros(b, h, nq, nk), *idx)
    expected = bias.dense().expand(b, h, nq, nk).masked_fill(~x["key_mask"][:, None, None, :], float("-inf"))
    torch.testing.assert_close(got, expected)
