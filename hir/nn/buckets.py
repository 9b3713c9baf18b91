"""Bucket vocabularies for the attention bias table ``T_h[qb_i, kb_j]``.

Every context token carries five small integer features:

    type      entity type 0..n_types-1, or ``n_types`` for an interest-primitive token
    relation  how it reaches the seed: SELF, ENGAGEMENT, METADATA or PRIMITIVE
    hop       0 (the seed / primitives), 1 or 2
    stage     funnel stage of the linking engagement edge, 1..n_stages (0 = none)
    recency   recency bucket of the linking edge, 1..n_recency (0 = none)

The full product of these is large (and mostly impossible: a metadata neighbour has no funnel
stage), so the valid combinations are enumerated and numbered densely. Keys use all five
components; queries use (type, relation, hop) only, which keeps the table ``(H, QB, KB)`` small
(e.g. 26 x 216 for five funnel stages). A component can be switched off for ablations: it is
then collapsed to one value, and tokens differing only in it share a bucket.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn

SELF, ENGAGEMENT, METADATA, PRIMITIVE = range(4)
RELATIONS = ("self", "engagement", "metadata", "primitive")
COMPONENTS = ("type", "relation", "hop", "stage", "recency")
QUERY_COMPONENTS = ("type", "relation", "hop")


def _valid_tuples(n_types: int, n_stages: int, n_recency: int) -> list[tuple[int, int, int, int, int]]:
    """Every (type, relation, hop, stage, recency) a sampler can emit."""
    out = [(n_types, PRIMITIVE, 0, 0, 0)]
    out += [(t, SELF, 0, 0, 0) for t in range(n_types)]
    out += [
        (t, ENGAGEMENT, h, s, r)
        for t, h, s, r in itertools.product(range(n_types), (1, 2), range(1, n_stages + 1), range(1, n_recency + 1))
    ]
    out += [(t, METADATA, h, 0, 0) for t, h in itertools.product(range(n_types), (1, 2))]
    return out


class BucketVocab(nn.Module):
    """Maps per-token components to dense query/key bucket ids.

    Args:
        n_types: number of entity types (the primitive token type is ``n_types``).
        n_stages: funnel stages of the snapshot.
        n_recency: recency buckets (default 4).
        enabled: component -> bool; a disabled component is collapsed (ablation). Default all on.
    """

    def __init__(self, n_types: int, n_stages: int, n_recency: int = 4, enabled: dict[str, bool] | None = None) -> None:
        super().__init__()
        enabled = dict.fromkeys(COMPONENTS, True) | dict(enabled or {})
        unknown = sorted(set(enabled) - set(COMPONENTS))
        if unknown:
            raise ValueError(f"unknown bucket components {unknown}; expected a subset of {list(COMPONENTS)}")
        self.n_types, self.n_stages, self.n_recency = n_types, n_stages, n_recency
        self.enabled = {c: bool(enabled[c]) for c in COMPONENTS}
        self.sizes = (n_types + 1, len(RELATIONS), 3, n_stages + 1, n_recency + 1)
        full = _valid_tuples(n_types, n_stages, n_recency)
        key_lut, self.n_key = self._lookup(full, COMPONENTS)
        query_lut, self.n_query = self._lookup(full, QUERY_COMPONENTS)
        # lookup tables over the mixed-radix index of the full tuple; -1 marks an impossible tuple
        self.register_buffer("key_lut", key_lut, persistent=False)
        self.register_buffer("query_lut", query_lut, persistent=False)

    def _lookup(self, full: list[tuple[int, ...]], use: tuple[str, ...]) -> tuple[Tensor, int]:
        keep = [i for i, c in enumerate(COMPONENTS) if c in use and self.enabled[c]]
        projected = [tuple(t[i] if i in keep else 0 for i in range(len(COMPONENTS))) for t in full]
        ids = {p: n for n, p in enumerate(sorted(set(projected)))}
        lut = torch.full((int(torch.tensor(self.sizes).prod()),), -1, dtype=torch.long)
        for t, p in zip(full, projected):
            lut[self._radix(torch.tensor([t]))] = ids[p]
        return lut, len(ids)

    def _radix(self, comps: Tensor) -> Tensor:
        """(..., 5) component tuples -> (...) mixed-radix index."""
        idx = torch.zeros(comps.shape[:-1], dtype=torch.long, device=comps.device)
        for i, size in enumerate(self.sizes):
            idx = idx * size + comps[..., i]
        return idx

    def forward(self, type_: Tensor, relation: Tensor, hop: Tensor, stage: Tensor, recency: Tensor) -> tuple[Tensor, Tensor]:
        """Each argument (B, N) int64 -> (qb, kb), each (B, N) int64.

        Padding tokens may carry any valid tuple (the attention masks them); an impossible tuple
        is a sampler bug and fails loudly.
        """
        idx = self._radix(torch.stack([type_, relation, hop, stage, recency], dim=-1))  # (B, N)
        qb, kb = self.query_lut[idx], self.key_lut[idx]
        if bool((kb < 0).any()):
            bad = torch.stack([type_, relation, hop, stage, recency], dim=-1)[kb < 0][0].tolist()
            raise AssertionError(f"impossible bucket tuple (type, relation, hop, stage, recency)={bad}")
        return qb, kb

    def extra_repr(self) -> str:
        off = [c for c, on in self.enabled.items() if not on]
        return f"query_buckets={self.n_query}, key_buckets={self.n_key}, off={off}"
