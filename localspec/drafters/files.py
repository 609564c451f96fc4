"""Reading the GGUF files drafters load (a Jakiro drafter, an acceptance head): their
metadata checked key by key, so a wrong, missing or mistyped key, or a file that is not what
it claims, ends in one line naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

import numpy as np
from gguf import GGUFReader

from localspec.drafters.jakiro_config import JakiroConfig
from localspec.errors import LocalspecError
from localspec.llama.gguf import read_header

ARCH = "jakiro"
T = TypeVar("T")
META = [  # (config field, GGUF key suffix, type)
    ("target_name", "target.name", str), ("target_vocab", "target.vocab_size", int),
    ("target_tokenizer", "target.tokenizer_hash", str), ("d_model", "embedding_length", int),
    ("n_heads", "attention.head_count", int), ("rope_theta", "rope.freq_base", float),
    ("norm_eps", "attention.layer_norm_rms_epsilon", float), ("n_experts", "expert_count", int),
    ("top_k", "expert_used_count", int), ("d_expert", "expert_feed_forward_length", int),
    ("gamma", "draft_steps", int), ("beta1", "contrastive.beta1", float),
    ("beta2", "contrastive.beta2", float),
]

HEAD_ARCH = "acceptance-head"
HEAD_META = [  # (checkpoint key, GGUF key suffix, type); strings from its "meta"
    ("target", "target.name", str), ("tokenizer", "target.tokenizer_hash", str),
    ("drafter", "drafter.name", str), ("d_model", "embedding_length", int),
    ("hidden", "feed_forward_length", int), ("n_blocks", "block_count", int), ("label", "label", str),
]


def _readable(path: Path, read: Callable[[Path], T]) -> T:
    """`read(path)`, or one LocalspecError line if the file is missing or not a GGUF it reads."""
    path = Path(path)
    if not path.exists():
        raise LocalspecError(f"file not found: {path}")
    try:
        return read(path)
    except Exception as e:  # the gguf package and read_header raise plain ValueErrors on bad files
        raise LocalspecError(f"not a readable GGUF file: {path} ({e})") from None


def open_gguf(path: Path) -> GGUFReader:
    return _readable(path, lambda p: GGUFReader(str(p)))


def metadata(reader: GGUFReader, path: Path, arch: str, what: str, keys: list[tuple[str, str, type]]) -> dict:
    """The values of `keys` ((name, GGUF key suffix, type) triples) of a GGUF of architecture
    `arch`, refused in one line if it is something else (`what` names what was expected) or a
    key is missing or holds another type."""
    name = Path(path).name
    if _value(reader, path, "general.architecture", str) != arch:
        raise LocalspecError(f"{name} is not {what} (architecture "
                             f"{_value(reader, path, 'general.architecture', str)})")
    return {field: _value(reader, path, f"{arch}.{suffix}", kind) for field, suffix, kind in keys}


def _value(reader: GGUFReader, path: Path, key: str, kind: type):
    f = reader.get_field(key)
    if f is None:
        raise LocalspecError(f"{Path(path).name}: missing metadata {key}")
    try:
        value = f.contents()
    except Exception:  # noqa: BLE001 -- the gguf package fails in many ways on bad bytes
        value = None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise LocalspecError(f"{Path(path).name}: metadata {key} should be a{'n' if kind is int else ''} "
                             f"{ {str: 'string', int: 'integer', float: 'number'}[kind]}, "
                             f"not {type(value).__name__}")
    return value


def config_of(reader: GGUFReader, path: Path) -> JakiroConfig:
    values = metadata(reader, path, ARCH, "a Jakiro drafter", META)
    d2t = next((np.asarray(t.data, np.int64) for t in reader.tensors if t.name == "d2t"), None)
    if d2t is None:
        raise LocalspecError(f"{Path(path).name}: missing the d2t tensor")
    full = len(d2t) == values["target_vocab"] and (d2t == np.arange(len(d2t))).all()
    return JakiroConfig(**values, draft_vocab=[] if full else d2t.tolist())


def is_jakiro(path: Path) -> bool:
    """Whether a GGUF is a Jakiro drafter (else, say, a draft model llama.cpp loads). Reads
    the header alone: the gguf package's reader parses a whole model's tokenizer (seconds)."""
    return _readable(path, read_header).metadata.get("general.architecture") == ARCH


def read_config(path: Path) -> JakiroConfig:
    """A Jakiro GGUF's config (metadata and draft vocabulary) without its weights."""
    return config_of(open_gguf(path), path)


def check_target(cfg: JakiroConfig, vocab: int, d_model: int, tokenizer: str, target: str) -> None:
    """Refuse a drafter made for another target, in one line."""
    if (cfg.target_vocab, cfg.d_model, cfg.target_tokenizer) != (vocab, d_model, tokenizer):
        raise LocalspecError(
            f"drafter made for {cfg.target_name} (vocab {cfg.target_vocab}, hidden "
            f"{cfg.d_model}, tokenizer {cfg.target_tokenizer}) cannot draft for {target} "
            f"(vocab {vocab}, hidden {d_model}, tokenizer {tokenizer})")


def read_head_gguf(path: Path) -> tuple[dict, list[tuple[np.ndarray, np.ndarray]]]:
    """An acceptance head's metadata (with q_scale, the weight of the draft's log-odds) and
    its layers in order, (weight (out, in), bias)."""
    reader = open_gguf(path)
    meta = metadata(reader, path, HEAD_ARCH, "an acceptance head", HEAD_META)
    # Heads from before this key read draft models' hidden states.
    has_kind = reader.get_field(f"{HEAD_ARCH}.drafter.kind") is not None
    meta["drafter_kind"] = _value(reader, path, f"{HEAD_ARCH}.drafter.kind", str) if has_kind else "draft"
    t = {x.name: np.asarray(x.data, np.float32).reshape(tuple(int(n) for n in reversed(x.shape)))
         for x in reader.tensors}
    names = ["in"] + [f"blk.{i}.{part}" for i in range(meta["n_blocks"]) for part in ("up", "down")] + ["out"]
    try:
        layers = [(np.array(t[f"{n}.weight"]), np.array(t[f"{n}.bias"])) for n in names]  # writable copies
        meta["q_scale"] = float(t["q_scale"].reshape(-1)[0])
    except KeyError as e:
        raise LocalspecError(f"{Path(path).name}: missing tensor {e}") from None
    return meta, layers
