"""A llama.cpp context: batch decode with per-token positions and sequence sets, zero-copy
views of logits and hidden states, KV-cache operations and a prefix cache."""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import llama_cpp as ll
import numpy as np
import numpy.ctypeslib  # noqa: F401  (loaded lazily otherwise: 2-3 ms inside a request's first read)

from localspec import _native
from localspec.llama import exact_head, recurrent, rpc
from localspec.llama.chunks import decode_chunks
from localspec.llama.model import Model
from localspec.errors import LocalspecError

FLASH_ATTN = {"auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
              "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED}
KV_TYPES = {"f16": 1, "bf16": 30, "q8_0": 8, "f32": 0}  # ggml_type values
PROGRESS_AFTER = 512  # tokens of prompt to decode beyond which prefill reports progress


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)


def padded_shape(shapes: Sequence[int], n: int) -> int:
    """The shape a batch of n rows is padded to: the smallest of `shapes` (sorted) that holds
    it, n itself beyond the largest."""
    return next((s for s in shapes if s >= n), n)


@dataclass(frozen=True)
class ContextConfig:
    n_ctx: int = 4096          # tokens of KV cache shared by all sequences (unified)
    n_batch: int = 512         # most tokens one decode call may carry
    n_ubatch: int = 512        # physical batch llama.cpp computes at once
    n_seq_max: int = 1         # sequences: one per root-to-leaf path of a draft tree
    n_threads: int = 0         # 0: all cores
    flash_attn: str = "auto"   # auto | on | off
    kv_type: str = "f16"       # f16 | bf16 | q8_0 | f32: element type of the KV cache
    embeddings: bool = False   # also return final hidden states (the LM-head input)
    chunk: int = 128           # prompts are decoded in chunks starting at multiples of this (docs/benchmarks.md#prompts-in-chunks: 64 costs 9% of prefill speed, 128 1%)
    # Requests that can read their rows' argmax or top-k from the graph do (sample_on_device).
    sample_on_device: bool = False
    # Greedy requests read their rows' argmax from the model's exact head (native/head.h: the
    # output layer's argmax on the CPU without its full matmul), where the model has one.
    exact_head: bool = False
    # Verification batches are padded up to the next of these sizes (rows nobody reads, in a
    # sequence of their own), so consecutive iterations keep their shape and llama.cpp (and
    # CUDA its captured graph) reuse the last graph; (): batches as they come (see launch).
    shapes: tuple[int, ...] = ()
    # A sequence for padding rows without shapes too: a batch is padded to a wider one where
    # the cost curve prices that lower at its context (this CPU's flash attention goes tiled
    # from 64 rows: after 3,841 tokens 55 rows took 4.0 s, padded to 64 2.9 s; CostCurve.pad_to).
    padding: bool = False
    # Every token the context holds sits in all n_seq_max sequences, so a draft tree's leaves
    # (one sequence each) see the context without a copy of it (native/step.h: launch, finish).
    # False: in sequence 0 only (a draft model's context, which branches its own way).
    context_in_every_sequence: bool = True
    # A model with a recurrent state (Model.recurrent): how many of a batch's last tokens its
    # state can be rolled back by (llama.cpp's n_rs_seq; 0 where the architecture cannot).
    rollback: int = 0
    # A hybrid target's draft trees, verified flattened: each root-to-leaf path in rows and a
    # sequence of its own (a sequence keeps its own recurrent state), and one sequence more,
    # without a path, keeps the state after the batch's pending tokens; its chains in every
    # sequence (native/step.h's tree_layout, verify.py).
    flat_trees: bool = False
    # The MTP layers of its model (llama.cpp's LLAMA_CONTEXT_TYPE_MTP): a drafter's context.
    mtp: bool = False


