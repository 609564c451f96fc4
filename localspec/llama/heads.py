"""The drafters llama.cpp runs beside a target (its own MTP layers, EAGLE-3 GGUFs): the target's
hidden states kept for them, and a drafter context that decodes each token with a hidden
state (the one it is drafted from).

Which state goes with which token: the state of context position p (the target's, or the
drafter's own while it drafts) predicts the token at p + 1; the drafter decodes the pair
(token p, state p - 1) at position p and its row predicts token p + 1 (llama.cpp's MTP
convention; its EAGLE-3 decodes the same pairs one position earlier, which RoPE, relative,
does not see)."""

from __future__ import annotations

import ctypes
from typing import Sequence

import llama_cpp as ll
import numpy as np
from llama_cpp import llama_cpp_ext as llx

from localspec.errors import LocalspecError
from localspec.llama.context import Context, ContextConfig, check_status, common_prefix
from localspec.llama.model import Model

_c = ctypes
WINDOW = 128  # positions of target states kept: where a drafter that fell behind starts afresh


def _bind(name: str, mangled: str, argtypes: list, restype):
    """A llama-ext.h function (C++ linkage in this build: exported under its mangled name)."""
    lib = ll.llama_cpp._lib
    for symbol in (name, mangled):
        if hasattr(lib, symbol):
            f = getattr(lib, symbol)
            f.argtypes, f.restype = argtypes, restype
            return f
    raise LocalspecError(f"this llama.cpp has no {name}: it cannot run EAGLE-3 drafters")


_set_layer_inp = _bind("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
                       [_c.c_void_p, _c.c_uint32, _c.c_bool], None)
_get_layer_inp = _bind("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
                       [_c.c_void_p, _c.c_uint32], _c.POINTER(_c.c_float))
_target_layer_ids = _bind("llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model",
                          [_c.c_void_p], _c.POINTER(_c.c_int32))
_target_layer_ids_n = _bind("llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model",
                            [_c.c_void_p], _c.c_uint32)


def target_layers(drafter: Model) -> list[int]:
    """The target layers whose inputs an EAGLE-3 drafter reads (its GGUF's target_layers)."""
    ids = _target_layer_ids(drafter.ptr)
    return [ids[i] for i in range(_target_layer_ids_n(drafter.ptr))]


class TargetStates:
    """What the target's forwards keep for a drafter, every row of a batch: the inputs of
    `layers` (EAGLE-3), or, with no layers, its last hidden state (the MTP layers')."""

    def __init__(self, layers: Sequence[int] = ()):
        self.layers = tuple(layers)
        self._staged: set[int] = set()

    def stage(self, target: Context) -> None:
        """Ask the target's context to keep them (before its next forward; llama.cpp plans its
        graph again once)."""
        if target.ptr in self._staged:
            return
        for lid in self.layers:
            _set_layer_inp(target.ptr, lid, True)
        if not self.layers:
            llx.llama_set_embeddings_nextn(target.ptr, True, False)  # every row, not only outputs
        self._staged.add(target.ptr)

    def rows(self, target: Context, rows: Sequence[int]) -> np.ndarray:
        """The states of these batch rows of the target's last forward: (len(rows), width)."""
        n_embd = target.model.n_embd
        n = max(rows) + 1
        if self.layers:
            parts = [np.ctypeslib.as_array(_get_layer_inp(target.ptr, lid), shape=(n, n_embd))[rows]
                     for lid in self.layers]
            return np.concatenate(parts, axis=1)
        return np.ctypeslib.as_array(llx.llama_get_embeddings_nextn(target.ptr), shape=(n, n_embd))[rows].copy()


