"""The arm registries end to end: arms defined outside evaluation/ (here) and named by one config
line each run in `hir evaluate`, and the report and `hir gather` show them; a class that is not
an arm is refused with the reason."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from hir.errors import HirError
from hir_evaluation import stage
from hir_evaluation.gather import gather
from hir_evaluation.ranking.registry import build_ranking_arms
from hir_evaluation.retrieval.rank import Ranked, rank_dense
from hir_evaluation.retrieval.registry import ArmInfo, RetrievalContext, build_arms
from tests.evaluation.test_stage import FAST, TINY_TASK


@dataclass(frozen=True)
class NoisyColumn:
    """A ranking arm: the baseline plus one seeded noise column."""

    needs: ClassVar[tuple[str, ...]] = ()

    def inputs(self, sources: Any, rows: Any, base: Any) -> Any:
        noise = np.random.default_rng(0).normal(size=len(base))
        return base.with_blocks({"has_noisy": np.ones(len(base)), "noisy": noise})


@dataclass(frozen=True)
class LowestIds:
    """A retrieval arm: entities by id, the same list for everyone."""

    info: ClassVar[ArmInfo] = ArmInfo(role="baseline")

    def topk(self, ctx: RetrievalContext, k: int) -> Ranked:
        row = -torch.arange(ctx.test.n_items, dtype=torch.float32)
        return rank_dense(lambda users: row.expand(len(users), -1).clone(), ctx.test.users, k, ctx.test.seen,
                          deep=ctx.test.seen_deep)


def test_one_config_line_adds_an_arm(compose: Callable, tiny_graph: Path, tmp_path: Path) -> None:
    cfg = compose("data=rees46", f"paths.graph_dir={tiny_graph}", TINY_TASK, "eval.require_hir=false",
                  "eval.require_content=false", *FAST,
                  "+eval.ranking.noisy={_target_: tests.evaluation.test_registry.NoisyColumn}",
                  "+eval.retrieval.lowest={_target_: tests.evaluation.test_registry.LowestIds}", stage="evaluate")
    metrics = stage.run(cfg)
    ranking, retrieval = metrics["ranking"], metrics["retrieval"]
    assert ranking["arms"] == ["baseline", "hir", "hir_tokens", "content", "noisy"]
    assert ranking["noisy"]["auc"] is not None and ranking["ne_lift_noisy"]["value"] is not None
    assert ranking["noisy"]["feature_coverage"]["test_has_noisy"] == 1.0
    assert ranking["hir"]["auc"] is None  # no embeddings: listed, not run
    assert list(retrieval["arms"])[-1] == "lowest" and retrieval["arms"]["lowest"] == "baseline"
    # tiny.py has 6 products: any top 10 holds every test purchase
    assert retrieval["lowest"]["recall@10"] == 1.0 and retrieval["masked_new_to_user"]["lowest"]["recall@10"] == 1.0
    # the deep funnel masks test users' past purchases; tiny.py's user 1 buys its past purchase 3 again
    assert retrieval["deep_funnel"]["lowest"]["hr@10"] == 0.5
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| noisy |" in report and "| lowest |" in report and "AUC noisy" in report and "lowest recall@20" in report

    job = tmp_path / "multirun" / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- data=rees46\n")
    (job / "report").mkdir()
    (job / "report" / "metrics.json").write_text(json.dumps(metrics))
    gather(tmp_path / "multirun")
    header = next(csv.reader((tmp_path / "multirun" / "comparison.csv").open()))
    assert "ranking.noisy.auc" in header and "retrieval.lowest.recall@20" in header


def test_a_class_that_is_not_an_arm_is_refused() -> None:
    with pytest.raises(HirError, match=r"eval\.retrieval\.noisy .*NoisyColumn\) is not a retrieval arm"):
        build_arms({"noisy": {"_target_": "tests.evaluation.test_registry.NoisyColumn"}})
    with pytest.raises(HirError, match=r"eval\.ranking\.lowest .*LowestIds\) is not a ranking arm"):
        build_ranking_arms({"lowest": {"_target_": "tests.evaluation.test_registry.LowestIds"}})
    with pytest.raises(HirError, match=r"'best' is a key of metrics\.json's retrieval section"):
        build_arms({"best": {"_target_": "tests.evaluation.test_registry.LowestIds"}})
