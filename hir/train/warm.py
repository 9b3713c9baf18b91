"""``model.warm_start``: begin training from another run's trained model.

The recipe it serves (issue 32's fault 1): train the default model first (``transformer=false``:
the knowledge view, the scale heads and the prototypes), then train only the user correction on top
of it (``model.net.transformer=true model.train_parts=correction model.warm_start=<that run's
checkpoints>``). Where the evidence gate closes, the export is then exactly the first run's
model, not a knowledge view trained beside a rejected correction::

    hir train run_name=base
    hir train run_name=full model.net.transformer=true model.train_parts=correction \\
        model.warm_start=outputs/<data>/base/checkpoints

The warm run reads the first run's spectral basis (``spectral.npz`` beside its checkpoints)
instead of searching the filter again, so both runs share one base exactly.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from hir.errors import InputError

log = logging.getLogger(__name__)

# the network settings a warm start may change (everything else must match the checkpoint's)
MAY_DIFFER = frozenset({"transformer"})


def resolve(path: str | Path) -> Path:
    """A checkpoint file, or a ``hir train`` checkpoint directory (its best checkpoint)."""
    from hir.export.embed import resolve_checkpoint

    path = Path(path)
    if path.is_dir():
        return resolve_checkpoint("best", path)
    if not path.exists():
        raise InputError(f"model.warm_start={path} does not exist; give a finished `hir train` run's checkpoint "
                         "directory (outputs/<data>/<run>/checkpoints) or one of its .ckpt files")
    return path


def copy_spectral(ckpt: Path, spectral_file: Path, name: str) -> None:
    """Copy the basis beside ``ckpt`` (its ``name``) to ``spectral_file``, this run's basis."""
    src = ckpt.parent / name
    if not src.exists():
        raise InputError(f"model.warm_start: {src} is missing; the warm run reuses the first run's spectral basis "
                         "(retrain that run, or give a checkpoint from a complete `hir train` directory)")
    spectral_file.parent.mkdir(parents=True, exist_ok=True)
    if src.resolve() != spectral_file.resolve():
        shutil.copyfile(src, spectral_file)


def load_weights(module: torch.nn.Module, ckpt: Path, net_config: dict[str, Any]) -> None:
    """Load ``ckpt``'s student and teacher weights (and buffers) into ``module`` (a
    :class:`hir.train.module.HirModule`); its network settings must equal ``net_config`` except
    :data:`MAY_DIFFER`. Nothing else of that run (history, gate, step) carries over."""
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    theirs = state["hyper_parameters"]["net_config"]
    differ = sorted(k for k in set(theirs) | set(net_config)
                    if k not in MAY_DIFFER and theirs.get(k) != net_config.get(k))
    if differ:
        raise InputError(f"model.warm_start={ckpt}: its network differs in {differ} "
                         f"({ {k: theirs.get(k) for k in differ} } there, { {k: net_config.get(k) for k in differ} } here); "
                         "warm-start from a run of the same data, spectral rank and model.net settings")
    module.load_state_dict(state["state_dict"], strict=True)
    log.info("warm start: weights from %s", ckpt)
