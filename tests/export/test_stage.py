"""`hir export` on a tiny trained model: the embeddings/ contract, cold start, hierarchy/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.errors import InputError
from hir.export.cold import place_like_export
from hir.export.embed import Embedder, resolve_checkpoint
from hir.export.recorded import exported_checkpoint
from hir.export.stage import run
from tests.export.fixtures import cold_product_inputs
from tests.train.fixtures import TINY_DATA, TINY_MODEL, compose

LEVELS = [2, 4, 8]
EXPECTED = {
    "entity_id": pl.String, "node_id": pl.Int64, "entity_type": pl.String, "embedding": pl.List(pl.Float32),
    "cold_start": pl.Boolean,
    **{c: t for k in range(3) for c, t in ((f"tokens_l{k}", pl.List(pl.Int32)), (f"weights_l{k}", pl.List(pl.Float32)))},
    "model_version": pl.String, "event_timestamp": pl.Datetime("us", "UTC"), "created": pl.Datetime("us", "UTC"),
}


@pytest.fixture(scope="module")
def exported(trained_run: Path) -> tuple[Path, dict]:
    return trained_run, run(compose(trained_run, *TINY_DATA, *TINY_MODEL, stage="export"))


def test_every_entity_has_one_row_with_the_contract_schema(exported):
    out, meta = exported
    graph_meta = json.loads((out / "graph" / "meta.json").read_text())
    assert meta["counts"] == {t: n for t, n in graph_meta["nodes"].items() if n}
    for etype, n in meta["counts"].items():
        df = pl.read_parquet(out / "embeddings" / f"{etype}.parquet")
        assert dict(df.schema) == EXPECTED, etype
        assert df.height == n and df["node_id"].to_list() == list(range(n))
        keys = pl.read_parquet(out / "graph" / "nodes" / f"{etype}.parquet").sort("node_id")["key"].cast(pl.String)
        assert df["entity_id"].to_list() == keys.to_list()
        emb = np.stack(df["embedding"].to_numpy())
        assert emb.shape == (n, 17) and np.isfinite(emb).all()  # spectral rank 16 + the scale slack
        np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
        for k, size in enumerate(LEVELS):
            tokens, weights = np.stack(df[f"tokens_l{k}"].to_numpy()), np.stack(df[f"weights_l{k}"].to_numpy())
            assert tokens.shape == (n, min(2, size)) and ((tokens >= 0) & (tokens < size)).all()
            np.testing.assert_allclose(weights.sum(1), 1.0, atol=1e-5)
        assert df["model_version"].n_unique() == 1 and df["model_version"][0] == meta["model_version"]
        assert (df["entity_type"] == etype).all()


def test_cold_start_entities_are_flagged_and_embedded_from_content(exported):
    out, meta = exported
    products = pl.read_parquet(out / "embeddings" / "product.parquet")
    edges = pl.read_parquet(out / "graph" / "edges" / "user__engages__product.parquet")
    trained_on = set(edges.filter(pl.col("split") == "train")["dst_id"].to_list())
    cold = set(products.filter(pl.col("cold_start"))["node_id"].to_list())
    assert cold == set(range(products.height)) - trained_on
    assert meta["cold_start"]["product"] == len(cold) > 0
    # every product first seen in the test period is among them
    nodes = pl.read_parquet(out / "graph" / "nodes" / "product.parquet")
    test_start = json.loads((out / "graph" / "meta.json").read_text())["split_bounds"]["test_start"]
    late = nodes.filter(pl.col("first_seen") >= pl.lit(test_start).str.to_datetime(time_zone="UTC"))["node_id"]
    assert set(late.to_list()) <= cold


def test_hierarchy_files(exported):
    out, meta = exported
    protos = pl.read_parquet(out / "hierarchy" / "prototypes.parquet")
    assert dict(protos.schema) == {"level": pl.Int8, "proto_id": pl.Int32, "parent_id": pl.Int32,
                                   "vector": pl.List(pl.Float32), "label": pl.String,
                                   "members": pl.List(pl.String), "usage": pl.Float64}
    assert protos.group_by("level").len().sort("level")["len"].to_list() == LEVELS
    assert (protos.filter(pl.col("level") == 0)["parent_id"] == -1).all()
    fine = protos.filter(pl.col("level") == 2)
    assert fine["parent_id"].to_list() == [i // 2 for i in range(8)]
    assert all(label for label in protos["label"].to_list())
    for lvl in range(3):
        assert protos.filter(pl.col("level") == lvl)["usage"].sum() == pytest.approx(1.0)
    sg = json.loads((out / "hierarchy" / "supergraph.json").read_text())
    assert 0 < sg["raw"]["density"] < 1
    assert [lv["prototypes"] for lv in sg["levels"]] == LEVELS
    for lv in sg["levels"]:
        assert lv["density"] == pytest.approx(lv["edges"] / (sg["raw"]["rows"] * lv["prototypes"]))
        assert lv["gain"] == pytest.approx(lv["density"] / sg["raw"]["density"])
    assert set(meta["planted_hierarchy"]["product"]["coarse"]) == {"l0", "l1", "l2"}
    # beside the learned tokens: a plain k-means per level on the exported vectors, same figures
    ref = sg["kmeans_reference"]
    assert [lv["prototypes"] for lv in ref["levels"]] == LEVELS
    engaged = [f.stem.split("__")[-1] for f in (out / "graph" / "edges").glob("user__engages__*.parquet")]
    assert ref["entities"] == sum(meta["counts"][t] for t in engaged)
    for learned, km in zip(sg["levels"], ref["levels"]):
        assert km["concentration"] == pytest.approx(km["edges"] / km["random_edges"]) and 0 < km["concentration"] < 2
        assert set(km["taxonomy_nmi"]) == set(learned["taxonomy_nmi"]) and learned["taxonomy_nmi"]
        assert all(0 <= v <= 1 for v in (*km["taxonomy_nmi"].values(), *learned["taxonomy_nmi"].values()))
        assert set(learned["taxonomy_purity"]) == set(km["taxonomy_purity"]) == set(learned["taxonomy_nmi"])
        assert all(0 < v <= 1 for v in (*km["taxonomy_purity"].values(), *learned["taxonomy_purity"].values()))
    assert sg["hierarchy_fit"] in ("checkpoint", "entities", "coengage", "bottomup")
    # judged on the test period's pairs, beside the k-means reference (hir/export/heldout.py)
    held = sg["heldout"]
    assert held["test_pairs"] > 0 and 0 <= held["raw_coverage"] <= 1
    for name in ("tokens", "kmeans_reference"):
        assert [lv["level"] for lv in held[name]] == [0, 1, 2]
        for lv in held[name]:
            assert 0 < lv["concentration"] < 2 and 0 <= lv["coverage"] <= 1 and lv["log_loss_popularity"] > 0


def test_saved_tokenizer_gives_the_exported_tokens(exported):
    """``hierarchy/tokenizer.pt`` is what the export tokenised with (refresh loads it): an Embedder
    of the exported checkpoint that loads it reproduces the exported tokens."""
    out, meta = exported
    emb = Embedder(exported_checkpoint(meta["checkpoint"], out / "embeddings"), out / "graph", out / "content")
    emb.load_tokenizer(out / "hierarchy" / "tokenizer.pt")
    products = pl.read_parquet(out / "embeddings" / "product.parquet")
    z = np.stack(products["embedding"].to_numpy())
    if meta["token_content"] > 0:  # the default: the tokens read the embedding blended with the text
        from hir.export.content_tokens import blend, store_text

        ids = emb.store.type_range("product")[0] + products["node_id"].to_numpy()
        z = blend(z, lambda rows: store_text(emb.store)(ids[rows]), int(emb.store.layout["text_dim"]),
                  meta["token_content"])
        assert emb.tokenizer.dim == z.shape[1] - 1
    codes, _ = emb.tokens(z)
    for lvl in range(len(LEVELS)):
        assert (codes[lvl] == np.stack(products[f"tokens_l{lvl}"].to_numpy())).all()


def test_tokens_recover_the_planted_hierarchy_well_above_chance(exported):
    """The synthetic data plants product -> fine -> coarse interests. The exported top-1 tokens of
    the finer levels must carry that structure: their NMI with the planted coarse interest is above
    every one of 200 shuffles of the same tokens and 5 standard deviations above their mean (a
    model that learned nothing, or an export that scrambled the rows, sits at the shuffles)."""
    from sklearn.metrics import normalized_mutual_info_score

    out, meta = exported
    truth = pl.read_parquet(out / "graph" / "synthetic_truth.parquet").filter(pl.col("entity_type") == "product")
    rows = pl.read_parquet(out / "embeddings" / "product.parquet").join(
        truth.select(pl.col("key").cast(pl.String).alias("entity_id"), "coarse"), on="entity_id")
    coarse = rows["coarse"].to_numpy()
    rng = np.random.default_rng(0)
    for lvl in (1, 2):
        top1 = np.array([t[int(np.argmax(w))] for t, w in zip(rows[f"tokens_l{lvl}"].to_list(),
                                                                  rows[f"weights_l{lvl}"].to_list())])
        nmi = normalized_mutual_info_score(coarse, top1)
        # the export's own figure is this number
        assert meta["planted_hierarchy"]["product"]["coarse"][f"l{lvl}"] == pytest.approx(nmi)
        chance = np.array([normalized_mutual_info_score(coarse, rng.permutation(top1)) for _ in range(200)])
        assert nmi > chance.max() and nmi > chance.mean() + 5 * chance.std(), (lvl, nmi, chance.mean(), chance.max())


def test_export_is_reused_for_the_same_checkpoint(exported):
    out, meta = exported
    mtime = (out / "embeddings" / "product.parquet").stat().st_mtime
    assert run(compose(out, *TINY_DATA, *TINY_MODEL, stage="export")) == meta
    assert (out / "embeddings" / "product.parquet").stat().st_mtime == mtime


def test_embed_new_matches_the_cold_export(exported):
    """A cold product re-embedded from its content vectors and links (the knowledge view, then
    the content-neighbour placement) lands where export put it."""
    out, _ = exported
    emb = Embedder(out / "checkpoints" / "last.ckpt", out / "graph", out / "content")
    cold, content, links = cold_product_inputs(out, out / "embeddings")
    z = emb.embed_new("product", np.stack(content["text_vec"].to_numpy()), np.stack(content["attr_vec"].to_numpy()),
                      content["has_text"].to_numpy(), links)
    # the export placed its cold products by their content neighbours; a new one goes the same way
    plan = json.loads((out / "embeddings" / "meta.json").read_text())["cold_placement"]
    assert plan["method"] == "content_knn" and plan["placed"]["product"] > 0 and plan["boost"] is not None
    z = place_like_export(out / "embeddings", emb.store, "product", z, np.stack(content["text_vec"].to_numpy()),
                          content["has_text"].to_numpy())
    exported_z = np.stack(cold.sort("node_id")["embedding"].to_numpy())
    assert z.shape == exported_z.shape
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)
    assert (np.sum(z * exported_z, axis=1) > 0.999).all()
    codes, _ = emb.tokens(z)
    assert [c.shape[1] for c in codes] == [2, 2, 2]


def test_best_resolves_beside_train_metrics_in_both_recorded_forms(tmp_path: Path):
    """``export.checkpoint=best``: the checkpoint train_metrics.json names, relative to its own
    dir (as `hir train` records it); an older file's absolute path of where the run was trained
    resolves to the file of that name beside it, and to the recorded path only when none is."""
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "best.ckpt").touch()

    def best(recorded: str | Path) -> Path:
        (ckpts / "train_metrics.json").write_text(json.dumps({"best_checkpoint": str(recorded)}))
        return resolve_checkpoint("best", ckpts)

    assert best("best.ckpt") == ckpts / "best.ckpt"
    # trained in a dir since removed (a git worktree) and moved here
    assert best(tmp_path / "gone" / "checkpoints" / "best.ckpt") == ckpts / "best.ckpt"
    # a copy of a run whose original is still there: its own checkpoint, not the original's
    original = tmp_path / "original" / "checkpoints" / "best.ckpt"
    original.parent.mkdir(parents=True)
    original.touch()
    assert best(original) == ckpts / "best.ckpt"
    # a checkpoint with no file of its name beside the metrics: the recorded path
    elsewhere = tmp_path / "kept" / "chosen.ckpt"
    elsewhere.parent.mkdir()
    elsewhere.touch()
    assert best(elsewhere) == elsewhere
    with pytest.raises(InputError, match=r"records the checkpoint .*gone/checkpoints/init\.ckpt, which does not "
                                         r"exist, and .*run/checkpoints/init\.ckpt does not either"):
        best(tmp_path / "gone" / "checkpoints" / "init.ckpt")


@pytest.mark.parametrize("recorded", ["as train writes it", "absolute, as older trains wrote it"])
def test_a_moved_run_dir_exports_its_own_best_checkpoint(trained_run: Path, tmp_path: Path, recorded: str):
    """A run dir renamed after training (its old path gone, as a removed git worktree's) still
    exports with ``export.checkpoint=best``, from its own checkpoint."""
    trained = tmp_path / "trained"
    trained.mkdir()
    for sub in ("graph", "content"):
        (trained / sub).symlink_to(trained_run / sub)
    shutil.copytree(trained_run / "checkpoints", trained / "checkpoints")
    metrics = trained / "checkpoints" / "train_metrics.json"
    report = json.loads(metrics.read_text())
    name = Path(report["best_checkpoint"]).name
    if recorded.startswith("absolute"):
        metrics.write_text(json.dumps({**report, "best_checkpoint": str(trained / "checkpoints" / name)}))
    moved = tmp_path / "moved"
    trained.rename(moved)
    meta = run(compose(moved, *TINY_DATA, *TINY_MODEL, stage="export"))
    # recorded relative to the export dir: the run dir can move again and still refresh
    assert meta["checkpoint"] == f"../checkpoints/{name}"
    assert exported_checkpoint(meta["checkpoint"], moved / "embeddings") == moved / "checkpoints" / name
    assert pl.read_parquet(moved / "embeddings" / "product.parquet")["model_version"][0] == meta["model_version"]
