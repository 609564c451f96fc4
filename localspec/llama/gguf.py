"""A GGUF file's header, read and checked before llama.cpp sees it.

llama.cpp trusts some of a file's counts: a `block_count` of 2^30 aborted the process (SIGABRT,
a backtrace on stderr), which in `chat` or `serve` takes the whole app down. So the header is
parsed here first (keys, types, tensor shapes and offsets against the file's length) and the
hyperparameters llama.cpp sizes its arrays by are held to its limits; anything wrong is one
LocalspecError line."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import LocalspecError

MAX_LAYERS = 512   # LLAMA_MAX_LAYERS: llama.cpp's per-layer arrays hold this many
MAX_EXPERTS = 512  # LLAMA_MAX_EXPERTS
MAX_DIMS = 4       # GGML_MAX_DIMS
MAX_WIDTH = 1 << 20  # no model's embedding, feed-forward or head count comes near this

# GGUF value types: struct format and size of the scalars; 8 string, 9 array
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
INTEGERS = {0, 1, 2, 3, 4, 5, 10, 11}
STRING, ARRAY = 8, 9

# ggml types: (elements per block, bytes per block). A type not here is left to llama.cpp,
# which refuses types it does not know.
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
          14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98),
          19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1),
          25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
          34: (256, 54), 35: (256, 66), 39: (32, 17)}


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    type: int
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, object]  # arrays of strings are kept as their length only
    tensors: list[Tensor]
    data_start: int


class _Reader:
    def __init__(self, data, size: int):
        self.data, self.pos, self.size = data, 0, size

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise ValueError("the header runs past the end of the file")
        b = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return b

    def scalar(self, kind: int):
        fmt = "<" + SCALARS[kind]
        n = struct.calcsize(fmt)
        if self.pos + n > self.size:
            raise ValueError("the header runs past the end of the file")
        self.pos += n
        return struct.unpack_from(fmt, self.data, self.pos - n)[0]

    def skip_strings(self, n: int) -> None:
        """n strings passed over (a vocabulary: a few hundred thousand of them)."""
        data, pos, size, unpack = self.data, self.pos, self.size, struct.Struct("<Q").unpack_from
        for _ in range(n):
            if pos + 8 > size:
                raise ValueError("the header runs past the end of the file")
            pos += 8 + unpack(data, pos)[0]
        if pos > size:
            raise ValueError("the header runs past the end of the file")
        self.pos = pos

    def string(self) -> str:
        n = self.scalar(10)
        if n > self.size:
            raise ValueError(f"a string of {n} bytes in a file of {self.size}")
        return self.take(n).decode("utf-8", "replace")

    def value(self, kind: int):
        if kind in SCALARS:
            return self.scalar(kind)
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            inner, n = self.scalar(4), self.scalar(10)
            if n > self.size:
                raise ValueError(f"an array of {n} values in a file of {self.size} bytes")
            if inner == STRING:
                self.skip_strings(n)
                return ("strings", n)
            if inner not in SCALARS:
                raise ValueError(f"an array of unknown value type {inner}")
            fmt = SCALARS[inner]
            return list(struct.unpack(f"<{n}{fmt}", self.take(n * struct.calcsize(fmt))))
        raise ValueError(f"unknown value type {kind}")


def read_header(path: Path) -> Header:
    """The header of the GGUF file at `path`; ValueError says what is wrong with it."""
    size = path.stat().st_size
    if size < 24:
        raise ValueError(f"{size} bytes")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _read(_Reader(data, size))


def _read(r: _Reader) -> Header:
    size = r.size
    if r.take(4) != b"GGUF":
        raise ValueError("bad magic")
    version = r.scalar(4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (2 and 3 are read)")
    n_tensors, n_kv = r.scalar(10), r.scalar(10)
    # A key-value pair takes at least 12 bytes, a tensor's description at least 28.
    if n_kv * 12 + n_tensors * 28 > size:
        raise ValueError(f"{n_kv} keys and {n_tensors} tensors cannot fit in {size} bytes")
    metadata: dict[str, object] = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = r.value(r.scalar(4))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.scalar(4)
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(f"tensor {name} has {n_dims} dimensions")
        shape = tuple(r.scalar(10) for _ in range(n_dims))
        tensors.append(Tensor(name, shape, r.scalar(4), r.scalar(10)))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment is {alignment!r}")
    return Header(version, metadata, tensors, -(-r.pos // alignment) * alignment)


def mtp_layers(path: Path | dict) -> int:
    """How many MTP layers (next-token prediction heads) a model's GGUF carries, from its path
    or its header's metadata (0 when it cannot be read: loading it says why)."""
    try:
        meta = path if isinstance(path, dict) else read_header(path).metadata
    except (ValueError, OSError, struct.error, UnicodeDecodeError):
        return 0
    return int(meta.get(f"{meta.get('general.architecture')}.nextn_predict_layers", 0) or 0)


