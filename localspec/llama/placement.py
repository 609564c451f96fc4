"""Where a model runs: with a GPU build of llama.cpp, every layer that fits on this machine's
GPUs (as llama.cpp's own server does by default), else the CPU."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as ll

from localspec import _native
from localspec.llama.model import Model

ALL_LAYERS = 999  # n_gpu_layers that offloads every layer
RESERVE = 1 << 30  # left free on the GPU: compute buffers, the runtime's own, drafters


def gpus() -> list[tuple[str, int, int]]:
    """(description, free bytes, total bytes) of each GPU the linked llama.cpp can use."""
    return _native.gpus() if ll.llama_supports_gpu_offload() else []


def layers_that_fit(path: Path, n_ctx: int) -> int:
    """How many of the model's layers fit on this machine's GPUs beside an f16 KV cache of
    n_ctx tokens: all of them (ALL_LAYERS), a share, or 0 without a GPU."""
    free = sum(f for _, f, _ in gpus())
    if not free:
        return 0
    # From the metadata: a model loaded without weights has no layer hyperparameters (asking
    # llama.cpp for them aborts the process).
    with Model(path, vocab_only=True) as m:
        arch = m.architecture
        n_layer = _int(m.meta(f"{arch}.block_count"), 1)
        n_embd = _int(m.meta(f"{arch}.embedding_length"), 0)
        n_head = _int(m.meta(f"{arch}.attention.head_count"), 1)
        n_head_kv = _int(m.meta(f"{arch}.attention.head_count_kv"), n_head)
    kv = 2 * n_ctx * n_layer * (n_embd * n_head_kv // max(1, n_head)) * 2  # K and V, f16
    weights = path.stat().st_size
    if weights + kv + RESERVE <= free:
        return ALL_LAYERS
    return max(0, int(n_layer * (free - RESERVE) / (weights + kv)))


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:  # a per-layer array, say: the default is an upper bound
        return default


def where(model: Model, n_threads: int) -> str:
    """One line on where the model runs."""
    n_layer = ll.llama_model_n_layer(model.ptr)
    threads = f"{n_threads} thread{'s' if n_threads != 1 else ''}"
    on_gpu = min(model.n_gpu_layers, n_layer + 1)  # llama.cpp counts the output layer too
    devices = ", ".join(d for d, _, _ in gpus()) or "the GPU"
    if model.rpc:
        return f"{model.path.stem}: {min(on_gpu, n_layer)} of {n_layer} layers over RPC ({', '.join(model.rpc)})"
    if on_gpu <= 0:
        return f"{model.path.stem} on the CPU ({threads})"
    if on_gpu > n_layer:
        return f"{model.path.stem} on {devices} (all {n_layer} layers)"
    return f"{model.path.stem}: {on_gpu} of {n_layer} layers on {devices}, the rest on the CPU ({threads})"
