"""The cost curve: seconds for one target forward of a batch of n tokens, n = 1..N.

Everything that sizes speculation plans with it. It is measured once per model, build and
thread count on this machine and cached, because it is the machine that decides its shape
(flat on a GPU, nearly linear on a small CPU)."""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import llama_cpp as ll
import numpy as np

from localspec import _native
from localspec.llama.context import Context
from localspec.paths import cache_dir
from localspec.progress import Progress

MAX_BATCH = 64  # a long draft (copying) verified at once


@dataclass(frozen=True)
class CostCurve:
    seconds: list[float]  # seconds[n-1]: one forward of n tokens after `n_context` tokens
    n_context: int
    # Largest |logit| difference between a batched forward and single-token forwards of the
    # same positions: below it, two computations may rank two tokens differently.
    discrepancy: float = 0.0
    # Largest n such that batches of 2..n reproduced single-token logits bit for bit (1: none).
    exact_batch: int = 1

    def cost(self, n: int) -> float:
        return self.seconds[min(n, len(self.seconds)) - 1]

    def ratio(self, n: int) -> float:
        """Cost of a batch of n relative to a single-token forward."""
        return self.cost(n) / self.seconds[0]


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
            progress: Progress | None = None) -> CostCurve:
    """Time batches of 1..max_batch tokens (all rows output, as in verification) after a
    context of n_context tokens, each until it has finished (not when llama_decode returns:
    GPU and RPC backends return early). Sizes are interleaved within each repeat so drift in the
    machine's speed spreads over all of them; the median of the repeats is kept. A context too
    small for n_context + max_batch gets a shorter n_context (the prompt, not this, should be
    what reports a full context)."""
    n_context = max(0, min(n_context, ctx.n_ctx - max_batch))
    progress = progress or (lambda what, done, total: None)
    ctx.clear()
    filler = filler_tokens(ctx, n_context + max_batch)
    ctx.extend(filler[:n_context])
    sizes = batch_sizes(max_batch)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    rounds = repeats + 1  # the first round warms caches and is discarded
    for r in range(rounds):
        progress("measuring the cost curve", r, rounds + 1)
        for n in sizes:
            t0 = time.perf_counter()
            ctx.extend(filler[n_context:n_context + n], n_outputs=n)
            ctx.synchronize()
            dt = time.perf_counter() - t0
            ctx.truncate(n_context)
            times[n].append(dt)
    ctx.clear()
    measured = [statistics.median(times[n][1:]) for n in sizes]
    # A batch of n never costs more than one of n+1 (padding it would do), so where noise says
    # otherwise the larger batch's time is the better estimate.
    for i in range(len(measured) - 2, -1, -1):
        measured[i] = min(measured[i], measured[i + 1])
    seconds = [float(x) for x in np.interp(range(1, max_batch + 1), sizes, measured)]
    discrepancy = measure_discrepancy(ctx, max_batch)
    progress("measuring the cost curve", rounds + 1, rounds + 1)
    return CostCurve(seconds, n_context, *discrepancy)


def measure_discrepancy(ctx: Context, max_batch: int = 12, contexts=(64, 320)) -> tuple[float, int]:
    """Decode the same positions one token at a time and as batches of the measured sizes up
    to max_batch, after a short and a longer context; return the largest logit difference seen
    and the largest n for which batches of 2..n were exact. llama.cpp's batched kernels need
    not reproduce single-token results bit for bit: on a CPU, repacked weights switch to
    matrix-matrix kernels at 4 rows, and flash attention over an f16 cache splits a single
    token's work across threads once the cache passes 256 cells (docs/benchmarks.md, kernel
    settings)."""
    sizes = [n for n in batch_sizes(max_batch) if n >= 2]
    worst_by_size = [max(d) for d in zip(*(batch_discrepancy(ctx, n, sizes) for n in contexts))]
    exact = next((n - 1 for n, w in zip(sizes, worst_by_size) if w > 0), max_batch)
    return max(worst_by_size), min(exact, 16)


def batch_discrepancy(ctx: Context, n_context: int, sizes: list[int]) -> list[float]:
    """After n_context filler tokens: the largest logit difference between a batch of n and
    single-token decoding of the same positions, for each n of `sizes`."""
    ctx.clear()
    tokens = filler_tokens(ctx, n_context + max(sizes))
    ctx.extend(tokens[:n_context])
    single = []
    for t in tokens[n_context:]:
        ctx.append(t)
        single.append(ctx.logits(0).copy())
    ctx.truncate(n_context)
    worst = []
    for n in sizes:
        ctx.extend(tokens[n_context:n_context + n], n_outputs=n)
        worst.append(max(float(abs(ctx.logits(i) - single[i]).max()) for i in range(n)))
        ctx.truncate(n_context)
    ctx.clear()
    return worst


def cache_key(ctx: Context) -> str:
    st = ctx.model.path.stat()
    parts = ["v4", str(ctx.model.path.resolve()), str(st.st_size), str(st.st_mtime_ns), ll.__version__,
             _native.system_info(), str(ctx.config.n_threads), ctx.config.flash_attn,
             ctx.config.kv_type, str(ctx.model.repack), str(ctx.model.n_gpu_layers),
             *ctx.model.rpc]  # over a network, the link shapes the curve
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cache_path(ctx: Context) -> Path:
    return cache_dir() / "cost" / f"{cache_key(ctx)}.json"


def cost_curve(ctx: Context, max_batch: int = MAX_BATCH, refresh: bool = False, repeats: int = 7,
               progress: Progress | None = None) -> CostCurve:
    """The cached curve for this model, build and settings; measured on first use."""
    path = cache_path(ctx)
    if path.exists() and not refresh:
        data = json.loads(path.read_text())
        if len(data["seconds"]) >= max_batch:
            return CostCurve(data["seconds"], data["n_context"], data["discrepancy"], data["exact_batch"])
    curve = measure(ctx, max_batch, repeats=repeats, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(curve) | {"model": str(ctx.model.path), "llama_cpp": ll.__version__}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
    return curve
