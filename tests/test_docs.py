"""Every shell command shown in the README and on the manual's pages (docs/*.md, ```bash blocks)
is checked here, so a renamed key, stage, target or script fails the suite instead of a reader:

- ``hir <stage> overrides...`` (and ``hir pipeline``): the overrides are composed with the real
  config (conf/), as Hydra would compose the run; a sweep (``a,b``, ``choice(...)``) is composed
  with its first value. Nothing runs, so a command that needs a server is composed too.
- ``hir <tool> ...`` (gather, promote, explain): the tool exists and every ``--flag`` is one it defines.
- ``make <target>``: the Makefile has the target.
- ``python <script> --flag ...``: the script exists and defines every flag.
- ``pip install 'hir[extra]'``: pyproject.toml has the extra.
- anything else carries a ``# needs a server`` comment (a command this suite cannot run), else it fails.

The commands that run end to end are run by the tests of their stage (the README's serving code
by tests/publish/test_publish.py, `hir explain` by tests/evaluation/test_explain.py, the optuna
sweep and the pipeline by the slow tests).
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hir.stages import HELPERS, ROOT, STAGES, register_resolvers

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", flags=re.S | re.M)
SERVER_MARK = re.compile(r"#\s*needs a server\b")
# Hydra's own flags and those that take a value (hir.stages.hydra_argv puts them first)
HYDRA_FLAGS = {"-m", "--multirun", "--help", "-h", "--hydra-help", "--resolve", "--info"}
HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                     "--config-dir", "-cd", "--experimental-rerun"}


def shell_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every command in the ```bash blocks of ``text``; a line ending in
    ``\\`` continues on the next, blank lines and whole-line comments are skipped."""
    out: list[tuple[int, str]] = []
    for block in BLOCK.finditer(text):
        first = text[: block.start(1)].count("\n") + 1
        pending, start = "", 0
        for offset, line in enumerate(block.group(1).splitlines()):
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if not pending:
                start = first + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            out.append((start, pending + line))
            pending = ""
    return out


def all_commands() -> list[tuple[str, str]]:
    return [(f"{page.relative_to(ROOT)}:{n}", cmd) for page in PAGES for n, cmd in shell_commands(page.read_text())]


def _first_of_sweep(override: str) -> str:
    """``key=a,b`` or ``key=choice(a,b)`` -> ``key=a`` (the sweep's first cell); other overrides as they are."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_override(override)
    if not parsed.is_sweep_override():
        return override
    prefix = {"ADD": "+", "FORCE_ADD": "++"}.get(parsed.type.name, "")
    return f"{prefix}{parsed.get_key_element()}={next(parsed.sweep_string_iterator())}"


def hydra_overrides(args: list[str]) -> list[str]:
    """The overrides of a stage's command line, Hydra's flags (and their values) left out."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in HYDRA_VALUE_FLAGS:
            skip = True
        elif arg not in HYDRA_FLAGS:
            out.append(arg)
    return out


