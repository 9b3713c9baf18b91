"""DDP's data layout (hir.train.datamodule.shared_state): laid out once in a child process and
mapped, it equals what one process builds in memory, array for array and bit for bit."""

from __future__ import annotations

import os
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra.utils import instantiate

from hir.train.datamodule import STATE, HirDataModule
from tests.train.fixtures import TINY_MODEL, compose


def _datamodule(run: Path, out: Path, mapped: Path | None) -> HirDataModule:
    cfg = compose(out, *TINY_MODEL, f"paths.graph_dir={run / 'graph'}", f"paths.content_dir={run / 'content'}")
    dm = instantiate(cfg.datamodule, spectral_file=str(out / "spectral.npz"), mapped_dir=mapped)
    dm.setup("fit")
    return dm


def _leaves(obj: Any, path: str, out: dict[str, Any], seen: set[int]) -> dict[str, Any]:
    """Every array and plain value reachable from ``obj`` (dataclasses, dicts, lists, attributes)."""
    if isinstance(obj, np.ndarray):
        out[path] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _leaves(v, f"{path}[{k!r}]", out, seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _leaves(v, f"{path}[{i}]", out, seen)
    elif is_dataclass(obj) or hasattr(obj, "__dict__"):
        if id(obj) in seen:
            return out
        seen.add(id(obj))
        names = [f.name for f in fields(obj)] if is_dataclass(obj) else list(vars(obj))
        for k in names:
            _leaves(getattr(obj, k), f"{path}.{k}", out, seen)
    else:
        out[path] = obj
    return out


@pytest.fixture(scope="module")
def mapped(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[HirDataModule, Path]:
    """Local rank 0's datamodule, its state laid out by a child process (``out/layout``), and ``out``
    (built once: the child's imports take most of a test's time)."""
    out = tmp_path_factory.mktemp("shared_state")
    return _datamodule(tiny_run, out, out / "layout"), out


def test_mapped_state_equals_the_in_process_build(tiny_run: Path, tmp_path: Path,
                                                  mapped: tuple[HirDataModule, Path]):
    built = _datamodule(tiny_run, tmp_path / "a", None)
    mapped, out = mapped
    assert (out / "layout" / "done.json").exists()
    n_mapped = 0
    for key in STATE:
        a, b = _leaves(getattr(built, key), key, {}, set()), _leaves(getattr(mapped, key), key, {}, set())
        assert a.keys() == b.keys(), key
        for k, va in a.items():
            vb = b[k]
            if isinstance(va, np.ndarray):
                assert va.dtype == vb.dtype and va.shape == vb.shape, k
                assert np.array_equal(va, vb, equal_nan=va.dtype.kind == "f"), k
                n_mapped += isinstance(vb.base, np.memmap)
            elif k.endswith("['seconds']"):
                continue  # (timings)
            else:
                assert va == vb, k
    assert n_mapped > 0  # the large arrays (content rows, bases) are the files' pages
    # the child process wrote the saved basis, the same as the in-process build's
    with np.load(tmp_path / "a" / "spectral.npz") as fa, np.load(out / "spectral.npz") as fb:
        assert fa.files == fb.files and all(np.array_equal(fa[k], fb[k]) for k in fa.files)


def test_other_ranks_map_the_layout_of_local_rank_zero(tiny_run: Path, mapped: tuple[HirDataModule, Path],
                                                       monkeypatch: pytest.MonkeyPatch):
    first, out = mapped
    stamp = (out / "layout" / "done.json").stat().st_mtime_ns
    monkeypatch.setenv("LOCAL_RANK", "1")
    other = _datamodule(tiny_run, out, out / "layout")
    assert (out / "layout" / "done.json").stat().st_mtime_ns == stamp  # mapped, not laid out again
    assert np.array_equal(other.base.vectors, first.base.vectors) and not other.base.vectors.flags.writeable
    assert os.environ["LOCAL_RANK"] == "1"
