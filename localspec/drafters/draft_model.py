"""A small model with the target's tokenizer drafts a chain in its own llama.cpp context,
token by token, while the planner says the next token is worth its cost."""

from __future__ import annotations

import time

import numpy as np

from localspec import _native
from localspec.drafters import Calibration
from localspec.engine import Context, Model
from localspec.engine.context import ContextConfig
from localspec.errors import LocalspecError
from localspec.sampling import SamplingConfig, TokenSampler
from localspec.verify import DraftTree, Verdict


def check_same_vocabulary(target: Model, draft: Model) -> None:
    """Refuse a draft model whose tokens mean something else than the target's."""
    if draft.n_vocab != target.n_vocab:
        raise LocalspecError(f"draft model {draft.path.name} has {draft.n_vocab} tokens, the "
                             f"target {target.path.name} {target.n_vocab}: not the same tokenizer")
    probe = range(0, target.n_vocab, max(1, target.n_vocab // 512))
    for t in probe:
        if target.token_bytes(t, special=True) != draft.token_bytes(t, special=True):
            raise LocalspecError(f"draft model {draft.path.name} and target {target.path.name} "
                                 f"disagree on token {t}: not the same tokenizer")


class DraftModelDrafter:
    def __init__(self, model: Model, target: Model, sampling: SamplingConfig, planner,
                 max_depth: int = 8, n_ctx: int = 4096, n_threads: int = 0):
        check_same_vocabulary(target, model)
        self.name = f"draft:{model.path.stem}"
        self.ctx = Context(model, ContextConfig(n_ctx=n_ctx, n_threads=n_threads))
        # Drafts at T = 0 are picked (deterministic); at T > 0 drawn from the draft's own
        # distribution under the same transform, so verification can use p/q.
        self.sampled = sampling.temperature > 0
        self.sampler = TokenSampler(sampling)
        self.planner = planner
        self.max_depth = max_depth
        self.calibration = Calibration(prior=0.9)
        self.t_token = 0.0  # running seconds per drafted token
        self._raw = np.zeros(0)

    def propose(self, context: list[int], max_nodes: int) -> DraftTree:
        self.calibration.tick()
        # Even a first token the target surely accepts must pay for its draft forward and the
        # larger verification; when it cannot (a slow draft model on a CPU), do not draft.
        if not self.planner.worth_drafting(min(1.0, self.calibration.scale), self.t_token, 0):
            return DraftTree.empty()
        t0 = time.perf_counter()
        row = self.ctx.prefill(context)
        if self.sampler.window:
            self.sampler.history = np.asarray(context[-self.sampler.window:], np.int32)
        tokens, raw, q_ids, q_probs, q_offsets = [], [], [], [], [0]
        reach = 1.0
        for depth in range(min(self.max_depth, max_nodes)):
            ids, probs = self.sampler.distribution(self.ctx.logits(row))
            x = _native.draw(ids, probs, self.sampler.rng) if self.sampled else int(ids[0])
            px = float(probs[ids == x][0])
            reach *= px
            if not self.planner.worth_drafting(reach * self.calibration.scale, self.t_token, depth):
                break
            tokens.append(x)
            raw.append(reach)
            self.sampler.extend([x])
            if self.sampled:
                q_ids.append(ids)
                q_probs.append(probs)
                q_offsets.append(q_offsets[-1] + len(ids))
            if depth + 1 < min(self.max_depth, max_nodes):
                self.ctx.append(x)
                row = 0
        if tokens:
            dt = (time.perf_counter() - t0) / len(tokens)
            self.t_token = dt if self.t_token == 0 else 0.8 * self.t_token + 0.2 * dt
        self._raw = np.asarray(raw)
        n = len(tokens)
        tree = DraftTree(np.asarray(tokens, np.int32), np.arange(-1, n - 1, dtype=np.int32),
                         np.minimum(1.0, self._raw * self.calibration.scale))
        if self.sampled and n:
            tree.q_offsets = np.asarray(q_offsets, np.int32)
            tree.q_ids = np.concatenate(q_ids).astype(np.int32)
            tree.q_probs = np.concatenate(q_probs).astype(np.float32)
        return tree

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        self.calibration.update(self._raw[:len(tree)], len(verdict.path))

    def close(self) -> None:
        self.ctx.close()
