"""The cost curve: seconds for one target forward of a batch of n tokens, n = 1..N, and what
each token of context adds to it; and CostModel, what everything that sizes speculation plans
with asks of one.

Context matters: every row of a batch attends to the whole cache, so after a long prompt (an
editor's file) a wide batch costs more forwards than after a short one, and not evenly: this
CPU's flash attention goes tiled from 64 rows, which after 3,841 tokens made 64 rows cost 2.9 s
against 4.0 s for 55. A batch is priced as the cheapest width that holds it, and verification
pads it to that width (pad_to). A curve is measured (measure.py) and cached (curve_cache.py)
per model and machine, corrected by the engine's own forwards as it runs (live.py), or read
from a file: another machine's (read_curve)."""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from localspec.errors import LocalspecError

MAX_BATCH = 64  # a long draft (copying) verified at once
POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64)


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
    # unpadded[n-1]: one forward of exactly n rows, where `seconds` prices n as the cheapest
    # width that holds it (empty: the same). A CPU's kernels run a batch in blocks (this one's
    # in 16, then 4, then single rows), so 12 rows can cost more than 16: verification pads
    # to the cheaper width, which it can see only here.
    unpadded: tuple[float, ...] = ()

    def cost(self, n: int) -> float:
        return self.seconds[min(n, len(self.seconds)) - 1]

    def at(self, n_context: int) -> CostCurve:
        """This curve after n_context tokens of context instead of self.n_context."""
        if not self.per_context or n_context == self.n_context:
            return self
        unpadded = self.unpadded_at(n_context)
        return replace(self, seconds=np.minimum.accumulate(unpadded[::-1])[::-1].tolist(), n_context=n_context,
                       unpadded=tuple(unpadded.tolist()) if self.unpadded else ())

    def seconds_at(self, n_context: int) -> np.ndarray:
        """at(n_context).seconds as an array (asked twice an iteration: no lists, no copies):
        each batch size priced as the cheapest width that holds it (pad_to)."""
        if not self.per_context or n_context == self.n_context:
            return self._arrays[0]
        return np.minimum.accumulate(self.unpadded_at(n_context)[::-1])[::-1]

    def unpadded_at(self, n_context: int) -> np.ndarray:
        """Per batch size, one forward of exactly that many rows after n_context tokens (never
        below half of what it costs at the curve's own context)."""
        s, per_context = self._arrays
        if self.unpadded:
            s = self._unpadded
        if not self.per_context or n_context == self.n_context:
            return s
        return np.maximum(s + (n_context - self.n_context) * per_context, 0.5 * s)

    def pad_to(self, n: int, n_context: int) -> int:
        """The rows a verification batch of n is best run as after n_context tokens: the
        cheapest width from n on (n itself where none is cheaper, or beyond the curve)."""
        if n > len(self.seconds) or not (self.per_context or self.unpadded):
            return n
        return int(cheapest_from(self.unpadded_at(n_context))[n - 1]) + 1

    @functools.cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.seconds, float), np.asarray(self.per_context, float)

    @functools.cached_property
    def _unpadded(self) -> np.ndarray:
        return np.asarray(self.unpadded, float)

    def ratio(self, n: int) -> float:
        """Cost of a batch of n relative to a single-token forward."""
        return self.cost(n) / self.seconds[0]

    def price(self, n: int, n_context: int) -> float:
        """Seconds for one forward of n tokens after n_context (beyond the curve's widest
        batch, that batch's seconds per token: a long catch-up is several such batches)."""
        s = self.seconds_at(n_context)
        return float(s[n - 1]) if n <= len(s) else float(s[-1]) * n / len(s)

    @property
    def base(self) -> CostCurve:
        """Itself: a curve held as it is has no correction to leave out."""
        return self

    def observe(self, n: int, n_context: int, seconds: float) -> None:
        """Nothing: a curve held as it is (another machine's, or flat) is not corrected by what
        this machine's forwards cost."""


