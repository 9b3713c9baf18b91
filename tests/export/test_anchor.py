"""Token ids that survive a retrain (export.hierarchy_anchor, hir/export/anchor.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir.errors import InputError
from hir.export.anchor import anchor_tree, read_anchor
from hir.export.fits import top1_of
from hir.export.hierarchy import refit_tokenizer
from hir.export.stage import run
from hir.nn.hierarchy import HierarchicalTokenizer
from tests.nn.config import tokenizer_kwargs
from tests.train.fixtures import TINY_DATA, TINY_MODEL, compose


def _clusters(rng: np.random.Generator, n: int = 400, dim: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(n, dim) unit directions around 8 centres, two per coarse group, and each point's centre."""
    coarse = rng.normal(size=(4, dim)) * 3
    fine = np.repeat(coarse, 2, axis=0) + rng.normal(size=(8, dim))
    which = rng.integers(0, 8, n)
    x = fine[which] + 0.15 * rng.normal(size=(n, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True), which


def test_an_anchored_refit_keeps_the_token_ids_of_a_moved_space():
    rng = np.random.default_rng(0)
    x, _ = _clusters(rng)
    tok = HierarchicalTokenizer(dim=8, **tokenizer_kwargs(levels=(4, 8), top_k=1))
    first = top1_of(refit_tokenizer(tok, x, seed=0), x)
    # a retrain: every vector rotated (another basis) and nudged (another seed)
    q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    y = x @ q + 0.02 * rng.normal(size=x.shape)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    fresh = top1_of(refit_tokenizer(tok, y, seed=1), y)
    # an independent refit finds the groups but numbers them its own way
    assert (fresh[0] == first[0]).mean() < 0.9
    anchored_tok = refit_tokenizer(tok, y, seed=1)
    kept = anchor_tree(anchored_tok, y, first)
    for lvl in range(2):
        assert (kept[lvl] == first[lvl]).mean() >= 0.95, lvl
    # the tokenizer itself now gives those tokens (what hierarchy/tokenizer.pt and refresh use)
    assert all((a == b).all() for a, b in zip(top1_of(anchored_tok, y), kept))


def test_entities_the_anchor_lacks_take_their_nearest_token():
    rng = np.random.default_rng(1)
    x, _ = _clusters(rng)
    tok = refit_tokenizer(HierarchicalTokenizer(dim=8, **tokenizer_kwargs(levels=(4, 8), top_k=1)), x, seed=0)
    first = top1_of(tok, x)
    partial = [np.where(np.arange(len(x)) % 3 == 0, -1, t) for t in first]  # a third are new
    kept = anchor_tree(tok, x, partial)
    assert (kept[0] == first[0]).mean() >= 0.95


def _table(path: Path, keys: list[str], tokens: list[list[int]]) -> None:
    pl.DataFrame({"entity_id": keys, **{f"tokens_l{lvl}": [[t] for t in tok] for lvl, tok in enumerate(tokens)}},
                 schema_overrides={f"tokens_l{lvl}": pl.List(pl.Int32) for lvl in range(len(tokens))}
                 ).write_parquet(path)


def test_read_anchor_maps_keys_and_names_what_is_wrong(tmp_path):
    _table(tmp_path / "product.parquet", ["b", "a"], [[1, 0], [3, 2]])
    got = read_anchor(tmp_path, {"product": ["a", "b", "new"], "brand": ["x"]}, (2, 4))
    assert [t.tolist() for t in got["product"]] == [[0, 1, -1], [2, 3, -1]]
    assert [t.tolist() for t in got["brand"]] == [[-1], [-1]]
    with pytest.raises(InputError, match="tokens_l2"):
        read_anchor(tmp_path, {"product": ["a"]}, (2, 4, 8))
    with pytest.raises(InputError, match="holds token 2, outside this tree's 2 level-1"):
        read_anchor(tmp_path, {"product": ["a"]}, (1, 2))
    with pytest.raises(InputError, match="no token table"):
        read_anchor(tmp_path / "nowhere", {"product": ["a"]}, (2, 4))


def test_an_export_anchored_on_the_previous_one_keeps_its_tokens(trained_run, tmp_path):
    """Two exports of one run, the second anchored on the first's embeddings/: supergraph.json
    reports the share of tokens kept, and that share is what the two token tables say."""
    out = tmp_path / "run"
    for d in ("graph", "content", "checkpoints"):
        shutil.copytree(trained_run / d, out / d)
    run(compose(out, *TINY_DATA, *TINY_MODEL, stage="export"))
    prev = tmp_path / "previous_embeddings"
    shutil.copytree(out / "embeddings", prev)
    run(compose(out, *TINY_DATA, *TINY_MODEL, "force=true", f"export.hierarchy_anchor={prev}", stage="export"))
    report = json.loads((out / "hierarchy" / "supergraph.json").read_text())["hierarchy_anchor"]
    assert report["path"] == str(prev) and report["anchored"] == report["fitted"] == report["compared"] > 0
    same = total = 0
    for t in load_snapshot(out / "graph").engaged_types():
        f = prev / f"{t}.parquet"
        a = pl.read_parquet(f).filter(~pl.col("cold_start"))
        b = pl.read_parquet(out / "embeddings" / f.name).filter(~pl.col("cold_start"))
        assert a["entity_id"].to_list() == b["entity_id"].to_list()
        same += int((a["tokens_l0"].list.first() == b["tokens_l0"].list.first()).sum())
        total += a.height
    assert total == report["compared"]
    assert report["agreement"][0] == pytest.approx(same / total, abs=1e-4)
    assert report["agreement"][0] >= 0.9
