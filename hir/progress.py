"""Rich progress for the data and publish stages (Lightning has its own bar for training)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

T = TypeVar("T")

_console = Console(stderr=True)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console,
        transient=False,
        disable=not sys.stderr.isatty(),
    )


@contextmanager
def progress_steps(name: str, total: int) -> Iterator[Callable[[str], None]]:
    """A bar over ``total`` named steps; call the yielded function when a step ends."""
    with _progress() as bar:
        task = bar.add_task(name, total=total)

        def step(next_desc: str) -> None:
            bar.update(task, advance=1, description=f"{name}: {next_desc}")

        yield step
        bar.update(task, completed=total, description=f"{name}: done")


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar (silent when stderr is not a terminal)."""
    with _progress() as bar:
        yield from bar.track(items, total=total, description=description)
