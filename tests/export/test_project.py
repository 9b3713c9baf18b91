"""The served dimension (hir/export/project.py): what the projection keeps, and that export and
`hir refresh` project alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.export.cold import place_like_export
from hir.export.embed import Embedder
from hir.export.project import (
    PROJECTION_FILE,
    Projection,
    fit_basis,
    fit_projection,
    lift,
    load_projection,
    project,
    served_rank,
    token_vectors,
)
from hir.export.recorded import exported_checkpoint
from hir.export.stage import run
from tests.export.fixtures import cold_product_inputs
from tests.train.fixtures import TINY_DATA, TINY_MODEL, compose


def universal(users: np.ndarray, entities: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The network's layout (hir/nn/net.py): users [s, 0], entities [a s, sqrt(1 - a^2)], s unit."""
    s_u = users / np.linalg.norm(users, axis=1, keepdims=True)
    s_e = entities / np.linalg.norm(entities, axis=1, keepdims=True)
    z = np.concatenate([np.concatenate([s_u, np.zeros((len(s_u), 1))], 1),
                        np.concatenate([scale[:, None] * s_e, np.sqrt(1 - scale[:, None] ** 2)], 1)])
    return z.astype(np.float32), np.r_[np.ones(len(s_u), bool), np.zeros(len(s_e), bool)]


def dots(z: np.ndarray, is_user: np.ndarray) -> np.ndarray:
    """(U, E) user·entity dot products, each user's row divided by its norm before the slack (the
    cosine search's score up to a per-user constant)."""
    u = z[is_user, :-1]
    return (u / np.linalg.norm(u, axis=1, keepdims=True)) @ z[~is_user, :-1].T


def test_served_rank_parses_the_config_value():
    assert served_rank(None) is None and served_rank("full") is None and served_rank(128) == 128
    for bad in (0, -3, "big"):
        with pytest.raises(ValueError, match=r"export\.dim"):
            served_rank(bad)


def test_full_dimension_is_the_identity_up_to_rotation():
    """At d = K the basis is a rotation: every dot product, norm and the slack are unchanged; and
    ``fit_projection`` at d >= K or d = null projects nothing (the export is the network's own)."""
    rng = np.random.default_rng(0)
    z, is_user = universal(rng.normal(size=(40, 12)), rng.normal(size=(70, 12)), rng.uniform(0.05, 0.95, 70))
    p, kept = fit_basis(z[is_user, :-1], z[~is_user, :-1], 12)
    np.testing.assert_allclose(p.T @ p, np.eye(12), atol=1e-5)
    out = project(z, p, is_user)
    np.testing.assert_allclose(out @ out.T, z @ z.T, atol=1e-5)
    np.testing.assert_allclose(out[:, -1], z[:, -1], atol=1e-5)
    assert kept == pytest.approx({"captured_user": 1.0, "captured_entity": 1.0}, abs=1e-6)
    warm = np.ones(len(z), bool)
    assert fit_projection(z, is_user, warm, None, "v") is None
    assert fit_projection(z, is_user, warm, 12, "v") is None and fit_projection(z, is_user, warm, 99, "v") is None


