"""The ranking arm registry: ``eval.ranking`` (conf/eval/default.yaml) maps each arm's name to its
constructor, one line per arm, in report order:

    hir: {_target_: hir_evaluation.ranking.arms.hir.HirFeatures}

Every arm trains the ranker of ``eval.ranker`` (same rows, recipe, seed and budget) on the
baseline's features (evaluation/ranking/features.py: counts, recency, price, ids, categories)
changed the arm's way: extra blocks (vectors, token bags, dense columns) or replaced columns. Its
NE lift over the baseline is reported (:func:`lift_key`). An arm is a class in
``evaluation/ranking/arms/<name>.py`` with ``needs: ClassVar[tuple[str, ...]]`` (the inputs it
reads, INPUTS; without one it is not run, and ``eval.require_<input>`` says whether that fails the
stage) and ``inputs(sources, rows, base) -> RankerInputs``. Its ``has_*`` dense columns (1 where
a row got its features) measure its coverage, point-in-time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from hir.errors import HirError

if TYPE_CHECKING:
    import polars as pl

    from hir_evaluation.ranking.features import RankerInputs
    from hir_evaluation.sources.selection import Sources

# the arm every lift is over: the baseline features alone (always run)
BASELINE = "baseline"
# inputs an arm may need (Sources.available), each with its option eval.require_<input>
INPUTS = ("hir", "content")
# keys of metrics.json's ranking section that are not arms
SECTION_KEYS = ("task", "fit_splits", "protocol", "notes", "rows", "positives", "bootstrap", "skipped",
                "calibration_curves", "slices", "arms")

# an arm bound to this run's sources: candidate rows, baseline inputs -> the arm's inputs
ArmInputs = Callable[["pl.DataFrame", "RankerInputs"], "RankerInputs"]


class RankingArm(Protocol):
    needs: ClassVar[tuple[str, ...]]

    def inputs(self, sources: Sources, rows: pl.DataFrame, base: RankerInputs) -> RankerInputs:
        """The arm's ranker inputs for ``rows`` (n): ``base`` (n rows) with its blocks added or changed."""
        ...


def lift_key(arm: str) -> str:
    """The arm's NE lift key in metrics.json's ranking section: ``ne_lift`` (hir), ``ne_lift_<arm>``."""
    return "ne_lift" if arm == "hir" else f"ne_lift_{arm}"


def build_ranking_arms(specs: Mapping[str, Any]) -> dict[str, RankingArm]:
    """name -> arm from ``eval.ranking`` (each value a ``_target_`` constructor call), in order."""
    from hydra.utils import instantiate

    arms = {}
    for name, spec in specs.items():
        arm = instantiate(spec, _convert_="all")
        where = f"eval.ranking.{name} ({type(arm).__module__}.{type(arm).__name__})"
        needs = getattr(type(arm), "needs", None)
        if not isinstance(needs, tuple) or not callable(getattr(arm, "inputs", None)):
            raise HirError(f"{where} is not a ranking arm: it needs a `needs: ClassVar[tuple[str, ...]]` class "
                           "attribute and inputs(sources, rows, base) (see evaluation/ranking/arms/content.py)")
        if unknown := sorted(set(needs) - set(INPUTS)):
            raise HirError(f"{where}: needs {unknown}; an arm may need {list(INPUTS)}")
        if name == BASELINE or name in SECTION_KEYS or name.startswith("ne_lift"):
            raise HirError(f"eval.ranking.{name}: {name!r} is a key of metrics.json's ranking section; rename the arm")
        arms[str(name)] = arm
    return arms


def bind(arms: Mapping[str, RankingArm], sources: Sources) -> dict[str, ArmInputs | None]:
    """Each arm bound to ``sources``, or None when an input it needs is missing (reported as nulls)."""
    return {name: partial(arm.inputs, sources) if all(sources.available(n) for n in arm.needs) else None
            for name, arm in arms.items()}


def require_options(arms: Mapping[str, RankingArm]) -> dict[str, list[str]]:
    """arm -> the ``eval.require_<input>`` options that allow it to be skipped."""
    return {name: [f"eval.require_{need}" for need in arm.needs] for name, arm in arms.items()}
