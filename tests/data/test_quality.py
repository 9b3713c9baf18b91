import gzip
from datetime import UTC, datetime

import polars as pl
import pytest

from hir.data import quality as q
from hir.errors import InputError


def test_parse_timestamp_iso_epoch_and_garbage():
    df = pl.DataFrame(
        {"t": ["2019-10-01 00:00:00 UTC", "2019-10-01T00:00:01Z", "1570000000", "1570000000000", "nope", "2019-10-01"]}
    )
    out = df.select(q.parse_timestamp("t"))["t"].to_list()
    assert out[0] == datetime(2019, 10, 1, tzinfo=UTC)
    assert out[1] == datetime(2019, 10, 1, 0, 0, 1, tzinfo=UTC)
    assert out[2] == datetime.fromtimestamp(1570000000, UTC)
    assert out[3] == datetime.fromtimestamp(1570000000, UTC)  # milliseconds detected
    assert out[4] is None
    assert out[5] == datetime(2019, 10, 1, tzinfo=UTC)


def test_parse_timestamp_explicit_formats():
    df = pl.DataFrame({"t": ["01/02/2020 10:00", "1570000000"]})
    assert df.select(q.parse_timestamp("t", "%d/%m/%Y %H:%M"))["t"][0] == datetime(2020, 2, 1, 10, tzinfo=UTC)
    assert df.select(q.parse_timestamp("t", "epoch_s"))["t"].to_list()[0] is None


def test_with_reason_first_failing_check_wins_and_keeps_prior_reason():
    df = pl.DataFrame({"a": [1, -1, None, 5]})
    out = q.with_reason(df, [("missing", pl.col("a").is_null()), ("negative", pl.col("a") < 0)])
    assert out["_reason"].to_list() == [None, "negative", "missing", None]
    again = q.with_reason(out, [("big", pl.col("a") > 2), ("negative2", pl.col("a") < 0)])
    assert again["_reason"].to_list() == [None, "negative", "missing", "big"]


def test_duplicated_marks_only_later_copies():
    df = pl.DataFrame({"a": [1, 1, 2, 1], "b": ["x", "x", "x", "y"]})
    assert df.select(q.duplicated(["a", "b"]))["a"].to_list() == [False, True, False, False]


def test_bad_float_flags_nan_inf_and_text_but_not_empty():
    df = pl.DataFrame({"v": ["1.5", "nan", "inf", "abc", "", None, "-2"]})
    assert df.select(q.bad_float("v"))["v"].to_list() == [False, True, True, True, False, False, False]


def test_non_utf8_bytes_are_detected(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_bytes(b"a,b\n1,caf\xe9\n2,ok\n")
    df = q.read_csv_strings(p, ["a", "b"], "test")
    assert df.select(q.non_utf8(["b"]))["b"].to_list() == [True, False]
    assert df["_row"].to_list() == [1, 2]


def test_truncated_gzip_is_a_clear_error(tmp_path):
    data = gzip.compress(b"a,b\n" + b"1,2\n" * 50000)
    p = tmp_path / "cut.csv.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated or corrupt gzip"):
        q.read_csv_strings(p, ["a"], "test")


@pytest.mark.parametrize(
    ("content", "match"),
    [(b"", "is empty"), (b"a,b\n", "no data rows"), (b"x,y\n1,2\n", "has no column 'a'")],
)
def test_structural_problems_name_the_file_and_fix(tmp_path, content, match):
    p = tmp_path / "in.csv"
    p.write_bytes(content)
    with pytest.raises(InputError, match=match) as err:
        q.read_csv_strings(p, ["a"], "test")
    assert str(p) in str(err.value)


def test_missing_file_names_the_config_key(tmp_path):
    with pytest.raises(InputError, match=r"data\.path"):
        q.check_file(tmp_path / "nope.csv", "test")
