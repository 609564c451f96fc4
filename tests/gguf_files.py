"""Rewriting GGUF files for tests: other metadata, fewer tensors, cut short."""

from __future__ import annotations

from pathlib import Path

import gguf

DROP = object()


def rewrite(src: Path, dst: Path, keys: dict | None = None, keep_tensor=lambda name: True) -> Path:
    """A copy of `src` with metadata `keys` replaced (key -> (value, GGUFValueType)) or dropped
    (key -> DROP), holding only the tensors keep_tensor(name) admits."""
    keys = keys or {}
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.get_field("general.architecture").contents())
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF.") or keys.get(f.name) is DROP:
            continue
        if f.name in keys:
            value, kind = keys[f.name]
            w.add_key_value(f.name, value, kind)
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    kept = [t for t in r.tensors if keep_tensor(t.name)]
    for t in kept:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in kept:
        w.write_tensor_data(t.data, tensor_endianess=r.endianess)
    w.close()
    return dst


def cut_short(src: Path, dst: Path, share: float = 0.5) -> Path:
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[:int(len(data) * share)])
    return dst
