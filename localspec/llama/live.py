"""The live cost curve: the measured curve, corrected by what the engine's own forwards cost
as it runs, and priced in the padded shape each batch runs in after the last forward's."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from localspec.llama.context import padded_shape
from localspec.llama.curve import CostCurve, cheapest_from

CONTEXT_STEP = 32  # LiveCurve keeps a curve per this many tokens of context
TOLERANCE = 0.03   # ... and recomputes it when a correction moved by more (3%: a replan costs
                   # about 0.3 ms of a CPU iteration, and a price 3% off barely moves a size)
CARRIED = 16       # forwards a correction an earlier run learnt counts as at most (resume): it
                   # prices a new run's first wide batches, and the run's own forwards soon
                   # outweigh it where the machine changed; below that, half the forwards it
                   # rests on, so a size the drafts stopped visiting fades from start to start
FAR = 3.0          # a log ratio beyond it (20x) is a hiccup, or a record that is not one

SAME, AFTER_ANOTHER = 0, 1  # a forward in the last one's batch shape, or after one of another
KINDS = {"same": SAME, "after_another": AFTER_ANOTHER}


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
    consistent error is still learnt, a step at a time). It is a CostModel, as the CostCurve
    it corrects is: what plans with it asks `at(n_context)`.

    Where batches are padded to a set of shapes (`shapes`: a GPU), the corrections are kept
    twice: for forwards in the last forward's shape and for forwards after one of another.
    A GPU reuses a forward's graph (llama.cpp's, and CUDA's captured one) only while the shape
    stays: on an H200 a 30B-A3B MoE's single token took 3.5 ms after a single token and 9.4 ms
    after 16 rows, which took 12.9 ms after 16 rows and 17.9 after a single token. So a
    batch's price depends on the shape the last forward had, and a smaller batch may stay in
    that shape, padded up to it, when leaving costs more than staying: leaving pays its own
    forward after another shape and, the next time that shape comes back, the difference
    again (pad_to() says which shape a batch of n runs as; at() prices it so). A larger batch
    pays its forward after another shape alone: what follows it is the next plan's. With
    shapes or without, a batch is priced as the cheapest width that holds it and run as that
    (a CPU's flash attention goes tiled from 64 rows: after a long context 55 cost more).

    It is asked twice an iteration, and the answer barely moves: a curve is kept per stretch
    of CONTEXT_STEP tokens of context and last shape, and recomputed only when a correction
    moved by more than TOLERANCE (in log) since it was made.

    What it learnt is kept beside the curve when the engine closes and taken up at the next
    start (learned(), resume()): a cold HumanEval request verifies a few dozen batches wider
    than 2 rows, too few to learn that on this CPU 16 rows cost 10-15% more in the loop than
    the curve's measurement says, and a `localspec generate` is a run of its own every time."""

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
        # Per kind (SAME, AFTER_ANOTHER) and batch size, as lists: observe() reads and writes
        # a few of them every iteration, where numpy's scalar access costs more.
        n = len(base.seconds)
        self.log_ratio = [[0.0] * n, [0.0] * n]
        self.count = [[0.0] * n, [0.0] * n]
        self._factors: np.ndarray | None = np.ones((2, n))  # None: to be recomputed (factors())
        self._base: dict[int, np.ndarray] = {}  # base.unpadded_at() by stretch of context
        self._at: dict[tuple[int, int], tuple[CostCurve, np.ndarray]] = {}  # _plan() by stretch of context and last shape
        self._stray = [[0.0] * n, [0.0] * n]  # per size: forwards, sum of log(seen / base)
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
        lr, r = self.log_ratio[kind][i], math.log(seconds / float(self._base_at(n_context)[i]))
        self._stray[0][i] += 1
        self._stray[1][i] += min(max(r, -FAR), FAR)  # a hiccup of 20x counts as 20x
        r = min(max(r, lr - self.step), lr + self.step)
        count = min(self.count[kind][i] + 1, self.memory)
        lr += (r - lr) / count
        self.count[kind][i], self.log_ratio[kind][i] = count, lr
        # Held against the correction the plan used for this size (a size seen for the first
        # time: its neighbours'), not replanned for every new size (a replan took 0.25 ms of a
        # CPU iteration); where the factors wait to be recomputed, the next plan sees it anyway.
        if self._factors is not None and \
                not abs(lr * count / (count + self.shrink) - math.log(self._factors[kind, i])) <= TOLERANCE:
            self._factors = None
            self._at.clear()

    def learned(self) -> dict[str, dict[int, list[float]]]:
        """The corrections learnt, for resume(): per kind of forward and batch size seen,
        [forwards, mean log(seconds observed / predicted)]."""
        return {name: {i + 1: [count, round(self.log_ratio[kind][i], 6)]
                       for i, count in enumerate(self.count[kind]) if count > 0} for name, kind in KINDS.items()}

    def resume(self, learned) -> None:
        """Start from the corrections an earlier run learnt on this base curve (learned(), read
        back from JSON), each counted as half the forwards it rests on, at most CARRIED: a size
        priced dear is drafted less and so seen less, and its correction must not outlive the
        forwards that would show it wrong. What is not such a record (a cache file edited or
        cut short) is passed over: the curve starts uncorrected."""
        try:
            entries = [(KINDS[name], int(n) - 1, float(count), float(lr))
                       for name, sizes in learned.items() for n, (count, lr) in sizes.items()]
        except (AttributeError, KeyError, TypeError, ValueError):
            return
        for kind, i, count, lr in entries:
            if 0 <= i < len(self.count[kind]) and count > 0 and abs(lr) <= FAR:  # finite, within 20x
                self.count[kind][i], self.log_ratio[kind][i] = min(count / 2, CARRIED), lr
        self._factors = None
        self._at.clear()

    def _base_at(self, n_context: int) -> np.ndarray:
        key = n_context // CONTEXT_STEP
        if key not in self._base:
            self._base[key] = self.base.unpadded_at(n_context)
        return self._base[key]

    def factors(self) -> np.ndarray:
        """Per kind of forward (SAME, AFTER_ANOTHER) and batch size, what the measured curve's
        seconds are multiplied by. A size one kind has not seen takes the other's correction
        where that saw it, else its seen neighbours'."""
        if self._factors is None:
            count = np.array(self.count)
            shrunk = np.array(self.log_ratio) * count / (count + self.shrink)
            factors = np.ones_like(shrunk)
            for kind in (SAME, AFTER_ANOTHER):
                own, other = count[kind] > 0, count[1 - kind] > 0
                known = np.where(own, shrunk[kind], shrunk[1 - kind])
                seen = np.flatnonzero(own | other)
                if len(seen):
                    factors[kind] = np.exp(np.interp(np.arange(len(known)), seen, known[seen]))
            self._factors = factors
        return self._factors

    def pad_to(self, n: int, n_context: int) -> int:
        """The rows a speculating step's batch of n tokens after n_context tokens is best run
        as after the last forward: its own shape, the last forward's where that is larger and
        staying costs less than leaving, or a wider one that costs less at this context (a
        plain step's is its own: Context.launch). Decided on the same prices at() plans with."""
        if n > len(self.base.seconds):
            return self.shape(n)
        return int(self._plan(n_context)[1][n - 1])

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
        n, total = np.array(self._stray)
        if not n.sum():
            return 0, 1.0, {}
        by_batch = {int(i) + 1: round(math.exp(total[i] / n[i]), 3) for i in np.flatnonzero(n >= 4)}
        return int(n.sum()), round(math.exp(total.sum() / n.sum()), 3), by_batch

    def at(self, n_context: int) -> CostCurve:
        return self._plan(n_context)[0]

    def _plan(self, n_context: int) -> tuple[CostCurve, np.ndarray]:
        """The curve at n_context after the last forward's shape, each batch size priced as
        the cheapest width that holds it, and per batch size the rows it runs as (pad_to);
        kept per stretch of context and last shape."""
        key = (n_context // CONTEXT_STEP, self.last_shape)
        plan = self._at.get(key)
        if plan is None:
            base = self._base_at(n_context)
            leave, stay, stays = self._choices(base)
            seconds = np.minimum(leave, stay)
            best = cheapest_from(seconds)
            rows = np.where(stays[best], self.last_shape, self._own_shapes(len(base))[best] + 1)
            curve = replace(self.base, seconds=seconds[best].tolist(), n_context=n_context, unpadded=())
            plan = self._at[key] = (curve, rows)
        return plan

    @property
    def seconds(self) -> list[float]:
        return self.at(self.base.n_context).seconds

    def cost(self, n: int) -> float:
        return self.at(self.base.n_context).cost(n)

    def price(self, n: int, n_context: int) -> float:
        return self.at(n_context).price(n, n_context)

    @property
    def discrepancy(self) -> float:
        return self.base.discrepancy

    @property
    def exact_batch(self) -> int:
        return self.base.exact_batch
