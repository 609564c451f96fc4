"""The acceptance head at inference: a GGUF written by `localspec train acceptance-head`,
evaluated natively, refused in one line beside a draft model or target it was not made for."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localspec import _native
from localspec.drafters.files import read_head_gguf
from localspec.llama import Model
from localspec.errors import LocalspecError
from localspec.sampling import SamplingConfig

# The transform under which heads learn q(x) (and the target's p, for sampled labels): the
# draft's probabilities fed to a head must come from the same one, also at T = 0.
HEAD_SAMPLING = SamplingConfig(temperature=1.0)


class AcceptanceHead:
    def __init__(self, path: Path, draft, target: Model):
        """`draft`: the draft Model (the head reads its hidden state) or a JakiroRuntime (the
        head reads its branch features)."""
        meta, layers = read_head_gguf(path)
        kind, width = ("draft", draft.n_embd) if isinstance(draft, Model) else ("jakiro", draft.cfg.d_model)
        if meta["d_model"] != width or meta["drafter_kind"] != kind or meta["tokenizer"] != target.tokenizer_hash:
            raise LocalspecError(
                f"acceptance head {Path(path).name} was made for {meta['drafter']} ({meta['drafter_kind']}, "
                f"hidden {meta['d_model']}) drafting for {meta['target']}, not {Path(draft.path).stem} "
                f"({kind}, hidden {width}) for {target.name}")
        self.native = _native.AcceptanceHead(layers, meta["q_scale"])

    def probs(self, f: np.ndarray, rows: list[int], q: list[float]) -> np.ndarray:
        """P(accepted) of tokens drafted with probability q[i] under hidden state f[rows[i]]."""
        return self.native.probs(np.ascontiguousarray(f, np.float32), np.asarray(rows, np.int32),
                                 np.asarray(q, np.float32))
