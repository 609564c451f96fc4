"""The cost curve's cache. A curve is measured once per model, build and thread count on this
machine, because it is the machine that decides its shape (flat on a GPU, nearly linear on a
small CPU), and cached under a key of all that (cache_key). Beside it, how far the loop's
forwards strayed from it (record_loop): a curve they strayed from is measured again at the
next start (strayed; cost_curve in measure.py)."""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import llama_cpp as ll

from localspec import _native
from localspec.llama.context import Context
from localspec.llama.curve import CostCurve
from localspec.llama.live import LiveCurve
from localspec.paths import cache_dir, read_cache, write_cache

LOOP_MARGIN = 0.25  # a cached curve from which the loop's forwards strayed more is measured again
LOOP_FORWARDS = 32  # ... over at least this many forwards


def cache_key(ctx: Context) -> str:
    st = ctx.model.path.stat()
    # "v7": what a curve times changed (the exact head's Q4_K copy, 2026-12-06)
    parts = ["v7", str(ctx.model.path.resolve()), str(st.st_size), str(st.st_mtime_ns), ll.__version__,
             _native.system_info(), str(ctx.config.n_threads), ctx.config.flash_attn,
             ctx.config.kv_type, str(ctx.model.repack), str(ctx.model.n_gpu_layers), f"head {ctx.exact_head}",
             *ctx.model.rpc]  # over a network, the link shapes the curve
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cache_path(ctx: Context) -> Path:
    return cache_dir() / "cost" / f"{cache_key(ctx)}.json"


def keep(ctx: Context, curve: CostCurve, again: bool = False) -> None:
    """Cache `curve` as ctx's. `again`: it was measured because the one before strayed (a
    whole curve that replaces a coarse one inherits that)."""
    path = cache_path(ctx)
    old = read_cache(path, {})
    if isinstance(old, dict):
        again = again or bool(old.get("coarse") and old.get("measured_again"))
    write_cache(path, asdict(curve) | {"model": str(ctx.model.path), "llama_cpp": ll.__version__,
                                       "measured_again": again})


def read_loop(path: Path) -> dict | None:
    """What the loop last recorded of its forwards against the curve cached in `path`:
    {"forwards", "ratio" (observed / predicted, all sizes), "by_batch", "at", "learned" (the
    live curve's corrections, LiveCurve.learned: the next start resumes them), "measured_again":
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
    shows it), and what it learnt (the next start's live curve resumes it). Nothing when the
    file holds another curve now."""
    forwards, ratio, by_batch = live.stray()
    if not forwards:
        return
    data = read_cache(path, None)
    if not isinstance(data, dict) or data.get("seconds") != live.base.seconds:
        return
    data["loop"] = {"forwards": forwards, "ratio": ratio, "by_batch": by_batch,
                    "at": time.strftime("%Y-%m-%d %H:%M:%S"), "learned": live.learned()}
    write_cache(path, data)
