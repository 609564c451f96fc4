"""Trained drafters to GGUF (architecture `jakiro`), acceptance heads to GGUF (architecture
`acceptance-head`), back again, and `inspect`.

Metadata names the target the drafter was made for (name, vocabulary size, hidden size,
tokenizer hash), so loading it beside another target fails in one line. Matrices are stored
as f32, f16 or q8_0; norms, biases and the router stay f32 (they are tiny)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

from localspec.drafters.jakiro_config import JakiroConfig
from localspec.errors import LocalspecError

ARCH = "jakiro"
TYPES = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16,
         "q8_0": GGMLQuantizationType.Q8_0}
# torch parameter name -> GGUF tensor name
_NAMES = {"fc.weight": "fc.weight", "fc.bias": "fc.bias", "q.weight": "attn_q.weight",
          "k.weight": "attn_k.weight", "v.weight": "attn_v.weight", "o.weight": "attn_output.weight",
          "norm.weight": "ffn_norm.weight", "router.weight": "ffn_gate_inp.weight"}
_EXPERT = {"gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
_META = [  # (config field, GGUF key suffix)
    ("target_name", "target.name"), ("target_vocab", "target.vocab_size"),
    ("target_tokenizer", "target.tokenizer_hash"), ("d_model", "embedding_length"),
    ("n_heads", "attention.head_count"), ("rope_theta", "rope.freq_base"),
    ("norm_eps", "attention.layer_norm_rms_epsilon"), ("n_experts", "expert_count"),
    ("top_k", "expert_used_count"), ("d_expert", "expert_feed_forward_length"),
    ("gamma", "draft_steps"), ("beta1", "contrastive.beta1"), ("beta2", "contrastive.beta2"),
]


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
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    w = GGUFWriter(str(tmp), ARCH)
    w.add_name(f"jakiro drafter for {cfg.target_name}")
    for field, key in _META:
        value = getattr(cfg, field)
        full = f"{ARCH}.{key}"
        if isinstance(value, str):
            w.add_string(full, value)
        elif isinstance(value, float):
            w.add_float64(full, value)
        else:
            w.add_uint32(full, int(value))
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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def _open(path: Path) -> GGUFReader:
    path = Path(path)
    if not path.exists():
        raise LocalspecError(f"file not found: {path}")
    try:
        return GGUFReader(str(path))
    except Exception as e:  # the gguf package raises plain ValueErrors on bad files
        raise LocalspecError(f"not a readable GGUF file: {path} ({e})") from None


def _metadata(reader: GGUFReader, path: Path, arch: str, what: str, keys: list[tuple[str, str]]) -> dict:
    """The values of `keys` ((name, GGUF key suffix) pairs) of a GGUF of architecture `arch`,
    refused in one line if it is something else (`what` names what was expected)."""
    found = reader.get_field("general.architecture")
    if found is None or found.contents() != arch:
        raise LocalspecError(f"{Path(path).name} is not {what} (architecture "
                             f"{found.contents() if found else 'missing'})")
    values = {}
    for name, suffix in keys:
        f = reader.get_field(f"{arch}.{suffix}")
        if f is None:
            raise LocalspecError(f"{Path(path).name}: missing metadata {arch}.{suffix}")
        values[name] = f.contents()
    return values


def _config(reader: GGUFReader, path: Path) -> JakiroConfig:
    values = _metadata(reader, path, ARCH, "a Jakiro drafter", _META)
    d2t = next((np.asarray(t.data, np.int64) for t in reader.tensors if t.name == "d2t"), None)
    if d2t is None:
        raise LocalspecError(f"{Path(path).name}: missing the d2t tensor")
    full = len(d2t) == values["target_vocab"] and (d2t == np.arange(len(d2t))).all()
    return JakiroConfig(**values, draft_vocab=[] if full else d2t.tolist())


def is_jakiro(path: Path) -> bool:
    """Whether a GGUF is a Jakiro drafter (else, say, a draft model llama.cpp loads)."""
    found = _open(path).get_field("general.architecture")
    return found is not None and found.contents() == ARCH


def read_config(path: Path) -> JakiroConfig:
    """A Jakiro GGUF's config (metadata and draft vocabulary) without its weights."""
    return _config(_open(path), path)