class HeadContext(Context):
    """A drafter's llama.cpp context over pairs (token, hidden state). It keeps the target's
    states of recent positions (commit), decodes the pairs a context needs (catch_up), and
    while drafting pairs each token with the state of the row it was drafted from (append,
    decode_pairs). `encode`: EAGLE-3, whose fc layer turns the target's three layer inputs
    into its own state first (llama.cpp's ENCODE). DFlash holds the states themselves
    (inject) and drafts a block of tokens in one forward (Context.decode)."""

    def __init__(self, model: Model, config: ContextConfig, target: Context, encode: bool = False,
                 causal: bool = True):
        """`causal` False: its tokens attend to each other both ways (DFlash's block)."""
        super().__init__(model, config, beside=target)
        llx.llama_set_embeddings_nextn(self.ptr, True, True)  # its rows' own states, for the next step
        if not causal:
            ll.llama_set_causal_attn(self.ptr, False)
        self.encode = encode
        self.width = ll.llama_model_n_embd_out(model.ptr) if config.mtp else model.n_embd
        self.states: dict[int, np.ndarray] = {}  # context position -> the target's state there
        self.state_tokens: list[int] = []  # the context those states belong to
        self._batch = ll.llama_batch_ext_init(self.ptr)
        self._last_row = 0  # the last decode's last row: what append() drafts from

    def close(self) -> None:
        if getattr(self, "_batch", None):
            ll.llama_batch_ext_free(self._batch)
            self._batch = None
        super().close()

    # --- the target's states ----------------------------------------------------------------

    def follow(self, prompt: list[int]) -> None:
        """A request starts from `prompt`: states of positions where it differs are stale."""
        same = common_prefix(self.state_tokens, prompt)
        for p in [p for p in self.states if p >= same]:
            del self.states[p]
        del self.state_tokens[same:]

    def commit(self, first_pos: int, tokens: Sequence[int], states: np.ndarray) -> None:
        """The target's states of positions first_pos... (of `tokens`, the target's context
        from position 0); what was known of later positions is stale."""
        # Stale ones, and those past the window a fresh start reads: a drafter that sits
        # unused keeps WINDOW states, not one per token generated.
        end = first_pos + len(states)
        for p in [p for p in self.states if p >= first_pos or p < end - WINDOW]:
            del self.states[p]
        for i, state in enumerate(states):
            self.states[first_pos + i] = state
        del self.state_tokens[first_pos:]
        self.state_tokens.extend(tokens[len(self.state_tokens):first_pos + len(states)])

    # --- decoding -----------------------------------------------------------------------------

    def catch_up(self, tokens: Sequence[int]) -> int:
        """Hold the pairs of `tokens` (each with the target's state of the position before):
        decode those it lacks, the last at least, from the first position whose states are all
        known if they are not; returns the batch row of the last."""
        n = len(tokens)
        if n - 2 not in self.states:
            raise LocalspecError("no target state for the drafter's root")
        begin = self._resume(tokens, n, lag=1, redo_last=True)
        states = np.stack([self.states[p - 1] for p in range(begin, n)])
        if self.encode:
            states = self._encode(states)
        step = self.config.n_batch
        for start in range(begin, n, step):
            end = min(n, start + step)
            chunk = list(tokens[start:end])
            self.decode_pairs(chunk, states[start - begin:end - begin], range(start, end),
                              [[0]] * len(chunk), outputs=[False] * (len(chunk) - 1) + [True])
            self.tokens.extend(chunk)
        return self._last_row

    def _resume(self, tokens: Sequence[int], end: int, lag: int, redo_last: bool) -> int:
        """Where to decode from for the KV to hold positions up to `end` of `tokens`, position
        p decoded with the target's state of p - lag: past what it holds that still matches
        (but the last, `redo_last`: its row is wanted), or, where the states from there are
        not all known, afresh from the first position from which they are."""
        first = end
        while first > lag and first - 1 - lag in self.states:
            first -= 1
        keep = min(common_prefix(self.tokens, tokens), end - 1 if redo_last else end)
        if keep < first:
            self._seq_rm(-1, 0, -1)
            self.tokens = list(tokens[:first])  # those before it, held by no one, never attended
            return first
        self.truncate(keep)
        return keep

    def append(self, token: int) -> None:
        """Decode one drafted token at the end of sequence 0, with the state of the row it was
        drafted from (the last decode's last row); its logits at row 0."""
        self.check_room(1)
        self.decode_pairs([token], self.row_states([self._last_row]), [len(self.tokens)], [[0]])
        self.tokens.append(token)

    def row_states(self, rows: Sequence[int]) -> np.ndarray:
        """The drafter's own states of rows of its last decode (they draft the next tokens)."""
        return np.stack([np.ctypeslib.as_array(llx.llama_get_embeddings_nextn_ith(self.ptr, r), shape=(self.width,))
                         for r in rows])

    def decode_pairs(self, tokens: Sequence[int], states: np.ndarray, pos: Sequence[int],
                     seq_ids: Sequence[Sequence[int]], outputs: Sequence[bool] | None = None) -> None:
        """One forward of pairs: token i with states[i], at pos[i] in the sequences seq_ids[i];
        logits and states kept where outputs[i] (default: all)."""
        b = self._batch
        ll.llama_batch_ext_clear(b)
        states = np.ascontiguousarray(states, np.float32)
        row_ptr = states.ctypes.data
        position = ll.llama_pos()
        for i, (token, p, seqs) in enumerate(zip(tokens, pos, seq_ids)):
            idx = ll.llama_batch_ext_add_token(b, seqs[0], int(token))
            if idx < 0:
                raise LocalspecError(f"the drafter's batch refused token {token} (status {idx})")
            for s in seqs[1:]:
                ll.llama_batch_ext_add_seq(b, idx, s)
            position.value = int(p)
            ll.llama_batch_ext_set_pos(b, idx, _c.byref(position))
            ptr = _c.cast(row_ptr + i * states.strides[0], _c.POINTER(_c.c_float))
            if not ll.llama_batch_ext_set_embd_token(b, idx, ll.llama_embd(ptr, 1, states.shape[1])):
                raise LocalspecError(f"the drafter takes states of another width than {states.shape[1]}")
            ll.llama_batch_ext_set_output_logits(b, idx, bool(outputs[i]) if outputs is not None else True)
        check_status(ll.llama_process(self.ptr, ll.LLAMA_PROCESS_TYPE_DECODE, b), len(tokens))
        self._last_row = len(tokens) - 1

    def inject(self, tokens: Sequence[int]) -> None:
        """DFlash: make the KV hold the target's states of the positions of `tokens` but its
        last (the root), each decoded as an embedding alone at its position (llama.cpp's
        DFlash graph writes them to the KV as they are, no attention, no logits)."""
        n = len(tokens) - 1  # positions 0 .. n - 1 have states
        keep = self._resume(tokens, n, lag=0, redo_last=False)
        b = self._batch
        position = (ll.llama_pos * 4)()
        for start in range(keep, n, self.config.n_ubatch):
            rows = np.ascontiguousarray(np.stack([self.states[p] for p in range(start, min(n, start + self.config.n_ubatch))]),
                                        np.float32)
            ll.llama_batch_ext_clear(b)
            for i, row in enumerate(rows):
                embd = ll.llama_embd(_c.cast(rows.ctypes.data + i * rows.strides[0], _c.POINTER(_c.c_float)), 1, rows.shape[1])
                idx = ll.llama_batch_ext_add_embd(b, 0, embd)
                if idx < 0:
                    raise LocalspecError(f"the drafter does not read target states of width {rows.shape[1]}")
                position[0] = position[1] = position[2] = start + i
                ll.llama_batch_ext_set_pos(b, idx, position)
            check_status(ll.llama_process(self.ptr, ll.LLAMA_PROCESS_TYPE_DECODE, b), len(rows))
            self.tokens.extend(tokens[start:start + len(rows)])

    def _encode(self, features: np.ndarray) -> np.ndarray:
        """EAGLE-3's fc layer over the target's features: its own states, a row each."""
        b = self._batch
        features = np.ascontiguousarray(features, np.float32)
        out = np.empty((len(features), self.width), np.float32)
        position = (ll.llama_pos * 4)()
        after = self.seq_pos_max(0) + 1  # llama.cpp checks an encoded batch's positions too
        step = self.config.n_ubatch
        for start in range(0, len(features), step):
            ll.llama_batch_ext_clear(b)
            rows = features[start:start + step]
            for i, row in enumerate(rows):
                embd = ll.llama_embd(row.ctypes.data_as(_c.POINTER(_c.c_float)), 1, row.shape[0])
                idx = ll.llama_batch_ext_add_embd(b, 0, embd)
                if idx < 0:
                    raise LocalspecError(f"the drafter does not read target states of width {row.shape[0]}")
                position[0] = after + i
                ll.llama_batch_ext_set_pos(b, idx, position)
                ll.llama_batch_ext_set_output_logits(b, idx, True)
            check_status(ll.llama_process(self.ptr, ll.LLAMA_PROCESS_TYPE_ENCODE, b), len(rows))
            g = llx.llama_get_embeddings_nextn(self.ptr)
            out[start:start + len(rows)] = np.ctypeslib.as_array(g, shape=(len(rows), self.width))
        return out
