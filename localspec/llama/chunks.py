"""Prompts decoded in chunks at fixed positions (Context.prefill says why)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import llama_cpp as ll

if TYPE_CHECKING:
    from localspec.llama.context import Context


def decode_chunks(ctx: Context, tokens: Sequence[int], start: int, first_out: int,
                  on_outputs: Callable[[int, list[int]], None] | None,
                  report: Callable[[int, int], None] | None) -> int:
    """Decode tokens[start:] into sequence 0 in chunks that start at multiples of ctx.chunk
    (Context.prefill says why), positions from first_out on with their outputs (handed to
    on_outputs after each chunk); returns the last chunk's length."""
    n, c = len(tokens), ctx.chunk
    # A context returning hidden states outputs every row of a batch (llama.cpp's rule),
    # running the LM head over every prompt token: only chunks with outputs get them.
    # Which rows a batch outputs cannot change the KV cache.
    hidden, begun = ctx.config.embeddings, start
    try:
        while start < n:
            end = min(n, (start // c + 1) * c)
            chunk = tokens[start:end]
            outputs = [p >= first_out for p in range(start, end)]
            if hidden:
                ll.llama_set_embeddings(ctx.ptr, outputs[-1])
            ctx.decode(chunk, range(start, end), outputs=outputs)
            ctx.tokens.extend(chunk)
            if on_outputs and outputs[-1]:
                first = max(start, first_out)
                on_outputs(first, list(range(first - start, end - start)))
            start = end
            if report:
                report(end - begun, n - begun)
    finally:
        if hidden:
            ll.llama_set_embeddings(ctx.ptr, True)
    return len(chunk)
