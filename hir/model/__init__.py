"""The model's view of a snapshot, shared by `hir train` and `hir export` (no Lightning, no Hydra).

- :func:`load_graph` -> :class:`GraphStore`: the snapshot as arrays (engagement with its sampling
  weights, the metadata closure, content rows);
- :class:`SpectralBasis` (fitted by :func:`fit_base`, saved beside the checkpoints) ->
  :class:`SpectralBase` of a store: every node's collaborative starting vector;
- :class:`ContextSampler`: each seed's engagement-view and knowledge-view context;
- :class:`EmbedBatches` + :func:`embed_batch`: fixed node batches through a network;
- :func:`validation_set` -> :class:`ValSet`, :func:`masked_recall`: the validation task.
"""

from hir.model.batches import EmbedBatches, catalogue, catalogue_vectors, embed_batch, to_tensors, views
from hir.model.content import content_rows
from hir.model.context import ContextSampler
from hir.model.filters import RESPONSES
from hir.model.metrics import masked_recall, usage_stats
from hir.model.spectral import (
    INIT_CHECKPOINT,
    SPECTRAL_FILE,
    Filter,
    SpectralBase,
    SpectralBasis,
    SpectralConfig,
    fit_base,
    refit_aligned,
)
from hir.model.store import GraphStore, load_graph
from hir.model.valset import ValSet, validation_set

__all__ = [
    "INIT_CHECKPOINT",
    "RESPONSES",
    "SPECTRAL_FILE",
    "ContextSampler",
    "EmbedBatches",
    "Filter",
    "GraphStore",
    "SpectralBase",
    "SpectralBasis",
    "SpectralConfig",
    "ValSet",
    "catalogue",
    "catalogue_vectors",
    "content_rows",
    "embed_batch",
    "fit_base",
    "load_graph",
    "masked_recall",
    "refit_aligned",
    "to_tensors",
    "usage_stats",
    "validation_set",
    "views",
]
