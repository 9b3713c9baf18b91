"""Beibei, a two-stage purchase funnel (cart -> buy), in the GHCF release (``train.txt.gz``,
``cart.txt.gz``, ``test.txt.gz``).

Each line is ``user item item ...`` (:mod:`hir.data.adapters.item_lists`). ``cart.txt.gz`` holds
the carts (stage ``cart``), ``train.txt.gz`` the purchases (stage ``purchase``, the deep stage),
and ``test.txt.gz`` one held-out purchase per user. Every purchased pair of the train file was
also carted, so such a pair has two events, and its deepest stage (what the spectral base weighs)
is the purchase. There are no timestamps and no item text: the test split is ``test.txt.gz``
exactly as shipped, val is a seeded ``data.split.val_fraction`` of the (user, item) pairs of
the cart and purchase files (both events of a pair land in the same split), and event times are
synthesized (:mod:`hir.data.split`).

Keys stay integers, so node ids equal the release's ids whenever every id occurs (they do). The
files are checked against the README's md5 and pair counts; a mismatch is an error that names
the file. See ../shared/data/ghcf_beibei/README.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from hir.data.adapters.item_lists import read_pairs
from hir.data.raw import Quarantine, RawDataset

ORIGIN = "the GHCF release's file"


def load(
    quarantine: Quarantine,
    train_path: str,
    cart_path: str,
    test_path: str,
    cart_stage: str = "cart",
    buy_stage: str = "purchase",
    md5: Mapping[str, str | None] | None = None,
    pairs: Mapping[str, int | None] | None = None,
) -> RawDataset:
    """Read and check the three files.

    Args:
        train_path: the purchases (``train.txt.gz``), minus the held-out one per user.
        cart_path: the carts (``cart.txt.gz``).
        test_path: one held-out purchase per user (``test.txt.gz``).
        cart_stage, buy_stage: the stage names of the two files' events (shallow, deep).
        md5: ``{train: ..., cart: ..., test: ...}`` expected md5 of each file (null: not checked).
        pairs: ``{train: ..., cart: ..., test: ...}`` expected (user, item) pairs per file
            (null: not checked).
    """
    md5, pairs = md5 or {}, pairs or {}

    def read(key: str, path: str, stage: str) -> pl.LazyFrame:
        return read_pairs(quarantine, "beibei", key, path, stage, md5.get(key), pairs.get(key), ORIGIN)

    events = pl.concat([read("cart", cart_path, cart_stage), read("train", train_path, buy_stage)])
    return RawDataset(
        events=events, heldout=read("test", test_path, buy_stage), stage_order=[cart_stage, buy_stage],
        has_timestamps=False, sources=(f"{cart_path} + {train_path}", str(test_path)),
    )
