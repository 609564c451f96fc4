"""Measuring the cost curve: the whole one (measure, with what context adds:
measure_per_context) and the coarse one a model's first start plans on, measured in seconds
(quick_measure); and cost_curve, the curve a context plans with, cached or measured."""

from __future__ import annotations

import contextlib
import math
import statistics
import time

import numpy as np

from localspec.errors import LocalspecError
from localspec.llama.context import Context
from localspec.llama.curve import MAX_BATCH, CostCurve, read_curve
from localspec.llama.curve_cache import cache_path, keep, read_loop, strayed
from localspec.llama.exactness import exactness, read_exactness
from localspec.llama.timing import Turn, batch_sizes, filler_tokens, plain_step_seconds, time_batch
from localspec.progress import Progress

LONG_CONTEXT = 2048  # where the second, coarser curve is measured (what context adds)
PLAIN_MARGIN = 0.2  # a curve whose single token strays more from a plain run is measured again
QUICK_SECONDS = 3.0  # what the coarse curve a model starts on may take to measure


def cost_curve(ctx: Context, max_batch: int = MAX_BATCH, refresh: bool = False, repeats: int = 7,
               progress: Progress | None = None, quick: bool = False) -> CostCurve:
    """The cached curve for this model, build and settings; measured on first use, and once
    more when the loop's forwards strayed from it (record_loop): a curve taken in a busy
    moment is replaced, while a machine whose loop and measurement differ for good (a tiny
    model's forwards vary by a quarter from one run to the next) does not measure at every
    start. `quick`: where no whole curve is cached, a coarse one (quick_measure) does."""
    path = cache_path(ctx)
    again = False
    try:
        curve = read_curve(path) if path.exists() and not refresh else None
    except LocalspecError:  # a cached curve that is not one: measured again, and replaced
        curve = None
    if curve is not None:
        if curve.coarse:
            if quick:
                return curve
        # A curve measured in a small context (--ctx 256) lacks what context adds: a larger
        # context measures it again, once.
        elif len(curve.seconds) >= max_batch and (curve.per_context or not long_context(ctx, max_batch)):
            loop = read_loop(path)
            if not strayed(loop) or loop.get("measured_again"):
                return curve
            again = True
            if progress:
                progress(f"the loop's forwards took {loop['ratio']:.2f}x what the cached cost curve "
                         "says: measuring it again", 0, 1)
    if quick:
        curve = quick_measure(ctx, max_batch)
    else:
        curve = measure(ctx, max_batch, repeats=repeats, progress=progress)
    keep(ctx, curve, again)
    return curve


