"""The target tensors a feature drafter shares, read straight from the target's GGUF: the token
embedding and the LM head (the embedding again when the model ties them), dequantized."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from localspec.errors import LocalspecError


class TargetWeights:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.reader = GGUFReader(str(self.path))
        self.tensors = {t.name: t for t in self.reader.tensors}
        if "token_embd.weight" not in self.tensors:
            raise LocalspecError(f"{self.path.name}: no token_embd.weight tensor")
        self.arch = self.meta("general.architecture")

    def meta(self, key: str, default=None):
        f = self.reader.get_field(key)
        return default if f is None else f.contents()

    def arch_meta(self, key: str, default=None):
        return self.meta(f"{self.arch}.{key}", default)

    def matrix(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """A 2-D tensor as float32 (n_rows, n_cols), or only the given rows."""
        t = self.tensors[name]
        data = t.data if rows is None else t.data[rows]
        out = dequantize(data, t.tensor_type)
        return np.ascontiguousarray(out.reshape(len(data) if rows is not None else -1,
                                                int(t.shape[0])), np.float32)

    def embedding(self) -> np.ndarray:
        return self.matrix("token_embd.weight")

    def head(self, rows: np.ndarray | None = None) -> np.ndarray:
        return self.matrix(self.head_tensor_name, rows)

    @property
    def head_tensor_name(self) -> str:
        return "output.weight" if "output.weight" in self.tensors else "token_embd.weight"
