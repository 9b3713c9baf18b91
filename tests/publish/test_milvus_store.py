"""Index-side details of the Milvus publish that need no server."""

from __future__ import annotations

import numpy as np

from hir.publish.milvus_store import break_ties


def test_break_ties_nudges_all_but_one_of_each_twin_group() -> None:
    rng = np.random.default_rng(0)
    v = rng.normal(size=(6, 8)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    v[3] = v[4] = v[5] = v[0]  # a group of four identical vectors
    data = {"vectors": v.copy()}
    assert break_ties(data, 1e-3) == 3
    out, group = data["vectors"], data["twin_group"]
    assert len(np.unique(out, axis=0)) == 6                      # all distinct now
    assert np.array_equal(out[[0, 1, 2]], v[[0, 1, 2]])          # first of a group and singletons untouched
    assert np.all(out[[3, 4, 5]] @ v[0] > 0.9999)                # twins stay (almost) where they were
    assert np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-6)
    assert len(set(group[[0, 3, 4, 5]])) == 1 and len(set(group)) == 3


def test_break_ties_off_or_without_twins_changes_nothing() -> None:
    v = np.eye(4, dtype=np.float32)
    data = {"vectors": v}
    assert break_ties(data, 1e-3) == 0 and data["vectors"] is v
    twins = {"vectors": np.ones((3, 4), np.float32) / 2}
    assert break_ties(twins, 0.0) == 0 and len(set(twins["twin_group"])) == 1


def test_near_twins_within_the_resolution_are_one_group() -> None:
    rng = np.random.default_rng(1)
    v = rng.normal(size=(5, 8)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    v[3] = v[0] + 2e-6  # the same up to float noise: a near-twin of row 0
    v[4] = v[1] + 5e-3  # close, but a different vector
    data = {"vectors": v.copy()}
    assert break_ties(data, 1e-3) == 1
    group = data["twin_group"]
    assert group[3] == group[0] and len(set(group)) == 4
    exact = {"vectors": v.copy()}
    assert break_ties(exact, 1e-3, resolution=0.0) == 0 and len(set(exact["twin_group"])) == 5


def test_the_nudge_is_relative_to_the_semantic_part() -> None:
    """With most of the norm in the last (prior/scale) coordinate, a fixed-size nudge would move
    an entity's meaning a lot while the whole-vector cosine still reads ~1: the nudge is scaled to
    the semantic part, the last coordinate kept, and checked_payload looks at both."""
    rng = np.random.default_rng(2)
    sem = rng.normal(size=(4, 16))
    sem *= 0.13 / np.linalg.norm(sem, axis=1, keepdims=True)       # a semantic part of norm 0.13
    v = np.concatenate([sem, np.full((4, 1), np.sqrt(1 - 0.13**2))], axis=1).astype(np.float32)
    v[1] = v[2] = v[3] = v[0]
    data = {"vectors": v.copy()}
    assert break_ties(data, 1e-3) == 3
    out = data["vectors"]
    s0, s1 = v[1:, :-1], out[1:, :-1]
    semantic_cos = (s0 * s1).sum(1) / (np.linalg.norm(s0, axis=1) * np.linalg.norm(s1, axis=1))
    assert semantic_cos.min() > 0.999 and len(np.unique(out, axis=0)) == 4


def test_checked_payload_refuses_a_nudge_that_moves_the_meaning(tmp_path) -> None:
    import pytest

    from hir.errors import HirError
    from hir.publish.milvus_store import checked_payload

    rng = np.random.default_rng(3)
    sem = rng.normal(size=(3, 16))
    sem *= 0.13 / np.linalg.norm(sem, axis=1, keepdims=True)
    v = np.concatenate([sem, np.full((3, 1), np.sqrt(1 - 0.13**2))], axis=1).astype(np.float32)
    v[2] = v[1]
    ok = checked_payload({"ids": ["a", "b", "c"], "vectors": v.copy(), "coarse": np.zeros(3, np.int64)}, 1e-3, 1e-4,
                         0.999, tmp_path / "ok.parquet", "t")
    assert ok["nudged"] == 1 and ok["min_cosine_to_validated"] > 0.999
    with pytest.raises(HirError, match=r"t: 1 vectors would reach Milvus changed .*semantic part"):
        checked_payload({"ids": ["a", "b", "c"], "vectors": v.copy(), "coarse": np.zeros(3, np.int64)}, 0.5, 1e-4,
                        0.999, tmp_path / "bad.parquet", "t")


def test_errors_the_caller_reraises_are_not_logged_with_tracebacks(tmp_path, caplog) -> None:
    """pymilvus and Milvus Lite's server log a failed call with its traceback before the client
    raises it; hir reports the exception itself (a full disk: one line), so after connect those
    records go to DEBUG, first line only, and other errors stay."""
    import logging

    from hir.publish import milvus_store

    uri = str(tmp_path / "milvus.db")
    milvus_store.disconnect(milvus_store.connect(uri), uri)
    own = logging.getLogger("pymilvus")  # pymilvus prints through its own handler (propagate off)
    own.addHandler(caplog.handler)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("pymilvus.decorators").error(
            "RPC error: [flush], <MilvusException: (code=1, message=[Errno 28] No space left on device)>\n"
            "Traceback:\nTraceback (most recent call last):\n  File ...")
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            logging.getLogger("milvus_lite.adapter.grpc.servicer").exception("Flush failed: disk full")
        logging.getLogger("pymilvus.decorators").error("a plain error")
    own.removeHandler(caplog.handler)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["a plain error"]
    assert "Traceback" not in caplog.text
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert "pymilvus.decorators: RPC error: [flush], <MilvusException: (code=1, message=[Errno 28] No space left on " \
           "device)>" in debug and "milvus_lite.adapter.grpc.servicer: Flush failed: disk full" in debug
