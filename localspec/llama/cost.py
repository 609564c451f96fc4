"""The cost curve: seconds for one target forward of a batch of n tokens, n = 1..N, and what
each token of context adds to it.

Everything that sizes speculation plans with it. It is measured once per model, build and
thread count on this machine and cached, because it is the machine that decides its shape
(flat on a GPU, nearly linear on a small CPU). Context matters too: every row of a batch
attends to the whole cache, so after a long prompt (an editor's file) a wide batch costs
more forwards than after a short one."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import re
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, ContextManager

import llama_cpp as ll
import numpy as np

from localspec import _native
from localspec.errors import LocalspecError
from localspec.llama.context import Context, padded_shape
from localspec.paths import cache_dir
from localspec.progress import Progress

MAX_BATCH = 64  # a long draft (copying) verified at once
CONTEXT_STEP = 32  # LiveCurve keeps a curve per this many tokens of context
TOLERANCE = 0.01   # ... and recomputes it when a correction moved by more (1%)
LONG_CONTEXT = 2048  # where the second, coarser curve is measured (what context adds)
PLAIN_MARGIN = 0.2  # a curve whose single token strays more from a plain run is measured again
LOOP_MARGIN = 0.25  # ... and a cached one from which the loop's forwards strayed more
LOOP_FORWARDS = 32  # ... over at least this many forwards
QUICK_SECONDS = 3.0  # what the coarse curve a model starts on may take to measure

# Held around each untimed stretch of a measurement (a forward and its clock): the engine's
# measurement between requests waits there for its turn.
Turn = Callable[[], ContextManager]


@dataclass(frozen=True)
class CostCurve:
    seconds: list[float]  # seconds[n-1]: one forward of n tokens after `n_context` tokens
    n_context: int
    # Largest |logit| difference between a batched forward and single-token forwards of the
    # same positions: below it, two computations may rank two tokens differently.
    discrepancy: float = 0.0
    # Largest n such that batches of 2..n reproduced single-token logits bit for bit (1: none).
    exact_batch: int = 1
    # per_context[n-1]: seconds one more token of context adds to a batch of n (attention:
    # every row reads the whole cache); empty: not measured, the curve holds at any context.
    per_context: tuple[float, ...] = ()
    measured_at: str = ""  # local time, as the machine's clock had it
    # Measured in seconds at start-up (a few sizes, no context term, exactness only if known):
    # the engine plans on it while it measures the whole curve between requests.
    coarse: bool = False

    def cost(self, n: int) -> float:
        return self.seconds[min(n, len(self.seconds)) - 1]

    def at(self, n_context: int) -> CostCurve:
        """This curve after n_context tokens of context instead of self.n_context."""
        if not self.per_context or n_context == self.n_context:
            return self
        return replace(self, seconds=self.seconds_at(n_context).tolist(), n_context=n_context)

    def seconds_at(self, n_context: int) -> np.ndarray:
        """at(n_context).seconds as an array (asked twice an iteration: no lists, no copies)."""
        s, per_context = self._arrays
        if not self.per_context or n_context == self.n_context:
            return s
        return np.minimum.accumulate(np.maximum(s + (n_context - self.n_context) * per_context, 0.5 * s)[::-1])[::-1]

    @functools.cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.seconds, float), np.asarray(self.per_context, float)

    def ratio(self, n: int) -> float:
        """Cost of a batch of n relative to a single-token forward."""
        return self.cost(n) / self.seconds[0]

    def price(self, n: int, n_context: int) -> float:
        """Seconds for one forward of n tokens after n_context (beyond the curve's widest
        batch, that batch's seconds per token: a long catch-up is several such batches)."""
        s = self.seconds_at(n_context)
        return float(s[n - 1]) if n <= len(s) else float(s[-1]) * n / len(s)


SAME, AFTER_ANOTHER = 0, 1  # a forward in the last one's batch shape, or after one of another


class LiveCurve:
    """The measured curve, corrected by what the engine's forwards cost as it runs. A curve
    measured once can be wrong for good: taken while something else loaded the cores, a
    single token looked 25% dearer and a batch of 2 1.4 single tokens instead of 1.8, and
    every draft was sized for a machine that was not there
    (docs/benchmarks-history.md#a-cost-curve-measured-under-load-and-the-live-curve-2026-11-25).
    So each verification forward is held against the curve: per batch size, a running mean of
    log(seconds observed / seconds predicted), shrunk towards 0 while it rests on few
    forwards, scales that size; sizes not yet seen take their seen neighbours' correction.
    One forward far from the mean counts as one `step` away from it (a robust mean: a
    consistent error is still learnt, a step at a time). What plans with it asks
    `at(n_context)`, as of a CostCurve.

    Where batches are padded to a set of shapes (`shapes`: a GPU), the corrections are kept
    twice: for forwards in the last forward's shape and for forwards after one of another.
    A GPU reuses a forward's graph (llama.cpp's, and CUDA's captured one) only while the shape
    stays: on an H200 a 30B-A3B MoE's single token took 3.5 ms after a single token and 9.4 ms
    after 16 rows, which took 12.9 ms after 16 rows and 17.9 after a single token. So a
    batch's price depends on the shape the last forward had, and a smaller batch may stay in
    that shape, padded up to it, when leaving costs more than staying: leaving pays its own
    forward after another shape and, the next time that shape comes back, the difference
    again (pad_to() says which shape a batch of n runs as; at() prices it so). A larger batch
    pays its forward after another shape alone: what follows it is the next plan's.

    It is asked twice an iteration, and the answer barely moves: a curve is kept per stretch
    of CONTEXT_STEP tokens of context and last shape, and recomputed only when a correction
    moved by more than TOLERANCE (in log) since it was made."""

    def __init__(self, base: CostCurve, shrink: float = 4.0, memory: int = 50, step: float = 0.3):
        # shrink: forwards worth half a correction; memory: the running mean's window in
        # forwards; step: the furthest one forward moves the mean, in log
        self.shrink, self.memory, self.step = shrink, memory, step
        self.shapes: tuple[int, ...] = ()  # the padded shapes (the engine sets its context's)
        self._own: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}  # _own_shapes()
        self.rebase(base)

    def rebase(self, base: CostCurve) -> None:
        """Correct `base` from here on, starting afresh (the whole curve measured in place of
        the coarse one a model started on)."""
        self.base = base
        size = (2, len(base.seconds))  # SAME, AFTER_ANOTHER
        self.log_ratio = np.zeros(size)
        self.count = np.zeros(size)
        self._factors: np.ndarray | None = np.ones(size)
        self._applied = np.full(size, np.nan)  # the corrections the factors hold
        self._base: dict[int, np.ndarray] = {}  # base.seconds_at() by stretch of context
        self._at: dict[tuple[int, int], tuple[CostCurve, np.ndarray]] = {}  # _plan() by stretch of context and last shape
        self._stray = np.zeros((2, len(base.seconds)))  # per size: forwards, sum of log(seen / base)
        self.last_shape = 0  # the shape the last forward ran in (0: none, or no shapes)

    def pad_with(self, shapes: tuple[int, ...]) -> None:
        """Price batches in these padded shapes (a context's) from here on."""
        if shapes != self.shapes:
            self.shapes, self.last_shape = shapes, 0
            self._at.clear()

    def _own_shapes(self, size: int) -> np.ndarray:
        """Per batch size n (1..size), the index of the shape it is padded to."""
        key = (size, self.shapes)
        if key not in self._own:
            self._own[key] = np.minimum([self.shape(n) for n in range(1, size + 1)], size) - 1
        return self._own[key]

    def shape(self, n: int) -> int:
        """The shape a batch of n tokens is padded to (n itself beyond the largest)."""
        return padded_shape(self.shapes, n)

    def observe(self, n: int, n_context: int, seconds: float) -> None:
        """A forward of a batch of n rows (padding included) after n_context tokens took
        `seconds`."""
        i = min(n, len(self.base.seconds)) - 1
        if i < 0 or seconds <= 0:
            return
        kind = AFTER_ANOTHER if self.shapes and self.last_shape not in (0, n) else SAME
        self.last_shape = n if self.shapes else 0
        # One forward may be an outlier (the first of a new batch shape allocates its graph; the
        # machine hiccups): it moves the mean by at most `step` in log, so one slow batch cannot
        # price its size out of the drafts that would measure it again.
        lr, r = float(self.log_ratio[kind, i]), math.log(seconds / float(self._base_at(n_context)[i]))
        self._stray[0, i] += 1
        self._stray[1, i] += min(max(r, -3.0), 3.0)  # a hiccup of 20x counts as 20x
        r = min(max(r, lr - self.step), lr + self.step)
        count = min(float(self.count[kind, i]) + 1, self.memory)
        lr += (r - lr) / count
        self.count[kind, i], self.log_ratio[kind, i] = count, lr
        if not abs(lr * count / (count + self.shrink) - self._applied[kind, i]) <= TOLERANCE:  # NaN: new
            self._factors = None
            self._at.clear()

    def _base_at(self, n_context: int) -> np.ndarray:
        key = n_context // CONTEXT_STEP
        if key not in self._base:
            self._base[key] = self.base.seconds_at(n_context)
        return self._base[key]

    def factors(self) -> np.ndarray:
        """Per kind of forward (SAME, AFTER_ANOTHER) and batch size, what the measured curve's
        seconds are multiplied by. A size one kind has not seen takes the other's correction
        where that saw it, else its seen neighbours'."""
        if self._factors is None:
            shrunk = self.log_ratio * self.count / (self.count + self.shrink)
            self._applied[self.count > 0] = shrunk[self.count > 0]
            factors = np.ones_like(shrunk)
            for kind in (SAME, AFTER_ANOTHER):
                own, other = self.count[kind] > 0, self.count[1 - kind] > 0
                known = np.where(own, shrunk[kind], shrunk[1 - kind])
                seen = np.flatnonzero(own | other)
                if len(seen):
                    factors[kind] = np.exp(np.interp(np.arange(len(known)), seen, known[seen]))
            self._factors = factors
        return self._factors

    def pad_to(self, n: int, n_context: int) -> int:
        """The shape a speculating step's batch of n tokens after n_context tokens is best run
        in after the last forward: its own, or the last forward's where that is larger and
        staying costs less than leaving (a plain step's is its own: Context.launch). Decided
        on the same prices at() plans with."""
        own = self.shape(n)
        if own < self.last_shape <= len(self.base.seconds) and self._plan(n_context)[1][own - 1]:
            return self.last_shape
        return own

    def _choices(self, base: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each batch size n (1..): the seconds of running it in its own shape, of staying
        in the last forward's, and whether staying is the cheaper, on the base curve `base`."""
        f, size, last = self.factors(), len(base), self.last_shape
        own = self._own_shapes(size)
        if not last or last > size:
            return base[own] * f[SAME, own], np.full(size, np.inf), np.zeros(size, bool)
        i = last - 1
        # A smaller batch that leaves the last shape pays, besides its own forward after another
        # shape, what coming back to that shape costs more later (a larger one cannot stay).
        back = np.where(own < i, base[i] * max(0.0, f[AFTER_ANOTHER, i] - f[SAME, i]), 0.0)
        leave = np.where(own == i, base[own] * f[SAME, own], base[own] * f[AFTER_ANOTHER, own] + back)
        stay = np.where(own <= i, base[i] * f[SAME, i], np.inf)
        return leave, stay, stay <= leave

    def stray(self) -> tuple[int, float, dict[int, float]]:
        """How far the forwards seen strayed from the base curve: their number, the geometric
        mean of seen / predicted over all of them, and per batch size seen 4 times or more."""
        n, total = self._stray
        if not n.sum():
            return 0, 1.0, {}
        by_batch = {int(i) + 1: round(math.exp(total[i] / n[i]), 3) for i in np.flatnonzero(n >= 4)}
        return int(n.sum()), round(math.exp(total.sum() / n.sum()), 3), by_batch

    def at(self, n_context: int) -> CostCurve:
        return self._plan(n_context)[0]

    def _plan(self, n_context: int) -> tuple[CostCurve, np.ndarray]:
        """The curve at n_context after the last forward's shape, and per batch size whether
        it stays in that shape; kept per stretch of context and last shape."""
        key = (n_context // CONTEXT_STEP, self.last_shape)
        plan = self._at.get(key)
        if plan is None:
            leave, stay, stays = self._choices(self._base_at(n_context))
            seconds = np.minimum(leave, stay)
            curve = replace(self.base, seconds=np.minimum.accumulate(seconds[::-1])[::-1].tolist(),
                            n_context=n_context)
            plan = self._at[key] = (curve, stays)
        return plan

    @property
    def seconds(self) -> list[float]:
        return self.at(self.base.n_context).seconds

    @property
    def discrepancy(self) -> float:
        return self.base.discrepancy

    @property
    def exact_batch(self) -> int:
        return self.base.exact_batch


POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64)


def stable_shapes(curve, sizes) -> tuple[int, ...]:
    """Of the batch sizes verification may pad to, those worth a shape of their own on `curve`
    (a CostCurve or LiveCurve): each costs at least 5% less than the next larger one kept (on
    the H200's 7B a batch of 16 costs what 8 does: 8 goes, and a tree of 9-16 rows pads to 16).
    A single row stays: plain steps are never padded."""
    seconds = curve.seconds
    cost = lambda n: seconds[min(n, len(seconds)) - 1]  # noqa: E731
    kept: list[int] = []
    for n in sorted(sizes, reverse=True):
        if not kept or cost(n) < 0.95 * cost(kept[-1]):
            kept.append(n)
    return tuple(sorted(set(kept) | {1}))


def filler_tokens(ctx: Context, n: int) -> list[int]:
    """Ordinary (not special) token ids spread over the vocabulary: timing and rounding do not
    depend on what the tokens say."""
    return [100 + (i * 7919) % (ctx.model.n_vocab - 200) for i in range(n)]


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes measured: every one up to 16, then 24, 32, 48, 64, ... (a long draft's
    verification; between them the curve is interpolated)."""
    sizes = list(range(1, min(max_batch, 16) + 1))
    n = 16
    while n < max_batch:
        n = min(max_batch, n + n // 2 if n & (n - 1) == 0 else n + n // 3)
        sizes.append(n)
    return sizes


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
        ctx.clear()
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
        measured = non_decreasing([statistics.median(times[n]) for n in sizes])
        plain = plain_step_seconds(ctx, filler, n_context, max(2, min(16, max_batch)), turn)
        ctx.clear()
        stray = abs(math.log(plain / measured[0]))
        if best is None or stray < best[0]:
            best = (stray, measured)
        if stray <= math.log(1 + PLAIN_MARGIN):
            break
        progress(f"measuring the cost curve again (a single token took {measured[0] * 1e3:.1f} ms "
                 f"there, {plain * 1e3:.1f} ms in a plain run)", 0, steps)
    measured = best[1]
    seconds = [float(x) for x in np.interp(range(1, max_batch + 1), sizes, measured)]
    progress("measuring the cost curve", steps - 2, steps)
    per_context = measure_per_context(ctx, max_batch, n_context, repeats, turn)
    progress("measuring the cost curve", steps - 1, steps)
    discrepancy = exactness(ctx, turn)
    progress("measuring the cost curve", steps, steps)
    return CostCurve(seconds, n_context, *discrepancy, per_context,
                     measured_at=time.strftime("%Y-%m-%d %H:%M:%S"))


def quick_measure(ctx: Context, max_batch: int = MAX_BATCH, n_context: int = 256,
                  budget: float = QUICK_SECONDS) -> CostCurve:
    """A coarse curve in about `budget` seconds, for a model's first start: a plain run prices
    a single token, then batches of 2, 4, 8, ... (then 3, 6, 12, ...) are timed twice each, the
    faster kept (the first of a shape may build its graph), while the budget lasts; between
    sizes the curve is interpolated, beyond the largest extended along its last slope. No
    context term; exactness only if this build's is already known."""
    n_context = max(0, min(n_context, ctx.n_ctx - max_batch))
    start = time.perf_counter()
    ctx.clear()
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
    known = _read_exactness(ctx)
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


def non_decreasing(seconds) -> list[float]:
    """A batch of n never costs more than one of n+1 (padding it would do), so where noise
    says otherwise the larger batch's time is the better estimate."""
    return np.minimum.accumulate(np.asarray(seconds, dtype=float)[::-1])[::-1].tolist()


def measure_per_context(ctx: Context, max_batch: int, n_context: int, repeats: int,
                        turn: Turn = contextlib.nullcontext) -> tuple[float, ...]:
    """What a token of context adds to a batch of n: batches of 1, 2, 4, ... timed after
    n_context tokens, then after LONG_CONTEXT (or as many as the context holds), then after
    n_context again, interpolated between sizes. This machine's speed drifts by 10% from one
    minute to the next, more than what context adds to a small batch: the long times are held
    against the mean of the short ones on either side, which cancels a steady drift, with one
    prompt's worth of decoding (the long context) in all. Empty when the context is too small
    to tell."""
    n_long = long_context(ctx, max_batch, n_context)
    if not n_long:
        return ()
    sizes = [n for n in (1, 2, 4, 8, 16, 32, 64) if n < max_batch] + [max_batch]
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

    ctx.clear()
    before, long, after = phase(n_context), phase(n_long), phase(n_context)
    ctx.clear()
    slope = [max(0.0, (t - (b + a) / 2) / (n_long - n_context)) for b, t, a in zip(before, long, after)]
    return tuple(float(x) for x in np.interp(range(1, max_batch + 1), sizes, slope))


def long_context(ctx: Context, max_batch: int, n_context: int = 256) -> int:
    """Where what context adds is measured in this context, 0 if it holds too little to tell."""
    n_long = min(LONG_CONTEXT, ctx.n_ctx - max_batch)
    return n_long if n_long >= n_context + 512 else 0


def measure_discrepancy(ctx: Context, max_batch: int = 12, contexts=(64, 320),
                        turn: Turn = contextlib.nullcontext) -> tuple[float, int]:
    """Decode the same positions one token at a time and as batches of the measured sizes up
    to max_batch, after a short and a longer context; return the largest logit difference seen
    and the largest n for which batches of 2..n were exact. llama.cpp's batched kernels need
    not reproduce single-token results bit for bit: on a CPU, repacked weights switch to
    matrix-matrix kernels at 4 rows, and flash attention over an f16 cache splits a single
    token's work across threads once the cache passes 256 cells
    (docs/benchmarks.md#kernel-settings)."""
    sizes = [n for n in batch_sizes(max_batch) if n >= 2]
    # A small context (--ctx 256) holds less than the longer one: as much as it holds.
    contexts = sorted({max(0, min(n, ctx.n_ctx - max_batch)) for n in contexts})
    worst_by_size = [max(d) for d in zip(*(batch_discrepancy(ctx, n, sizes, turn) for n in contexts))]
    exact = next((n - 1 for n, w in zip(sizes, worst_by_size) if w > 0), max_batch)
    return max(worst_by_size), min(exact, 16)


def batch_discrepancy(ctx: Context, n_context: int, sizes: list[int],
                      turn: Turn = contextlib.nullcontext) -> list[float]:
    """After n_context filler tokens: the largest logit difference between a batch of n and
    single-token decoding of the same positions, for each n of `sizes`."""
    ctx.clear()
    tokens = filler_tokens(ctx, n_context + max(sizes))
    single = []
    with turn():
        ctx.extend(tokens[:n_context])
        for t in tokens[n_context:]:
            ctx.append(t)
            single.append(ctx.logits(0).copy())
        ctx.truncate(n_context)
    worst = []
    for n in sizes:
        with turn():
            ctx.extend(tokens[n_context:n_context + n], n_outputs=n)
            worst.append(max(float(abs(ctx.logits(i) - single[i]).max()) for i in range(n)))
            ctx.truncate(n_context)
    ctx.clear()
    return worst


def cache_key(ctx: Context) -> str:
    st = ctx.model.path.stat()
    parts = ["v5", str(ctx.model.path.resolve()), str(st.st_size), str(st.st_mtime_ns), ll.__version__,
             _native.system_info(), str(ctx.config.n_threads), ctx.config.flash_attn,
             ctx.config.kv_type, str(ctx.model.repack), str(ctx.model.n_gpu_layers),
             *ctx.model.rpc]  # over a network, the link shapes the curve
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cache_path(ctx: Context) -> Path:
    return cache_dir() / "cost" / f"{cache_key(ctx)}.json"


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


def keep(ctx: Context, curve: CostCurve, again: bool = False) -> None:
    """Cache `curve` as ctx's. `again`: it was measured because the one before strayed (a
    whole curve that replaces a coarse one inherits that)."""
    path = cache_path(ctx)
    try:
        old = json.loads(path.read_text())
        again = again or bool(old.get("coarse") and old.get("measured_again"))
    except (OSError, ValueError, AttributeError):
        pass
    _write_json(path, asdict(curve) | {"model": str(ctx.model.path), "llama_cpp": ll.__version__,
                                       "measured_again": again})


def read_loop(path: Path) -> dict | None:
    """What the loop last recorded of its forwards against the curve cached in `path`:
    {"forwards", "ratio" (observed / predicted, all sizes), "by_batch", "at", "measured_again":
    whether this curve was measured because an earlier one strayed}."""
    try:
        data = json.loads(Path(path).read_text())
        loop = data.get("loop")
        loop = loop | {"measured_again": bool(data.get("measured_again"))} if isinstance(loop, dict) else None
        return loop if isinstance(loop, dict) and float(loop["ratio"]) > 0 else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def strayed(loop: dict | None) -> bool:
    """Did the loop's forwards stray from the curve by more than LOOP_MARGIN, over enough of
    them to tell?"""
    return bool(loop) and loop["forwards"] >= LOOP_FORWARDS and abs(math.log(loop["ratio"])) > math.log(1 + LOOP_MARGIN)


def record_loop(path: Path, live: LiveCurve) -> None:
    """Keep what `live`'s forwards took against its base curve beside that curve in its cache
    file (cost_curve measures again from the next start when they strayed; `localspec cost`
    shows it). Nothing when the file holds another curve now."""
    forwards, ratio, by_batch = live.stray()
    if not forwards:
        return
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(data, dict) or data.get("seconds") != live.base.seconds:
        return
    data["loop"] = {"forwards": forwards, "ratio": ratio, "by_batch": by_batch,
                    "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    _write_json(path, data)


def read_curve(path: Path) -> CostCurve:
    """A curve from a file: the JSON cost_curve caches, or the table `localspec cost` prints
    (another machine's, say)."""
    try:
        text = Path(path).read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = _from_table(text)
        curve = CostCurve([float(x) for x in data["seconds"]], int(data["n_context"]),
                          float(data.get("discrepancy", 0.0)), int(data.get("exact_batch", 1)),
                          tuple(float(x) for x in data.get("per_context", ())),
                          str(data.get("measured_at", "")), bool(data.get("coarse", False)))
        if not curve.seconds or not all(0 < x < math.inf for x in curve.seconds) or \
                not all(0 <= x < math.inf for x in curve.per_context) or curve.n_context < 0:
            raise ValueError("its times must be positive and finite")
        return curve
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise LocalspecError(f"{path}: not a cost curve ({e})") from None


def _from_table(text: str) -> dict:
    """The curve in the markdown table `localspec cost` prints: per batch, ms after the
    heading's context and ms after 4,096 tokens."""
    n_context = int(re.search(r"after (\d+) tokens of context", text).group(1))
    rows = [tuple(float(x) for x in m.groups()) for m in re.finditer(
        r"^\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*[\d.]+\s*\|\s*([\d.]+)\s*\|", text, re.M)]
    if [int(n) for n, _, _ in rows] != list(range(1, len(rows) + 1)):
        raise ValueError("the table's batches are not 1, 2, 3, ...")
    return {"seconds": [ms / 1e3 for _, ms, _ in rows], "n_context": n_context,
            "per_context": [max(0.0, (long - ms) / 1e3 / (4096 - n_context)) for _, ms, long in rows]}


def planning_curve(path: Path, ctx: Context) -> CostCurve:
    """The curve in `path` to plan with, and this machine's own exactness (how far its batched
    forwards reproduce single tokens: a property of this build, not of that machine's
    timing), measured once and cached."""
    discrepancy, exact_batch = exactness(ctx)
    return replace(read_curve(path), discrepancy=discrepancy, exact_batch=exact_batch)


def exactness(ctx: Context, turn: Turn = contextlib.nullcontext) -> tuple[float, int]:
    """measure_discrepancy's answer for this build and settings, measured once and cached."""
    known = _read_exactness(ctx)
    if known is None:
        known = measure_discrepancy(ctx, turn=turn)
        _write_json(_exactness_path(ctx), list(known))
    return known


def _exactness_path(ctx: Context) -> Path:
    return cache_dir() / "cost" / f"exact-{cache_key(ctx)}.json"


def _read_exactness(ctx: Context) -> tuple[float, int] | None:
    try:
        discrepancy, exact_batch = json.loads(_exactness_path(ctx).read_text())
        return float(discrepancy), int(exact_batch)
    except (OSError, ValueError, TypeError):
        return None


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
