"""Speculative generation: draft a tree, verify it in one target forward, keep exactly what
the target would have produced. Same tokens as `generate` (greedy) or the same distribution
(T > 0)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from localspec.control.planner import Planner
from localspec.drafters import Drafter
from localspec.engine.context import Context
from localspec.generate import GenerationStats
from localspec.sampling import SamplingConfig, TokenSampler
from localspec.verify import DraftTree, verify_tree


@dataclass
class SpecStats(GenerationStats):
    n_forwards: int = 0   # target forwards after the prompt (verifications and plain steps)
    n_drafted: int = 0    # draft nodes sent to verification
    n_accepted: int = 0   # of those, accepted
    n_settled: int = 0    # strict mode: rows re-decoded alone because of a near tie
    accept_lengths: list[int] = field(default_factory=list)  # per verification

    @property
    def tau(self) -> float:
        """Tokens emitted per target forward (the prompt's forward emits the first)."""
        return self.n_generated / (self.n_forwards + 1) if self.n_generated else 0.0

    @property
    def acceptance(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    def summary(self) -> str:
        if not self.n_forwards:  # plain generation counts no speculative forwards
            return super().summary()
        return (super().summary() + f"\nτ {self.tau:.2f} tokens/forward · acceptance "
                f"{self.acceptance:.1%} · drafted {self.n_drafted} · accepted {self.n_accepted}"
                + (f" · settled {self.n_settled}" if self.n_settled else ""))


def speculative_generate(ctx: Context, drafter: Drafter, planner: Planner, prompt: Sequence[int],
                         max_tokens: int, sampling: SamplingConfig = SamplingConfig(),
                         stats: SpecStats | None = None, tie_bound: float = 0.0,
                         stop_at_eog: bool = True, max_batch: int | None = None) -> Iterator[int]:
    """Yield up to `max_tokens` tokens. With tie_bound > 0 (strict, greedy), a position whose
    top-two gap in the batched logits is below it is decided by a single-token forward, as
    plain decoding would. `max_batch` caps every target forward (strict: the largest batch
    that reproduces single-token decoding)."""
    stats = stats if stats is not None else SpecStats()
    stats.n_prompt = len(prompt)
    sampler = TokenSampler(sampling, list(prompt))
    t0 = time.perf_counter()
    # Feature drafters (Jakiro) read the target's hidden states of the tokens it commits:
    # the prompt's last `window` and every token after.
    window = getattr(drafter, "feature_window", 0)
    row = ctx.prefill(prompt, n_outputs=max(1, window))
    if window:
        k = min(window, row + 1)
        drafter.committed(ctx, len(prompt) - k, list(range(row + 1 - k, row + 1)), fresh=True)
    max_tokens = min(max_tokens, ctx.n_ctx - len(prompt) + 1)
    first = sampler.sample(ctx.logits(row))
    sampler.extend([first])
    stats.t_prompt = time.perf_counter() - t0
    t0 = time.perf_counter()
    stats.n_generated = n_out = 1
    yield first
    pending = [first]  # emitted, not yet in the KV cache; the last is the next tree's root
    while n_out < max_tokens and not (stop_at_eog and ctx.model.is_eog(pending[-1])):
        room = min(max_tokens - n_out - 1, ctx.n_ctx - len(ctx.tokens) - len(pending) - 1,
                   (max_batch or ctx.n_ctx) - len(pending))
        tree = planner.size(drafter.propose(ctx.tokens + pending, room)) if room > 0 \
            else DraftTree.empty()
        n_past = len(ctx.tokens)
        if len(tree) == 0:
            emitted = [sampler.sample(ctx.logits(ctx.extend(pending, len(pending) if window else 1)))]
            if window:
                drafter.committed(ctx, n_past, list(range(len(pending))))
            pending, unsettled = [], False
        else:
            verdict = verify_tree(ctx, tree, pending, sampler, tie_bound, all_pending_rows=bool(window))
            if window:  # the pending rows, then the accepted nodes the cache kept
                drafter.committed(ctx, n_past, list(range(len(pending) + verdict.n_cached)))
            drafter.observe(tree, verdict)
            emitted, unsettled = verdict.tokens, verdict.unsettled
            pending = emitted[verdict.n_cached:len(verdict.path)]  # accepted, not cached
            stats.n_drafted += len(tree)
            stats.n_accepted += len(verdict.path)
            stats.accept_lengths.append(len(verdict.path))
        stats.n_forwards += 1
        sampler.extend(emitted)
        if unsettled:
            emitted.append(settle(ctx, sampler, pending))
            sampler.extend(emitted[-1:])
            pending = []
            stats.n_forwards += 1
            stats.n_settled += 1
        pending.append(emitted[-1])
        for token in emitted:
            n_out += 1
            stats.n_generated = n_out
            stats.t_generate = time.perf_counter() - t0
            yield token
            if (stop_at_eog and ctx.model.is_eog(token)) or n_out == max_tokens:
                return


def settle(ctx: Context, sampler: TokenSampler, pending: list[int]) -> int:
    """Draw the token after the accepted path (already in the sampler's history) from
    single-token forwards of what is not yet in the cache (at least the path's last token),
    as plain decoding computes it."""
    if not pending:
        pending = [ctx.tokens.pop()]
        ctx.seq_rm(0, len(ctx.tokens), -1)
    for token in pending:
        ctx.append(token)
    return sampler.sample(ctx.logits(0))
