"""`hir funnel` on the tiny snapshot, then `hir recommend` (Python and CLI) over its output."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.funnel.fit import FunnelConfig
from hir.funnel.scorer import ScorerConfig
from hir.funnel.serve import SOURCES, Recommender
from hir.funnel.stage import FILES, write_funnel
from hir.publish.recommend import main, open_recommender


@pytest.fixture(scope="module")
def funnel_run(tiny_graph: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("funnel") / "run"
    shutil.copytree(tiny_graph, run / "graph")
    config = FunnelConfig(rank=8, discovery=10, popular=5, max_funnel=20,
                         scorer=ScorerConfig(hidden=[8], steps=30, batch=32, checks=3))
    write_funnel(run / "graph", run / "funnel", ["train", "val"], config, seed=0)
    return run


def test_stage_writes_every_file_with_the_cutoff(funnel_run: Path) -> None:
    for name in FILES:
        assert (funnel_run / "funnel" / name).exists(), name
    meta = json.loads((funnel_run / "funnel" / "meta.json").read_text())
    graph = json.loads((funnel_run / "graph" / "meta.json").read_text())
    assert meta["asof"] == graph["split_bounds"]["test_start"]
    # the default check: the val period's view (its cut the val start), then a refit on the latest views
    fit = meta["fit"]
    assert (fit["select"], fit["refit"]) == ("period", True)
    assert fit["check_view"] == fit["views"][0] and fit["check_view"]["asof"] < graph["split_bounds"]["test_start"]
    rows = pl.read_parquet(funnel_run / "funnel" / "open_funnel.parquet")
    assert rows.height == meta["pairs"] > 0
    # nothing at or after the cut-off is read: every pair's last event is before it
    assert (rows["age_days"] > 0).all()
    assert rows.group_by("user_id").agg((pl.col("pos").sort() == pl.int_range(pl.len())).all())["pos"].all()


def test_recommender_returns_sources_and_reasons(funnel_run: Path) -> None:
    rec = Recommender(funnel_run / "funnel")
    users = np.unique(pl.read_parquet(funnel_run / "funnel" / "open_funnel.parquet")["user_id"].to_numpy())[:5]
    out = rec.recommend(users, k=8)
    assert out.ids.shape == (5, 8) and np.array_equal(out.users, users)
    assert (out.ids >= 0).all(), "the tiny catalogue has enough candidates for k=8"
    for r in range(5):
        assert len(set(out.ids[r].tolist())) == 8, "a user's list repeats an entity"
        assert np.all(np.diff(out.scores[r]) <= 1e-6), "not sorted by score"
    rows = out.as_rows()
    assert {row["source"] for row in rows} <= set(SOURCES) and all(row["why"] for row in rows)
    funnel = [row for row in rows if row["source"] == "funnel"]
    assert funnel and all(("before" in row["why"]) or ("not" in row["why"]) for row in funnel)


def test_cli_by_original_ids(funnel_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = pl.read_parquet(funnel_run / "graph" / "nodes" / "user.parquet").sort("node_id")["key"].cast(pl.String).to_list()
    main([keys[0], keys[1], "--funnel", str(funnel_run / "funnel"), "--discovery", "base", "--k", "3", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert [r["user"] for r in rows] == [keys[0]] * 3 + [keys[1]] * 3
    rec = open_recommender(funnel=funnel_run / "funnel", discovery="base")
    assert rec.recommend_keys([keys[0]], k=3) == rows[:3]
    main([keys[0], "--funnel", str(funnel_run / "funnel"), "--discovery", "base", "--k", "3", "--json", "--with-discovery"])
    both = json.loads(capsys.readouterr().out)
    assert both["recommended"] == rows[:3] and len(both["discovery"][keys[0]]) == 3
    history = pl.read_parquet(funnel_run / "funnel" / "open_funnel.parquet").filter(pl.col("user_id") == 0)
    entity_keys = pl.read_parquet(funnel_run / "graph" / "nodes" / "product.parquet").sort("node_id")["key"].cast(pl.String)
    seen = {entity_keys[e] for e in history["entity_id"].to_list()}
    assert not seen & set(both["discovery"][keys[0]]), "discovery lists an entity the user engaged with"
    with pytest.raises(SystemExit) as err:
        main(["no-such-user", "--funnel", str(funnel_run / "funnel"), "--discovery", "base"])
    assert err.value.code == 2
    assert "unknown user ids" in capsys.readouterr().err


def test_a_scorer_with_the_target_aware_head_is_served(tiny_graph: Path, tmp_path: Path) -> None:
    """The head's scorer round-trips through scorer.pt: the Recommender's scores are the fitted
    model's on the same candidates."""
    shutil.copytree(tiny_graph, tmp_path / "graph")
    config = FunnelConfig(rank=8, discovery=10, popular=5, max_funnel=20, affinity_context=10,
                          scorer=ScorerConfig(hidden=[8], steps=30, batch=32, checks=3, heads=2))
    write_funnel(tmp_path / "graph", tmp_path / "funnel", ["train", "val"], config, seed=0)
    rec = Recommender(tmp_path / "funnel")
    assert rec.scorer.head is not None and rec.config.scorer.heads == 2
    users = np.unique(pl.read_parquet(tmp_path / "funnel" / "open_funnel.parquet")["user_id"].to_numpy())[:4]
    cands = rec.candidates(users)
    assert cands.context is not None
    out = rec.recommend(users, k=5)
    top = np.sort(rec.scorer.score(cands.x, cands.context)[cands.offsets[0]:cands.offsets[1]])[::-1][:5]
    np.testing.assert_allclose(out.scores[0], top, rtol=1e-5)


