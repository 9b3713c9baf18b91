"""The snapshot as numpy arrays: one global node index, CSR adjacencies, content rows.

Built once per process from ``graph/`` (prepare) and ``content/`` (enrich). Every entity type
of ``hir.data.schema.ENTITY_TYPES`` has a fixed type id (a type absent from the snapshot has no
nodes), and node ``(type, node_id)`` has global id ``offset[type] + node_id``. Three concerns,
one module each:

- :mod:`hir.model.engagement`: the visible engagement pairs and their sampling weights (``eng``);
- :mod:`hir.model.metadata`: metadata links and their closure (``up``, ``down``);
- :mod:`hir.model.content`: the content rows and their layout.

The spectral base of a store is not part of it: :meth:`hir.model.spectral.SpectralBasis.base_for`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hir.data.schema import ENTITY_TYPES
from hir.data.snapshot import Snapshot, load_snapshot
from hir.model.content import load_content
from hir.model.csr import CSR
from hir.model.engagement import N_RECENCY, load_engagement, span_days, visible_end
from hir.model.metadata import closure, inherit_exposure, members, metadata_links, spread_warm

log = logging.getLogger(__name__)


@dataclass
class GraphStore:
    """Everything the sampler, the validation metric and export need, as arrays."""

    types: tuple[str, ...]  # ENTITY_TYPES; the index is the type id
    offsets: np.ndarray  # (n_types + 1,) int64 global id ranges per type
    node_type: np.ndarray  # (n,) int8
    content: np.ndarray  # (n, content_dim) float16: text | image | attr blocks per type | has_text
    exposure: np.ndarray  # (n,) float32 visible engagement events of the node (popularity)
    warm: np.ndarray  # (n,) bool: has engagement in the visible splits (or, without engagement types, linked to warm)
    eng: CSR
    up: CSR
    down: CSR
    deep_pairs: np.ndarray  # (P, 2) int64 (user, entity) visible deep-stage edges, one row per pair
    deep_weight: np.ndarray  # (P,) float64 sampling weight of each pair (its deep-stage event count ** pair_power)
    val_pairs: np.ndarray  # (V, 2) int64 (user, entity) deep-stage edges of the val split
    stage_order: tuple[str, ...]
    deep_stage: str
    spec: dict[str, Any]  # plain sizes the network is built from (saved in checkpoints)
    layout: dict[str, Any]  # content row layout (see hir.model.content)
    split_bounds: dict[str, str]  # the snapshot's split bounds (ISO), from meta.json
    visible_end: str  # ISO time the visible engagement ends (val_start or test_start)
    # the timestamps are the data's own (False: synthesized by prepare, no order within a split)
    real_time: bool = True

    @property
    def n_nodes(self) -> int:
        return int(self.offsets[-1])

    @property
    def span_days(self) -> float:
        """Days from the snapshot's first event to the end of the visible window (``eng.age`` is
        an age over this span)."""
        return span_days(self.split_bounds["min"], self.visible_end)

    def global_ids(self, etype: str, node_id: np.ndarray) -> np.ndarray:
        return self.offsets[self.types.index(etype)] + np.asarray(node_id, dtype=np.int64)

    def type_range(self, etype: str) -> tuple[int, int]:
        t = self.types.index(etype)
        return int(self.offsets[t]), int(self.offsets[t + 1])


def load_graph(
    snapshot: Snapshot | Path | str,
    content_dir: Path | str,
    visible_splits: tuple[str, ...] | list[str],
    *,
    stage_base: float,
    half_life_days: float | None,
    meta_depth: int,
    pair_power: float,
) -> GraphStore:
    """Read a snapshot into a :class:`GraphStore`.

    The sampling options `hir train` uses are ``datamodule.graph`` (conf/datamodule/default.yaml);
    export takes them from the checkpoint.

    Args:
        snapshot: prepare's ``graph/`` (a :class:`~hir.data.snapshot.Snapshot` or its directory).
        content_dir: enrich's ``content/``.
        visible_splits: engagement splits the contexts may see (training: only ``train``).
        stage_base: sampling weight of funnel stage r is ``stage_base ** r`` (deeper = likelier).
        half_life_days: recency decay of sampling weights; None = the median visible edge age.
        meta_depth: hops of the forward metadata closure (category ancestors).
        pair_power: deep-funnel (user, entity) pairs, the training targets, are drawn with
            probability ~ (deep-stage events of the pair) ** pair_power: 1 = as often as they
            happened (a weekly repeat purchase weighs 50 one-off ones), 0 = every pair alike.
    """
    snap = snapshot if isinstance(snapshot, Snapshot) else load_snapshot(snapshot)
    types = ENTITY_TYPES
    counts = snap.node_counts
    offsets = np.cumsum([0] + [counts[t] for t in types]).astype(np.int64)
    n = int(offsets[-1])
    node_type = np.repeat(np.arange(len(types), dtype=np.int8), [counts[t] for t in types])

    e = load_engagement(snap, offsets, tuple(visible_splits), stage_base, half_life_days, pair_power)
    src, dst = metadata_links(snap, offsets)
    up = closure(n, src, dst, meta_depth)
    exposure = inherit_exposure(up, e.exposure)
    warm = np.zeros(n, bool)
    warm[e.engaged] = True
    warm = spread_warm(warm, node_type, src, dst, meta_depth)
    content, layout = load_content(Path(content_dir), types, counts)
    stage_order = tuple(snap.stage_order)
    spec = {
        "n_types": len(types), "n_stages": len(stage_order), "content_dim": layout["dim"], "n_recency": N_RECENCY,
        "n_nodes": n,
    }
    log.info(
        "graph: %d nodes %s; %d visible engagement pairs (%s), %d deep pairs, %d val deep pairs; "
        "recency buckets at %s days, half-life %.3g days; content %d-d",
        n, {t: c for t, c in counts.items() if c}, len(e.eng.dst) // 2, "+".join(visible_splits), len(e.deep_pairs),
        len(e.val_pairs), [round(x, 3) for x in e.recency_edges], e.half_life, layout["dim"],
    )
    return GraphStore(
        types=types, offsets=offsets, node_type=node_type, content=content, exposure=exposure.astype(np.float32),
        warm=warm, eng=e.eng, up=up, down=members(n, src, dst, exposure), deep_pairs=e.deep_pairs,
        deep_weight=e.deep_weight, val_pairs=e.val_pairs, stage_order=stage_order,
        deep_stage=snap.deep_stage, spec=spec, layout=layout, split_bounds=snap.split_bounds,
        visible_end=visible_end(snap, tuple(visible_splits)), real_time=snap.real_time,
    )
