"""Corrupted copies of a real GGUF file, and what loading each of them does.

    python tests/corrupt_gguf.py MODEL.gguf WORKDIR

makes each case in WORKDIR in turn, loads it with localspec's Model (weights and all) and
prints one JSON line per case: {"case", "outcome": "error" | "loaded", "line"}. A case that
takes the process down (llama.cpp aborts) ends the output early with the process's status:
that is what the test looks for, in a process of its own."""

from __future__ import annotations

import json
import os
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

from localspec.llama import gguf


@dataclass
class Parsed:
    """A GGUF file in pieces that can be changed and put back together."""
    preamble: dict = field(default_factory=dict)  # version
    kvs: list[tuple[str, int, bytes]] = field(default_factory=list)  # key, value type, value bytes
    tensors: list[tuple[str, bytes]] = field(default_factory=list)  # name, its description's bytes
    data: tuple[int, int] = (0, 0)  # where the tensor data lies in the original (start, end)


def parse(path: Path) -> Parsed:
    raw = path.read_bytes()
    r = gguf._Reader(raw, len(raw))
    r.take(4)
    out = Parsed({"version": r.scalar(4)})
    n_tensors, n_kv = r.scalar(10), r.scalar(10)
    for _ in range(n_kv):
        key = r.string()
        kind = r.scalar(4)
        start = r.pos
        r.value(kind)
        out.kvs.append((key, kind, raw[start:r.pos]))
    for _ in range(n_tensors):
        start = r.pos
        name = r.string()
        n_dims = r.scalar(4)
        r.pos += 8 * n_dims + 4 + 8
        out.tensors.append((name, raw[start:r.pos]))
    header = gguf.read_header(path)
    out.data = (header.data_start, len(raw))
    return out


def string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def tensor_info(name: str, shape: tuple[int, ...], kind: int, offset: int) -> bytes:
    return string(name) + struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, kind, offset)


def write(p: Parsed, src: Path, dest: Path, n_tensors: int | None = None, n_kv: int | None = None) -> None:
    """The pieces as a file, the original's tensor data after them (aligned to 32 bytes)."""
    head = b"GGUF" + struct.pack("<IQQ", p.preamble["version"],
                                 len(p.tensors) if n_tensors is None else n_tensors,
                                 len(p.kvs) if n_kv is None else n_kv)
    head += b"".join(string(k) + struct.pack("<I", kind) + v for k, kind, v in p.kvs)
    head += b"".join(t for _, t in p.tensors)
    head += b"\0" * (-len(head) % 32)
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        fout.write(head)
        fin.seek(p.data[0])
        os.sendfile(fout.fileno(), fin.fileno(), None, p.data[1] - p.data[0])


def with_kv(p: Parsed, key: str, kind: int, value: bytes) -> Parsed:
    kvs = [(k, kind, value) if k == key else (k, t, v) for k, t, v in p.kvs]
    if all(k != key for k, _, _ in p.kvs):
        kvs.append((key, kind, value))
    return Parsed(p.preamble, kvs, p.tensors, p.data)