def test_projection_keeps_dot_products_better_than_truncation():
    """Users and entities live near a random 4-dim subspace of a 16-dim space, its coordinates
    not the leading ones; a weak isotropic remainder is spread over all 16. Kept to 4 directions,
    the fitted basis loses far less of the user·entity dot products than the first 4 coordinates,
    every row stays unit-norm, and a cosine search over the served rows ranks each user's
    entities by the projected dot product."""
    rng = np.random.default_rng(1)
    k, d = 16, 4
    sub = np.linalg.qr(rng.normal(size=(k, k)))[0][:, k - d:]  # (K, d): no preference for coordinate order
    users = rng.normal(size=(60, d)) @ sub.T + 0.1 * rng.normal(size=(60, k))
    ents = rng.normal(size=(200, d)) @ sub.T + 0.1 * rng.normal(size=(200, k))
    z, is_user = universal(users, ents, rng.uniform(0.1, 0.9, 200))
    true = dots(z, is_user)
    fitted = fit_projection(z, is_user, np.ones(len(z), bool), d, "v")
    served = fitted.apply(z, is_user)
    assert served.shape == (len(z), d + 1)
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)
    # the served user is unit: its projected dot product is P^T s_u · P^T x_e over |P^T s_u|
    raw = {name: (z[is_user, :-1] @ b) @ (z[~is_user, :-1] @ b).T for name, b in
           (("fitted", fitted.basis), ("truncated", np.eye(k, d, dtype=np.float32)))}
    err = {name: float(np.sqrt(np.mean((raw[name] - true) ** 2))) for name in raw}
    assert err["fitted"] < 0.5 * err["truncated"], err
    assert fitted.report["captured_user"] > 0.9 and fitted.report["captured_entity"] > 0.9
    cos = served[is_user] @ served[~is_user].T
    assert (np.argsort(-cos, axis=1)[:, :20] == np.argsort(-raw["fitted"], axis=1)[:, :20]).mean() > 0.999


def test_served_tokenizer_is_the_tree_in_the_served_space():
    """``export.hierarchy_fit=checkpoint`` at a served dimension: the checkpoint's prototypes
    projected. At d = K the projection is a rotation, so every code of every level is the one the
    original tokenizer gives the unprojected direction; at d < K it still yields a valid tree."""
    import torch

    from hir.export.project import served_tokenizer
    from hir.nn import HierarchicalTokenizer

    rng = np.random.default_rng(2)
    torch.manual_seed(0)
    k = 12
    z, is_user = universal(rng.normal(size=(30, k)), rng.normal(size=(90, k)), rng.uniform(0.2, 0.9, 90))
    tok = HierarchicalTokenizer(k, (2, 4, 8), 2, 0.1, 0.2).eval()
    s = z[:, :-1] / np.linalg.norm(z[:, :-1], axis=1, keepdims=True)
    tok.init_from_data(torch.from_numpy(s))
    for d in (k, 5):
        basis, _ = fit_basis(z[is_user, :-1], z[~is_user, :-1], d)
        proj = Projection(basis, "v", {})
        served = served_tokenizer(tok, proj)
        assert served.dim == d and served.levels == tok.levels
        zp = proj.apply(z, is_user)
        sp = zp[:, :-1] / np.linalg.norm(zp[:, :-1], axis=1, keepdims=True)
        with torch.no_grad():
            codes, weights, _ = served(torch.from_numpy(sp))
            ref, _, _ = tok(torch.from_numpy(s))
        for lvl, size in enumerate((2, 4, 8)):
            assert ((codes[lvl] >= 0) & (codes[lvl] < size)).all()
            torch.testing.assert_close(weights[lvl].sum(1), torch.ones(len(z)))
            if d == k:
                assert torch.equal(codes[lvl], ref[lvl]), lvl


def test_lift_keeps_the_served_direction_in_the_rank_space():
    """A served row lifted back to rank K has the same direction inside the served span (P^T of
    the lift is the row), nothing outside it, and the same slack; a width that is not the
    basis's is refused."""
    rng = np.random.default_rng(4)
    z, is_user = universal(rng.normal(size=(10, 12)), rng.normal(size=(40, 12)), rng.uniform(0.2, 0.9, 40))
    basis, _ = fit_basis(z[is_user, :-1], z[~is_user, :-1], 5)
    served = project(z, basis, is_user)
    up = lift(served, basis)
    assert up.shape == (50, 13)
    np.testing.assert_allclose(up[:, :-1] @ basis, served[:, :-1], atol=1e-5)
    outside = up[:, :-1] - (up[:, :-1] @ basis) @ basis.T
    np.testing.assert_allclose(outside, 0.0, atol=1e-5)
    np.testing.assert_array_equal(up[:, -1], served[:, -1])
    with pytest.raises(Exception, match="cannot be lifted"):
        lift(z, basis)