def context_params(config: ContextConfig) -> ll.llama_context_params:
    p = ll.llama_context_default_params()
    p.n_ctx = config.n_ctx
    p.n_batch = config.n_batch
    p.n_ubatch = min(config.n_ubatch, config.n_batch)
    p.n_seq_max = config.n_seq_max + (1 if config.shapes or config.padding else 0)  # the last: padding's
    # A draft tree's rows are all outputs, and the pending tokens and root are in every
    # sequence: with the argmax in the graph, a sequence may output a whole batch.
    p.n_outputs_max_per_seq = config.n_batch
    p.kv_unified = True  # one KV buffer: sequence masks over it are tree-attention masks
    p.n_threads = p.n_threads_batch = config.n_threads or default_threads()
    p.flash_attn_type = FLASH_ATTN[config.flash_attn]
    p.type_k = p.type_v = KV_TYPES[config.kv_type]
    p.embeddings = config.embeddings
    p.no_perf = True
    p.n_rs_seq = config.rollback
    p.ctx_type = ll.LLAMA_CONTEXT_TYPE_MTP if config.mtp else ll.LLAMA_CONTEXT_TYPE_DEFAULT
    if 0 < min(config.n_ctx, config.n_batch) < p.n_seq_max:  # llama.cpp would abort the process
        raise LocalspecError(f"a context of {config.n_ctx} tokens is too small: this one keeps {p.n_seq_max} "
                             f"sequences (a draft tree's paths) and needs at least as many tokens (--ctx)")
    return p


