"""The synthetic generator (determinism, planted hierarchy, funnel, cold start) and its adapter."""

import itertools
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.prepare import run
from hir.data.synthetic import dataset
from hir.data.synthetic.dataset import ensure, generate
from hir.data.synthetic.events import DIRTY_KINDS, funnel_counts
from hir.data.synthetic.spec import STAGES, SyntheticSpec
from hir.data.synthetic.world import Sampler, _alias
from hir.errors import HirError
from tests.conftest import run_hir

TINY = {"n_events": 6000, "n_users": 200, "n_products": 300, "n_advertisers": 20, "n_campaigns": 30}
TINY_OVERRIDES = [f"data.adapter.{k}={v}" for k, v in TINY.items()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synthetic") / "data"
    return out, generate(SyntheticSpec(**TINY), out)


def _events(root: Path) -> pl.DataFrame:
    return pl.read_parquet(root / "events.parquet")


def test_same_seed_same_bytes_other_seed_differs(tmp_path, tiny):
    root, _ = tiny
    again = tmp_path / "again"
    generate(SyntheticSpec(**TINY), again)
    names = sorted(p.name for p in root.glob("*.parquet"))
    assert "events.parquet" in names and len(names) == 10
    for name in names:
        assert (root / name).read_bytes() == (again / name).read_bytes(), name
    other = tmp_path / "other"
    generate(SyntheticSpec(**{**TINY, "seed": 8}), other)
    assert (root / "events.parquet").read_bytes() != (other / "events.parquet").read_bytes()
    assert not _events(root).equals(_events(other))


def test_exact_sizes_and_chunked_stream(tmp_path, monkeypatch):
    # several chunks plus a remainder: the row count is exact and chunks are row groups
    monkeypatch.setattr(dataset, "CHUNK_EVENTS", 2500)
    manifest = generate(SyntheticSpec(**TINY), tmp_path)
    ev = _events(tmp_path)
    assert ev.height == TINY["n_events"] == sum(manifest["stages"].values())
    import pyarrow.parquet as pq

    assert pq.ParquetFile(tmp_path / "events.parquet").num_row_groups == 3


def test_planted_hierarchy_is_consistent(tiny):
    root, manifest = tiny
    spec = manifest["spec"]
    truth = pl.read_parquet(root / "truth.parquet")
    products = truth.filter(pl.col("entity_type") == "product")
    # each product one fine interest, each fine interest one coarse parent
    assert products.height == spec["n_products"] == products["key"].n_unique()
    assert products["fine"].null_count() == 0
    parents = products.group_by("fine").agg(pl.col("coarse").n_unique().alias("n"), pl.col("coarse").first())
    assert parents["n"].max() == 1
    assert (parents["fine"] // spec["n_fine"] == parents["coarse"]).all()
    assert products["fine"].n_unique() == spec["n_coarse"] * spec["n_fine"]  # every interest populated
    interests = pl.read_parquet(root / "interests.parquet")
    assert interests.height == spec["n_coarse"] * spec["n_fine"]
    # the category taxonomy mirrors the hierarchy: fine category -> its coarse category
    cats = pl.read_parquet(root / "categories.parquet")
    fine_cats = cats.filter(pl.col("parent").is_not_null())
    assert ((fine_cats["key"] - spec["n_coarse"]) // spec["n_fine"] == fine_cats["parent"]).all()
    prod = pl.read_parquet(root / "products.parquet").join(
        products.select(pl.col("key").cast(pl.Int64), "fine"), on="key"
    )
    filed_right = (prod["category"] - spec["n_coarse"] == prod["fine"]).mean()
    assert 1 - spec["category_noise"] - 0.05 < filed_right < 1
    # text carries the interest: every title names its fine interest
    names = prod.join(interests.select("fine", "fine_name"), on="fine")
    assert all(f in t for t, f in names.select("text", "fine_name").iter_rows())
    # users engage mostly inside their own interests (noise 0.1)
    mix = pl.read_parquet(root / "user_interests.parquet")
    assert np.allclose(mix.group_by("key").agg(pl.col("weight").sum())["weight"].to_numpy(), 1.0)
    ev = _events(root).filter(pl.col("entity_type") == "product", pl.col("stage") == "exposure")
    ev = ev.join(prod.select(pl.col("key").alias("entity_id"), "fine"), on="entity_id")
    mix = mix.select(pl.col("key").cast(pl.Int64).alias("user_id"), pl.col("fine").cast(pl.Int64))
    inside = ev.join(mix, on=["user_id", "fine"], how="semi").height
    assert inside / ev.height > 1 - spec["noise"] - 0.05


def test_funnel_is_monotone_and_nested(tiny):
    root, manifest = tiny
    counts = [manifest["stages"][s] for s in STAGES]
    assert all(a >= b > 0 for a, b in itertools.pairwise(counts))
    ev = _events(root)
    assert ev.group_by("stage").len().sort("stage").rows() == sorted(manifest["stages"].items())
    products = ev.filter(pl.col("entity_type") == "product")
    for shallow, deep in itertools.pairwise(STAGES):
        a = products.filter(pl.col("stage") == shallow).group_by("user_id", "entity_id").agg(pl.col("timestamp").min())
        b = products.filter(pl.col("stage") == deep).group_by("user_id", "entity_id").agg(pl.col("timestamp").min())
        both = b.join(a, on=["user_id", "entity_id"], how="left", suffix="_before")
        # every deeper (user, product) pair went through the shallower stage, no later than it
        assert both["timestamp_before"].null_count() == 0, (shallow, deep)
        assert (both["timestamp_before"] <= both["timestamp"]).all()
    purchases = products.filter(pl.col("stage") == "purchase")
    assert (purchases["value"] > 0).all() and (products.filter(pl.col("stage") != "purchase")["value"] == 0).all()
    campaign = ev.filter(pl.col("entity_type") == "campaign")
    assert set(campaign["stage"].unique()) == {"exposure", "click"}


def test_late_entities_appear_only_in_the_late_window(tiny):
    root, manifest = tiny
    assert all(n > 0 for n in manifest["late"].values()), manifest["late"]
    start, end = manifest["period"]["start"], manifest["period"]["end"]
    late_start = end - int(manifest["spec"]["late_window"] * (end - start))
    truth = pl.read_parquet(root / "truth.parquet").filter("late")
    ev = _events(root).with_columns(pl.col("timestamp").dt.epoch("us").alias("us"))
    for etype, col in (("product", "entity_id"), ("campaign", "entity_id"), ("user", "user_id")):
        late = truth.filter(pl.col("entity_type") == etype)["key"].cast(pl.Int64)
        rows = ev.filter(pl.col(col).is_in(late.implode()))
        if etype != "user":
            rows = rows.filter(pl.col("entity_type") == etype)
        assert rows.height > 0 and rows["us"].min() >= late_start, etype


def test_alias_sampler_is_exact_and_empty_groups_fall_back():
    rng = np.random.default_rng(0)
    for w in (rng.lognormal(0, 2, 97), (np.arange(50) + 1.0) ** -1.1, np.ones(4), np.array([5.0])):
        prob, alias = _alias(w * len(w) / w.sum())
        implied = prob / len(w)
        np.add.at(implied, alias, (1 - prob) / len(w))
        assert np.allclose(implied, w / w.sum(), atol=1e-12)
    s = Sampler.build(np.array([1.0, 3.0, 1.0, 1.0]), np.array([0, 0, 2, 2]), n_groups=3)
    draws = s.sample(rng.random(40_000), np.repeat([0, 1, 2], [20_000, 10_000, 10_000]))
    assert set(draws[:20_000]) == {0, 1} and abs((draws[:20_000] == 1).mean() - 0.75) < 0.02
    assert set(draws[20_000:30_000]) == {0, 1, 2, 3}  # group 1 is empty: draws come from all items
    assert set(draws[30_000:]) == {2, 3}


def test_funnel_counts_exact():
    for n in (1, 7, 1000, 123_457):
        c = funnel_counts(n, [0.4, 0.25, 0.3, 0.5])
        assert sum(c) == n and all(a >= b for a, b in itertools.pairwise(c))


def test_bad_parameters_are_one_clear_error(tmp_path):
    with pytest.raises(HirError, match="n_products=10 must be >= n_coarse"):
        SyntheticSpec(n_products=10)
    with pytest.raises(HirError, match="conversion has stages"):
        SyntheticSpec(conversion={"view": 0.5})
    from hir.data.adapters.synthetic import load
    from hir.data.raw import Quarantine

    with pytest.raises(HirError, match=r"unknown parameter\(s\) \['n_user'\]"):
        load(Quarantine(tmp_path / "q"), cache_dir=str(tmp_path), n_user=5)


def test_cache_is_keyed_by_parameters_and_reused(tmp_path):
    a = ensure(SyntheticSpec(**TINY), tmp_path)
    mtime = (a / "events.parquet").stat().st_mtime_ns
    assert ensure(SyntheticSpec(**TINY), tmp_path) == a
    assert (a / "events.parquet").stat().st_mtime_ns == mtime
    b = ensure(SyntheticSpec(**{**TINY, "n_events": 5000}), tmp_path)
    assert b != a and b.parent == a.parent == tmp_path
    assert not list(tmp_path.glob("*.tmp-*"))
    # YAML hands over 90 where the default is 90.0: one dataset, one key
    assert SyntheticSpec(days=90, noise="0.1").cache_key() == SyntheticSpec().cache_key()


def test_prepare_snapshot_reconciles_with_the_generator(compose):
    cfg = compose("data=synthetic", *TINY_OVERRIDES, stage="prepare")
    meta = run(cfg)
    graph = Path(cfg.paths.graph_dir)
    manifest = json.loads(next(Path(cfg.data.adapter.cache_dir).glob("*/manifest.json")).read_text())
    assert meta["input_rows"] == meta["kept_rows"] + meta["quarantined_rows"] == TINY["n_events"]
    assert meta["quarantined_rows"] == 0 and meta["events"] == TINY["n_events"]
    assert meta["nodes"] == manifest["entities"]
    assert meta["stages"] == manifest["stages"] and meta["stage_order"] == list(STAGES)
    assert meta["category_levels"] == 2 and meta["cold_start"]["product"] > 0
    for etype, n in meta["nodes"].items():
        nodes = pl.read_parquet(graph / "nodes" / f"{etype}.parquet")
        assert nodes.height == n and nodes["node_id"].to_list() == list(range(n))
    assert set(meta["edges"]) >= {
        "user__engages__product", "user__engages__campaign", "product__in_category__category",
        "category__child_of__category", "product__by_advertiser__advertiser", "campaign__promotes__product",
        "campaign__by_advertiser__advertiser",
    }
    assert meta["edges"]["product__in_category__category"] == TINY["n_products"]
    # the ground truth travels with the snapshot and joins to the node keys
    truth = pl.read_parquet(graph / "synthetic_truth.parquet")
    products = pl.read_parquet(graph / "nodes" / "product.parquet").join(
        truth.filter(pl.col("entity_type") == "product"), on="key"
    )
    assert products.height == TINY["n_products"] and products["text"].null_count() == 0


def test_bad_rows_are_quarantined_with_their_reason(compose):
    cfg = compose("data=synthetic", *TINY_OVERRIDES, "data.adapter.dirty_rows=16", stage="prepare")
    meta = run(cfg)
    manifest = json.loads(next(Path(cfg.data.adapter.cache_dir).glob("*/manifest.json")).read_text())
    assert manifest["dirty_rows"] == {k: 2 for k in DIRTY_KINDS}
    assert meta["input_rows"] == TINY["n_events"] + 16
    assert (meta["kept_rows"], meta["quarantined_rows"]) == (TINY["n_events"], 16)
    assert meta["sources"]["events"]["quarantine"] == manifest["dirty_rows"]
    bad = pl.read_parquet(Path(cfg.paths.graph_dir) / "quarantine" / "events.parquet")
    assert bad.height == 16 and set(bad["_reason"]) == set(DIRTY_KINDS)
    assert bad["_row"].min() > TINY["n_events"]  # the injected rows, never their originals


def test_cli_prepare_synthetic(tmp_path):
    out = run_hir(
        "prepare", "data=synthetic", *TINY_OVERRIDES, f"paths.cache_dir={tmp_path}/cache",
        f"hydra.run.dir={tmp_path}/run", cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    meta = json.loads((tmp_path / "run" / "graph" / "meta.json").read_text())
    assert meta["dataset"] == "synthetic" and meta["events"] == TINY["n_events"]