def test_token_vectors_keep_the_rank_vectors_of_rows_placement_left_alone():
    """``export.token_space=full``: rows the placement did not touch read their own rank-K
    vector; a placed row reads its served vector lifted; without a projection the served rows
    are returned as they are."""
    rng = np.random.default_rng(5)
    z, is_user = universal(rng.normal(size=(10, 12)), rng.normal(size=(40, 12)), rng.uniform(0.2, 0.9, 40))
    basis, _ = fit_basis(z[is_user, :-1], z[~is_user, :-1], 5)
    proj = Projection(basis, "v", {})
    projected = proj.apply(z, is_user)
    served = projected.copy()
    served[[3, 20]] = projected[[7, 30]]  # two rows placed elsewhere in the served space
    out = token_vectors(z, projected, served, proj)
    moved = np.zeros(50, bool)
    moved[[3, 20]] = True
    np.testing.assert_array_equal(out[~moved], z[~moved])
    np.testing.assert_allclose(out[moved], lift(served[moved], basis), atol=1e-6)
    assert token_vectors(z, projected, served, None) is served


@pytest.fixture(scope="module")
def served(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model (rank 16) exported three times from one checkpoint: at full rank, at 8
    served directions with the tokens at the full rank (the default) and with the tokens in the
    served space, each into its own embeddings/ and hierarchy/."""
    out = {}
    for name, dim, space in (("full", "null", "full"), ("d8", "8", "full"), ("d8s", "8", "served")):
        d = tmp_path_factory.mktemp(name)
        run(compose(trained_run, *TINY_DATA, *TINY_MODEL, f"export.dim={dim}", f"paths.embeddings_dir={d}/embeddings",
                    f"paths.hierarchy_dir={d}/hierarchy", f"export.token_space={space}",
                    # the collaborative directions alone: the text blend is tested at a served
                    # dimension in tests/export/test_content_tokens.py
                    "export.token_content=0", stage="export"))
        out[name] = d
    return out


def frames(emb_dir: Path) -> dict[str, pl.DataFrame]:
    meta = json.loads((emb_dir / "meta.json").read_text())
    return {t: pl.read_parquet(emb_dir / f"{t}.parquet") for t in meta["counts"]}


def test_export_at_a_served_dimension(served, trained_run):
    """meta.json's dim is the served width (validate and publish read it), every row has it and unit
    norm, the basis is saved beside the export, and the tokenizer and prototypes live in the
    full-rank space (export.token_space=full): the warm rows are the full-rank export's rows
    projected with the saved basis, with the full-rank export's tokens."""
    emb_dir = served["d8"] / "embeddings"
    meta = json.loads((emb_dir / "meta.json").read_text())
    assert meta["dim"] == 9 and meta["export_dim"] == 8 and meta["projection"]["rank"] == 16
    assert meta["token_space"] == "full"
    assert 0 < meta["projection"]["captured_entity"] <= 1 and 0 < meta["projection"]["captured_user"] <= 1
    proj = load_projection(emb_dir, meta, meta["model_version"])
    assert proj.basis.shape == (16, 8)
    full, d8 = frames(served["full"] / "embeddings"), frames(emb_dir)
    assert json.loads((served["full"] / "embeddings" / "meta.json").read_text())["projection"] is None
    assert not (served["full"] / "embeddings" / PROJECTION_FILE).exists()
    for t, frame in d8.items():
        z = np.stack(frame["embedding"].to_numpy())
        assert z.shape == (frame.height, 9)
        np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)
        warm = ~frame["cold_start"].to_numpy()
        z_full = np.stack(full[t]["embedding"].to_numpy())
        np.testing.assert_allclose(proj.apply(z_full[warm], np.full(warm.sum(), t == "user")), z[warm], atol=1e-5)
        for lvl in range(3):
            col = f"tokens_l{lvl}"
            assert (np.stack(d8[t][col].to_numpy())[warm] == np.stack(full[t][col].to_numpy())[warm]).all(), (t, lvl)
    protos = pl.read_parquet(served["d8"] / "hierarchy" / "prototypes.parquet")
    assert set(protos["vector"].list.len().to_list()) == {16}