class Context:
    """Owns a llama_context. Sequence 0 is the main sequence; `tokens` is what its KV holds,
    which is what the prefix cache compares a new prompt against."""

    def __init__(self, model: Model, config: ContextConfig = ContextConfig(), beside: Context | None = None):
        """`beside`: the target context of a drafter that uses the target's token embeddings
        and output head (EAGLE-3 and DFlash GGUFs need one where they have none of their own)."""
        self.model = model
        self.config = config
        params = context_params(config)
        if beside is not None:
            params.ctx_other = beside.ptr
        self._hook = exact_head.hook_into(model, config.exact_head, params)  # llama.cpp calls it: kept
        ptr = ll.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise LocalspecError(f"cannot create a llama.cpp context for {model.path} "
                                 f"(n_ctx={config.n_ctx}, n_seq_max={config.n_seq_max})")
        self.ptr = ptr
        self._head = exact_head.bound(self._hook, ptr)  # greedy rows' argmax from the exact head, or None
        self.exact_head = self._head is not None  # (ContextConfig.exact_head, where the model has one)
        rpc.keepalive(model.rpc)  # the context's buffers may have opened connections
        self.n_ctx = ll.llama_n_ctx(ptr)
        self.mem = ll.llama_get_memory(ptr)
        # A recurrent state (recurrent.py): rolled back by verification up to `rollback` tokens
        # of a batch, or, without rollback steps, a batch that rejects something is undone from
        # a checkpoint.
        self.recurrent = recurrent.Saved() if model.recurrent else None
        self.rollback = ll.llama_n_rs_seq(ptr) if model.recurrent else 0
        self.flat = config.flat_trees
        self.n_paths = config.n_seq_max - self.flat  # root-to-leaf paths a tree may have here
        self.checkpoints = model.recurrent and not self.rollback  # (but a flattened tree's: verify.py)
        self.tokens: list[int] = []  # what sequence 0's KV cache holds, position by position
        # Leading positions computed exactly as a cold prefill of tokens[:n_exact] computes them.
        self.n_exact = 0
        self.chunk = config.chunk
        # Every batch of up to `chunk` tokens reproduces single-token decoding (--strict), so
        # any cached position is exact wherever it came from.
        self.all_exact = False
        # (prompt length, its last row: logits, or its token id with the argmax on the device)
        self._last: tuple[int, np.ndarray | int] | None = None
        # A launched batch not yet accepted (verify.launch, verify.accept): its native batch first, then the rest.
        self.inflight: tuple | None = None
        self._device: _native.SamplerOnDevice | None = None  # see sample_on_device
        self._device_top_k = 0  # what it runs: 0 the argmax, k a top-k
        self._rows_reserved = 0  # output rows llama.cpp's buffer holds (reserve_outputs)
        self.shapes = sorted(config.shapes)  # the engine may narrow them to its cost curve's
        # (n, context length) -> the rows a speculating batch of n runs as, where the engine's
        # curve says staying in the last forward's shape, or a wider batch, costs less (the
        # curve's pad_to); None: the next shape up, or n itself.
        self.pad_rule: Callable[[int, int], int] | None = None
        self.shape = 0  # the last launched batch's rows, padding included
        self.pad_seq = config.n_seq_max if config.shapes or config.padding else -1
        # The sequences every token the context holds sits in (see context_in_every_sequence).
        self._shared = np.arange(config.n_seq_max if config.context_in_every_sequence else 1, dtype=np.int32)
        self._one = (np.zeros(1, np.int32), np.zeros(1, np.int32), np.array([0, len(self._shared)], np.int32),
                     self._shared, np.ones(1, np.int8))

    def close(self) -> None:
        if self._device is not None:
            self._device.detach()
            self._device = None
        if self._head is not None:
            self._head.unbind()
        if self.ptr:
            ll.llama_free(self.ptr)
            self.ptr = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- decode ---------------------------------------------------------------------------

    def decode(self, tokens: Sequence[int], pos: Sequence[int],
               seq_ids: Sequence[Sequence[int]] | None = None,
               outputs: Sequence[bool] | None = None) -> None:
        """One llama_decode. Token i sits at pos[i] in every sequence of seq_ids[i] (default:
        the context's, see context_in_every_sequence) and has its logits kept when outputs[i]
        (default: the last token only).
        Does not touch `tokens`; callers that extend sequence 0 use `prefill`/`append`."""
        n = len(tokens)
        if n == 0:
            return
        if n > self.config.n_batch:
            raise LocalspecError(f"batch of {n} tokens exceeds n_batch={self.config.n_batch}")
        if seq_ids is None:
            offsets = np.arange(n + 1, dtype=np.int32) * len(self._shared)
            flat = np.tile(self._shared, n)
        else:
            offsets = np.zeros(n + 1, np.int32)
            np.cumsum([len(s) for s in seq_ids], out=offsets[1:])
            flat = np.fromiter((s for ss in seq_ids for s in ss), np.int32, int(offsets[-1]))
        if outputs is None:
            out = np.zeros(n, np.int8)
            out[-1] = 1
        else:
            out = np.asarray(outputs, dtype=np.int8)
        self._decode(np.asarray(tokens, np.int32), np.asarray(pos, np.int32), offsets, flat, out)

    def _decode(self, tokens, pos, offsets, flat, out) -> None:
        if self.inflight is not None:
            raise LocalspecError("a launched batch is not finished yet")
        check_status(_native.decode(self.ptr, tokens, pos, offsets, flat, out), len(tokens))

    def sample_on_device(self, top_k: int | None) -> None:
        """Acceptance reads each row from a sampler inside the forward's graph (native/step.h):
        with top_k 0 greedy's argmax (a token id a row), with top_k k the row's k best
        candidates and their logits (all that sampling with top-k truncation needs); None: the
        full rows on the host. While on, the rows' full logits cannot be read (logits()
        refuses). Switching costs llama.cpp a new graph: a request sets it once."""
        if top_k == (self._device_top_k if self._device is not None else None):
            return
        self.abandon()
        if self._device is not None:
            self._device.detach()
            self._device = None
        if top_k == 0 and self._head is not None:
            self._head.on = True
            self._device, self._device_top_k = self._head, 0
        elif top_k is not None:
            try:
                self._device, self._device_top_k = _native.SamplerOnDevice(self.ptr, top_k), top_k
            except ValueError:  # a backend that cannot (llama.cpp said why in its log)
                pass
        self._last = None  # a prompt's last row read in the other mode

    @property
    def rows_from(self) -> int:
        """How verification reads the rows (native rows_from): 0 host, 1 argmax, 2 top-k."""
        return 0 if self._device is None else 2 if self._device_top_k else 1

    def abandon(self) -> None:
        """Drop a launched batch that nobody will finish: the cache holds `tokens` again."""
        if self.inflight is None:
            return
        launched, self.inflight = self.inflight[0], None
        if self.recurrent:  # the batch is in the state
            self.synchronize()
            recurrent.undo(self)
        else:
            _native.abandon(self.ptr, launched)

    def append(self, token: int) -> None:
        """Decode one token at the end of sequence 0, keeping its logits at row 0."""
        t, p, offsets, flat, out = self._one
        t[0] = token
        p[0] = len(self.tokens)
        self.check_room(1)
        self._decode(t, p, offsets, flat, out)
        self.tokens.append(token)

    def prefill(self, tokens: Sequence[int], n_outputs: int = 1,
                on_outputs: Callable[[int, list[int]], None] | None = None,
                progress: Callable[[int, int], None] | None = None) -> tuple[int, np.ndarray | int]:
        """Make sequence 0 hold the prompt `tokens`, reusing cached positions only where that
        cannot change a result. Returns how many positions were reused and the logits of the
        prompt's last token (a copy, kept for the same prompt asked again; with a sampler on
        the device, its token id or its candidates' (ids, logits)). Outputs (logits,
        hidden states) of the last `n_outputs` positions decoded go to on_outputs(first
        position, batch rows) after each chunk; a prompt of more than PROGRESS_AFTER tokens to
        decode reports progress(decoded, to decode) as it goes.

        Why chunks at fixed positions: llama.cpp computes a row of a batch slightly differently
        from the same row in a batch of another size, so a cached position equals what a cold
        start computes only if it was decoded in the same batch. Prompts are decoded in chunks
        that start at multiples of `chunk`; a later prompt reuses the whole chunks it shares (or
        all of an identical prompt), and what it decodes from there forms the chunks a cold
        start forms. A prompt that runs on into generated tokens (a chat's earlier answer)
        reuses them too, although they were decoded as generation, not as a prompt: what that
        can change is measured in docs/benchmarks.md#reusing-a-cached-answer."""
        n = len(tokens)
        if n == 0:
            raise LocalspecError("empty prompt")
        self.check_room(n, fresh=True)
        m = common_prefix(self.tokens, tokens)
        if self._last is not None and self._last[0] == n <= m:
            self.truncate(n)  # what was generated after it goes
            return n, self._last[1]
        c = self.chunk
        base = self.n_exact // c * c  # exact for any prompt that shares them, not only one
        limit = min(m, n - 1)  # at least the last token is decoded: its logits are needed
        reuse = limit if self.all_exact else limit // c * c
        self.truncate(reuse)
        # Decoded on top of exact positions, the prompt is exact; on generated ones, only the
        # whole chunks before them are.
        self.n_exact = n if reuse <= base else base
        report = progress if progress is not None and n - reuse > PROGRESS_AFTER else None
        first_out = n - max(1, n_outputs)
        start, boundary = reuse, first_out // self.chunk * self.chunk  # a recurrent state is saved there
        if self.recurrent and start < boundary:  # for a later prompt that shares it
            decode_chunks(self, tokens[:boundary], start, boundary, None, report)
            recurrent.save(self)
            start, report = boundary, None
        last_chunk = decode_chunks(self, tokens, start, first_out, on_outputs, report)
        last = read_row(self, last_chunk - 1)
        if last is not None:
            self._last = (n, last)
        else:  # the last chunk again, its rows read on the host (its outputs were handed out)
            off_device(self, "the prompt's last row")
            self.truncate(n - last_chunk)
            self.prefill(tokens, n_outputs)
            if not np.isfinite(self._last[1]).all():  # CUDA's argmax gives -1 for a row of NaN
                print("localspec: the prompt's last row has logits that are not finite (NaN or inf in "
                      "the forward)", file=sys.stderr)
        return reuse, self._last[1]

    def catch_up(self, tokens: Sequence[int]) -> int:
        """Make sequence 0 hold `tokens` by decoding what it lacks of them (at least the last
        token); returns the batch row with that token's logits. For draft models, whose
        exactness does not matter."""
        self.truncate(min(common_prefix(self.tokens, tokens), len(tokens) - 1))
        return self.extend(tokens[len(self.tokens):])

    def extend(self, tokens: Sequence[int], n_outputs: int = 1) -> int:
        """Decode `tokens` at the end of sequence 0, in chunks of n_batch; returns the batch
        row holding the logits of the last one. The last `n_outputs` tokens of the last chunk
        keep their outputs (logits, hidden states) at rows len(chunk) - n_outputs ..."""
        self.check_room(len(tokens))
        step = self.config.n_batch
        row = 0
        for start in range(0, len(tokens), step):
            chunk = tokens[start:start + step]
            n_past = len(self.tokens)
            k = min(n_outputs, len(chunk))
            self.decode(chunk, range(n_past, n_past + len(chunk)), outputs=[False] * (len(chunk) - k) + [True] * k)
            self.tokens.extend(chunk)
            row = len(chunk) - 1
        return row

    def check_room(self, n_new: int, fresh: bool = False) -> None:
        n = n_new + (0 if fresh else len(self.tokens))
        if n > self.n_ctx:
            raise LocalspecError(f"context full: {n} tokens > n_ctx={self.n_ctx} (raise --ctx)")

    # --- outputs (views into llama.cpp's buffers: valid until the next decode) -------------

    def logits(self, row: int) -> np.ndarray:
        if self._device is not None:
            raise LocalspecError("no logits while a sampler runs on the device (sample_on_device)")
        ptr = ll.llama_get_logits_ith(self.ptr, row)
        if not ptr:
            raise LocalspecError(f"no logits for batch row {row}")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def hidden(self, row: int) -> np.ndarray:
        """Final hidden state (the LM-head input) of a batch row; needs embeddings=True."""
        ptr = ll.llama_get_embeddings_ith(self.ptr, row)
        if not ptr:
            raise LocalspecError(f"no hidden state for batch row {row} (embeddings off?)")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_embd,))

    # --- KV cache: every edit of it happens here ----------------------------------------------

    def synchronize(self) -> None:
        """Wait until the last decode has finished: on GPU and RPC backends llama_decode
        returns before it has (reading its logits waits too)."""
        ll.llama_synchronize(self.ptr)

    def truncate(self, n: int) -> None:
        """Keep the first n positions of sequence 0 (where rejected tokens go)."""
        if n < len(self.tokens) and self.recurrent:
            recurrent.back_to(self, n)
        elif n < len(self.tokens):
            self._seq_rm(-1, n, -1)
            del self.tokens[n:]
        if n < self.n_exact:  # a cut chunk is exact only for a prompt ending where it ends
            self.n_exact = n // self.chunk * self.chunk
        if self._last is not None and n < self._last[0]:
            self._last = None

    def clear(self) -> None:
        self.sample_on_device(None)  # a cleared context reads logits again (measurements, checks)
        if self.inflight is not None:  # what it added goes with the rest
            self.synchronize()
            self.inflight = None
        ll.llama_memory_clear(self.mem, True)
        self.tokens.clear()
        self.n_exact = 0
        self._last = None
        self.recurrent = recurrent.Saved() if self.recurrent else None

    def branch(self, src: int, dst: int) -> None:
        """Make sequence `dst` a copy of sequence `src` (a draft tree's next level)."""
        self._seq_rm(dst, 0, -1)
        ll.llama_memory_seq_cp(self.mem, src, dst, 0, -1)

    def drop_branches(self, n_seqs: int) -> None:
        """Drop sequences 1..n_seqs-1 and anything sequence 0 holds past `tokens`."""
        self._seq_rm(-1, len(self.tokens), -1)
        for s in range(1, n_seqs):
            self._seq_rm(s, 0, -1)

    def seq_pos_max(self, seq: int) -> int:
        return ll.llama_memory_seq_pos_max(self.mem, seq)

    def _seq_rm(self, seq: int, p0: int, p1: int) -> None:
        if not ll.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise LocalspecError(f"cannot remove positions [{p0}, {p1}) of sequence {seq}")


