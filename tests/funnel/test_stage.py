"""`hir funnel` as a stage: an existing ``funnel/`` is reused only when it was written under the
same settings and snapshot and its scorer reads this hir's inputs; otherwise it is refitted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hir.funnel import stage
from tests.publish.fixtures import FUNNEL_FIT, compose_at


def test_reused_only_under_the_same_settings_snapshot_and_inputs(tiny_graph: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(tiny_graph, tmp_path / "run" / "graph")
    fits: list[str] = []
    real = stage.write_funnel

    def counted(*args: object, **kwargs: object) -> dict:
        fits.append(str(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(stage, "write_funnel", counted)

    def run(*overrides: str) -> dict:
        return stage.run(compose_at(tmp_path / "run", *FUNNEL_FIT, "funnel.config.scorer.checks=2", *overrides,
                                    stage="funnel"))

    meta = run()
    assert len(fits) == 1 and len(meta["settings_digest"]) == 16
    assert run() == json.loads(json.dumps(meta, default=str)) and len(fits) == 1  # reused as written

    run("funnel.config.popular=7")  # a changed setting refits
    assert len(fits) == 2
    run("funnel.config.popular=7")
    assert len(fits) == 2

    path = tmp_path / "run" / "funnel" / "meta.json"
    written = json.loads(path.read_text())
    written["fit"]["features"] = written["fit"]["features"][:-2]  # a scorer of an older hir's inputs
    path.write_text(json.dumps(written))
    run("funnel.config.popular=7")
    assert len(fits) == 3
    written = json.loads(path.read_text())
    del written["settings_digest"]  # an output written before the digest was recorded
    path.write_text(json.dumps(written))
    run("funnel.config.popular=7")
    assert len(fits) == 4

    graph_meta = tmp_path / "run" / "graph" / "meta.json"
    snapshot = json.loads(graph_meta.read_text())
    snapshot["created"] = "2030-01-01T00:00:00+00:00"  # what a new `hir prepare` rewrites
    graph_meta.write_text(json.dumps(snapshot))
    run("funnel.config.popular=7")
    assert len(fits) == 5
