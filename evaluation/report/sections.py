"""Which arms a metrics.json section holds, in report order, read from the section itself (the
registry's arms as evaluation wrote them), so the report, the plots, `hir gather` and the
benchmarks show every registered arm without naming any."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the fixed arms of metrics.json files written before the registry listed them
LEGACY_RETRIEVAL_ARMS = {"hir": "model", "popularity": "baseline", "itemknn": "baseline", "lightgcn": "baseline",
                         "content": "baseline", "repeat": "reference"}
LEGACY_RANKING_ARMS = ("baseline", "hir", "content")


def retrieval_arms(retrieval: Mapping[str, Any]) -> dict[str, str]:
    """name -> role (model, baseline, reference) of every arm of metrics.json's ``retrieval``."""
    return dict(retrieval.get("arms") or LEGACY_RETRIEVAL_ARMS)


def ranking_arms(ranking: Mapping[str, Any]) -> list[str]:
    """The arms of metrics.json's ``ranking``, the baseline first."""
    return list(ranking.get("arms") or LEGACY_RANKING_ARMS)
