"""What the benchmarks' results files share: docs/results.md holds one section per benchmark
between its own markers (``<!-- <name>:begin -->`` / ``<!-- <name>:end -->``), which a benchmark
rewrites alone, and a path in a results file is never a machine's absolute one (:func:`shown`)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shown(path: Path) -> str:
    """``path`` as a results file records it: relative to the checkout; else from its
    ``outputs/`` folder (a run of another checkout); else its last two parts (a scratch run's dir
    and the folder in it). Never a machine's absolute path."""
    path = path.resolve()
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    parts = path.parts
    return str(Path(*parts[parts.index("outputs"):])) if "outputs" in parts else str(Path(*parts[-2:]))


def markers(name: str) -> tuple[str, str]:
    """The (begin, end) markers of section ``name``."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def write_section(section: str, path: Path, name: str) -> None:
    """Put ``section`` (which starts and ends with the markers of ``name``) in place of that
    section of ``path``, or append it when the file does not have one yet."""
    begin, end = markers(name)
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
