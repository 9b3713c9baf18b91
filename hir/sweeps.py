"""Hydra callbacks for sweeps.

:class:`PrepareOnce` runs the data stages once, before the first job of a multirun, into the run
dir a single run of the same command would use (``hydra.run.dir``, by default
``outputs/<dataset>/<run_name>``); every job then reads them through ``paths.graph_dir`` /
``paths.content_dir`` (conf/hparams_search/optuna.yaml points them there). Prepared data that
exists is reused (the stages are idempotent), so a sweep after `hir pipeline data=X` or
`hir prepare data=X` just finds it.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


class PrepareOnce(Callback):
    """Before a multirun's first job: run ``stages`` (default prepare, enrich) into ``hydra.run.dir``.

    Args:
        stages: stage names of :data:`hir.stages.STAGES` that every job shares (their outputs must
            not depend on the swept parameters).
    """

    def __init__(self, stages: list[str] | None = None) -> None:
        self.stages = list(stages or ["prepare", "enrich"])

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig

        from hir.stages import run_stage, user_error

        # ${hydra:...} in paths resolves against this command (a copy: set_config freezes its argument)
        HydraConfig.instance().set_config(copy.deepcopy(config))
        run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir"))).resolve()
        cfg = config.copy()
        with open_dict(cfg):
            del cfg["hydra"]
            cfg.paths.output_dir = str(run_dir)
            # the jobs read these; the shared stages write them
            cfg.paths.graph_dir = str(Path(str(OmegaConf.select(config, "paths.graph_dir"))).resolve())
            cfg.paths.content_dir = str(Path(str(OmegaConf.select(config, "paths.content_dir"))).resolve())
            cfg.stage = "pipeline"
        log.info("sweep: preparing the shared inputs once in %s (%s); every job reads them", run_dir,
                 ", ".join(self.stages))
        try:
            for stage in self.stages:
                run_stage(stage, cfg)
        except Exception as err:
            error = user_error(err)
            if error is None:
                raise
            log.error("hir sweep (shared %s): %s", "/".join(self.stages), error)
            raise SystemExit(2) from None
