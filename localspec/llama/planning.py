"""The cost curve an engine plans on, and its measurement: at a model's first start a coarse
curve measured in seconds, then the whole curve measured between requests (a forward per turn
of the engine's request lock, once it has idled REFINE_IDLE seconds) in a context of its own,
cached and planned on in place of the coarse one; corrected all along by the loop's forwards
(LiveCurve), and how far they strayed and what was learnt kept beside it when the engine
closes (the next start resumes it)."""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

from localspec.errors import LocalspecError
from localspec.llama.context import Context
from localspec.llama.curve import MAX_BATCH, CostModel
from localspec.llama.curve_cache import cache_path, keep, read_loop, record_loop
from localspec.llama.exactness import exactness, planning_curve
from localspec.llama.live import LiveCurve
from localspec.llama.measure import LONG_CONTEXT, cost_curve, measure
from localspec.progress import Progress

REFINE_IDLE = 1.0  # seconds without a request before the whole curve's measurement goes on


class Planning:
    def __init__(self, ctx: Context, progress: Progress, lock: threading.Lock, idle: Callable[[], float],
                 curve_file: str = "", flat: bool = False, whole: bool = False, refine: bool = True,
                 strict: bool = False):
        """`ctx`: the engine's context a curve is measured in and cached for. `lock`: the
        engine's request lock, which the measurement takes turns with, once `idle()` (seconds
        since the last request ended) says no request has run for REFINE_IDLE. The rest as
        EngineConfig's curve, flat_cost, whole_curve, refine_curve and strict say."""
        self.ctx, self.progress, self.lock, self.idle = ctx, progress, lock, idle
        self.curve_file, self.flat, self.whole, self.refine = curve_file, flat, whole, refine
        self.strict = strict
        self._curve: CostModel | None = None
        self._closing = threading.Event()
        self._refiner: threading.Thread | None = None
        self.refining = threading.Event()  # set once the whole curve's measurement has begun

    def prepare(self) -> CostModel:
        """The cost curve, measured (or read) the first time it is asked, once per model and
        machine, then corrected by what this engine's forwards cost (flat_cost: a curve held
        flat; curve_file: the one in that file)."""
        if self._curve is None and self.curve_file:
            self._curve = planning_curve(Path(self.curve_file), self.ctx)
        if self._curve is None:
            curve = cost_curve(self.ctx, progress=self.progress, quick=not self.whole)
            if self.flat:
                self._curve = replace(curve, seconds=[curve.seconds[0]] * len(curve.seconds), per_context=(), unpadded=())
            else:
                self._curve = live = LiveCurve(curve)
                live.resume((read_loop(cache_path(self.ctx)) or {}).get("learned", {}))
                if curve.coarse and self.refine:
                    self._refiner = threading.Thread(target=self._refine, args=(live,), name="localspec-curve",
                                                     daemon=True)
                    _MEASURING.add(self)
                    self._refiner.start()
        return self._curve

    @property
    def curve(self) -> CostModel:
        """The cost curve prepare() made."""
        if self._curve is None:
            raise LocalspecError("no cost curve yet: prepare() measures it")
        return self._curve

    @property
    def measured(self) -> bool:
        """Whether there is a curve to plan on yet (prepare() measures one)."""
        return self._curve is not None

    def exactness(self) -> tuple[float, int]:
        """How far batched forwards reproduce single tokens here: (the largest logit difference,
        the largest batch that was exact), as the whole cost curve measures it."""
        curve = self.prepare()
        return exactness(self.ctx) if curve.base.coarse else (curve.discrepancy, curve.exact_batch)

    def check_strict(self, temperature: float) -> None:
        if self.strict and temperature > 0:
            raise LocalspecError("--strict applies to greedy decoding (temperature 0)")

    def strict_batch(self) -> int | None:
        """The largest batch verification may use: under --strict, the largest that reproduces
        single tokens here (bit for bit: greedy output is plain decoding's), else no limit."""
        return self.exactness()[1] if self.strict else None

    def _refine(self, live: LiveCurve) -> None:
        """The whole cost curve, measured in a context of its own between requests, then
        cached and planned on by `live` in place of the coarse one."""
        try:
            with self._turn():
                config = self.ctx.config
                ctx = Context(self.ctx.model, replace(config, n_ctx=min(config.n_ctx, LONG_CONTEXT + MAX_BATCH)))
            self.refining.set()
            try:
                curve = measure(ctx, turn=self._turn)
            finally:
                with self._turn(closing=True):
                    ctx.close()
            keep(self.ctx, curve)
            with self.lock:
                live.rebase(curve)
        except _Closing:
            pass

    @contextlib.contextmanager
    def _turn(self, closing: bool = False) -> Iterator[None]:
        """The engine's request lock for the curve's measurement, once no request has run for
        REFINE_IDLE seconds (at once with `closing`); _Closing when the engine closes first."""
        while True:
            if self._closing.is_set() and not closing:
                raise _Closing
            wait = 0.0 if closing else REFINE_IDLE - self.idle()
            if wait > 0:
                self._closing.wait(wait)
            elif self.lock.acquire(timeout=0.1):
                if closing or self.idle() >= REFINE_IDLE:
                    break
                self.lock.release()
        try:
            yield
        finally:
            self.lock.release()

    def close(self) -> None:
        """Stop the measurement under way, if any (after the forward it is in), and keep how
        far the loop's forwards strayed from the curve beside it (the next start reads it)."""
        self._closing.set()
        if self._refiner is not None:
            self._refiner.join()
        if isinstance(self._curve, LiveCurve):
            record_loop(cache_path(self.ctx), self._curve)


class _Closing(Exception):
    """The engine closed while its curve was being measured."""


_MEASURING: weakref.WeakSet[Planning] = weakref.WeakSet()  # engines whose curve a thread measures


@atexit.register
def _stop_measuring() -> None:
    """At the interpreter's exit, end each measurement under way after its forward: a script
    that never closed its engines otherwise freed their contexts under a thread inside
    llama_decode (a segfault at exit, seen with two engines of a new model)."""
    for planning in list(_MEASURING):
        planning._closing.set()
        if planning._refiner is not None:
            planning._refiner.join()
