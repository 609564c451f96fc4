"""A context whose model keeps a recurrent state (Model.recurrent: Mamba's, a gated delta-net's,
short convolutions'), which llama.cpp cannot cut back to an earlier position. Verification
undoes a batch that rejected something from a checkpoint taken before it, and the batch's
kept tokens lead the next one (or, with rollback steps, rolls the state back by what it
rejects: llama.cpp's n_rs_seq, native accept). Every other cut goes through here: the
recurrent part of the state saved at the last cut is restored where that is at or before the
cut, else the kept tokens are decoded again as a cold prompt is."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llama_cpp as ll

from localspec.errors import LocalspecError
from localspec.llama.chunks import decode_chunks

if TYPE_CHECKING:
    from localspec.llama.context import Context

# llama_state_seq_*_ext: only the recurrent part of a sequence's state (its KV cells stay).
PARTIAL_STATE = 1


@dataclass
class Saved:
    """Copies of the recurrent part of a context's state, each with its position: the last
    saved (a prompt's last chunk boundary, the last cut: back_to's way back), and the
    checkpoint where the launched batch starts (undo's)."""
    saved: tuple[int, ctypes.Array] | None = None
    checkpoint: tuple[int, ctypes.Array] | None = None


def checkpoint(ctx: Context) -> None:
    """Keep the recurrent part of the state where the next batch starts (unless it is kept
    there already: a rejected batch was just undone to it), for undo()."""
    n, kept = len(ctx.tokens), ctx.recurrent.checkpoint
    if kept is None or kept[0] != n:
        ctx.recurrent.checkpoint = (n, _get(ctx, kept[1] if kept else None))


def undo(ctx: Context) -> None:
    """Take out what was decoded after ctx.tokens: the cache holds them again, their state as
    it was (the checkpoint, where one was taken where they end; else from the last saved)."""
    kept = ctx.recurrent.checkpoint
    if kept is not None and kept[0] == len(ctx.tokens):
        _set(ctx, *kept)
    else:
        back_to(ctx, len(ctx.tokens))


def back_to(ctx: Context, n: int) -> None:
    """The context's state back at position n: the state saved at m <= n restored (the
    attention layers' cells from m on removed) and tokens[m:n] decoded again, else a restart;
    then saved at n, where measurements and the prompt cache come back to."""
    ctx.recurrent.checkpoint = None  # a batch's checkpoint is good until the next cut
    saved = ctx.recurrent.saved
    if saved is not None and saved[0] <= n:
        m = saved[0]
        _set(ctx, *saved)
        keep = ctx.tokens[:n]
        del ctx.tokens[m:]
        if n > m:
            decode_chunks(ctx, keep, m, n - 1, None, None)
    else:
        restart(ctx, n)
    save(ctx)


def save(ctx: Context) -> None:
    """Keep the recurrent part of the state at the context's end (one slot: the last saved)."""
    ctx.recurrent.saved = (len(ctx.tokens), _get(ctx))


def _get(ctx: Context, into: ctypes.Array | None = None) -> ctypes.Array:
    """The recurrent part of sequence 0's state (`into`, where it is of the size)."""
    size = ll.llama_state_seq_get_size_ext(ctx.ptr, 0, PARTIAL_STATE)
    state = into if into is not None and len(into) == size else (ctypes.c_uint8 * size)()
    ll.llama_state_seq_get_data_ext(ctx.ptr, state, size, 0, PARTIAL_STATE)
    return state


def _set(ctx: Context, m: int, state: ctypes.Array) -> None:
    """Sequence 0 back at position m: the state saved there, the attention cells from m on
    gone; every other sequence (a flattened tree's, Context.flat) its copy again."""
    ll.llama_state_seq_set_data_ext(ctx.ptr, state, len(state), 0, PARTIAL_STATE)
    if not ll.llama_memory_seq_rm(ctx.mem, 0, m, -1):  # the restored state ends at m
        raise LocalspecError(f"cannot go back to position {m} of a recurrent state")
    for s in range(1, ctx.config.n_seq_max):
        # The state, not a cell (llama.cpp's recurrent copy takes the whole state whatever the
        # range): then the cut, which a recurrent state refuses before its end.
        ll.llama_memory_seq_cp(ctx.mem, 0, s, m, m)
        ll.llama_memory_seq_rm(ctx.mem, s, m, -1)


def restart(ctx: Context, n: int) -> None:
    """Hold the first n tokens by decoding them again from an empty cache, in the chunks a
    cold prompt forms. As slow as reading that prompt."""
    keep = ctx.tokens[:n]
    ll.llama_memory_clear(ctx.mem, True)
    ctx.tokens.clear()
    ctx.recurrent.checkpoint = None
    if ctx.recurrent.saved is not None and ctx.recurrent.saved[0] > n:
        ctx.recurrent.saved = None
    if keep:
        decode_chunks(ctx, keep, 0, len(keep) - 1, None, None)
