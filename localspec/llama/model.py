"""A loaded GGUF model: weights, vocabulary and metadata (llama.cpp's llama_model)."""

from __future__ import annotations

import collections
import ctypes
import functools
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import llama_cpp as ll
import numpy as np

from localspec import _native
from localspec.errors import LocalspecError
from localspec.llama import gguf
from localspec.llama import rpc as rpc_module

GGUF_MAGIC = b"GGUF"
# The exact head is used where its row takes at most this share of the full output layer's.
HEAD_PAYS = 0.85

# llama.cpp logs through one process-wide callback; keep its recent errors so a failed load
# can say why in one line, and pass lines on to whoever listens (LOCALSPEC_VERBOSE: stderr).
# The callback is process-wide in llama.cpp, so its listener is too.
_recent_log: collections.deque[str] = collections.deque(maxlen=20)
LogHandler = Callable[[int, str], None]  # (ggml log level, text)


def _stderr(level: int, text: str) -> None:
    print(text, end="", file=sys.stderr)


_listener: list[LogHandler | None] = [_stderr if os.environ.get("LOCALSPEC_VERBOSE") else None]


def set_log_handler(handler: LogHandler | None) -> None:
    """Where llama.cpp's log goes from now on (None: nowhere)."""
    _listener[0] = handler


@ll.llama_log_callback
def _log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", "replace")
    if level == 4:  # GGML_LOG_LEVEL_ERROR
        _recent_log.append(line.strip())
    if _listener[0] is not None:
        _listener[0](level, line)


ll.llama_log_set(_log, ctypes.c_void_p(0))
ll.llama_backend_init()


