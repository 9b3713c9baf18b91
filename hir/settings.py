"""What changed between the settings a stage's output recorded and the ones of this run.

A stage that reuses what exists (`hir prepare`, `hir train`) records its resolved settings beside
its output and, on reuse, names every one that differs, so a changed override never passes
silently (docs/operations.md)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


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
