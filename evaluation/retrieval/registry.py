"""The retrieval arm registry: ``eval.retrieval`` (conf/eval/default.yaml) maps each arm's name to
its constructor, one line per arm, in report order:

    gfcf: {_target_: hir_evaluation.retrieval.arms.gfcf.GFCF, rank: 256, ideal_weight: 0.3}

An arm is one class in ``evaluation/retrieval/arms/<name>.py`` with an ``info: ArmInfo`` class
attribute (its role and what it needs) and ``topk(ctx, k) -> Ranked``. The name is the arm's key
in metrics.json; evaluation, the report, the plots, `hir gather` and benchmarks/quality.py take
the arms and their roles from there (``retrieval.arms``), so adding an arm is its file plus its
line. ``eval.retrieval_arms`` runs a subset (the others report null metrics).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Protocol

import numpy as np

from hir.data.snapshot import Snapshot
from hir.errors import HirError
from hir_evaluation.retrieval.data import RetrievalData, retrieval_data
from hir_evaluation.retrieval.rank import Ranked, TopK
from hir_evaluation.tasks import RetrievalTask

# model: what the report measures (hir); baseline: what it is ranked against (hir_over_best_baseline);
# reference: reported beside them, never a baseline (repeat: the user's own past entities)
ROLES = ("model", "baseline", "reference")
# optional inputs (RetrievalContext fields): an arm that needs a missing one is not run
INPUTS = ("hir", "content")
# keys of a metrics.json retrieval section that are not arms
# (and the ratios, `<model>_over_<baseline or reference>`)
SECTION_KEYS = ("task", "history_splits", "ks", "users", "protocol", "seconds", "fits", "arms", "slices", "best",
                "masked_new_to_user", "deep_funnel", "skipped")


@dataclass(frozen=True)
class ArmInfo:
    """What evaluation and the report need to know about an arm, without running it.

    Args:
        role: one of ROLES.
        needs: optional inputs it reads (INPUTS): ``hir`` the HIR search, ``content`` the content
            vectors; without one the arm is not run and reports nulls. Every arm may read the
            history (``ctx.test.history`` / ``ctx.test.seen``).
        fits_on_val: it trains, selecting its fit on the val period (``ctx.val``, history = train).
        no_masked: why it has no masked list (None: it runs under both protocols).
    """

    role: str
    needs: tuple[str, ...] = ()
    fits_on_val: bool = False
    no_masked: str | None = None


@dataclass
class RetrievalContext:
    """Everything an arm may read.

    test: the held-out test sets and the history the arms learn from; task, seed: as configured;
    hir: the HIR search (Milvus or the export files), None without embeddings; content:
    (entity content vectors (I, d), has-vector (I,)), None without content.
    """

    snap: Snapshot
    task: RetrievalTask
    test: RetrievalData
    seed: int
    hir: TopK | None = None
    content: tuple[np.ndarray, np.ndarray] | None = None

    @cached_property
    def val(self) -> RetrievalData:
        """The val period's held-out sets, history = the train period (for early stopping)."""
        return retrieval_data(self.snap, self.task, "val", self.seed)

    def has(self, needs: tuple[str, ...]) -> bool:
        return all(getattr(self, need) is not None for need in needs)


class RetrievalArm(Protocol):
    info: ClassVar[ArmInfo]

    def topk(self, ctx: RetrievalContext, k: int) -> Ranked:
        """(U, k) top-k entity ids of ``ctx.test.users`` under every protocol it has (full; masked
        new-to-user; deep funnel, ``Ranked.deep``)."""
        ...


def check_arm(name: str, arm: Any) -> RetrievalArm:
    """``arm`` if it is a retrieval arm named acceptably, else an error saying what is wrong."""
    where = f"eval.retrieval.{name} ({type(arm).__module__}.{type(arm).__name__})"
    info = getattr(type(arm), "info", None)
    if not isinstance(info, ArmInfo) or not callable(getattr(arm, "topk", None)):
        raise HirError(f"{where} is not a retrieval arm: it needs an `info: ArmInfo` class attribute and "
                       "topk(ctx, k) -> Ranked (see evaluation/retrieval/arms/popularity.py)")
    if info.role not in ROLES:
        raise HirError(f"{where}: role {info.role!r}; expected one of {list(ROLES)}")
    if unknown := sorted(set(info.needs) - set(INPUTS)):
        raise HirError(f"{where}: needs {unknown}; an arm may need {list(INPUTS)}")
    if name in SECTION_KEYS or "_over_" in name:
        raise HirError(f"eval.retrieval.{name}: {name!r} is a key of metrics.json's retrieval section; rename the arm")
    return arm


def build_arms(specs: Mapping[str, Any]) -> dict[str, RetrievalArm]:
    """name -> arm from ``eval.retrieval`` (each value a ``_target_`` constructor call), in order."""
    from hydra.utils import instantiate

    return {str(name): check_arm(str(name), instantiate(spec, _convert_="all")) for name, spec in specs.items()}
