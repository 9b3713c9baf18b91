"""The manual's strict build fails on a broken link or anchor: the Makefile's ``docs-build``
command is run, as written there, on a copy of mkdocs.yml and docs/ into which a broken link is
planted. (A flag that silences warnings, e.g. ``--quiet``, also keeps ``--strict`` from counting
them: the build then passes whatever the links say, and these tests fail.)"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hir.stages import ROOT


def docs_build_command() -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the Makefile's ``docs-build`` recipe: its one mkdocs line, with
    ``$(VENV)/bin/mkdocs`` run as this interpreter's ``-m mkdocs`` (a worktree's venv may not
    have the script), and the Makefile's exported variables."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^docs-build:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert recipe, "the Makefile has no docs-build target with a recipe"
    lines = [line.strip() for line in recipe.group(1).splitlines() if "mkdocs" in line]
    assert len(lines) == 1, f"expected one mkdocs line in docs-build, found {lines}"
    argv = shlex.split(lines[0])
    assert argv[0] == "$(VENV)/bin/mkdocs", f"docs-build runs {argv[0]!r}; this test runs $(VENV)/bin/mkdocs"
    env = dict(os.environ) | dict(re.findall(r"^export\s+(\w+)\s*:?=\s*(\S*)\s*$", makefile, flags=re.M))
    return [sys.executable, "-m", "mkdocs", *argv[1:]], env


@pytest.fixture
def manual(tmp_path: Path) -> Path:
    """A copy of mkdocs.yml and docs/ (built into its own site/)."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def build(root: Path) -> subprocess.CompletedProcess[str]:
    argv, env = docs_build_command()
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_manual_builds_strict(manual: Path) -> None:
    res = build(manual)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (manual / "site" / "index.html").exists()


@pytest.mark.parametrize(("link", "reported"), [
    ("operations.md#no-such-anchor", "does not contain an anchor '#no-such-anchor'"),
    ("#no-such-heading", "no-such-heading"),
    ("no-such-page.md", "no-such-page.md"),
])
def test_a_broken_link_fails_the_build(manual: Path, link: str, reported: str) -> None:
    page = manual / "docs" / "datasets.md"
    page.write_text(page.read_text() + f"\nSee [this]({link}).\n")
    res = build(manual)
    out = res.stdout + res.stderr
    assert res.returncode != 0, f"the strict build passed with a broken link {link!r}:\n{out}"
    assert reported in out and "datasets.md" in out, out
