"""The Jakiro drafter at inference: the native runtime (ggml, any backend llama.cpp runs on)
loaded beside its target, refused in one line when it was made for another target."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localspec import _native
from localspec.convert import check_target
from localspec.drafters.jakiro_config import JakiroConfig
from localspec.engine.model import Model
from localspec.errors import LocalspecError
from localspec.train.features import tokenizer_hash


class JakiroRuntime:
    """The drafter's layer and head, with its own KV cache (slots in decode order; the caller's
    masks say which slots each position sees)."""

    def __init__(self, drafter: Path, target: Model, n_ctx: int = 4096, n_threads: int = 0):
        from localspec.convert import read_config
        self.cfg: JakiroConfig = read_config(drafter)
        check_target(self.cfg, target.n_vocab, target.n_embd, tokenizer_hash(target), target.name)
        try:
            self.native = _native.JakiroModel(str(drafter), str(target.path), n_ctx, n_threads)
        except RuntimeError as e:
            raise LocalspecError(f"cannot load drafter {Path(drafter).name}: {e}") from None
        self.draft_vocab = self.native.draft_vocab()

    def layer(self, feats: np.ndarray, tokens, pos, mask: np.ndarray):
        """(u, experts (n, N, d), router logits (n, N)); the new K/V join the cache."""
        return self.native.step(np.ascontiguousarray(feats, np.float32),
                                np.ascontiguousarray(tokens, np.int32),
                                np.ascontiguousarray(pos, np.int32),
                                np.ascontiguousarray(mask, np.float32))

    def logits(self, feats: np.ndarray) -> np.ndarray:
        return self.native.logits(np.ascontiguousarray(feats, np.float32))

    def truncate(self, n: int) -> None:
        self.native.truncate(n)

    @property
    def n_cached(self) -> int:
        return self.native.n_cached
