"""What a measurement runs on a context: filler tokens, the batch sizes measured, one batch
timed, a run of single tokens timed; each untimed stretch in a turn of the engine's (Turn)."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable, ContextManager

from localspec.llama.context import Context

# Held around each untimed stretch of a measurement (a forward and its clock): the engine's
# measurement between requests waits there for its turn.
Turn = Callable[[], ContextManager]


def filler_tokens(ctx: Context, n: int) -> list[int]:
    """Ordinary (not special) token ids spread over the vocabulary: timing and rounding do not
    depend on what the tokens say."""
    return [100 + (i * 7919) % (ctx.model.n_vocab - 200) for i in range(n)]


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes measured: every one up to 16, then 24, 32, 48, 64, ... (a long draft's
    verification; between them the curve is interpolated), and past 16 the width just below
    each multiple of 16 among them. A CPU's kernels run a batch in blocks of 16 rows, then 4,
    then single rows, each reading all the weights again: here 31 rows cost 1.05-1.17x what
    32 do and 63 rows 1.2-1.3x 64, a step the interpolation would not see, so verification
    could not pad across it. Measuring the widths below the steps (nearly half again the measuring
    time) was worth 0-3.6% replayed on code edits and completion; every width, 6x the time,
    no more (docs/benchmarks.md#what-a-batch-of-each-width-costs-on-this-cpu-and-the-curves-unpadded-times-issues-44-46-2026-12-03-session-38)."""
    sizes = list(range(1, min(max_batch, 16) + 1))
    n = 16
    while n < max_batch:
        n = min(max_batch, n + n // 2 if n & (n - 1) == 0 else n + n // 3)
        sizes += [n - 1, n] if n % 16 == 0 else [n]
    return sizes


def plain_step_seconds(ctx: Context, filler: list[int], n_past: int, n: int = 16,
                       turn: Turn = contextlib.nullcontext) -> float:
    """The median seconds of n single tokens decoded one after another after n_past (plain
    decoding), the context holding n_past again after."""
    times = []
    with turn():
        for t in filler[n_past:n_past + n]:
            t0 = time.perf_counter()
            ctx.append(t)
            ctx.synchronize()
            times.append(time.perf_counter() - t0)
        ctx.truncate(n_past)
    return statistics.median(times[1:])


def time_batch(ctx: Context, filler: list[int], n_past: int, n: int,
               turn: Turn = contextlib.nullcontext) -> float:
    """Seconds for one forward of n tokens after the first n_past of `filler` (which the
    context holds, and holds again after), all rows output, until the backend has finished."""
    with turn():
        t0 = time.perf_counter()
        ctx.extend(filler[n_past:n_past + n], n_outputs=n)
        ctx.synchronize()
        dt = time.perf_counter() - t0
        ctx.truncate(n_past)
    return dt

