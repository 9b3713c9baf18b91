"""The HIR arm: the published user embedding searched in Milvus, or exact search over the export
files when nothing is published (evaluation/retrieval/hir_search.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hir_evaluation.retrieval.rank import Ranked
from hir_evaluation.retrieval.registry import ArmInfo, RetrievalContext


@dataclass(frozen=True)
class HirSearch:
    """Top-k of the HIR search (``ctx.hir``): the model the report measures."""

    info: ClassVar[ArmInfo] = ArmInfo(role="model", needs=("hir",))

    def topk(self, ctx: RetrievalContext, k: int) -> Ranked:
        assert ctx.hir is not None  # info.needs: not run without embeddings
        return ctx.hir(ctx.test, k)