def off_device(ctx: Context, where: str) -> None:
    """The device handed back no valid token for a row it sampled (a backend's fault, seen on
    CUDA): the request goes on sampling its rows on the host, which reads the same logits, so
    its output does not change; the next request tries the device again."""
    print(f"localspec: the device gave no valid token for {where}: this request goes on sampling "
          f"on the host", file=sys.stderr)
    ctx.sample_on_device(None)


def read_row(ctx: Context, row: int) -> np.ndarray | tuple[np.ndarray, np.ndarray] | int | None:
    """What the last decode left at `row`: a copy of its logits, or, with a sampler on the
    device, its token id or its best candidates' (ids, logits); None where the device
    handed back nothing valid."""
    if ctx._device is None:
        return ctx.logits(row).copy()
    if ctx._device_top_k:
        candidates = _native.sampled_candidates(ctx.ptr, row)
        return candidates if len(candidates[0]) else None
    token = _native.sampled_token(ctx.ptr, row)
    return token if token >= 0 else None


def check_status(status: int, n_tokens: int) -> None:
    if status != 0:
        why = {1: "no KV-cache slot (context full?)", 2: "aborted"}.get(status, "failed")
        raise LocalspecError(f"llama_decode {why} (status {status}, {n_tokens} tokens)")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def hidden_rows(ctx: Context, rows: Sequence[int]) -> np.ndarray:
    """ctx.hidden() of these batch rows, (len(rows), n_embd): one view where they are a run
    that llama.cpp keeps side by side (a view per row costs about 20 µs; a copied text commits
    20 rows an iteration), else row by row."""
    n = len(rows)
    if n == 0:
        return np.empty((0, ctx.model.n_embd), np.float32)
    ends = [ll.llama_get_embeddings_ith(ctx.ptr, r) for r in (rows[0], rows[-1])]
    head, tail = (ctypes.cast(p, ctypes.c_void_p).value for p in ends)
    if head and tail and tail - head == 4 * (n - 1) * ctx.model.n_embd and \
            list(rows) == list(range(rows[0], rows[0] + n)):
        return np.ctypeslib.as_array(ends[0], shape=(n, ctx.model.n_embd))
    return np.stack([ctx.hidden(r) for r in rows])


