"""Trained drafters to GGUF (architecture `jakiro`), acceptance heads to GGUF (architecture
`acceptance-head`), a drafter's weights back again, and `inspect` (drafters/files.py reads
what drafting needs).

Metadata names the target the drafter was made for (name, vocabulary size, hidden size,
tokenizer hash), so loading it beside another target fails in one line. Matrices are stored
as f32, f16 or q8_0; norms, biases and the router stay f32 (they are tiny)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from localspec.drafters.files import ARCH, HEAD_ARCH, HEAD_META, META, config_of, open_gguf
from localspec.drafters.jakiro_config import JakiroConfig
from localspec.errors import LocalspecError
from localspec.paths import replacing

TYPES = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16,
         "q8_0": GGMLQuantizationType.Q8_0}
# torch parameter name -> GGUF tensor name
_NAMES = {"fc.weight": "fc.weight", "fc.bias": "fc.bias", "q.weight": "attn_q.weight",
          "k.weight": "attn_k.weight", "v.weight": "attn_v.weight", "o.weight": "attn_output.weight",
          "norm.weight": "ffn_norm.weight", "router.weight": "ffn_gate_inp.weight"}
_EXPERT = {"gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}


def gguf_name(torch_name: str) -> str:
    if torch_name.startswith("experts."):
        _, j, part, kind = torch_name.split(".")
        return f"{_EXPERT[part]}.{j}.{kind}"
    return _NAMES[torch_name]


def torch_name(name: str) -> str:
    for k, v in _NAMES.items():
        if v == name:
            return k
    part, j, kind = name.split(".")
    return f"experts.{j}.{next(k for k, v in _EXPERT.items() if v == part)}.{kind}"


def write_gguf(cfg: JakiroConfig, state: dict[str, np.ndarray], path: Path, dtype: str = "q8_0") -> None:
    if dtype not in TYPES:
        raise LocalspecError(f"tensor type must be one of {', '.join(TYPES)} (got {dtype})")
    with replacing(Path(path)) as tmp:
        w = GGUFWriter(str(tmp), ARCH)
        w.add_name(f"jakiro drafter for {cfg.target_name}")
        for field, key, kind in META:
            _add(w, f"{ARCH}.{key}", kind(getattr(cfg, field)))
        for name, value in state.items():
            value = np.ascontiguousarray(value, np.float32)
            qtype = TYPES[dtype] if value.ndim == 2 and name != "router.weight" else TYPES["f32"]
            if qtype == GGMLQuantizationType.Q8_0 and value.shape[-1] % 32:
                qtype = GGMLQuantizationType.F16
            data = value if qtype == GGMLQuantizationType.F32 else \
                value.astype(np.float16) if qtype == GGMLQuantizationType.F16 else quantize(value, qtype)
            w.add_tensor(gguf_name(name), data,
                         raw_dtype=qtype if qtype == GGMLQuantizationType.Q8_0 else None)
        # The draft vocabulary map (draft row -> target token id), as EAGLE-3's d2t.
        vocab = np.asarray(cfg.draft_vocab or range(cfg.target_vocab), np.int32)
        w.add_tensor("d2t", vocab)
        _write_out(w)


def read_gguf(path: Path) -> tuple[JakiroConfig, dict[str, np.ndarray]]:
    """The config and float32 weights of a Jakiro GGUF."""
    reader = open_gguf(path)
    cfg = config_of(reader, path)
    state = {}
    for t in reader.tensors:
        if t.name != "d2t":
            shape = tuple(int(n) for n in reversed(t.shape))
            state[torch_name(t.name)] = dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)
    return cfg, state


def write_head_gguf(ckpt: dict, path: Path) -> None:
    """An acceptance head, float32 throughout (it is tiny): tensors in.*, blk.N.up.*,
    blk.N.down.*, out.*, q_scale; metadata names the target, tokenizer and drafter it was made for,
    the label it predicts (greedy or sampled) and its held-out calibration."""
    with replacing(Path(path)) as tmp:
        w = GGUFWriter(str(tmp), HEAD_ARCH)
        values = {**ckpt["meta"], **{k: ckpt[k] for k in ("hidden", "n_blocks", "label", "d_model")}}
        w.add_name(f"acceptance head of {values['drafter']} for {values['target']}")
        for key, suffix, kind in HEAD_META:
            _add(w, f"{HEAD_ARCH}.{suffix}", kind(values[key]))
        # What reads the head's features: a draft model's hidden state, or a Jakiro branch feature
        # (heads from before this key are draft models').
        w.add_string(f"{HEAD_ARCH}.drafter.kind", values.get("drafter_kind", "draft"))
        for key, v in ckpt.get("report", {}).items():
            w.add_float64(f"{HEAD_ARCH}.heldout.{key}", float(v))
        for name, value in ckpt["state"].items():  # torch: inp, blocks.N.0 (up), blocks.N.2 (down), out
            parts = name.split(".")
            if parts[0] == "blocks":
                name = f"blk.{parts[1]}.{'up' if parts[2] == '0' else 'down'}.{parts[3]}"
            w.add_tensor(name.replace("inp.", "in."), np.ascontiguousarray(value.float().numpy(), np.float32))
        _write_out(w)


def _write_out(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add(w: GGUFWriter, key: str, value: str | int | float) -> None:
    """One metadata value, of the GGUF type drafters/files.py reads it as."""
    if isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, float):
        w.add_float64(key, value)
    else:
        w.add_uint32(key, value)


def read_checkpoint(path: Path) -> dict:
    """A training checkpoint (torch's file: `train` writes and resumes it, `convert` reads it)."""
    import torch
    if not Path(path).exists():
        raise LocalspecError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch's readers raise many kinds on a damaged file
        raise LocalspecError(f"{path} is damaged ({type(e).__name__}): move it aside, or restore it") from None


def convert_checkpoint(checkpoint: Path, out: Path, dtype: str = "q8_0") -> Path:
    ckpt = read_checkpoint(checkpoint)
    if ckpt.get("kind") == HEAD_ARCH:
        write_head_gguf(ckpt, out)
        return Path(out)
    cfg = JakiroConfig.from_dict(ckpt["config"])
    state = {k: v.float().numpy() for k, v in ckpt["state"].items()}
    write_gguf(cfg, state, out, dtype)
    return Path(out)


def inspect_gguf(path: Path) -> str:
    """Metadata and tensors of any GGUF, one per line (arrays summarised)."""
    reader = open_gguf(path)
    lines = [f"{path}"]
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        value = field.contents()
        if isinstance(value, list) and len(value) > 8:
            value = f"[{len(value)} items: {', '.join(map(str, value[:4]))}, ...]"
        lines.append(f"  {name} = {value}")
    total = 0
    for t in reader.tensors:
        shape = "×".join(str(int(n)) for n in reversed(t.shape))
        lines.append(f"  tensor {t.name:28s} {t.tensor_type.name:5s} {shape}")
        total += int(t.n_bytes)
    lines.append(f"  {len(reader.tensors)} tensors, {total / 1e6:.1f} MB")
    return "\n".join(lines)