def check_gguf(path: Path) -> None:
    """Fail with one clear line when `path` cannot be a GGUF model."""
    if not path.exists():
        raise LocalspecError(f"model file not found: {path}")
    if not path.is_file():
        raise LocalspecError(f"not a file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise LocalspecError(f"not a GGUF file (bad magic {magic!r}): {path}")
    gguf.check(path)  # what llama.cpp would abort on, refused in one line


@dataclass(frozen=True)
class SpecialTokens:
    bos: int
    eos: int
    eot: int
    fim_pre: int
    fim_suf: int
    fim_mid: int
    fim_pad: int
    fim_rep: int
    fim_sep: int
    mask: int = -1  # a DFlash drafter's block filler


class Model:
    """Owns a llama_model. Tokenization lives here because it needs only the vocabulary."""

    def __init__(self, path: str | os.PathLike, n_gpu_layers: int = 0, repack: bool = True,
                 progress: Callable[[float], None] | None = None, vocab_only: bool = False,
                 rpc: tuple[str, ...] = (), mtp: bool = False):
        """`progress` hears the share of the weights loaded, from 0 to 1; `vocab_only` loads
        the vocabulary and metadata but no weights; `rpc`: rpc-servers (HOST:PORT) whose
        devices take the offloaded layers (n_gpu_layers) before this machine's GPUs; `mtp`:
        its MTP layers too, where its GGUF has them (a drafter; llama.cpp skips them else)."""
        self.path = Path(path)
        self.n_gpu_layers = n_gpu_layers
        self.repack = repack
        self.rpc = rpc
        check_gguf(self.path)
        params = ll.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        if rpc or rpc_module.connected():
            # Registered RPC devices would otherwise take any model's layers: name the devices.
            # RPC first, as llama.cpp orders them, so fewer activations cross the network.
            devices = rpc_module.device_list(rpc_module.connect(rpc) + _native.local_gpus())
            params.devices = ctypes.cast(devices, ctypes.c_void_p)
        # CPU weight repacking (interleaved layouts) is faster, but its kernels switch from
        # matrix-vector to matrix-matrix at 4 rows, so batches stop reproducing single tokens.
        params.use_extra_bufts = repack
        params.vocab_only = vocab_only
        params.load_mtp = mtp
        if progress is not None:
            report = ll.llama_progress_callback(lambda share, _user: progress(share) or True)
            params.progress_callback = report  # `report` stays referenced until loading ends
        _recent_log.clear()
        ptr = ll.llama_model_load_from_file(str(self.path).encode(), params)
        if not ptr:
            why = next((m.split("error loading model: ", 1)[1] for m in _recent_log
                        if "error loading model: " in m), "llama.cpp could not load it")
            raise LocalspecError(f"cannot load {self.path}: {why}")
        self.ptr = ptr
        rpc_module.keepalive(rpc)
        self.vocab = ll.llama_model_get_vocab(ptr)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.n_embd = ll.llama_model_n_embd(ptr)
        self.n_layer = ll.llama_model_n_layer(ptr)  # its layers, MTP layers not counted
        self.n_params = ll.llama_model_n_params(ptr)
        # What a step of a one-layer drafter on its hidden states (Jakiro, an MTP layer,
        # EAGLE-3) reads of its weights until the step is timed: one of its layers and its
        # output head (on a small model with a large vocabulary, the head is most of it).
        self.head_share = (self.n_params / max(1, self.n_layer) + self.n_vocab * self.n_embd) / self.n_params
        self.mtp_layers = ll.llama_model_n_layer_nextn(ptr)  # MTP layers its GGUF has
        self.mtp = mtp and self.mtp_layers > 0  # ... and loaded
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.vocab))
        v = self.vocab
        self.special = SpecialTokens(
            bos=ll.llama_vocab_bos(v), eos=ll.llama_vocab_eos(v), eot=ll.llama_vocab_eot(v),
            fim_pre=ll.llama_vocab_fim_pre(v), fim_suf=ll.llama_vocab_fim_suf(v),
            fim_mid=ll.llama_vocab_fim_mid(v), fim_pad=ll.llama_vocab_fim_pad(v),
            fim_rep=ll.llama_vocab_fim_rep(v), fim_sep=ll.llama_vocab_fim_sep(v), mask=ll.llama_vocab_mask(v),
        )
        self._piece_cache: dict[int, bytes] = {}
        self._eog = frozenset(_native.eog_tokens(ptr))  # asked of every token generated
        self._head: tuple[_native.ExactHead | None, str] | None = None  # see exact_head()
        self._weights: np.memmap | None = None  # the file, mapped for the heads' rows (build_head)

    def close(self) -> None:
        if self.ptr:
            ll.llama_model_free(self.ptr)
            self.ptr = None

    def exact_head(self, threads: int) -> _native.ExactHead | None:
        """Greedy's argmax without the output layer's full matmul (native/head.h), built
        once: where the output layer runs on this CPU from a matrix of its own in the GGUF,
        of a type the head reproduces exactly, and where its 4-bit copy runs in HEAD_PAYS of
        the full layer's time or less (measured as it is built). None otherwise; `head_note` says why."""
        if self._head is None:
            self._head = self.build_head(threads)
        return self._head[0]

    @property
    def head_note(self) -> str:
        return self._head[1] if self._head else "not asked for"

    def build_head(self, threads: int, copy_type: int = -1) -> tuple[_native.ExactHead | None, str]:
        """A new head and its note (exact_head() keeps the first; another one is for comparing
        settings side by side, bench/s56/head_dims.py.txt; `copy_type` a ggml type for its
        copy, -1 the one that fits the output layer)."""
        if self.n_gpu_layers > 0 or self.rpc or rpc_module.connected():
            return None, "the output layer may run off this CPU"
        if self.recurrent:  # (llama.cpp may reorder a recurrent model's outputs)
            return None, "a recurrent model"
        header = gguf.read_header(self.path)
        out = next((t for t in header.tensors if t.name == "output.weight"), None)
        if out is None or out.shape != (self.n_embd, self.n_vocab):
            return None, "no output matrix of its own"
        if self._weights is None:  # mapped once: a second head must not unmap the first's rows
            self._weights = np.memmap(self.path, mode="r")
        try:
            head = _native.ExactHead(self._weights.ctypes.data + header.data_start + out.offset, out.type,
                                     self.n_embd, self.n_vocab, threads, copy_type)
        except ValueError as e:
            return None, str(e)
        if head.approx_ms > HEAD_PAYS * head.full_ms:
            return None, f"its copy would not pay ({head.approx_ms:.2f} ms a row against {head.full_ms:.2f})"
        return head, f"exact head: {head.approx_ms:.2f} ms a row against {head.full_ms:.2f}, {head.extra_bytes / 1e6:.0f} MB"

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- metadata -------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    @property
    def architecture(self) -> str:
        return self.meta("general.architecture") or "unknown"

    @property
    def recurrent(self) -> bool:
        """Whether some of its layers keep a recurrent state (Mamba, RWKV; hybrids such as
        Qwen3.5, LFM2, Granite 4): a state that cannot be cut back to an earlier position."""
        return bool(ll.llama_model_is_recurrent(self.ptr) or ll.llama_model_is_hybrid(self.ptr))

    @property
    def hybrid(self) -> bool:
        """Attention layers beside the recurrent ones (Qwen3.5, LFM2, Granite 4, Nemotron-H):
        llama.cpp decodes a batch whose sequences share some tokens and not others for these
        (it splits it), where a recurrent-only model (Mamba, RWKV) refuses one."""
        return bool(ll.llama_model_is_hybrid(self.ptr))

    @property
    def name(self) -> str:
        return self.meta("general.name") or self.path.stem

    @property
    def chat_template(self) -> str | None:
        ptr = ll.llama_model_chat_template(self.ptr, None)
        return ptr.decode("utf-8") if ptr else None

    # --- tokens ---------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (ll.llama_token * n_max)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: llama.cpp says how much it needs
            n_max = -n
            buf = (ll.llama_token * n_max)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character)."""
        if not 0 <= token < self.n_vocab:  # llama.cpp would abort the process on it
            raise LocalspecError(f"token id {token} is not in {self.name}'s vocabulary (0..{self.n_vocab - 1})")
        key = token if not special else -1 - token  # special pieces under negative keys
        piece = self._piece_cache.get(key)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            piece = buf.raw[:n]
            self._piece_cache[key] = piece
        return piece

    @functools.cached_property
    def tokenizer_hash(self) -> str:
        """A hash of the vocabulary's token pieces: two GGUFs with the same value tokenize alike."""
        return hashlib.sha256(_native.vocab_pieces(self.ptr)).hexdigest()[:16]

    def detokenize(self, tokens: list[int], special: bool = False) -> str:
        return b"".join(self.token_bytes(t, special) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return token in self._eog
