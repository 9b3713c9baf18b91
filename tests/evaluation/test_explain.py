"""`hir explain` ("why this?"): the Bag-of-Meaning tokens a user and an entity share, read from the
Feast online store of a published version and labelled from its hierarchy. The shared tokens are
computed from what the store holds (a token changed in the store changes the explanation), the
errors say what is missing, and the serving page's command (docs/serving.md) runs as written."""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import polars as pl
import pytest

from hir.errors import HirError
from hir.publish.explain import explain, shared_tokens
from tests.conftest import ROOT, run_hir
from tests.publish.fixtures import compose_at, export_run

CREATED = datetime(2026, 1, 1, tzinfo=UTC)


def test_shared_tokens_are_the_intersection_weighted_by_both_sides() -> None:
    user = {0: [(3, 0.5), (1, 0.3), (7, 0.2)], 1: [(10, 1.0)]}
    entity = {0: [(7, 0.6), (3, 0.4)], 1: [(11, 1.0)]}
    labels = {0: [f"coarse {i}" for i in range(8)], 1: [f"fine {i}" for i in range(12)]}
    shared, overlap = shared_tokens(user, entity, labels)
    assert [(t.level, t.token, t.label) for t in shared] == [(0, 3, "coarse 3"), (0, 7, "coarse 7")]
    assert [t.weight for t in shared] == pytest.approx([0.5 * 0.4, 0.2 * 0.6])  # by weight, largest first
    assert overlap == pytest.approx({0: 0.2 + 0.12, 1: 0.0})
    # a token with weight 0 on one side (padding) is not shared
    assert shared_tokens({0: [(3, 0.0)]}, {0: [(3, 1.0)]})[0] == []


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A tiny synthetic snapshot, an export with a labelled hierarchy, validated and published."""
    from hir.data import prepare
    from hir.publish import stage as publish
    from hir.validate import stage as validate

    base = tmp_path_factory.mktemp("explain")
    prepare.run(compose_at(base / "prep", stage="prepare"))
    cfg = export_run(base / "prep" / "graph", base / "v1", "v1", created=CREATED)
    meta = json.loads((base / "v1" / "embeddings" / "meta.json").read_text())
    (base / "v1" / "hierarchy").mkdir()
    pl.DataFrame({"level": [lvl for lvl, k in enumerate(meta["levels"]) for _ in range(k)],
                  "proto_id": [i for k in meta["levels"] for i in range(k)],
                  "label": [f"label {lvl}.{i}" for lvl, k in enumerate(meta["levels"]) for i in range(k)]}).with_columns(
        pl.col("level").cast(pl.Int8), pl.col("proto_id").cast(pl.Int32)).write_parquet(
        base / "v1" / "hierarchy" / "prototypes.parquet")
    validate.run(cfg)
    publish.run(cfg)
    emb = {t: pl.read_parquet(base / "v1" / "embeddings" / f"{t}.parquet") for t in ("user", "product")}
    # a pair that shares a coarse token in the export
    user = emb["user"].row(0, named=True)
    product = next(p for p in emb["product"].iter_rows(named=True) if set(p["tokens_l0"]) & set(user["tokens_l0"]))
    return SimpleNamespace(base=base, store=base / "store", user=user, product=product, levels=meta["levels"],
                           manifest=json.loads((base / "v1" / "publish" / "manifest.json").read_text()))


def _expected(user: dict, product: dict, levels: int) -> dict[int, dict[int, float]]:
    """level -> {token: w_user * w_product} from two export rows."""
    out = {}
    for k in range(levels):
        u = dict(zip(user[f"tokens_l{k}"], user[f"weights_l{k}"]))
        p = dict(zip(product[f"tokens_l{k}"], product[f"weights_l{k}"]))
        out[k] = {t: u[t] * p[t] for t in u.keys() & p.keys()}
    return out


def test_explains_a_pair_from_the_live_version(served: SimpleNamespace) -> None:
    ex = explain(served.user["entity_id"], served.product["entity_id"], "product", store_dir=served.store)
    assert ex.version == "v1" and not ex.notes
    expected = _expected(served.user, served.product, len(served.levels))
    for k, tokens in expected.items():
        assert {t.token: t.weight for t in ex.shared if t.level == k} == pytest.approx(tokens)
    assert ex.overlap == pytest.approx({k: sum(v.values()) for k, v in expected.items()})
    assert all(t.label == f"label {t.level}.{t.token}" for t in ex.shared)
    assert len(ex.user_tokens[0]) == len(served.user["tokens_l0"])


def test_shared_tokens_are_computed_from_the_store_not_copied(served: SimpleNamespace) -> None:
    """Rewrite the product's row in the online store: its tokens become exactly the user's coarse
    tokens, then none of them; the explanation follows the store each time."""
    from feast import FeatureStore

    m = served.manifest
    store = FeatureStore(repo_path=m["feast"]["repo_path"])
    view = m["feast"]["feature_views"]["product"]
    row = dict(served.product)

    def write(tokens_l0: list[int], weights_l0: list[float] | None = None) -> None:
        frame = {"product_id": [row["entity_id"]], "embedding": [list(row["embedding"])],
                 "model_version": ["v1"], "event_timestamp": [pd.Timestamp(CREATED)],
                 "created": [pd.Timestamp(datetime.now(UTC))]}
        for k in range(len(served.levels)):
            frame[f"tokens_l{k}"] = [tokens_l0 if k == 0 else list(row[f"tokens_l{k}"])]
            uniform = [1.0 / len(tokens_l0)] * len(tokens_l0)
            frame[f"weights_l{k}"] = [(weights_l0 or uniform) if k == 0 else list(row[f"weights_l{k}"])]
        store.write_to_online_store(view, pd.DataFrame(frame))

    user_l0 = [int(t) for t in served.user["tokens_l0"]]
    try:
        write(user_l0)
        ex = explain(served.user["entity_id"], row["entity_id"], store_dir=served.store)
        assert sorted(t.token for t in ex.shared if t.level == 0) == sorted(user_l0)
        assert ex.overlap[0] == pytest.approx(sum(served.user["weights_l0"]) / len(user_l0))
        others = [t for t in range(served.levels[0]) if t not in user_l0][:len(user_l0)]
        write(others)
        ex = explain(served.user["entity_id"], row["entity_id"], store_dir=served.store)
        assert [t for t in ex.shared if t.level == 0] == [] and ex.overlap[0] == 0.0
    finally:
        write([int(t) for t in row["tokens_l0"]], [float(w) for w in row["weights_l0"]])
    assert explain(served.user["entity_id"], row["entity_id"], store_dir=served.store).overlap[0] == pytest.approx(
        sum(_expected(served.user, served.product, 1)[0].values()))


def test_errors_name_what_is_missing(served: SimpleNamespace, tmp_path: Path) -> None:
    with pytest.raises(HirError, match=r"unknown product id 'no-such-product'.*product_id"):
        explain(served.user["entity_id"], "no-such-product", store_dir=served.store)
    with pytest.raises(HirError, match=r"unknown user id 'nobody'"):
        explain("nobody", served.product["entity_id"], store_dir=served.store)
    with pytest.raises(HirError, match=r"entity type 'campaign_x' is not published.*--type"):
        explain(served.user["entity_id"], served.product["entity_id"], "campaign_x", store_dir=served.store)
    with pytest.raises(HirError, match=r"no serving store at .*run `hir publish`"):
        explain("1", "2", store_dir=tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HirError, match=r"nothing is published in .*run `hir publish`"):
        explain("1", "2", store_dir=tmp_path / "empty")


@pytest.mark.slow  # three fresh `hir` processes (~30 s each on 2 cores); test_explains_a_pair_from_the_live_version is its in-process equivalent
def test_the_readme_command_runs_as_written(served: SimpleNamespace, tmp_path: Path) -> None:
    """The manual's serving page names one `hir explain` command for the default dataset; run
    it with only the ids and the store (`--store`, the default is outputs/serving/completejourney)
    replaced by this store's, in a fresh process. Its exit code and output are what a user gets;
    an unknown id exits 2 with one line."""
    page = (ROOT / "docs" / "serving.md").read_text()
    section = page.split("## Why this? `hir explain`", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^hir explain .*$", section, flags=re.M)
    assert commands, "docs/serving.md's explain section has no `hir explain` command"
    args = shlex.split(commands[0].split("#")[0])[2:]
    assert args[:2] == ["1234", "1082185"]  # completejourney's household and product of docs/serving.md
    user, product = served.user["entity_id"], served.product["entity_id"]
    proc = run_hir("explain", user, product, *args[2:], "--store", str(served.store), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = sorted(_expected(served.user, served.product, 1)[0].items(), key=lambda kv: -kv[1])[0]
    assert f"why product {product} for user {user} (version v1)" in proc.stdout
    assert re.search(rf"token\s+{first[0]}\s+weight {first[1]:.4f}.*label 0\.{first[0]}", proc.stdout), proc.stdout
    as_json = run_hir("explain", user, product, "--json", "--store", str(served.store), cwd=tmp_path)
    body = json.loads(as_json.stdout)
    assert body["overlap"]["0"] == pytest.approx(sum(_expected(served.user, served.product, 1)[0].values()))
    bad = run_hir("explain", user, "no-such-product", "--store", str(served.store), cwd=tmp_path)
    assert bad.returncode == 2 and "unknown product id 'no-such-product'" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert np.isfinite(body["shared"][0]["weight"])
