"""The evaluation's configs compose and instantiate: eval group, per-dataset tasks, sweeps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from hir_evaluation.ranking.ranker import RankerConfig
from hir_evaluation.ranking.registry import build_ranking_arms
from hir_evaluation.retrieval.arms.gfcf import GFCF
from hir_evaluation.retrieval.arms.lightgcn import LightGCN
from hir_evaluation.retrieval.registry import build_arms
from hir_evaluation.tasks import RankingTask, RetrievalTask

TASKS = sorted((Path(__file__).resolve().parents[2] / "conf" / "eval" / "task").glob("*.yaml"))


def test_eval_group_instantiates(compose: Callable) -> None:
    cfg = compose("data=rees46", stage="evaluate")
    assert isinstance(instantiate(cfg.eval.ranker), RankerConfig)
    retrieval = build_arms(cfg.eval.retrieval)
    assert list(retrieval) == ["hir", "recommend", "popularity", "itemknn", "lightgcn", "content", "repeat", "gfcf"]
    assert isinstance(retrieval["lightgcn"], LightGCN) and retrieval["gfcf"] == GFCF(rank=256, ideal_weight=0.3)
    assert {name: arm.info.role for name, arm in retrieval.items() if arm.info.role != "baseline"} == {
        "hir": "model", "recommend": "model", "repeat": "reference"}
    assert list(build_ranking_arms(cfg.eval.ranking)) == ["hir", "hir_tokens", "content"]
    assert cfg.eval.bootstrap.resamples == 200 and cfg.eval.seed == cfg.seed


@pytest.mark.parametrize("path", TASKS, ids=[p.stem for p in TASKS])
def test_task_files_instantiate(path: Path) -> None:
    task = OmegaConf.load(path)
    assert isinstance(instantiate(task.ranking, _convert_="all"), RankingTask)
    assert isinstance(instantiate(task.retrieval, _convert_="all"), RetrievalTask)


def test_ablation_experiment(compose: Callable) -> None:
    cfg = compose("experiment=ablation_bias", stage="pipeline")
    assert cfg.pipeline.stages[-1] == "evaluate"
    # one store per cell: conf/publish/default.yaml's multirun default, not overridden by the
    # experiment (tests/publish/test_sweeps.py runs a sweep)
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "conf"), version_base="1.3"):
        plain = hydra_compose("config", overrides=["experiment=ablation_bias"])
    assert OmegaConf.to_container(plain.publish, resolve=False)["store_dir"].startswith("${hir_serving_dir:")
    # the swept keys exist in the model config (a renamed key would make every cell identical)
    for key in ("model.net.bias.table", "model.net.bias.exposure", "model.objective.weights.distill"):
        assert OmegaConf.select(cfg, key) is not None, key


def test_optuna_search(compose: Callable) -> None:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    root = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(root), version_base="1.3"):
        cfg = hydra_compose("config", overrides=["hparams_search=optuna", "stage=train"], return_hydra_config=True)
    assert cfg.optimized_metric == "val/recall@20"
    assert cfg.hydra.sweeper.storage is None  # in-memory only (STACK.md section 4)
    assert cfg.hydra.sweeper.direction == "maximize"
    for key in cfg.hydra.sweeper.params:
        assert OmegaConf.select(cfg, key) is not None, f"hparams_search sweeps {key}, which conf/model lacks"