def test_export_with_tokens_in_the_served_space(served, trained_run):
    """``export.token_space=served``: the tokenizer and prototypes live in the served space, and
    the saved tokenizer gives every exported row its tokens from its served embedding."""
    emb_dir = served["d8s"] / "embeddings"
    meta = json.loads((emb_dir / "meta.json").read_text())
    assert meta["dim"] == 9 and meta["token_space"] == "served"
    protos = pl.read_parquet(served["d8s"] / "hierarchy" / "prototypes.parquet")
    assert set(protos["vector"].list.len().to_list()) == {8}
    d8s = frames(emb_dir)
    emb = Embedder(exported_checkpoint(meta["checkpoint"], emb_dir), trained_run / "graph", trained_run / "content")
    emb.load_tokenizer(served["d8s"] / "hierarchy" / "tokenizer.pt")
    codes, _ = emb.tokens(np.stack(d8s["product"]["embedding"].to_numpy()))
    for lvl in range(3):
        assert (codes[lvl] == np.stack(d8s["product"][f"tokens_l{lvl}"].to_numpy())).all()


@pytest.mark.parametrize("run_name", ["d8", "d8s"])
def test_refresh_projects_a_new_entity_as_export_did(served, trained_run, run_name):
    """A cold product re-embedded from its content and links (the knowledge view at rank 16),
    projected with the basis the export saved and placed as the export placed its cold ones (what
    `hir refresh` does, hir/publish/refresh.py) lands where the served export put it, and its
    tokens come from the saved tokenizer: at the full rank from its placed vector lifted back
    (:func:`token_vectors`), in the served space from the served vector itself."""
    out, emb_dir = trained_run, served[run_name] / "embeddings"
    meta = json.loads((emb_dir / "meta.json").read_text())
    emb = Embedder(exported_checkpoint(meta["checkpoint"], emb_dir), out / "graph", out / "content")
    emb.load_tokenizer(served[run_name] / "hierarchy" / "tokenizer.pt")
    cold, content, links = cold_product_inputs(out, emb_dir)
    text = np.stack(content["text_vec"].to_numpy())
    full = emb.embed_new("product", text, np.stack(content["attr_vec"].to_numpy()), content["has_text"].to_numpy(),
                         links)
    assert full.shape[1] == 17
    proj = load_projection(emb_dir, meta, emb.version)
    projected = proj.apply(full, np.zeros(len(full), bool))
    z = place_like_export(emb_dir, emb.store, "product", projected.copy(), text, content["has_text"].to_numpy())
    exported = np.stack(cold["embedding"].to_numpy())
    assert z.shape == exported.shape == (cold.height, 9)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)
    assert (np.sum(z * exported, axis=1) > 0.999).all()
    assert emb.tokenizer.dim == (16 if meta["token_space"] == "full" else 8)
    codes, _ = emb.tokens(token_vectors(full, projected, z, proj) if meta["token_space"] == "full" else z)
    assert [c.shape[1] for c in codes] == [2, 2, 2]
    assert (codes[0][:, 0] == np.stack(cold["tokens_l0"].to_numpy())[:, 0]).mean() > 0.9


def test_export_is_redone_when_the_served_dimension_changes(served, trained_run):
    """An export of the same checkpoint is reused only at the same ``export.dim``: asked for another
    one, it re-exports (a stale width would otherwise be validated and published). Runs last: it
    rewrites the full-rank export of the fixture."""
    d = served["full"]

    def export(dim: str) -> dict:
        return run(compose(trained_run, *TINY_DATA, *TINY_MODEL, f"export.dim={dim}", "export.token_content=0",
                           f"paths.embeddings_dir={d}/embeddings",
                           f"paths.hierarchy_dir={d}/hierarchy", stage="export"))

    before = json.loads((d / "embeddings" / "meta.json").read_text())
    mtime = (d / "embeddings" / "product.parquet").stat().st_mtime
    assert export("null") == before and (d / "embeddings" / "product.parquet").stat().st_mtime == mtime
    meta = export("8")
    assert meta["dim"] == 9 and meta["export_dim"] == 8 and (d / "embeddings" / PROJECTION_FILE).exists()
    assert len(pl.read_parquet(d / "embeddings" / "product.parquet")["embedding"][0]) == 9
    assert export("full")["dim"] == 17 and not (d / "embeddings" / PROJECTION_FILE).exists()


