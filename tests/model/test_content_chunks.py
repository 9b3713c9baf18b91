"""load_content streams each content file a block of rows at a time: the rows and the layout are the
same whatever the block and equal each whole file converted at once, and bad input still names the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir.errors import InputError
from hir.model import content
from hir.model.content import content_rows, load_content
from hir.model.store import ENTITY_TYPES
from tests.train.fixtures import tiny_snapshot


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("content_chunks"))


def test_rows_are_the_same_whatever_the_block(tiny_run: Path, tmp_path: Path) -> None:
    counts = load_snapshot(tiny_run / "graph").node_counts
    whole, layout = load_content(tiny_run / "content", ENTITY_TYPES, counts, chunk_rows=1 << 30)
    for rows in (1, 7, 64):
        got, got_layout = load_content(tiny_run / "content", ENTITY_TYPES, counts, chunk_rows=rows)
        assert got_layout == layout and got.dtype == whole.dtype and np.array_equal(got, whole), rows
    # a file's rows in another order land on the same nodes (the ids, not the order, place them)
    shuffled = tmp_path / "content"
    shuffled.mkdir()
    for f in (tiny_run / "content").glob("*.parquet"):
        pl.read_parquet(f).sample(fraction=1.0, shuffle=True, seed=0).write_parquet(shuffled / f.name)
    for json_file in (tiny_run / "content").glob("*.json"):
        (shuffled / json_file.name).write_text(json_file.read_text())
    got, _ = load_content(shuffled, ENTITY_TYPES, counts, chunk_rows=5)
    assert np.array_equal(got, whole)
    # an id outside the snapshot names the file, in whichever block it sits
    t = next(t for t in ENTITY_TYPES if (shuffled / f"{t}.parquet").exists() and counts.get(t, 0) > 6)
    df = pl.read_parquet(shuffled / f"{t}.parquet")
    df.with_columns(pl.when(pl.int_range(pl.len()) == df.height - 1).then(counts[t] + 5).otherwise(pl.col("node_id"))
                    .cast(df["node_id"].dtype).alias("node_id")).write_parquet(shuffled / f"{t}.parquet")
    with pytest.raises(InputError, match=f"{t}.parquet: node_id outside"):
        load_content(shuffled, ENTITY_TYPES, counts, chunk_rows=3)


def test_an_empty_content_file_gives_zero_rows(tiny_run: Path, tmp_path: Path) -> None:
    counts = load_snapshot(tiny_run / "graph").node_counts
    whole, _ = load_content(tiny_run / "content", ENTITY_TYPES, counts)
    copy = tmp_path / "content"
    copy.mkdir()
    files = sorted((tiny_run / "content").glob("*.parquet"))
    for f in files:
        (copy / f.name).write_bytes(f.read_bytes())
    t = next(t for t in ENTITY_TYPES if (copy / f"{t}.parquet").exists() and counts.get(t, 0) > 0)
    pl.read_parquet(copy / f"{t}.parquet").head(0).write_parquet(copy / f"{t}.parquet")
    got, _ = load_content(copy, ENTITY_TYPES, counts, chunk_rows=4)
    lo = sum(counts.get(x, 0) for x in ENTITY_TYPES[:ENTITY_TYPES.index(t)])
    assert not got[lo:lo + counts[t]].any()
    others = np.ones(len(got), bool)
    others[lo:lo + counts[t]] = False
    assert np.array_equal(got[others][:, :whole.shape[1]], whole[others][:, :got.shape[1]])


def test_streamed_rows_equal_each_whole_file_converted_at_once(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = load_snapshot(tiny_run / "graph").node_counts
    blocks: list[int] = []

    def recording(*args: Any) -> np.ndarray:
        blocks.append(len(args[4]))  # has_text
        return content_rows(*args)

    monkeypatch.setattr(content, "content_rows", recording)
    got, layout = load_content(tiny_run / "content", ENTITY_TYPES, counts, chunk_rows=3)
    # every file went through in blocks of at most 3 rows (what streaming holds is measured in docs/scale.md)
    assert max(blocks) <= 3 and len(blocks) > len(ENTITY_TYPES), blocks
    want = np.zeros_like(got)
    lo = 0
    for t in ENTITY_TYPES:
        path = tiny_run / "content" / f"{t}.parquet"
        if counts.get(t, 0) and path.exists():
            df = pl.read_parquet(path)

            def vectors(col: str, df: pl.DataFrame = df) -> np.ndarray | None:
                return np.array(df[col].to_list(), np.float32) if col in df.columns else None

            want[lo + df["node_id"].to_numpy()] = content_rows(layout, t, vectors("text_vec"), vectors("attr_vec"),
                                                              df["has_text"].to_numpy(), vectors("image_vec"))
        lo += counts.get(t, 0)
    assert got.dtype == np.float16 and np.array_equal(got, want)