class CostModel(Protocol):
    """What plans with a cost curve asks of it: a CostCurve, held as it was measured or read
    (another machine's, or held flat), or a LiveCurve, which corrects one by what the engine's
    forwards cost."""

    @property
    def base(self) -> CostCurve:
        """The curve as measured or read, before any correction."""
        ...

    @property
    def seconds(self) -> list[float]:
        """seconds[n-1]: one forward of n tokens after base.n_context tokens of context."""
        ...

    @property
    def discrepancy(self) -> float:
        """The base curve's (CostCurve.discrepancy): this build's, not corrected."""
        ...

    @property
    def exact_batch(self) -> int:
        """The base curve's (CostCurve.exact_batch)."""
        ...

    def at(self, n_context: int) -> CostCurve:
        """The curve to plan with after n_context tokens of context."""
        ...

    def cost(self, n: int) -> float:
        """Seconds for one forward of n tokens after base.n_context."""
        ...

    def price(self, n: int, n_context: int) -> float:
        """Seconds for one forward of n tokens after n_context."""
        ...

    def pad_to(self, n: int, n_context: int) -> int:
        """The rows a speculating batch of n tokens after n_context runs as, padding included:
        the width its price is (CostCurve.pad_to; LiveCurve.pad_to with padded shapes)."""
        ...

    def observe(self, n: int, n_context: int, seconds: float) -> None:
        """A verification forward of n rows after n_context tokens took `seconds`."""
        ...


def cheapest_from(seconds: np.ndarray) -> np.ndarray:
    """Per index i, the index j >= i of the least seconds (the first of equals: a batch is
    padded only where that is cheaper): the first j from i on that costs no more than any
    after it (no loop: it runs on every replan)."""
    last = len(seconds)
    cheapest_after = np.minimum.accumulate(seconds[::-1])[::-1]
    candidates = np.where(seconds <= cheapest_after, np.arange(last), last)
    return np.minimum.accumulate(candidates[::-1])[::-1]


def stable_shapes(curve: CostModel, sizes) -> tuple[int, ...]:
    """Of the batch sizes verification may pad to, those worth a shape of their own on `curve`:
    each costs at least 5% less than the next larger one kept (on the H200's 7B a batch of 16
    costs what 8 does: 8 goes, and a tree of 9-16 rows pads to 16). A single row stays: plain
    steps are never padded."""
    seconds = curve.seconds
    cost = lambda n: seconds[min(n, len(seconds)) - 1]  # noqa: E731
    kept: list[int] = []
    for n in sorted(sizes, reverse=True):
        if not kept or cost(n) < 0.95 * cost(kept[-1]):
            kept.append(n)
    return tuple(sorted(set(kept) | {1}))


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
                          str(data.get("measured_at", "")), bool(data.get("coarse", False)),
                          tuple(float(x) for x in data.get("unpadded", ())))
        if curve.unpadded and (len(curve.unpadded) != len(curve.seconds) or
                               not all(0 < x < math.inf for x in curve.unpadded)):
            raise ValueError("its unpadded times must be one positive time per batch size")
        if not curve.seconds or not all(0 < x < math.inf for x in curve.seconds) or \
                not all(0 <= x < math.inf for x in curve.per_context) or curve.n_context < 0:
            raise ValueError("its times must be positive and finite")
        return curve
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise LocalspecError(f"{path}: not a cost curve ({e})") from None


def _from_table(text: str) -> dict:
    """The curve in the markdown table `localspec cost` prints: per batch, ms after the
    heading's context and ms after 4,096 tokens."""
    heading = re.search(r"after (\d+) tokens of context", text)
    if heading is None:
        raise ValueError("neither its JSON nor the table `localspec cost` prints")
    n_context = int(heading.group(1))
    rows = [tuple(float(x) for x in m.groups()) for m in re.finditer(
        r"^\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*[\d.]+\s*\|\s*([\d.]+)\s*\|", text, re.M)]
    if [int(n) for n, _, _ in rows] != list(range(1, len(rows) + 1)):
        raise ValueError("the table's batches are not 1, 2, 3, ...")
    return {"seconds": [ms / 1e3 for _, ms, _ in rows], "n_context": n_context,
            "per_context": [max(0.0, (long - ms) / 1e3 / (4096 - n_context)) for _, ms, long in rows]}