def test_export_is_redone_when_the_token_space_changes(served, trained_run):
    """At a served dimension an export is reused only with the same ``export.token_space`` (its
    tokens and saved tokenizer depend on it)."""
    d = served["d8s"]

    def export(space: str) -> dict:
        return run(compose(trained_run, *TINY_DATA, *TINY_MODEL, "export.dim=8", f"export.token_space={space}",
                           "export.token_content=0",
                           f"paths.embeddings_dir={d}/embeddings", f"paths.hierarchy_dir={d}/hierarchy",
                           stage="export"))

    mtime = (d / "embeddings" / "product.parquet").stat().st_mtime
    assert export("served")["token_space"] == "served"
    assert (d / "embeddings" / "product.parquet").stat().st_mtime == mtime
    assert export("full")["token_space"] == "full"
    assert (d / "embeddings" / "product.parquet").stat().st_mtime != mtime
    with pytest.raises(Exception, match="token_space"):
        export("neither")


def test_export_dim_auto_serves_the_dimension_chosen_in_training(trained_run: Path, tmp_path: Path):
    """``export.dim=auto`` serves the d the spectral basis beside the checkpoint records (`hir train`
    chose it on val): the full rank for the tiny model (its rank 16 is below every default
    candidate), and 8 directions once the basis records 8."""
    import shutil
    from dataclasses import replace

    from hir.model import SPECTRAL_FILE, SpectralBasis

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for sub in ("graph", "content"):
        (run_dir / sub).symlink_to(trained_run / sub)
    shutil.copytree(trained_run / "checkpoints", run_dir / "checkpoints")
    ckpt = Path(json.loads((run_dir / "checkpoints" / "train_metrics.json").read_text())["best_checkpoint"]).name
    basis = SpectralBasis.load(run_dir / "checkpoints" / SPECTRAL_FILE)
    assert basis.rank == 16 and basis.served_dim == 0

    def export() -> dict:
        return run(compose(run_dir, *TINY_DATA, *TINY_MODEL, "export.dim=auto", "force=true",
                           f"export.checkpoint={run_dir / 'checkpoints' / ckpt}", stage="export"))

    meta = export()
    assert meta["dim"] == 17 and meta["export_dim"] == "auto" and meta["projection"] is None
    replace(basis, served_dim=8).save(run_dir / "checkpoints" / SPECTRAL_FILE)
    meta = export()
    assert meta["dim"] == 9 and meta["export_dim"] == "auto" and meta["projection"]["served"] == 8


def test_lift_in_row_blocks_equals_the_whole_product() -> None:
    """:func:`lift` multiplies a block of rows at a time (no (n, K) product beside its output):
    every row is bit for bit the whole product's, the short remainder joined to the last block."""
    from hir.export.project import row_blocks

    assert row_blocks(10, 4) == [(0, 4), (4, 10)] and row_blocks(8, 4) == [(0, 4), (4, 8)]
    assert row_blocks(3, 4) == [(0, 3)] and row_blocks(0, 4) == []
    rng = np.random.default_rng(5)
    basis = np.linalg.qr(rng.normal(size=(512, 128)))[0].astype(np.float32)
    for n in (40_000, 16_390):
        z = rng.normal(size=(n, 129)).astype(np.float32)
        whole = np.concatenate([z[:, :128] @ basis.T, z[:, 128:]], 1)
        np.testing.assert_array_equal(lift(z, basis), whole)