def read_gguf(path: Path) -> tuple[JakiroConfig, dict[str, np.ndarray]]:
    """The config and float32 weights of a Jakiro GGUF."""
    reader = _open(path)
    cfg = _config(reader, path)
    state = {}
    for t in reader.tensors:
        if t.name != "d2t":
            shape = tuple(int(n) for n in reversed(t.shape))
            state[torch_name(t.name)] = dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)
    return cfg, state


def check_target(cfg: JakiroConfig, vocab: int, d_model: int, tokenizer: str, target: str) -> None:
    """Refuse a drafter made for another target, in one line."""
    if (cfg.target_vocab, cfg.d_model, cfg.target_tokenizer) != (vocab, d_model, tokenizer):
        raise LocalspecError(
            f"drafter made for {cfg.target_name} (vocab {cfg.target_vocab}, hidden "
            f"{cfg.d_model}, tokenizer {cfg.target_tokenizer}) cannot draft for {target} "
            f"(vocab {vocab}, hidden {d_model}, tokenizer {tokenizer})")


HEAD_ARCH = "acceptance-head"
_HEAD_META = [  # (checkpoint key, GGUF key suffix); strings from its "meta"
    ("target", "target.name"), ("tokenizer", "target.tokenizer_hash"), ("drafter", "drafter.name"),
    ("d_model", "embedding_length"), ("hidden", "feed_forward_length"), ("n_blocks", "block_count"),
    ("label", "label"),
]


def write_head_gguf(ckpt: dict, path: Path) -> None:
    """An acceptance head, float32 throughout (it is tiny): tensors in.*, blk.N.up.*,
    blk.N.down.*, out.*, q_scale; metadata names the target, tokenizer and drafter it was made for,
    the label it predicts (greedy or sampled) and its held-out calibration."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    w = GGUFWriter(str(tmp), HEAD_ARCH)
    values = {**ckpt["meta"], **{k: ckpt[k] for k in ("hidden", "n_blocks", "label", "d_model")}}
    w.add_name(f"acceptance head of {values['drafter']} for {values['target']}")
    for key, suffix in _HEAD_META:
        v = values[key]
        (w.add_string if isinstance(v, str) else w.add_uint32)(f"{HEAD_ARCH}.{suffix}", v)
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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def read_head_gguf(path: Path) -> tuple[dict, list[tuple[np.ndarray, np.ndarray]]]:
    """An acceptance head's metadata (with q_scale, the weight of the draft's log-odds) and
    its layers in order, (weight (out, in), bias)."""
    reader = _open(path)
    meta = _metadata(reader, path, HEAD_ARCH, "an acceptance head", _HEAD_META)
    kind = reader.get_field(f"{HEAD_ARCH}.drafter.kind")
    meta["drafter_kind"] = kind.contents() if kind is not None else "draft"
    t = {x.name: np.asarray(x.data, np.float32).reshape(tuple(int(n) for n in reversed(x.shape)))
         for x in reader.tensors}
    names = ["in"] + [f"blk.{i}.{part}" for i in range(meta["n_blocks"]) for part in ("up", "down")] + ["out"]
    try:
        layers = [(np.array(t[f"{n}.weight"]), np.array(t[f"{n}.bias"])) for n in names]  # writable copies
        meta["q_scale"] = float(t["q_scale"].reshape(-1)[0])
    except KeyError as e:
        raise LocalspecError(f"{Path(path).name}: missing tensor {e}") from None
    return meta, layers


def convert_checkpoint(checkpoint: Path, out: Path, dtype: str = "q8_0") -> Path:
    import torch
    if not Path(checkpoint).exists():
        raise LocalspecError(f"checkpoint not found: {checkpoint}")
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    if ckpt.get("kind") == HEAD_ARCH:
        write_head_gguf(ckpt, out)
        return Path(out)
    cfg = JakiroConfig.from_dict(ckpt["config"])
    state = {k: v.float().numpy() for k, v in ckpt["state"].items()}
    write_gguf(cfg, state, out, dtype)
    return Path(out)


def inspect_gguf(path: Path) -> str:
    """Metadata and tensors of any GGUF, one per line (arrays summarised)."""
    reader = _open(path)
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
