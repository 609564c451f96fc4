"""Progress bars on stderr for long work (downloads, assembly, measurements)."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)
from rich.console import Console


@contextlib.contextmanager
def progress_bar(label: str, total: int, unit: str = "bytes") -> Iterator[Callable[[int], None]]:
    """Yield advance(n); draws a bar only when stderr is a terminal."""
    console = Console(file=sys.stderr)
    columns = [TextColumn("{task.description}"), BarColumn()]
    columns += [DownloadColumn(), TransferSpeedColumn()] if unit == "bytes" else \
        [TextColumn("{task.completed}/{task.total}")]
    columns.append(TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)
