"""What a stage's output was made from and under, and what changed since (docs/operations.md).

Digests of settings and input files, recorded beside an output: `hir export` and `hir funnel`
reuse an output only under the same digest, `hir evaluate` only for the same inputs, and `hir
prepare` and `hir train`, which reuse what exists, name every setting or input that differs."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


def digest(data: Any) -> str:
    """16 hex of the sha256 of ``data`` as sorted JSON (``default=str`` for dates and paths)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def flatten(value: Any, prefix: str) -> dict[str, Any]:
    """``{"a.b.c": leaf}`` of nested mappings under ``prefix``; a non-mapping is one leaf."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= flatten(item, f"{prefix}.{key}")
        return out
    return {prefix: value}


def recorded(cfg: DictConfig, parts: Sequence[str]) -> dict[str, Any]:
    """The resolved ``cfg[part]`` of each of ``parts`` that ``cfg`` has, as plain data (to record)."""
    return {part: OmegaConf.to_container(cfg[part], resolve=True) for part in parts if part in cfg}


def _path_like(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return last in ("path", "dir") or last.endswith(("_dir", "_path"))


def changed(old: Mapping[str, Any], new: Mapping[str, Any], ignore: Sequence[str] = (),
            ignore_paths: bool = False) -> list[str]:
    """``key: recorded -> now`` for every dotted setting whose value in ``new`` differs from the
    recorded ``old`` (both :func:`recorded`'s form, the same parts), less the keys under
    ``ignore`` and, with ``ignore_paths``, the paths (``path``, ``dir``, ``*_dir``, ``*_path``: where a file
    is, which a moved checkout changes, not what it holds); empty when none does, or when nothing
    was recorded (an output of an older hir)."""
    before = {k: v for part, value in old.items() for k, v in flatten(value, part).items()}
    if not before:
        return []
    now = {k: v for part, value in new.items() for k, v in flatten(value, part).items()}
    keys = sorted(k for k in before.keys() | now.keys()
                  if before.get(k) != now.get(k) and not any(k == n or k.startswith(n + ".") for n in ignore)
                  and not (ignore_paths and _path_like(k)))
    return [f"{k}: {before.get(k, '(absent)')} -> {now.get(k, '(absent)')}" for k in keys]


def shown(lines: Sequence[str], most: int = 5) -> str:
    """The first ``most`` of ``lines`` joined for one log line, with how many more there are."""
    return "; ".join(lines[:most]) + (f"; and {len(lines) - most} more" if len(lines) > most else "")


def file_digests(files: Mapping[str, Path]) -> dict[str, str | None]:
    """``{name: 16 hex of the file's sha256}`` (None where the file does not exist): what an
    output was made from, by the meta.json that marks each input whole."""
    return {name: hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else None
            for name, path in files.items()}


def log_reuse(log: logging.Logger, what: str, where: Path, differ: Sequence[str], redo: str) -> None:
    """Say that the ``what`` at ``where`` is reused as it is: a warning naming ``differ`` (the
    settings and inputs that differ from the ones it was made under) when there are any, else an
    info line; ``redo``: what ``force=true`` does instead (``rebuilds``, ``retrains``)."""
    if differ:
        log.warning("the %s at %s was made under other settings or from other inputs (%s); reusing it as it is: "
                    "force=true %s it, or give this run its own run_name", what, where, shown(differ), redo)
    else:
        log.info("%s exists at %s; reusing it (force=true %s)", what, where, redo)
