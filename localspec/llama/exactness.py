"""How far this build's batched forwards reproduce single-token ones: the largest logit
difference seen and the largest batch that was exact (measure_discrepancy), a property of the
build and its settings, not of the machine's timing, so measured once and cached (exactness).
Every curve carries it (one read from another machine's file, this machine's: planning_curve),
and --strict keeps verification within it."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path

from localspec.llama.context import Context
from localspec.llama.curve import MAX_BATCH, CostCurve, read_curve
from localspec.llama.curve_cache import cache_key
from localspec.llama.timing import Turn, batch_sizes, filler_tokens
from localspec.paths import cache_dir, write_cache


def measure_discrepancy(ctx: Context, max_batch: int = 12, contexts=(64, 320), widest: int = MAX_BATCH,
                        turn: Turn = contextlib.nullcontext) -> tuple[float, int]:
    """Decode the same positions one token at a time and as batches of the measured sizes up
    to max_batch after a short and a longer context, and of 32, 48, the widest and the one
    below it after the longer (as far from single tokens there as after the short); return
    the largest logit difference seen and the largest n for which batches of 2..n were exact.
    llama.cpp's batched kernels need not reproduce single-token results bit for bit: on a CPU,
    repacked weights switch to matrix-matrix kernels at 4 rows, flash attention over an f16
    cache splits a single token's work across threads once the cache passes 256 cells
    (docs/benchmarks.md#kernel-settings), and runs 64 rows and more tiled (SmolLM2's logits:
    2-12 rows 0.63 apart after 320 tokens, 64 rows 1.11). The wide sizes count in the
    difference, not in the exact size (--strict keeps to 16 rows at most)."""
    sizes = [n for n in batch_sizes(max_batch) if n >= 2]
    widest = min(widest, ctx.n_ctx)
    wide = sorted({n for n in (32, 48, widest - 1, widest) if max_batch < n <= widest})
    # A small context (--ctx 256) holds less than the longer one: as much as it holds.
    contexts = sorted({max(0, min(n, ctx.n_ctx - widest)) for n in contexts})
    *shorter, longest = contexts
    last = batch_discrepancy(ctx, longest, sizes + wide, turn)
    worst_by_size = [max(d) for d in zip(last, *(batch_discrepancy(ctx, n, sizes, turn) for n in shorter))]
    worst_by_size += last[len(sizes):]
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


def exactness(ctx: Context, turn: Turn = contextlib.nullcontext) -> tuple[float, int]:
    """measure_discrepancy's answer for this build and settings, measured once and cached."""
    known = read_exactness(ctx)
    if known is None:
        known = measure_discrepancy(ctx, turn=turn)
        write_cache(_exactness_path(ctx), list(known))
    return known


def _exactness_path(ctx: Context) -> Path:
    return cache_dir() / "cost" / f"exact-{cache_key(ctx)}.json"


def read_exactness(ctx: Context) -> tuple[float, int] | None:
    """This build's exactness as cached, None if it was never measured."""
    try:
        discrepancy, exact_batch = json.loads(_exactness_path(ctx).read_text())
        return float(discrepancy), int(exact_batch)
    except (OSError, ValueError, TypeError):
        return None


def planning_curve(path: Path, ctx: Context) -> CostCurve:
    """The curve in `path` to plan with, and this machine's own exactness (how far its batched
    forwards reproduce single tokens: a property of this build, not of that machine's
    timing), measured once and cached."""
    discrepancy, exact_batch = exactness(ctx)
    return replace(read_curve(path), discrepancy=discrepancy, exact_batch=exact_batch)
