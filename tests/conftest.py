"""Shared fixtures: compose real Hydra configs, shrunk for tests, writing under tmp_path; and the
serving inputs that tests/publish and tests/validate share, each built once per session: a
prepared tiny snapshot and a validated export of it (tests only read them; a test that edits an
export gets its own copy through ``make_run``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# offline, quiet, small: set before anything imports torch/transformers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# idle OpenMP threads sleep instead of spinning (hir/train/stage.py sets it too, but only
# takes effect before torch is loaded; under pytest a test module imports torch first)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# under pytest-xdist (`make test` runs one worker per core) each worker computes on one thread:
# two workers with two threads each would fight over the two cores
if os.environ.get("PYTEST_XDIST_WORKER"):
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "POLARS_MAX_THREADS"):
        os.environ.setdefault(var, "1")
    # execnet runs a worker with a bare __main__ (no __spec__, no __file__); pyspark.sql.connect
    # (imported by great_expectations) takes that for its own doctest run and calls sys.exit(0).
    # A spec named __main__ tells it otherwise, and multiprocessing's spawn (evaluate's second
    # process) then imports no main module in the child, as for an interactive parent
    _main = sys.modules["__main__"]
    if getattr(_main, "__spec__", None) is None and not hasattr(_main, "__file__"):
        import importlib.machinery

        _main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
# Triton reads TRITON_INTERPRET when its own @jit helpers (triton.language.standard) are defined,
# i.e. when triton is first imported — and torch/lightning import it early. Without a GPU the
# kernels run under the interpreter, so set it here, before anything imports torch.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
REES46 = SHARED_DATA / "rees46_multicat_2019oct_head" / "events.csv.gz"
ONLINE_RETAIL = SHARED_DATA / "uci_online_retail" / "online_retail.csv.gz"


@pytest.fixture
def compose(tmp_path: Path) -> Callable:
    """``compose("data=rees46", stage="prepare")`` -> a DictConfig whose outputs go to tmp_path."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from hir.stages import register_resolvers

    register_resolvers()

    def _compose(*overrides: str, stage: str = "pipeline", output_dir: Path | None = None):
        out = output_dir or tmp_path
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            return hydra_compose(
                "config",
                overrides=[
                    f"stage={stage}", f"paths.output_dir={out}", f"paths.cache_dir={out}/.cache",
                    f"publish.store_dir={out}/store", *overrides,
                ],
            )

    return _compose


def run_hir(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the real `hir` command in a subprocess (as a user would)."""
    exe = Path(sys.executable).with_name("hir")
    return subprocess.run(
        [str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """A read-only directory ``name`` that ``build(dir)`` fills once per test session, also across
    pytest-xdist workers: the first worker to ask builds it under the session's common temp dir,
    holding a file lock, and the others wait for it and read it (each worker building its own
    copy cost the suite tens of seconds). Without xdist: a fresh temp dir of this session."""
    from filelock import FileLock

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        out = tmp_path_factory.mktemp(name)
        build(out)
        return out
    # under xdist each worker's base temp is <session>/popen-gwN: the parent is this session's
    root = tmp_path_factory.getbasetemp().parent / "built_once"
    root.mkdir(exist_ok=True)
    out = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (out / ".built").exists():
            shutil.rmtree(out, ignore_errors=True)  # a worker that failed half-way
            out.mkdir()
            build(out)
            (out / ".built").touch()
    return out


@pytest.fixture(scope="session")
def tiny_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared synthetic snapshot (graph/) of tests/publish/fixtures.py's TINY, built once per
    session; read only (``make_run`` and ``export_run`` copy it)."""
    from hir.data import prepare
    from tests.publish.fixtures import compose_at

    out = built_once(tmp_path_factory, "tiny", lambda d: prepare.run(compose_at(d / "run", stage="prepare")))
    return out / "run" / "graph"


@pytest.fixture(scope="session")
def rees46_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real rees46 head prepared with the default config (graph/), built once per session
    (it was prepared by three test modules, ~20 s each); read only: copy it to write beside it."""
    from hir.data import prepare
    from tests.publish.fixtures import compose_at

    if not REES46.exists():
        pytest.skip(f"needs {REES46}")
    out = built_once(tmp_path_factory, "rees46",
                     lambda d: prepare.run(compose_at(d / "run", stage="prepare", data=("data=rees46",))))
    return out / "run" / "graph"


def _validated(tmp_path_factory: pytest.TempPathFactory, tiny_graph: Path, version: str, seed: int) -> Iterator[Path]:
    """The run dir of :func:`validated_v1` for export ``version`` (``seed``, created ``seed``
    days after CREATED); it must still be the validated export at the end of the session."""
    from datetime import timedelta

    from hir.validate import stage as validate
    from hir.validate.binding import require_validated
    from tests.publish.fixtures import CREATED, export_run

    def build(d: Path) -> None:
        validate.run(export_run(tiny_graph, d / version, version, created=CREATED + timedelta(days=seed), seed=seed))

    run = built_once(tmp_path_factory, f"validated_{version}", build) / version
    yield run
    require_validated(run / "embeddings", run / "validation")  # no test edited the shared export


@pytest.fixture(scope="session")
def validated_v1(tiny_graph: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A run dir with a copy of ``tiny_graph``, the contract export ``v1`` (seed 0, created
    tests/publish/fixtures.py's CREATED) and its passing validation (against an empty store),
    built once per session. Read only: ``reading(validated_v1, base)`` publishes it into a store
    of its own. At the end of the session the export must still be the validated one."""
    yield from _validated(tmp_path_factory, tiny_graph, "v1", 0)


@pytest.fixture(scope="session")
def validated_v2(tiny_graph: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Like ``validated_v1`` for the export ``v2`` (seed 1, created a day after v1), validated
    against an empty store: the next version the publish tests switch to. Read only (``reading``)."""
    yield from _validated(tmp_path_factory, tiny_graph, "v2", 1)


@pytest.fixture
def make_run(tiny_graph: Path, tmp_path: Path) -> Callable:
    """``make_run("v2", *overrides, seed=1)`` -> tests/publish/fixtures.py's ``export_run`` under
    this test's tmp dir (a copy of ``tiny_graph`` and a fresh export the test may edit)."""
    from tests.publish.fixtures import export_run

    def _make(version: str, *overrides: str, **export: object):
        return export_run(tiny_graph, tmp_path / version, version, *overrides, **export)

    return _make