def cases(src: Path, work: Path):
    """(name, a function writing the case to a path)."""
    p = parse(src)
    size = src.stat().st_size
    header = gguf.read_header(src)
    arch = header.metadata["general.architecture"]

    def truncated(n):
        def make(dest):
            with open(src, "rb") as fin, open(dest, "wb") as fout:
                os.sendfile(fout.fileno(), fin.fileno(), None, n)
        return make

    for n in (10, 1000, p.data[0] // 2, p.data[0], p.data[0] + 4096, size // 2, size - 1):
        yield f"truncated at {n} bytes", truncated(n)

    def patched(offset, data):
        def make(dest):
            write(p, src, dest)
            with open(dest, "r+b") as f:
                f.seek(offset)
                f.write(data)
        return make

    yield "magic flipped", patched(0, b"GGUE")
    for v in (1, 4, 0xFFFFFFFF):
        yield f"version {v}", patched(4, struct.pack("<I", v))
    for n in (1 << 40, len(p.tensors) + 1, len(p.tensors) - 1):
        yield f"tensor count {n}", lambda dest, n=n: write(p, src, dest, n_tensors=n)
    for n in (1 << 40, len(p.kvs) + 1, len(p.kvs) - 1):
        yield f"key count {n}", lambda dest, n=n: write(p, src, dest, n_kv=n)
    yield "a key's length past the file", patched(24, struct.pack("<Q", 1 << 50))
    yield "a value type of 99", patched(24 + 8 + len(p.kvs[0][0].encode()), struct.pack("<I", 99))

    u32 = lambda v: (4, struct.pack("<I", v))  # noqa: E731
    i32 = lambda v: (5, struct.pack("<i", v))  # noqa: E731
    wrong_type = [(8, string("twelve")), (6, struct.pack("<f", 12.5))]
    for key in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "context_length", "expert_count", "expert_used_count"):
        values = wrong_type + [u32(1 << 30), i32(-1), u32(0) if key != "expert_count" else u32(100000)]
        if key in ("expert_count", "expert_used_count"):
            values = [u32(1 << 30), u32(100000)] + wrong_type
        for kind, value in values:
            shown = value if kind == 8 else struct.unpack("<" + gguf.SCALARS[kind], value)[0]
            yield (f"{arch}.{key} = {shown!r} (type {kind})",
                   lambda dest, k=key, t=kind, v=value: write(with_kv(p, f"{arch}.{k}", t, v), src, dest))
    n_layer = header.metadata[f"{arch}.block_count"]
    for n in (n_layer - 1, n_layer + 1):
        yield f"{arch}.block_count = {n} (its tensors say {n_layer})", \
            lambda dest, n=n: write(with_kv(p, f"{arch}.block_count", 4, struct.pack("<I", n)), src, dest)
    yield "an unknown architecture", lambda dest: write(
        with_kv(p, "general.architecture", 8, string("nonesuch")), src, dest)
    yield "no architecture", lambda dest: write(
        Parsed(p.preamble, [kv for kv in p.kvs if kv[0] != "general.architecture"], p.tensors, p.data), src, dest)
    yield "no vocabulary", lambda dest: write(
        Parsed(p.preamble, [kv for kv in p.kvs if kv[0] != "tokenizer.ggml.tokens"], p.tensors, p.data), src, dest)

    for which in (0, len(header.tensors) // 2, len(header.tensors) - 1):
        t = header.tensors[which]
        yield f"tensor {t.name} missing", lambda dest, which=which: write(
            Parsed(p.preamble, p.kvs, p.tensors[:which] + p.tensors[which + 1:], p.data), src, dest)

        def lie(dest, which=which, shape=None, kind=None, offset=None):
            t = header.tensors[which]
            tensors = list(p.tensors)
            tensors[which] = (t.name, tensor_info(t.name, shape or t.shape, t.type if kind is None else kind,
                                                  t.offset if offset is None else offset))
            write(Parsed(p.preamble, p.kvs, tensors, p.data), src, dest)
        doubled = (t.shape[0] * 2,) + t.shape[1:]
        yield f"tensor {t.name} of shape {doubled}", lambda dest, lie=lie, s=doubled: lie(dest, shape=s)
        swapped = t.shape[::-1] if len(t.shape) > 1 else (t.shape[0], 2)
        yield f"tensor {t.name} of shape {swapped}", lambda dest, lie=lie, s=swapped: lie(dest, shape=s)
        yield f"tensor {t.name} of 5 dimensions", lambda dest, lie=lie, t=t: lie(dest, shape=t.shape + (1,) * (5 - len(t.shape)))
        yield f"tensor {t.name} of type 200", lambda dest, lie=lie: lie(dest, kind=200)
        yield f"tensor {t.name} past the end", lambda dest, lie=lie: lie(dest, offset=size)
        yield f"tensor {t.name} at an unaligned offset", lambda dest, lie=lie, t=t: lie(dest, offset=t.offset + 1)


def main() -> None:
    from localspec.errors import LocalspecError
    from localspec.llama import Model

    src, work = Path(sys.argv[1]), Path(sys.argv[2])
    dest = work / "case.gguf"
    for name, make in cases(src, work):
        make(dest)
        print(json.dumps({"case": name, "outcome": "starting"}), flush=True)
        try:
            Model(dest).close()
            out = {"case": name, "outcome": "loaded", "line": ""}
        except LocalspecError as e:
            out = {"case": name, "outcome": "error", "line": str(e)}
        print(json.dumps(out), flush=True)
        dest.unlink()


if __name__ == "__main__":
    main()