class Planted:
    """Unpickling this creates the directory ``path``: a stand-in for what a hostile pickle can do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.path),))


def test_the_mlp_scorer_loads_weights_only(funnel_run: Path, tmp_path: Path) -> None:
    """scorer.pt is read with torch.load(weights_only=True): the served MLP loads, and a
    scorer.pt that holds any other object is refused without running its pickle."""
    import torch

    funnel = tmp_path / "funnel"
    shutil.copytree(funnel_run / "funnel", funnel)
    saved = torch.load(funnel / "scorer.pt", weights_only=True)
    assert saved["kind"] == "mlp"
    marker = tmp_path / "ran"
    torch.save(saved | {"extra": Planted(marker)}, funnel / "scorer.pt")
    with pytest.raises(ValueError, match="not loaded: refit"):
        Recommender(funnel)
    assert not marker.exists(), "scorer.pt's pickle ran on load"


def test_a_scorer_fitted_on_other_inputs_is_refused(funnel_run: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """A scorer.pt written before an input was added (here: without the neighbour inputs) is
    refused with the fix, rather than scoring with a shape error."""
    import torch

    funnel = tmp_path / "funnel"
    shutil.copytree(funnel_run / "funnel", funnel)
    saved = torch.load(funnel / "scorer.pt", weights_only=True)
    torch.save(saved | {"features": [f for f in saved["features"] if not f.startswith("nbr_")]}, funnel / "scorer.pt")
    with pytest.raises(ValueError, match=r"new here: \['nbr_share', 'nbr_inv_rank'\]\); refit"):
        Recommender(funnel)
    # the command says so in one line and exits 2, no traceback
    from hir.publish.recommend import main

    shutil.copytree(funnel_run / "graph", tmp_path / "graph")  # the funnel's snapshot, beside it
    with pytest.raises(SystemExit) as stop:
        main(["1", "--funnel", str(funnel), "--discovery", "base"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("hir recommend: ") and "refit it: `hir funnel force=true`" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_served_candidates_read_the_neighbours(tiny_graph: Path, tmp_path: Path) -> None:
    """neighbours > 0 is saved with the scorer, and `hir recommend` computes the neighbours'
    shares from the stored open funnel, as the training views did from theirs."""
    run = tmp_path / "run"
    shutil.copytree(tiny_graph, run / "graph")
    config = FunnelConfig(rank=8, discovery=10, popular=5, max_funnel=20, neighbours=3,
                          scorer=ScorerConfig(hidden=[8], steps=30, batch=32, checks=3))
    write_funnel(run / "graph", run / "funnel", ["train", "val"], config, seed=0)
    rec = Recommender(run / "funnel")
    assert rec.config.neighbours == 3
    users = np.unique(rec.tables.source.filter(pl.col("converted"))["user_id"].to_numpy())
    assert rec.candidates(users).rows["nbr_share"].sum() > 0


@pytest.mark.parametrize("searched", [False, True], ids=["view base", "a discovery search"])
def test_a_request_reads_narrowed_tables_and_gets_the_same_candidates(funnel_run: Path, searched: bool) -> None:
    """Recommender.request_tables: the request's users' rows and its entities only, renumbered;
    every scorer input, row and recommendation equals the whole tables' (bit for bit)."""
    rec = Recommender(funnel_run / "funnel")
    assert rec.narrow
    n_entities = rec.tables.base.entities.shape[0]
    if searched:  # discovery lists with gaps (-1) and entities outside anyone's open funnel
        def search(users: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            rng = np.random.default_rng(int(users.sum()))
            ids = np.stack([rng.choice(n_entities, k, replace=False) for _ in users])
            ids[:, -2:] = -1
            return ids, np.sort(rng.random(ids.shape).astype(np.float32), axis=1)[:, ::-1].copy()
        rec.discovery = search
    users = np.arange(rec.tables.base.users.shape[0])
    for batch in (users[:1], users[3:4], users[::7], users):
        rec.narrow = True
        narrow, narrow_out = rec.candidates(batch), rec.recommend(batch, k=8)
        rec.narrow = False
        whole, whole_out = rec.candidates(batch), rec.recommend(batch, k=8)
        assert narrow.rows.equals(whole.rows) and np.array_equal(narrow.x, whole.x)
        assert np.array_equal(narrow.offsets, whole.offsets) and np.array_equal(narrow.users, whole.users)
        for field in ("ids", "scores", "sources", "discovery"):
            assert np.array_equal(getattr(narrow_out, field), getattr(whole_out, field)), field
        assert narrow_out.why == whole_out.why
