"""The `hir` command: `hir <stage> [hydra overrides]`, `hir pipeline`, `-m` sweeps, `hir --help`.

The first argument picks the stage; everything after it goes to Hydra untouched, so every
Hydra feature (overrides, `--multirun`, `--cfg job`, `hydra.run.dir=...`) works as usual.
How a stage runs under Hydra is :mod:`hir.stages`.
"""

from __future__ import annotations

import importlib
import os
import sys

from hir.stages import HELPERS, PIPELINE_HELP, ROOT, STAGES, run_hydra


def _datasets() -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / "data").glob("*.yaml"))


def _usage() -> str:
    width = max(len(s) for s in [*STAGES, "pipeline", *HELPERS])
    lines = ["usage: hir <stage> [hydra overrides ...]   (hir <stage> --help for the composed config)", ""]
    lines.append("stages:")
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in STAGES.items()]
    lines.append(f"  {'pipeline':<{width}}  {PIPELINE_HELP}")
    if HELPERS:
        lines += ["", "tools:"]
        lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in HELPERS.items()]
    lines += ["", "datasets (data=<name>):", "  " + ", ".join(_datasets())]
    lines += [
        "",
        "examples:",
        "  hir prepare data=rees46",
        "  hir pipeline data=synthetic",
        "  hir prepare data=events_csv data.path=events.csv data.columns.user=uid ...",
        "  hir pipeline -m data=rees46,online_retail     # a Hydra multirun sweep",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return
    stage, rest = argv[0], argv[1:]
    if stage not in STAGES and stage not in HELPERS and stage != "pipeline":
        print(f"hir: unknown stage {stage!r}\n\n{_usage()}", file=sys.stderr)
        sys.exit(2)
    # torch's OpenMP threads spin while idle by default, which starves the other thread on a
    # busy 2-core machine (measured 5x slower MiniLM encoding); must be set before torch loads
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if stage in HELPERS:
        module = importlib.import_module(HELPERS[stage][0])
        if hasattr(module, "main"):
            # tools with their own arguments (e.g. `hir gather multirun/DIR`) bypass Hydra
            module.main(rest)
            return
    run_hydra(stage, rest)


if __name__ == "__main__":
    main()
