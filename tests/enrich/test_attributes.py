from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from hir.enrich.attributes import AttributeEncoder, fit_attributes
from hir.errors import InputError


@pytest.fixture
def frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "key": [f"k{i}" for i in range(8)],
            # price: skewed (one huge value) -> log1p; one missing
            "attr_price": [1.0, 2.0, 2.5, 3.0, 4.0, 5.0, None, 5000.0],
            # level: symmetric -> no log
            "attr_level": [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 2.0, 2.0],
            # brand: b and c tie (2 each) -> order by value; one empty string counts as missing
            "attr_brand": ["a", "a", "a", "c", "c", "b", "b", ""],
            "attr_image": ["x.png"] * 8,  # a path, never an attribute
        }
    )


def test_fit_is_deterministic_and_order_free(frame):
    a = fit_attributes(frame, n_bands=4, top_n=2)
    b = fit_attributes(frame.sample(fraction=1.0, shuffle=True, seed=3), n_bands=4, top_n=2)
    assert a.to_json() == b.to_json()
    np.testing.assert_array_equal(a.transform(frame), b.transform(frame))


def test_column_layout_and_dims(frame):
    enc = fit_attributes(frame, n_bands=4, top_n=2)
    names = [c.name for c in enc.columns]
    assert names == ["attr_brand", "attr_level", "attr_price"]  # sorted, image column excluded
    brand, level, price = enc.columns
    assert brand.values == ["a", "b"]  # top 2: a (3), then b/c tie broken by value
    assert price.log and not level.log
    x = enc.transform(frame)
    assert x.shape == (8, enc.dim) and x.dtype == np.float32
    assert enc.dim == (2 + 2) + (1 + len(level.edges) + 1 + 1) + (1 + len(price.edges) + 1 + 1)
    # brand block: a -> slot 0, c -> other (2), "" -> missing (3)
    assert x[0, :4].tolist() == [1, 0, 0, 0]
    assert x[3, :4].tolist() == [0, 0, 1, 0]
    assert x[7, :4].tolist() == [0, 0, 0, 1]
    # price block: present rows have exactly one band, missing row only the missing slot
    p = x[:, -price.dim :]
    assert p[6].tolist() == [0.0] * (price.dim - 1) + [1.0]
    assert (p[[0, 1, 2, 3, 4, 5, 7], 1:-1].sum(axis=1) == 1).all()
    assert np.abs(p[:, 0]).max() <= price.clip


def test_json_round_trip_reproduces_transform(frame):
    enc = fit_attributes(frame, n_bands=8, top_n=32)
    again = AttributeEncoder.from_json(json.loads(json.dumps(enc.to_json())))
    np.testing.assert_array_equal(enc.transform(frame), again.transform(frame))
    assert again.dim == enc.dim


def test_new_frames_keep_the_fitted_dims(frame):
    enc = fit_attributes(frame, n_bands=4, top_n=2)
    # a later frame: a column missing entirely, a numeric sent as text, an unseen category
    later = pl.DataFrame({"key": ["n1"], "attr_price": ["3.5"], "attr_brand": ["zzz"], "attr_new": [1.0]})
    x = enc.transform(later)
    assert x.shape == (1, enc.dim)
    level = enc.columns[1]
    level_block = x[0, 4 : 4 + level.dim]
    assert level_block[-1] == 1.0 and level_block[:-1].sum() == 0  # missing column -> missing
    assert x[0, :4].tolist() == [0, 0, 1, 0]  # unseen brand -> other


def test_bad_numeric_value_names_the_column(frame):
    enc = fit_attributes(frame)
    with pytest.raises(InputError, match="attr_price"):
        enc.transform(pl.DataFrame({"key": ["n1"], "attr_price": ["cheap"]}))


def test_no_attribute_columns_gives_zero_width(frame):
    enc = fit_attributes(frame.select("key"))
    assert enc.dim == 0 and enc.transform(frame).shape == (8, 0)
