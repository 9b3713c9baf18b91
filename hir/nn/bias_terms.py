"""Attention bias terms, in a registry: a new term costs one function here plus one config entry.

The score of head h, query i, key j is ``q_i·k_j / sqrt(d)`` plus every term switched on in the
``bias:`` block of conf/model/hir.yaml (``<name>: true``). A term is a function ``part(params, feats)``
registered with :func:`bias_term` under its config name, with the initial value of each of its
learned parameters:

  * ``params``: the term's parameters by name. They live on
    :class:`hir.nn.attention.BiasedSelfAttention` under these names (``layer.lam``; None while the
    term is off), so a checkpoint names them as before the registry existed.
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
from torch import Tensor

from hir_kernels import Table

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


def switched_on(bias: Mapping[str, Any]) -> list[str]:
    """The registered terms ``bias`` switches on, in registry order; raises for an unknown entry."""
    unknown = sorted(set(bias) - set(BIAS_TERMS) - _options())
    if unknown:
        raise ValueError(
            f"unknown bias entries {unknown}; expected a term of {sorted(BIAS_TERMS)} (true/false) "
            f"or an option of one {sorted(_options())}"
        )
    return [name for name in BIAS_TERMS if bool(bias.get(name, False))]


def initial_params(name: str, settings: Mapping[str, Any]) -> dict[str, Tensor]:
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


__all__ = ["BIAS_TERMS", "LAYER_SETTINGS", "BiasTerm", "bias_term", "initial_params", "switched_on"]
