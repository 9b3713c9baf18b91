"""`hir promote <multirun cell dir>`: make one sweep cell's model the live version of its dataset.

A multirun cell (`hir pipeline -m ...`) publishes into its own store, ``<cell dir>/serving``, so a
sweep never changes what is served (``publish.store_dir`` in conf/publish/default.yaml). To serve
the cell you chose, promote it:

    hir gather multirun/2026-11-29_12-00-00            # pick a cell
    hir promote multirun/2026-11-29_12-00-00/3          # = hir publish with that cell's overrides

This runs `hir publish` with the cell's own overrides (its dataset, its ``publish=...``) on the
cell's validated ``embeddings/``, in a single run, so the store is the dataset's shared one
(``outputs/serving/<dataset>``) unless the sweep named ``publish.store_dir`` itself. The cell's
``.hydra/`` stays as the sweep wrote it (``hir gather`` reads it); its ``publish/manifest.json``
then describes the promoted publish. Extra overrides after the dir go to `hir publish`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from hir.stages import run_hydra

USAGE = "usage: hir promote <multirun cell dir> [hydra overrides ...]   e.g. hir promote multirun/2026-11-29_12-00-00/3"


def cell_overrides(cell: Path) -> list[str]:
    """The task overrides the sweep gave this cell (``.hydra/overrides.yaml``), minus ``stage=``."""
    path = cell / ".hydra" / "overrides.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {cell} is not a Hydra job dir (a multirun cell looks like "
                                "multirun/<date>_<time>/<n>)")
    items = yaml.safe_load(path.read_text()) or []
    return [str(o) for o in items if not str(o).lstrip("+~").startswith("stage=")]


def main(argv: list[str]) -> None:
    """Plain command line (no Hydra of its own): re-enters ``hir publish`` for the cell."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    cell, extra = Path(argv[0]), argv[1:]
    try:
        overrides = cell_overrides(cell)
    except FileNotFoundError as err:
        print(f"hir promote: {err}\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    # publish itself refuses a cell without a passing validation of its export, and says so;
    # hydra.output_subdir=null: the cell's .hydra/ (what `hir gather` reads) is not rewritten
    run_hydra("publish", [*overrides, f"hydra.run.dir={cell.resolve()}", "hydra.output_subdir=null", *extra])