def check(path: Path, model: bool = True) -> None:
    """Raise one LocalspecError line if the GGUF file at `path` is one llama.cpp should not
    be given: a header that does not parse, tensors outside the file, or (a `model` for
    llama.cpp, not a drafter's own file) hyperparameters past what llama.cpp holds."""
    try:
        header = read_header(path)
        check_tensors(header, path.stat().st_size)
        if model:
            check_hyperparameters(header)
    except (ValueError, struct.error, UnicodeDecodeError) as e:
        raise LocalspecError(f"cannot load {path}: the file is corrupted or incomplete ({e})") from None


def check_tensors(header: Header, size: int) -> None:
    alignment = header.metadata.get("general.alignment", 32)
    names = set()
    for t in header.tensors:
        if t.name in names:
            raise ValueError(f"tensor {t.name} appears twice")
        names.add(t.name)
        if any(d <= 0 for d in t.shape):
            raise ValueError(f"tensor {t.name} has shape {list(t.shape)}")
        if t.offset % alignment:
            raise ValueError(f"tensor {t.name} starts at offset {t.offset}, not a multiple of {alignment}")
        if t.type not in BLOCKS:
            if t.type >= 64:  # ggml has about 40; a type it does not know is llama.cpp's to refuse
                raise ValueError(f"tensor {t.name} has type {t.type}")
            continue
        block, nbytes = BLOCKS[t.type]
        if t.shape[0] % block:
            raise ValueError(f"tensor {t.name}'s rows ({t.shape[0]}) are not whole blocks of its type")
        n = t.shape[0] // block * nbytes
        for d in t.shape[1:]:
            n *= d
        if header.data_start + t.offset + n > size:
            raise ValueError(f"tensor {t.name} ends past the end of the file (truncated?)")


def check_hyperparameters(header: Header) -> None:
    meta = header.metadata
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ValueError("no general.architecture")

    def count(key: str, low: int, high: int, required: bool = False) -> int | None:
        """The integer (or per-layer integers) under arch.key, held to [low, high]."""
        value = meta.get(f"{arch}.{key}")
        if value is None:
            if required:
                raise ValueError(f"no {arch}.{key}")
            return None
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(values) > MAX_LAYERS:
            raise ValueError(f"{arch}.{key} has {len(values)} values (at most {MAX_LAYERS} layers)")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{arch}.{key} is {type(v).__name__}, not an integer")
            if not low <= v <= high:
                raise ValueError(f"{arch}.{key} is {v} (expected {low} to {high})")
        return max(values) if values else None

    n_layer = count("block_count", 1, MAX_LAYERS, required=True)
    count("embedding_length", 1, MAX_WIDTH, required=True)
    count("feed_forward_length", 0, MAX_WIDTH)
    n_head = count("attention.head_count", 0, MAX_WIDTH)
    n_head_kv = count("attention.head_count_kv", 0, MAX_WIDTH)
    if n_head is not None and n_head_kv is not None and n_head_kv > n_head:
        raise ValueError(f"{arch}.attention.head_count_kv ({n_head_kv}) exceeds head_count ({n_head})")
    count("attention.key_length", 0, MAX_WIDTH)
    count("attention.value_length", 0, MAX_WIDTH)
    count("context_length", 1, 1 << 27)  # a context this long would be what --ctx 0 allocates
    n_used = count("expert_used_count", 0, MAX_EXPERTS)
    n_expert = count("expert_count", 0, MAX_EXPERTS) or 0
    if n_used and n_used > n_expert:
        raise ValueError(f"{arch}.expert_used_count ({n_used}) exceeds expert_count ({n_expert})")
    for t in header.tensors:
        if t.name.startswith("blk."):
            index = t.name.split(".")[1]
            if not index.isdigit() or int(index) >= n_layer:
                raise ValueError(f"tensor {t.name} is past the {n_layer} layers of block_count")
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is not None and not (isinstance(tokens, tuple) and 0 < tokens[1] <= 1 << 24):
        raise ValueError("tokenizer.ggml.tokens is not a list of strings")