def compose_overrides(overrides: list[str]) -> None:
    """Compose the real config with ``overrides`` (raises what Hydra raises)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_resolvers()
    if GlobalHydra.instance().is_initialized():  # inside composing(): one initialisation for many commands
        compose("config", overrides=overrides)
        return
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        compose("config", overrides=overrides)


@contextmanager
def composing() -> Iterator[None]:
    """Hydra initialised once for the commands checked inside (composing is then ~10x faster)."""
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield


def check_hir(args: list[str]) -> str | None:
    """None when ``hir <args>`` names a stage or tool and its overrides compose; else the problem."""
    if not args or args[0] in ("--help", "-h", "help"):
        return None
    stage, rest = args[0], args[1:]
    if stage in HELPERS:
        source = Path(__import__(HELPERS[stage][0], fromlist=["_"]).__file__).read_text()
        unknown = [a.split("=")[0] for a in rest if a.startswith("--") and f'"{a.split("=")[0]}"' not in source]
        return f"hir {stage} has no flag(s) {unknown}" if unknown else None
    if stage not in STAGES and stage != "pipeline":
        return f"hir has no stage or tool {stage!r} (stages {sorted(STAGES)}, tools {sorted(HELPERS)})"
    overrides = [_first_of_sweep(o) for o in hydra_overrides(rest)]
    try:
        compose_overrides([f"stage={stage}", *overrides])
    except Exception as err:  # any composition error is the finding
        return f"the overrides {overrides} do not compose: {type(err).__name__}: {str(err).splitlines()[0]}"
    return None


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_.-]+):", (ROOT / "Makefile").read_text(), flags=re.M))


def check_command(command: str) -> str | None:
    """None when ``command`` is checked (see the module doc) or marked; else what is wrong."""
    try:
        argv = shlex.split(command, comments=True)
    except ValueError as err:
        return f"cannot be parsed as a shell command: {err}"
    if not argv:
        return None
    if SERVER_MARK.search(command) and argv[0] not in ("hir", "make", "python"):
        return None
    program, args = argv[0], argv[1:]
    if program == "hir":
        return check_hir(args)
    if program == "make":
        missing = [t for t in args if not t.startswith("-") and "=" not in t and t not in makefile_targets()]
        return f"the Makefile has no target(s) {missing}" if missing else None
    if program == "python" and args and args[0].endswith(".py"):
        script = ROOT / args[0]
        if not script.exists():
            return f"{args[0]} does not exist"
        source = script.read_text()
        unknown = [a.split("=")[0] for a in args[1:] if a.startswith("--") and f'"{a.split("=")[0]}"' not in source]
        return f"{args[0]} defines no flag(s) {unknown}" if unknown else None
    if program == "pip" and args[:1] == ["install"]:
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        wanted = [e for a in args[1:] for e in re.findall(r"^hir\[([^\]]+)\]$", a)]
        missing = [e for w in wanted for e in w.split(",") if e not in extras]
        return f"pyproject.toml has no extra(s) {missing}" if missing or not wanted else None
    if program == "mkdocs":
        return None  # `make test` runs `mkdocs build --strict`
    return "no test runs it: make it an hir/make/python command, or mark it `# needs a server`"


def test_every_documented_command_is_checked() -> None:
    with composing():
        problems = [f"{where}: `{command}`: {problem}" for where, command in all_commands()
                    if (problem := check_command(command)) is not None]
    assert not problems, "\n".join(problems)


def test_the_pages_show_commands() -> None:
    commands = all_commands()
    assert len(commands) >= 20, f"only {len(commands)} commands in ```bash blocks; did the block syntax change?"
    assert any(c.startswith("make run") for _, c in commands)


@pytest.mark.parametrize(("command", "expected"), [
    ("hir pipeline trainer.no_such_key=1", "do not compose"),
    ("hir prepare data=no_such_dataset", "do not compose"),
    ("hir trian data=rees46", "no stage or tool 'trian'"),
    ("hir gather multirun/x --no-such-flag", "no flag(s) ['--no-such-flag']"),
    ("make no-such-target", "no target(s) ['no-such-target']"),
    ("python benchmarks/no_such.py", "does not exist"),
    ("python benchmarks/ablation.py --no-such-flag 1", "defines no flag(s) ['--no-such-flag']"),
    ("pip install 'hir[nope]'", "no extra(s) ['nope']"),
    ("curl http://localhost:8000", "no test runs it"),
])
def test_a_stale_command_is_reported(command: str, expected: str) -> None:
    problem = check_command(command)
    assert problem is not None and expected in problem, problem


def test_commands_that_pass() -> None:
    assert check_command("hir pipeline -m data=rees46,synthetic") is None
    assert check_command("hir train hparams_search=optuna data=rees46 'model.net.heads=choice(2,4)'") is None
    assert check_command("curl http://milvus:19530/healthz  # needs a server: Milvus") is None
    assert shell_commands("```bash\nhir prepare \\\n  data=rees46   # x\n\n# note\nmake test\n```\n") == [
        (2, "hir prepare    data=rees46   # x"), (6, "make test")]


def _code_lines(text: str, lang: str = "python") -> list[str]:
    blocks = re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)
    return [line.rstrip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_is_a_front_door() -> None:
    """At most 12 KB, and its Python is an excerpt of the serving page's code, which
    tests/publish/test_publish.py runs against a real published store."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024, f"README.md is {len(readme.encode())} bytes; move detail into docs/"
    tested = set(_code_lines((ROOT / "docs" / "serving.md").read_text()))
    untested = [line for line in _code_lines(readme) if line not in tested]
    assert _code_lines(readme) and not untested, f"README lines not in docs/serving.md's tested code: {untested}"
