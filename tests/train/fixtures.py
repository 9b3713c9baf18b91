"""Tiny model inputs for the train/export tests: a small synthetic snapshot (the real prepare
stage) plus content files written per docs/contracts.md with a cheap deterministic text
encoder (hashed bag of words), so no sentence model is loaded."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[2]
TEXT_DIM = 32

# a planted hierarchy of 4 x 2 interests, small enough to prepare in about a second
TINY_DATA = [
    "data=synthetic", "data.adapter.n_users=150", "data.adapter.n_products=240", "data.adapter.n_events=6000",
    "data.adapter.n_advertisers=12", "data.adapter.n_campaigns=20", "data.adapter.n_coarse=4", "data.adapter.n_fine=2",
]
# a model small enough to train two epochs in a few seconds
TINY_MODEL = [
    "spectral.rank=16", "model.net.width=16", "model.net.depth=1", "model.net.heads=2", "model.net.hierarchy.levels=[2,4,8]",
    "model.net.hierarchy.top_k=2", "datamodule.batch_size=48", "datamodule.task.users=16", "datamodule.seeds_per_epoch=192",
    "datamodule.embed_batch_size=256", "datamodule.val_candidates=null", "model.objective.init_nodes=256",
    "export.batch_size=256", "trainer.max_epochs=2", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
    # the tests of training train (the default, model.train_parts=auto, trains nothing without the transformer)
    "model.train_parts=all",
]


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """torch on one intra-op thread inside the block, restored after it: bitwise reproducible on
    CPU, and no OpenMP threads spinning against the other processes of a busy 2-core machine
    (a test process imports torch before `hir train` can set ``OMP_WAIT_POLICY=PASSIVE``;
    measured under load: tests/train/test_learns.py's training 67 s with two threads, 15 s with one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compose(out: Path, *overrides: str, stage: str = "train"):
    """The real Hydra config with outputs under ``out`` (for in-process stage runs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from hir.stages import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=[f"stage={stage}", f"paths.output_dir={out}",
                                                  f"paths.cache_dir={out}/.cache", *overrides])


@functools.cache
def _defaults() -> dict[str, Any]:
    from omegaconf import OmegaConf

    cfg = compose(Path("/nonexistent"), stage="train")  # only read: nothing is written there
    return {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "datamodule", "spectral")}


def defaults(group: str) -> dict[str, Any]:
    """The YAML defaults of ``model``, ``datamodule`` or ``spectral`` as plain values (a copy)."""
    import copy

    return copy.deepcopy(_defaults()[group])


def graph_options(**overrides: Any) -> dict[str, Any]:
    """``datamodule.graph``: the keyword arguments of :func:`hir.model.load_graph`."""
    return defaults("datamodule")["graph"] | overrides


def context_sizes(**overrides: int) -> dict[str, int]:
    """``datamodule.context``: the sizes of :class:`hir.model.ContextSampler`."""
    return defaults("datamodule")["context"] | overrides


def spectral_fit(**overrides: Any) -> dict[str, Any]:
    """``spectral`` as keyword arguments of :func:`hir.model.spectral.fit_spectral` after the rank."""
    spec = defaults("spectral")
    # `auto` chooses among stage_bases on val; a direct fit takes the sampling graph's weighting
    stage_base = defaults("datamodule")["graph"]["stage_base"] if spec["stage_base"] == "auto" else spec["stage_base"]
    return {"stage_base": float(stage_base), "n_iter": spec["n_iter"], "seed": 0} | overrides


def hashed_text_vectors(texts: list[str | None], dim: int = TEXT_DIM) -> np.ndarray:
    """Each text -> L2-normalised sum of one fixed random vector per word (zeros without text)."""
    out = np.zeros((len(texts), dim), np.float32)
    for i, text in enumerate(texts):
        for word in (text or "").lower().split():
            rng = np.random.default_rng(zlib.crc32(word.encode()))
            out[i] += rng.standard_normal(dim).astype(np.float32)
        norm = np.linalg.norm(out[i])
        if norm > 0:
            out[i] /= norm
    return out


def write_content(graph_dir: Path, content_dir: Path) -> None:
    """``content/<type>.parquet`` for every node type of the snapshot (enrich's contract)."""
    content_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted((graph_dir / "nodes").glob("*.parquet")):
        nodes = pl.read_parquet(path).sort("node_id")
        texts = nodes["text"].to_list()
        attr = np.zeros((nodes.height, 0), np.float32)
        if "attr_price" in nodes.columns:
            price = np.log1p(nodes["attr_price"].fill_null(0).to_numpy().astype(np.float32))
            attr = ((price - price.mean()) / (price.std() + 1e-6))[:, None]
        pl.DataFrame({
            "node_id": nodes["node_id"],
            "has_text": pl.Series([bool(t) for t in texts]),
            "text_vec": pl.Series(hashed_text_vectors(texts)).cast(pl.List(pl.Float32)),
            "attr_vec": pl.Series(attr).cast(pl.List(pl.Float32)),
            "content_hash": pl.Series([hashlib.sha256((t or "").encode()).hexdigest()[:16] for t in texts]),
        }).write_parquet(content_dir / path.name)


def tiny_snapshot(out: Path) -> Path:
    """Prepare the tiny synthetic snapshot under ``out`` and write its content; returns ``out``."""
    from hir.data.prepare import run as prepare

    prepare(compose(out, *TINY_DATA, stage="prepare"))
    write_content(out / "graph", out / "content")
    return out
