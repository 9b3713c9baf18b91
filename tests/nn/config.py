"""The network's hyper-parameters as conf/model/hir.yaml sets them (defaults live only there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]


def net_kwargs(**overrides: Any) -> dict[str, Any]:
    """``model.net`` without its target: :class:`hir.nn.HirNet`'s hyper-parameters, ``overrides`` on top."""
    net = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / "hir.yaml").net)
    net.pop("_target_")
    # these tests exercise the network itself: its transformer on (the shipped default is off,
    # conf/model/hir.yaml says why)
    return net | {"transformer": True} | overrides


def tokenizer_kwargs(**overrides: Any) -> dict[str, Any]:
    """``model.net.hierarchy``: :class:`hir.nn.HierarchicalTokenizer`'s keyword arguments."""
    return net_kwargs()["hierarchy"] | overrides
