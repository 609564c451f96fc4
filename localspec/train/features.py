"""Target features for drafter training, computed by llama.cpp itself (so training sees exactly
the hidden states inference will see) and cached on disk in memory-mapped shards.

A store is a folder per target: shard-NNNNN.{tokens,mask,offsets,hidden}.npy and a manifest
that lists finished shards and how many corpus examples they consumed. A shard is written
under a temporary name and renamed when complete, then the manifest is replaced atomically, so
an interrupted extraction resumes after its last finished shard."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from localspec.llama.context import Context, ContextConfig, hidden_rows
from localspec.llama.model import Model
from localspec.errors import LocalspecError
from localspec.paths import replacing, write_whole
from localspec.progress import progress_bar
from localspec.train.corpus import Example

# Prompt-sized batches: on a CPU 1.4x faster per token than the verification-sized batches
# drafting sees (16 rows or fewer), whose kernels round differently by about as much as the
# noise training adds to its input features anyway (docs/jakiro.md).
UBATCH = 512


@dataclass(frozen=True)
class Shard:
    tokens: np.ndarray   # int32, all examples concatenated
    mask: np.ndarray     # bool, per token: learnt
    offsets: np.ndarray  # int64, example i is [offsets[i], offsets[i+1])
    hidden: np.ndarray   # float16 (n_tokens, n_embd): the target's LM-head input per token

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.tokens[a:b], self.mask[a:b], self.hidden[a:b]


class FeatureStore:
    def __init__(self, root: Path, model: Model):
        self.model = model
        self.dir = Path(root) / f"{model.path.stem}-{model.tokenizer_hash}-{model.n_embd}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.manifest_path = self.dir / "manifest.json"
        self.manifest = {"target": model.path.name, "n_embd": model.n_embd, "shards": [], "n_examples": 0}
        if self.manifest_path.exists():
            try:
                self.manifest = json.loads(self.manifest_path.read_text())
                if not isinstance(self.manifest, dict) or not isinstance(self.manifest.get("shards"), list):
                    raise ValueError("not a manifest of shards")
            except ValueError as e:
                raise self._damaged(self.manifest_path, e) from None

    @property
    def n_tokens(self) -> int:
        return sum(s["n_tokens"] for s in self.manifest["shards"])

    def shards(self) -> list[Shard]:
        return [self.load(s["name"]) for s in self.manifest["shards"]]

    def load(self, name: str) -> Shard:
        try:
            arrays = {k: np.load(self.dir / f"{name}.{k}.npy", mmap_mode="r")
                      for k in ("tokens", "mask", "offsets", "hidden")}
        except (OSError, ValueError) as e:
            raise self._damaged(self.dir / name, e) from None
        return Shard(**arrays)

    def _damaged(self, what: Path, e: Exception) -> LocalspecError:
        return LocalspecError(f"the extracted features in {self.dir} are damaged ({what.name}: {e}): "
                              "move that folder aside and train again to extract them anew")

    def extract(self, examples: Iterable[Example], max_tokens: int, shard_tokens: int = 32768,
                n_threads: int = 0) -> Iterator[Shard]:
        """Run the target over `examples` (skipping those earlier runs consumed) until the store
        holds `max_tokens`, yielding each shard as it is finished."""
        done = self.manifest["n_examples"]
        todo = max_tokens - self.n_tokens
        if todo <= 0:
            return
        n_ctx = 4096
        config = ContextConfig(n_ctx=n_ctx, n_batch=UBATCH, n_ubatch=UBATCH, n_threads=n_threads,
                               embeddings=True)
        with Context(self.model, config) as ctx, \
                progress_bar("extracting target features", todo, unit="tokens") as advance:
            buf: list[tuple[Example, np.ndarray]] = []
            n_buf = consumed = 0
            for i, ex in enumerate(examples):
                consumed = i + 1
                if i < done:
                    continue
                if len(ex.tokens) > n_ctx:
                    raise LocalspecError(f"example {ex.id} has {len(ex.tokens)} tokens > {n_ctx}")
                buf.append((ex, hidden_states(ctx, ex.tokens)))
                n_buf += len(ex.tokens)
                advance(len(ex.tokens))
                if n_buf >= shard_tokens or n_buf >= todo:
                    yield self._write(buf, consumed)
                    todo -= n_buf
                    buf, n_buf = [], 0
                    if todo <= 0:
                        return
            if buf:  # the corpus ran out: the manifest counts every example consumed
                yield self._write(buf, consumed)

    def _write(self, buf: list[tuple[Example, np.ndarray]], n_examples: int) -> Shard:
        name = f"shard-{len(self.manifest['shards']):05d}"
        lengths = [len(ex.tokens) for ex, _ in buf]
        arrays = {
            "tokens": np.concatenate([ex.tokens for ex, _ in buf]).astype(np.int32),
            "mask": np.concatenate([ex.mask for ex, _ in buf]).astype(bool),
            "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            "hidden": np.concatenate([h for _, h in buf]).astype(np.float16),
        }
        for key, value in arrays.items():
            with replacing(self.dir / f"{name}.{key}.npy") as tmp, open(tmp, "wb") as f:
                np.save(f, value)  # (a file object: given a path, np.save would add ".npy")
        self.manifest["shards"].append({"name": name, "n_tokens": int(sum(lengths)),
                                        "n_examples": len(buf)})
        self.manifest["n_examples"] = n_examples
        write_whole(self.manifest_path, json.dumps(self.manifest, indent=1).encode())
        return self.load(name)


def hidden_states(ctx: Context, tokens: np.ndarray) -> np.ndarray:
    """The target's final hidden state (LM-head input) at every position of `tokens`, decoded
    from an empty cache in batches of n_batch."""
    ctx.clear()
    out = np.empty((len(tokens), ctx.model.n_embd), np.float32)
    step = ctx.config.n_batch
    for start in range(0, len(tokens), step):
        chunk = tokens[start:start + step]
        ctx.decode(chunk, range(start, start + len(chunk)), outputs=[True] * len(chunk))
        out[start:start + len(chunk)] = hidden_rows(ctx, range(len(chunk)))
    return out
