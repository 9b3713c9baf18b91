"""Gowalla check-ins in the LightGCN benchmark split (``train.txt``, ``test.txt``).

Each line is ``user item item ...`` (:mod:`hir.data.adapters.item_lists`); every (user, item)
pair is one event of the single stage ``checkin`` (the deep stage: retrieval and the contrastive
objective target it). There are no timestamps: ``test.txt`` is the test split exactly as shipped,
val is a seeded ``data.split.val_fraction`` of the ``train.txt`` pairs, and event times are
synthesized (:mod:`hir.data.split`).

Keys stay integers, so node ids equal the benchmark's ids whenever every id occurs (it does on
the published files). The files are checked against the README's md5 and pair counts; a
mismatch is an error that names the file. See ../shared/data/gowalla_lightgcn/README.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from hir.data.adapters.item_lists import read_pairs
from hir.data.raw import Quarantine, RawDataset

ORIGIN = "the LightGCN benchmark file"


def load(
    quarantine: Quarantine,
    train_path: str,
    test_path: str,
    stage: str = "checkin",
    md5: Mapping[str, str | None] | None = None,
    pairs: Mapping[str, int | None] | None = None,
) -> RawDataset:
    """Read and check both files.

    Args:
        train_path, test_path: the benchmark's ``train.txt`` and ``test.txt``.
        stage: the name of the one engagement stage.
        md5: ``{train: ..., test: ...}`` expected md5 of each file (null: not checked).
        pairs: ``{train: ..., test: ...}`` expected (user, item) tokens per file (null: not checked).
    """
    md5, pairs = md5 or {}, pairs or {}
    train, test = (
        read_pairs(quarantine, "gowalla", key, path, stage, md5.get(key), pairs.get(key), ORIGIN)
        for key, path in (("train", train_path), ("test", test_path))
    )
    return RawDataset(
        events=train, heldout=test, stage_order=[stage], has_timestamps=False,
        sources=(str(train_path), str(test_path)),
    )
