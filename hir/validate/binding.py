"""Binds a validation result to the exact files it checked (sha256 of every export file), so
`hir publish` can refuse outputs that failed, were never validated, or changed afterwards."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hir.errors import HirError

RESULT_FILE = "result.json"


class NotValidated(HirError):
    """The embeddings have no passing validation result bound to their current content."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def export_hashes(embeddings_dir: Path) -> dict[str, str]:
    """``{file name: sha256}`` of every file directly in ``embeddings_dir`` (parquet + meta.json)."""
    return {p.name: sha256(p) for p in sorted(embeddings_dir.iterdir()) if p.is_file() and not p.name.startswith(".")}


FUNNEL_FILES = ("open_funnel.parquet", "meta.json")


def funnel_hashes(funnel_dir: Path) -> dict[str, str]:
    """``{file name: sha256}`` of what `hir publish` reads from ``funnel/`` (the open funnel and its meta)."""
    return {name: sha256(funnel_dir / name) for name in FUNNEL_FILES if (funnel_dir / name).exists()}


def require_funnel(result: dict[str, Any]) -> dict[str, Any] | None:
    """The ``funnel`` binding of a validation result (None: none was validated), its files unchanged.

    Raises:
        NotValidated: a file of the validated ``funnel/`` changed or went missing.
    """
    bound = result.get("funnel")
    if not bound:
        return None
    now, then = funnel_hashes(Path(bound["dir"])), bound["files"]
    changed = sorted(f for f in set(now) | set(then) if now.get(f) != then.get(f))
    if changed:
        raise NotValidated(f"{bound['dir']} changed since it was validated: {', '.join(changed)}; run "
                           "`hir validate force=true` again (or `hir funnel force=true` first)")
    return bound


def read_result(validation_dir: Path) -> dict[str, Any] | None:
    path = validation_dir / RESULT_FILE
    return json.loads(path.read_text()) if path.exists() else None


def require_validated(embeddings_dir: Path, validation_dir: Path) -> dict[str, Any]:
    """The validation result of ``embeddings_dir`` if it passed and the files are unchanged.

    Raises:
        NotValidated: naming what is missing, failed or changed, and the command that fixes it.
    """
    result = read_result(validation_dir)
    if result is None:
        raise NotValidated(
            f"no validation result at {validation_dir / RESULT_FILE}; run `hir validate` on {embeddings_dir} first"
        )
    if not result.get("success"):
        fails = result.get("failures") or []
        lines = "\n  ".join(f"{f['table']} | column {f['column']} | {f['check']}: {f['observed']}" for f in fails[:10])
        raise NotValidated(
            f"the outputs did not pass validation ({len(fails)} failed expectations, see "
            f"{validation_dir / RESULT_FILE}); nothing was published:\n  {lines}"
        )
    now = export_hashes(embeddings_dir)
    then: dict[str, str] = result.get("files", {})
    changed = sorted(f for f in set(now) | set(then) if now.get(f) != then.get(f))
    if changed:
        detail = ", ".join(
            f"{f} ({'new' if f not in then else 'removed' if f not in now else 'content changed'})" for f in changed
        )
        raise NotValidated(
            f"{embeddings_dir} changed since it was validated: {detail}; run `hir validate force=true` again"
        )
    return result
