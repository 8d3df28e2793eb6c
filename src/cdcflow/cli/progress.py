"""Progress of long work, the same look in every command (Rich Progress on stdout).

On a terminal, :func:`working` shows one live line — spinner, what is being done, a bar (when
the total is known), done/total, a detail text and the elapsed time — removed when the work
ends, so only the result stays. When stdout is not a terminal nothing is animated and nothing
extra is printed, except the lines given to :meth:`Work.step` (one plain line each).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from cdcflow.logs import is_terminal


class _Count(ProgressColumn):
    """``done/total unit`` (``done unit`` while the total is unknown)."""

    def render(self, task: Task) -> Text:
        unit = str(task.fields.get("unit", ""))
        if task.total is None and not unit:  # one step of unknown size: nothing to count
            return Text("")
        if task.total is None and int(task.completed) == 1 and unit.endswith("s"):
            unit = unit[:-2] if unit.endswith("ches") else unit[:-1]  # 1 batch, 1 bucket
        done = f"{int(task.completed):,}"
        count = done if task.total is None else f"{done}/{int(task.total):,}"
        return Text(f"{count} {unit}".rstrip(), style="progress.download")


def is_live(console: Console) -> bool:
    """True when ``console`` writes to a terminal that can show a live display."""
    return console.is_terminal and not console.is_dumb_terminal


class Work:
    """Handle on one piece of long work (see :func:`working`)."""

    def __init__(self, console: Console, progress: Progress | None, task: TaskID | None) -> None:
        self._console = console
        self._progress = progress
        self._task = task

    def update(
        self,
        completed: float | None = None,
        total: float | None = None,
        detail: str | None = None,
        label: str | None = None,
    ) -> None:
        """Set how much is done, the total, the detail text or the label (terminal only)."""
        if self._progress is None or self._task is None:
            return
        if detail is not None:
            self._progress.update(self._task, detail=detail)
        self._progress.update(self._task, completed=completed, total=total, description=label)

    def advance(self, amount: float = 1) -> None:
        """Add ``amount`` to what is done (terminal only)."""
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, amount)

    def step(self, text: str) -> None:
        """Print ``text`` as one line on stdout, above the live display on a terminal."""
        self._console.print(text, markup=False, highlight=False, soft_wrap=True)


@contextmanager
def working(
    label: str,
    total: float | None = None,
    unit: str = "",
    console: Console | None = None,
    enabled: bool = True,
) -> Iterator[Work]:
    """Show the progress of one piece of long work while the ``with`` block runs.

    Args:
        label: what is being done (e.g. ``replay buckets``).
        total: how many units there are (None: unknown, a pulsing bar).
        unit: the unit counted (e.g. ``files``), shown after the count.
        console: where to show it (default: the command's stdout console).
        enabled: False shows nothing (e.g. when stdout carries JSON).

    Yields:
        A :class:`Work` to report progress and print step lines.
    """
    if console is None:
        from cdcflow.cli.app import console as app_console

        console = app_console
    if not enabled or not is_live(console):
        yield Work(console, None, None)
        return
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        _Count(),
        TextColumn("{task.fields[detail]}", markup=False),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        # stderr (the logs) is drawn above the bar only when it is the same terminal; a
        # redirected stderr (`2>run.log`) keeps its lines
        redirect_stderr=is_terminal(sys.stderr),
    )
    with progress:
        task = progress.add_task(label, total=total, unit=unit, detail="")
        yield Work(console, progress, task)
