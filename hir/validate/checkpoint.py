"""Run the suites as one Great Expectations checkpoint; data docs HTML; readable failures.

Each :class:`~hir.validate.suites.Table` is written to ``<work_dir>/<name>.parquet`` and
registered as a pandas parquet asset, so one checkpoint (no per-table batch parameters) runs
every suite; one ``build_data_docs`` renders the HTML site into ``docs_dir``. A table's row checks
run as one expectation on its ``failed_checks`` column (:mod:`hir.validate.bundle`) and are
reported, and counted, check by check as if each were its own.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hir.validate import bundle
from hir.validate.suites import Table

log = logging.getLogger(__name__)


@dataclass
class Failure:
    """One failed expectation, in the words of the user's files."""

    table: str
    column: str
    expectation: str
    check: str
    observed: str
    examples: list[str]

    def line(self) -> str:
        ex = f"; e.g. ids {', '.join(self.examples)}" if self.examples else ""
        return f"{self.table} | column {self.column} | {self.check} ({self.expectation}): {self.observed}{ex}"


@dataclass
class CheckpointOutcome:
    success: bool
    evaluated: int
    failures: list[Failure]
    docs_index: Path | None

    def to_json(self) -> dict[str, Any]:
        return {"success": self.success, "evaluated": self.evaluated, "failures": [asdict(f) for f in self.failures],
                "data_docs": str(self.docs_index) if self.docs_index else None}


def _short(value: Any) -> str:
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.6g}"
    if hasattr(value, "item"):  # numpy scalar
        return _short(value.item())
    return str(value)


def _exception(info: Any) -> str | None:
    """GE reports an expectation that raised either flat or keyed by metric; the first message."""
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message"))
    return next((m for v in info.values() if (m := _exception(v))), None)


def _observed(result: dict[str, Any], exception: str | None) -> str:
    if exception:
        return f"error: {exception}"
    if "observed_value" in result:
        return f"observed {_short(result['observed_value'])}"
    if "unexpected_count" in result:
        n, total = result["unexpected_count"], result.get("element_count", 0)
        values = ", ".join(_short(v) for v in (result.get("partial_unexpected_list") or [])[:3])
        return f"{n} of {total} rows fail" + (f" (values {values})" if values else "")
    return json.dumps(result, default=str)[:200]


def _examples(result: dict[str, Any], meta: dict[str, Any], n: int) -> list[str]:
    ids = [str(row["id"]) for row in (result.get("partial_unexpected_index_list") or []) if "id" in row]
    return list(dict.fromkeys(ids or [str(x) for x in meta.get("examples") or []]))[:n]


def _bundled_failures(table: Table, frame: Any, rows: list[bundle.Bundled], n_examples: int,
                      exc: str | None) -> list[Failure]:
    """The failed bundled checks of ``table`` (``frame``: what GE read), one :class:`Failure`
    each, worded as GE's result for a separate expectation would be."""
    found = [] if exc else bundle.failures(frame, rows, n_examples)
    if not found:  # GE failed the bundle itself (it raised): say so rather than pass silently
        return [Failure(table=table.source, column="*", expectation="expect_column_values_to_be_in_set",
                        check=f"the {len(rows)} row checks ({bundle.COLUMN})",
                        observed=f"error: {exc}" if exc else "GE reports failing rows that no check explains",
                        examples=[])]
    return [Failure(table=table.source, column=f["column"], expectation=f["expectation"], check=f["check"],
                    observed=_observed({"unexpected_count": f["unexpected_count"], "element_count": f["element_count"],
                                        "partial_unexpected_list": f["values"]}, None),
                    examples=list(dict.fromkeys(f["ids"]))[:n_examples]) for f in found]


def run_checkpoint(tables: list[Table], work_dir: Path, docs_dir: Path, n_examples: int = 5,
                   bundle_rows: bool = True) -> CheckpointOutcome:
    """Validate every table; returns success, the failures and the data-docs index page.

    ``bundle_rows``: each table's row checks as one GE expectation (:mod:`hir.validate.bundle`;
    the same failures, ~7 ms of GE overhead per table instead of per check). False runs every
    check as its own expectation: the reference ``tests/validate/test_bundle.py`` compares with."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    # that module sets its own logger to INFO on import and logs every ephemeral docs temp dir
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)
    work_dir.mkdir(parents=True, exist_ok=True)
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)  # our own log lines instead
    ctx.add_data_docs_site(site_name="hir", site_config={
        "class_name": "SiteBuilder",
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
        # validation pages already list each expectation; suite pages would double the render time
        "site_section_builders": {"expectations": "0", "profiling": "0"},
    })
    source = ctx.data_sources.add_pandas(name="hir")
    definitions, by_suite = [], {}
    for table in tables:
        path = work_dir / f"{table.name}.parquet"
        own, rows = bundle.split(list(table.expectations), table.frame) if bundle_rows else (list(table.expectations), [])
        frame = table.frame
        if rows:
            frame = bundle.with_failed_checks(frame, rows)
            own.append(bundle.expectation(rows))
        frame.write_parquet(path)
        batch = source.add_parquet_asset(name=table.name, path=path).add_batch_definition_whole_dataframe("all")
        suite = ctx.suites.add(gx.ExpectationSuite(name=table.name, expectations=own))
        definitions.append(ctx.validation_definitions.add(gx.ValidationDefinition(name=table.name, data=batch, suite=suite)))
        by_suite[table.name] = (table, frame, rows)
    checkpoint = ctx.checkpoints.add(gx.Checkpoint(
        name="hir", validation_definitions=definitions,
        # no UpdateDataDocsAction: it rebuilds the whole site once per validation definition
        # (~1 s each); one build_data_docs after the run renders every result once
        actions=[],
        # SUMMARY + an index column: failed rows come back as example ids, not as every row
        result_format={"result_format": "SUMMARY", "unexpected_index_column_names": ["id"],
                       "partial_unexpected_count": n_examples},
    ))
    result = checkpoint.run()
    ctx.build_data_docs(site_names=["hir"])
    failures: list[Failure] = []
    evaluated = 0
    for suite_result in result.run_results.values():
        table, frame, rows = by_suite[suite_result.suite_name]
        for er in suite_result.results:
            cfg = er.expectation_config
            meta = cfg.meta or {}
            exc = _exception(er.exception_info)
            if rows and cfg.kwargs.get("column") == bundle.COLUMN:
                evaluated += len(rows)
                if not er.success:
                    failures += _bundled_failures(table, frame, rows, n_examples, exc)
                continue
            evaluated += 1
            if er.success:
                continue
            failures.append(Failure(
                table=table.source, column=str(meta.get("column", cfg.kwargs.get("column", "*"))),
                expectation=cfg.type, check=str(meta.get("check", "")),
                observed=_observed(er.result or {}, exc), examples=_examples(er.result or {}, meta, n_examples),
            ))
    (work_dir / "gx_checkpoint_result.json").write_text(json.dumps(result.describe_dict(), indent=1, default=str))
    index = docs_dir / "index.html"
    return CheckpointOutcome(bool(result.success), evaluated, failures, index if index.exists() else None)
