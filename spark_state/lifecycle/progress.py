"""Progress of long work (copying files, checking checksums): a rich bar on a terminal, silence elsewhere.

The library functions take a ``Progress``; the default does nothing, the CLI
passes a ``BarProgress`` when stderr is a terminal, so scripts and ``--json``
output never see bar characters.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator


class Task:
    def advance(self, amount: float = 1) -> None:
        """Marks `amount` units (files, bytes) done."""


class Progress:
    """No output: what library callers get unless they ask for bars."""

    @contextmanager
    def task(self, description: str, total: float | None) -> Iterator[Task]:
        yield Task()


class _RichTask(Task):
    def __init__(self, bar, task_id):
        self._bar, self._id = bar, task_id

    def advance(self, amount: float = 1) -> None:
        self._bar.advance(self._id, amount)


class BarProgress(Progress):
    """rich progress bars on stderr (transient: they vanish once a task is done)."""

    def __init__(self):
        from rich.console import Console

        self._console = Console(stderr=True)

    @contextmanager
    def task(self, description: str, total: float | None) -> Iterator[Task]:
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress as RichProgress,
                                   TextColumn, TimeElapsedColumn)

        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        if description.endswith("bytes"):
            columns[2] = DownloadColumn()
        with RichProgress(*columns, console=self._console, transient=True) as bar:
            yield _RichTask(bar, bar.add_task(description, total=total))


def for_terminal(enabled: bool = True) -> Progress:
    """Bars when `enabled` and stderr is a terminal, else silence."""
    return BarProgress() if enabled and sys.stderr.isatty() else Progress()
