"""Every defaults table of the README and of every page of the manual (docs/*.md; a table whose
header starts ``| key | default |``) states the composed config's values, so a default changed
in conf/ and not in the documentation fails here.

A row names its keys in backticks in the first cell (a backticked ``data=<name>`` there picks the
dataset it is composed with, completejourney otherwise) and one backticked value per key, in the
same order, in the second cell. Nothing runs: the config is only composed.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from omegaconf import DictConfig, OmegaConf

from hir.stages import ROOT, register_resolvers

README = ROOT / "README.md"
# the README and every page of the manual (mkdocs.yml, docs/)
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
DEFAULT_DATASET = "completejourney"
CODE = re.compile(r"`([^`]*)`")
CELL_SEPARATOR = re.compile(r"(?<!\\)\|")  # `\|` inside a cell is text, not a column


def defaults_rows(text: str) -> list[tuple[int, str, str]]:
    """(line number, key cell, default cell) of every row of every ``| key | default |`` table."""
    rows, in_table = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in CELL_SEPARATOR.split(line.strip().strip("|"))]
        if cells[:2] == ["key", "default"]:
            in_table = True
        elif in_table and not set("".join(cells)) <= set("-: "):
            rows.append((number, cells[0], cells[1]))
    return rows


def _compose(dataset: str, cache: dict[str, DictConfig]) -> DictConfig:
    if dataset not in cache:
        from hydra import compose, initialize_config_dir

        register_resolvers()
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cache[dataset] = compose("config", overrides=[f"data={dataset}"])
    return cache[dataset]


def _composed(cfg: DictConfig, key: str) -> Any:
    node = OmegaConf.select(cfg, key, throw_on_missing=True)
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _matches(stated: str, composed: Any) -> bool:
    # a string default is compared as written (YAML would read 00:00:12:00 as a base-60 number)
    return stated == composed if isinstance(composed, str) else yaml.safe_load(stated) == composed


def stale_rows(text: str, source: str = "README.md") -> list[str]:
    """One message per stated default that the composed config contradicts (or cannot find)."""
    problems: list[str] = []
    cache: dict[str, DictConfig] = {}
    for number, key_cell, default_cell in defaults_rows(text):
        names = CODE.findall(key_cell)
        datasets = [n.removeprefix("data=") for n in names if n.startswith("data=")]
        keys = [n for n in names if not n.startswith("data=")]
        values = CODE.findall(default_cell)
        where = f"{source}:{number}"
        if not keys or len(values) != len(keys):
            problems.append(f"{where}: {len(keys)} backticked key(s) in {key_cell!r} but {len(values)} backticked "
                            f"default(s) in {default_cell!r}; write one `value` per `key`, in order")
            continue
        dataset = datasets[0] if datasets else DEFAULT_DATASET
        cfg = _compose(dataset, cache)
        for key, stated in zip(keys, values, strict=True):
            if OmegaConf.select(cfg, key, default="<absent>") == "<absent>":
                problems.append(f"{where}: {key} is not in the composed config (data={dataset})")
                continue
            composed = _composed(cfg, key)
            if not _matches(stated, composed):
                problems.append(f"{where}: {key} is stated as {stated!r}, the composed config (data={dataset}) has "
                                f"{composed!r}; fix the documented row (or the config)")
    return problems


def test_the_pages_have_defaults_tables() -> None:
    rows = sum(len(defaults_rows(page.read_text())) for page in PAGES)
    assert len(PAGES) > 5, f"the manual has {len(PAGES) - 1} pages under docs/"
    assert rows >= 10, f"the README and docs/ have {rows} rows in `| key | default |` tables; did the header change?"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_defaults_match_the_composed_config(page) -> None:
    problems = stale_rows(page.read_text(), str(page.relative_to(ROOT)))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("row", "expected"), [
    ("| `trainer.max_epochs` | `3` | 1 | x |", "trainer.max_epochs is stated as '3'"),
    ("| `trainer.max_time` | `00:00:10:00` | 1 | x |", "trainer.max_time is stated as '00:00:10:00'"),
    ("| `pipeline.stages` | `[prepare, train]` | x | x |", "pipeline.stages is stated as '[prepare, train]'"),
    ("| `data.adapter.n_users` with `data=synthetic` | `200` | x | x |", "(data=synthetic) has 2000"),
    ("| `model.no_such_key` | `1` | x | x |", "model.no_such_key is not in the composed config"),
    ("| `model.net.depth`, `model.width` | `2` | x | x |", "2 backticked key(s)"),
])
def test_a_stale_row_is_reported(row: str, expected: str) -> None:
    text = f"intro\n\n| key | default | small | what |\n|---|---|---|---|\n| `model.net.depth` | `2` | 1 | x |\n{row}\n"
    problems = stale_rows(text, "doc.md")
    assert len(problems) == 1 and problems[0].startswith("doc.md:6: ") and expected in problems[0], problems


def test_other_tables_are_not_read() -> None:
    assert defaults_rows("| key | value |\n|---|---|\n| `model.net.depth` | `7` |\n") == []
    assert defaults_rows("| key | default |\n|---|---|\n| `a` | `1` |\n\n| `b` | `2` |\n") == [(3, "`a`", "`1`")]