def reserve_outputs(ctx: Context, n: int) -> None:
    """Grow llama.cpp's output buffer to n rows read from a sampler on the device, now
    rather than inside a request. It only grows, each time a batch outputs more rows than it
    holds, and with a sampler attached it holds every row's logits, probabilities and
    candidates in pinned memory (2.4 MB a row for a 152k vocabulary): on the H200 a growth
    cost 14-73 ms at 8-64 rows, paid in the first long drafts (docs/benchmarks.md, "On an
    H200, 2026-12-04 (session 45)"). One forward of n rows in the padding's sequence,
    removed after; the argmax stays attached (a request sets its own)."""
    if not ctx.config.sample_on_device or ctx.pad_seq < 0 or n <= ctx._rows_reserved or \
            n > ctx.config.n_batch or len(ctx.tokens) + n > ctx.n_ctx:
        return
    if ctx._device is None:
        ctx.sample_on_device(0)
        if ctx._device is None:  # a backend that cannot
            return
    ctx.abandon()
    first = len(ctx.tokens)
    ctx.decode([i % ctx.model.n_vocab for i in range(n)], range(first, first + n), [[ctx.pad_seq]] * n, [True] * n)
    ctx.synchronize()
    ctx._seq_rm(ctx.pad_seq, 0, -1)
    ctx._rows_reserved = n
