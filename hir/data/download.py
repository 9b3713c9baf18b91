"""Fetch a public dataset file when the local copy is absent, verified by SHA-256."""

from __future__ import annotations

import hashlib
import logging
import shutil
import urllib.request
from pathlib import Path

from hir.errors import InputError

log = logging.getLogger(__name__)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_file(path: str | Path, url: str | None, sha256: str | None, download_dir: str | Path) -> Path:
    """Return ``path`` if it exists; otherwise download ``url`` into ``download_dir`` (once).

    The download is written to a temporary name, checked against ``sha256`` and only then moved
    into place, so an interrupted or tampered download never looks like a good file.
    ``file://`` URLs work too (tests use them; no test touches the network).
    """
    path = Path(path).resolve()
    if path.exists():
        return path
    if not url:
        raise InputError(f"{path} does not exist and the dataset config has no download url; set data.path")
    target = Path(download_dir) / path.name
    if target.exists():
        if sha256 and sha256_of(target) != sha256:
            raise InputError(f"{target} does not match sha256 {sha256}; delete it to download again")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    log.info("downloading %s -> %s", url, target)
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(partial, "wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise InputError(
            f"{path} is absent and downloading {url} failed ({err}); place the file at {path} "
            "or set data.url to a reachable mirror"
        ) from err
    got = sha256_of(partial)
    if sha256 and got != sha256:
        partial.unlink()
        raise InputError(
            f"download of {url} has sha256 {got}, expected {sha256}; the upstream file changed or the "
            "download was corrupted (set data.sha256 only if you trust the new file)"
        )
    partial.rename(target)
    return target
