"""Shared inputs of the kernel tests: awkward shapes, every kind of bias part, dtypes as (dtype, atol, rtol).

On CPU the Triton kernels run in the interpreter (conftest.py), so shapes are small but awkward:
length 1, lengths that are not powers of two or block multiples, several blocks (the interpreter
tiles are 32x16 / 16x32), masked keys and batches whose keys are all masked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from hir_kernels import Bias, Table

# (dtype, atol, rtol); atol is relative to the largest reference magnitude of each tensor
DTYPES = [
    (torch.float32, 2e-5, 1e-4),
    (torch.float16, 3e-3, 1e-2),
    (torch.bfloat16, 2e-2, 2e-2),
]
FP32 = DTYPES[0]


def dtype_id(v: object) -> str:
    return str(v).replace("torch.", "")


@dataclasses.dataclass
class Case:
    b: int = 2
    h: int = 2
    nq: int = 37
    nk: int = 45
    d: int = 32
    tables: tuple[tuple[int, int], ...] = ((5, 7),)  # (QB, KB) per table; > 32 query buckets in all: gather + atomics
    columns: tuple[str, ...] = ("lam",)  # lam: -lam[h] log1p(exposure_j), (B, H, Nk); shared: a learned (B, 1, Nk)
    mask: str = "some"  # none | some | dead (the last batch has no real key)


CASES = {
    "n1": Case(b=1, h=1, nq=1, nk=1, d=16, mask="none"),
    "odd_lengths": Case(),
    "dead_batch": Case(nq=20, nk=33, mask="dead"),
    "model_like_table": Case(nq=30, nk=41, tables=((26, 216),)),  # the model's QB x KB is ~26 x 216
    "big_table_atomics": Case(nq=21, nk=40, tables=((40, 36),)),
    "two_tables_and_columns": Case(nq=23, nk=35, tables=((5, 7), (3, 4)), columns=("lam", "shared")),
    "two_tables_atomics": Case(nq=17, nk=35, tables=((30, 5), (6, 9)), columns=("shared",), mask="dead"),
    "no_bias": Case(nq=33, nk=17, tables=(), columns=()),
    "column_only_mask": Case(nq=16, nk=50, tables=()),
    "table_only": Case(b=1, h=3, nq=48, nk=48, d=64, columns=(), mask="none"),
    "head_dim_24_padded": Case(b=1, nq=19, nk=23, d=24, mask="dead"),
}


def make_inputs(c: Case, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict:
    """q, k, v in ``dtype``; tables ``table<n>`` with ids ``qb<n>``, ``kb<n>``; ``lam`` and
    ``exposure``, ``shared`` (the column parts); ``key_mask``."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    x = {name: randn(c.b, c.h, n, c.d).to(device, dtype) for name, n in (("q", c.nq), ("k", c.nk), ("v", c.nk))}
    for n, (nq, nk) in enumerate(c.tables):
        x[f"table{n}"] = randn(c.h, nq, nk).to(device)
        x[f"qb{n}"] = torch.randint(0, nq, (c.b, c.nq), generator=g).to(device)
        x[f"kb{n}"] = torch.randint(0, nk, (c.b, c.nk), generator=g).to(device)
    if "lam" in c.columns:
        x["lam"] = (torch.rand(c.h, generator=g) + 0.1).to(device)
        x["exposure"] = (torch.rand(c.b, c.nk, generator=g) * 20).to(device)
    if "shared" in c.columns:
        x["shared"] = randn(c.b, 1, c.nk).to(device)
    x["key_mask"] = None
    if c.mask != "none":
        km = torch.rand(c.b, c.nk, generator=g) > 0.3
        km[:, 0] = True
        if c.mask == "dead":
            km[-1] = False
        x["key_mask"] = km.to(device)
    return x


def bias_of(x: dict) -> Bias:
    """The Bias of ``make_inputs``' tensors (its column parts built with torch ops, so gradients reach lam)."""
    tables = tuple(Table(x[f"table{n}"], x[f"qb{n}"], x[f"kb{n}"]) for n in range(sum(k.startswith("table") for k in x)))
    columns = []
    if "lam" in x:
        columns.append(-x["lam"][None, :, None] * torch.log1p(x["exposure"])[:, None, :])  # (B, H, Nk)
    if "shared" in x:
        columns.append(x["shared"])  # (B, 1, Nk)
    return Bias(tables, tuple(columns), x["key_mask"])


def grad_names(x: dict) -> list[str]:
    return [n for n in x if n in ("q", "k", "v", "lam", "shared") or n.startswith("table")]


def run(fn: Callable, x: dict, do: torch.Tensor, upcast: bool = False) -> tuple[torch.Tensor, dict]:
    """Forward + backward of ``fn(q, k, v, bias)``; the output and the gradient of every float input.
    ``upcast``: q, k, v in fp32 (the reference's maths on the same rounded inputs)."""
    leaves = {n: (x[n].detach().float() if upcast else x[n].detach()).requires_grad_() for n in grad_names(x)}
    args = {**x, **leaves}
    out = fn(args["q"], args["k"], args["v"], bias_of(args))
    grads = torch.autograd.grad(out, list(leaves.values()), do.to(out.dtype))
    return out, dict(zip(leaves, grads))


def upstream(c: Case, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """dO for (B, H, Nq, D), rounded to ``dtype`` so every path sees the same upstream gradient; fp32."""
    do = torch.randn(c.b, c.h, c.nq, c.d, generator=torch.Generator().manual_seed(1))
    return do.to(device, dtype).float()


def assert_close(name: str, got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> None:
    got, ref = got.float().cpu(), ref.float().cpu()
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    scale = max(1.0, ref.abs().max().item())
    torch.testing.assert_close(got, ref, atol=atol * scale, rtol=rtol, msg=lambda m: f"{name}: {m}")


def assert_matches(out: torch.Tensor, grads: dict, ref: torch.Tensor, ref_grads: dict, atol: float, rtol: float) -> None:
    """Same output and the same set of gradients, each close to the reference's."""
    assert out.shape == ref.shape
    assert_close("out", out, ref, atol, rtol)
    assert set(grads) == set(ref_grads)
    for name in grads:
        assert_close(f"d{name}", grads[name], ref_grads[name], atol, rtol)
