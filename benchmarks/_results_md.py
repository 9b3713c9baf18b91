"""docs/results.md holds one section per benchmark between its own markers
(``<!-- <name>:begin -->`` / ``<!-- <name>:end -->``); a benchmark rewrites only its section."""

from __future__ import annotations

from pathlib import Path


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