def measure(ctx: Context, max_batch: int = MAX_BATCH, n_context: int = 256, repeats: int = 7,
            progress: Progress | None = None, turn: Turn = contextlib.nullcontext) -> CostCurve:
    """Time batches of 1..max_batch tokens (all rows output, as in verification) after a
    context of n_context tokens, each until it has finished (not when llama_decode returns:
    GPU and RPC backends return early). A size is timed in a run of its own, as the loop meets
    it (a GPU reuses a forward's graph while the batch keeps its shape: interleaved sizes
    priced a single token 10-40% above what plain decoding pays on an H200), in two sweeps,
    sizes up then down, so that drift in the machine's speed falls on all sizes alike; the
    median of each size's runs is kept. Then a plain run, single tokens one after another,
    checks the single-token price: a busy moment that skewed it (a curve cached on a fresh
    install priced a token at 4x what the loop paid) measures the curve again, once. A context
    too small for n_context + max_batch gets a shorter n_context (the prompt, not this, should
    be what reports a full context)."""
    n_context = max(0, min(n_context, ctx.n_ctx - max_batch))
    progress = progress or (lambda what, done, total: None)
    steps = 2 * max_batch + 3
    best: tuple[float, list[float]] | None = None
    for attempt in range(2):
        timed_as_greedy(ctx)
        filler = filler_tokens(ctx, n_context + max_batch)
        with turn():
            ctx.extend(filler[:n_context])
        sizes = batch_sizes(max_batch)
        times: dict[int, list[float]] = {n: [] for n in sizes}
        per_run = max(2, (repeats + 1) // 2) + 1  # the first of a run builds its graph: dropped
        for sweep, order in enumerate((sizes, sizes[::-1])):
            for i, n in enumerate(order):
                progress("measuring the cost curve", sweep * max_batch + i, steps)
                times[n] += [time_batch(ctx, filler, n_context, n, turn) for _ in range(per_run)][1:]
        measured = [statistics.median(times[n]) for n in sizes]
        plain = plain_step_seconds(ctx, filler, n_context, max(2, min(16, max_batch)), turn)
        ctx.clear()
        stray = abs(math.log(plain / measured[0]))
        if best is None or stray < best[0]:
            best = (stray, measured)
        if stray <= math.log(1 + PLAIN_MARGIN):
            break
        progress(f"measuring the cost curve again (a single token took {measured[0] * 1e3:.1f} ms "
                 f"there, {plain * 1e3:.1f} ms in a plain run)", 0, steps)
    unpadded = [float(x) for x in np.interp(range(1, max_batch + 1), sizes, best[1])]
    progress("measuring the cost curve", steps - 2, steps)
    per_context = measure_per_context(ctx, max_batch, n_context, repeats, turn)
    progress("measuring the cost curve", steps - 1, steps)
    discrepancy = exactness(ctx, turn)
    progress("measuring the cost curve", steps, steps)
    return CostCurve(non_decreasing(unpadded), n_context, *discrepancy, per_context,
                     measured_at=time.strftime("%Y-%m-%d %H:%M:%S"), unpadded=tuple(unpadded))


def timed_as_greedy(ctx: Context) -> None:
    """An empty context whose forwards run as a greedy request's do: on the CPU, through the
    exact head where it has one (native/head.h), which makes every row cheaper."""
    ctx.clear()
    if ctx.exact_head:
        ctx.sample_on_device(0)


def quick_measure(ctx: Context, max_batch: int = MAX_BATCH, n_context: int = 256,
                  budget: float = QUICK_SECONDS) -> CostCurve:
    """A coarse curve in about `budget` seconds, for a model's first start: a plain run prices
    a single token, then batches of 2, 4, 8, ... (then 3, 6, 12, ...) are timed twice each, the
    faster kept (the first of a shape may build its graph), while the budget lasts; between
    sizes the curve is interpolated, beyond the largest extended along its last slope. No
    context term; exactness only if this build's is already known."""
    n_context = max(0, min(n_context, ctx.n_ctx - max_batch))
    start = time.perf_counter()
    timed_as_greedy(ctx)
    filler = filler_tokens(ctx, n_context + max_batch)
    ctx.extend(filler[:n_context])
    # Untimed: the first forwards after a load run slow (a single token priced 40% above the
    # whole curve's without this), and the widest batch sizes the compute buffers once.
    time_batch(ctx, filler, n_context, max_batch)
    plain_step_seconds(ctx, filler, n_context, 4)
    times = {1: plain_step_seconds(ctx, filler, n_context, min(8, max_batch))}
    doubling = [n for n in (2, 4, 8, 16, 32, 64, 128) if n < max_batch] + [max_batch]
    between = [n for n in (3, 6, 12, 24, 48, 96) if n < max_batch]
    for n in dict.fromkeys(doubling + between):
        if time.perf_counter() - start > budget and len(times) >= 2:
            break
        times[n] = min(time_batch(ctx, filler, n_context, n) for _ in range(2))
    ctx.clear()
    known = read_exactness(ctx)
    return CostCurve(fill_curve(times, max_batch), n_context, *(known or (0.0, 1)),
                     measured_at=time.strftime("%Y-%m-%d %H:%M:%S"), coarse=True)


def fill_curve(times: dict[int, float], max_batch: int) -> list[float]:
    """A curve of 1..max_batch from the sizes timed (at least two): made non-decreasing first,
    then interpolated, and beyond the largest extended along the last slope. Non-decreasing
    before extending: a busy moment that made the largest size time below the one before gave
    a falling slope, which ran below zero by 64 tokens and priced every batch there."""
    sizes = sorted(times)
    measured = non_decreasing([times[n] for n in sizes])
    seconds = np.interp(range(1, max_batch + 1), sizes, measured)
    if sizes[-1] < max_batch:
        slope = (measured[-1] - measured[-2]) / (sizes[-1] - sizes[-2])
        seconds[sizes[-1]:] = measured[-1] + slope * np.arange(1, max_batch - sizes[-1] + 1)
    return seconds.tolist()


def non_decreasing(seconds) -> list[float]:
    """Each batch size priced as the cheapest width that holds it: a batch of n never costs
    more than one of n+1, since verification pads it there where that is cheaper (the
    curve's `unpadded` times say where)."""
    return np.minimum.accumulate(np.asarray(seconds, dtype=float)[::-1])[::-1].tolist()


def measure_per_context(ctx: Context, max_batch: int, n_context: int, repeats: int,
                        turn: Turn = contextlib.nullcontext) -> tuple[float, ...]:
    """What a token of context adds to a batch of n: batches of 1, 2, 4, ... 32, 48, the widest
    and the one below it timed after n_context tokens, then after LONG_CONTEXT (or as many as the context holds), then after
    n_context again, interpolated between sizes. This machine's speed drifts by 10% from one
    minute to the next, more than what context adds to a small batch: the long times are held
    against the mean of the short ones on either side, which cancels a steady drift, with one
    prompt's worth of decoding (the long context) in all. The sizes below the widest: kernels
    change path with the rows (this CPU's flash attention goes tiled from 64: after 2,048 tokens
    context added 583 µs a token to 48 rows and 166 to 64, so 64's slope priced 33-63 rows at
    0.7x). Empty when the context is too small to tell."""
    n_long = long_context(ctx, max_batch, n_context)
    if not n_long:
        return ()
    sizes = sorted({n for n in (1, 2, 4, 8, 16, 24, 32, 48, max_batch - 1) if 0 < n < max_batch} | {max_batch})
    filler = filler_tokens(ctx, n_long + max_batch)
    rounds = max(2, repeats // 2)

    def phase(n_past: int) -> list[float]:
        """Median seconds per size after n_past tokens, sizes interleaved within each round."""
        ctx.truncate(min(n_past, len(ctx.tokens)))
        while len(ctx.tokens) < n_past:  # a long prompt's worth, a turn per 256 tokens
            with turn():
                ctx.extend(filler[len(ctx.tokens):min(n_past, len(ctx.tokens) + 256)])
        times = [[time_batch(ctx, filler, n_past, n, turn) for n in sizes] for _ in range(rounds)]
        return [statistics.median(t) for t in zip(*times)]

    timed_as_greedy(ctx)
    before, long, after = phase(n_context), phase(n_long), phase(n_context)
    ctx.clear()
    slope = [max(0.0, (t - (b + a) / 2) / (n_long - n_context)) for b, t, a in zip(before, long, after)]
    return tuple(float(x) for x in np.interp(range(1, max_batch + 1), sizes, slope))


def long_context(ctx: Context, max_batch: int, n_context: int = 256) -> int:
    """Where what context adds is measured in this context, 0 if it holds too little to tell."""
    n_long = min(LONG_CONTEXT, ctx.n_ctx - max_batch)
    return n_long if n_long >= n_context + 512 else 0

