"""Progress bars on stderr for long work (downloads, assembly, measurements, training)."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Callable, Iterator

from rich import progress as rich
from rich.console import Console

LOG_INTERVAL = 60.0  # seconds between progress lines when stderr is a file

# How long work reports how far it got: (what, done, total). The CLI draws it as bars on
# stderr (StderrProgress); the chat app in its own screen.
Progress = Callable[[str, float, float], None]
# What a user should know and nothing waits on (a store left alone, a drafter found): one line,
# on stderr from the command line, a notification in the chat app.
Notice = Callable[[str], None]


def notice_on_stderr(text: str) -> None:
    print(f"localspec: {text}", file=sys.stderr)


@contextlib.contextmanager
def progress_bar(label: str, total: int, unit: str = "bytes") -> Iterator[Callable[[int], None]]:
    """Yield advance(n); a live bar when stderr is a terminal, else a line a minute (hours of
    feature extraction under nohup should still say how far they got)."""
    console = Console(file=sys.stderr)
    if not console.is_terminal:
        with _progress_lines(label, total, unit) as advance:
            yield advance
        return
    columns = [rich.TextColumn("{task.description}"), rich.BarColumn()]
    columns += [rich.DownloadColumn(), rich.TransferSpeedColumn()] if unit == "bytes" else \
        [rich.TextColumn("{task.completed}/{task.total}")]
    columns.append(rich.TimeRemainingColumn())
    with rich.Progress(*columns, console=console) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)


@contextlib.contextmanager
def _progress_lines(label: str, total: int, unit: str) -> Iterator[Callable[[int], None]]:
    start = last = time.monotonic()
    done = 0

    def line() -> None:
        rate = done / max(time.monotonic() - start, 1e-9)
        print(f"{label}: {done}/{total} {unit} ({100 * done / max(total, 1):.0f}%, {rate:.1f} {unit}/s)",
              file=sys.stderr, flush=True)

    def advance(n: int) -> None:
        nonlocal done, last
        done += n
        if time.monotonic() - last >= LOG_INTERVAL:
            last = time.monotonic()
            line()

    yield advance
    if time.monotonic() - start >= LOG_INTERVAL:  # long work ends with its final count
        line()


class StderrProgress:
    """An engine's progress callback, (what, done, total), as bars on stderr: one per `what`,
    closed once done reaches total."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[contextlib.AbstractContextManager, Callable[[int], None], int]] = {}

    def __call__(self, what: str, done: float, total: float) -> None:
        scale = 100 if total <= 1 else 1  # shares become percentages
        if what not in self._open:
            bar = progress_bar(what, int(total * scale), unit="%" if scale == 100 else "steps")
            self._open[what] = (bar, bar.__enter__(), 0)
        bar, advance, shown = self._open[what]
        now = int(done * scale)
        advance(now - shown)
        self._open[what] = (bar, advance, now)
        if done >= total:
            del self._open[what]
            bar.__exit__(None, None, None)
