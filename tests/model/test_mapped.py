"""Memory-mapped layouts (hir/model/mapped.py): the mapped store equals load_graph's, bit for bit."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from hir.model import GraphStore, load_graph
from hir.model.csr import CSR
from hir.model.mapped import MIN_BYTES, load_mapped, mapped_ready, save_mapped
from tests.train.fixtures import graph_options, tiny_snapshot


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("tiny"))


def _arrays(store: GraphStore) -> dict[str, np.ndarray]:
    out = {}
    for f in fields(GraphStore):
        v = getattr(store, f.name)
        if isinstance(v, np.ndarray):
            out[f.name] = v
        elif isinstance(v, CSR):
            out |= {f"{f.name}.{g.name}": getattr(v, g.name) for g in fields(CSR)}
    return out


def test_mapped_store_equals_load_graph(tiny_run: Path, tmp_path: Path):
    store = load_graph(tiny_run / "graph", tiny_run / "content", ("train",), **graph_options())
    done = save_mapped({"store": store}, tmp_path / "m", {"k": 1}, min_bytes=0)  # every array to a file
    assert done["arrays"] == len(_arrays(store)) - sum(a.dtype.hasobject for a in _arrays(store).values())
    mapped = load_mapped(tmp_path / "m")["store"]
    a, b = _arrays(store), _arrays(mapped)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k
    # the other fields (sizes, layout, bounds) come back as they were
    for f in fields(GraphStore):
        if not isinstance(getattr(store, f.name), (np.ndarray, CSR)):
            assert getattr(mapped, f.name) == getattr(store, f.name), f.name


def test_large_arrays_are_mapped_read_only_and_shared_once(tmp_path: Path):
    big = np.arange(MIN_BYTES, dtype=np.int64)  # 8x the threshold
    small = np.arange(4, dtype=np.float32)
    obj = {"a": big, "again": big, "copy": big.copy(), "view": big[::3], "small": small, "text": "x"}
    done = save_mapped(obj, tmp_path / "m")
    got = load_mapped(tmp_path / "m")
    # `big` and its equal copy once, the strided view as its own contiguous copy
    assert len(list((tmp_path / "m").glob("*.npy"))) == done["files"] == 2
    assert got["a"] is got["again"]
    np.testing.assert_array_equal(got["copy"], big)
    assert isinstance(got["a"].base, np.memmap) and not got["a"].flags.writeable
    np.testing.assert_array_equal(got["view"], big[::3])
    with pytest.raises(ValueError, match="read-only"):
        got["a"][0] = 1
    assert got["small"].flags.writeable and got["text"] == "x"


def test_ready_only_when_complete_and_of_the_same_inputs(tmp_path: Path):
    d = tmp_path / "m"
    assert not mapped_ready(d, {"k": 1})
    with pytest.raises(FileNotFoundError, match="incomplete"):
        load_mapped(d)
    save_mapped({"x": np.zeros(MIN_BYTES)}, d, {"k": 1, "path": Path("a")})
    assert mapped_ready(d, {"k": 1, "path": "a"}) and not mapped_ready(d, {"k": 2, "path": "a"})
    (d / "done.json").unlink()  # a killed writer leaves no marker
    assert not mapped_ready(d, {"k": 1, "path": "a"})
