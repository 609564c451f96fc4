"""Plain autoregressive generation: the reference every speculative decoder must match."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from localspec.engine.context import Context
from localspec.sampling import SamplingConfig, TokenSampler


@dataclass
class GenerationStats:
    n_prompt: int = 0
    n_generated: int = 0
    t_prompt: float = 0.0    # seconds to prefill the prompt (and draw the first token)
    t_generate: float = 0.0  # seconds for the rest

    @property
    def tokens_per_s(self) -> float:
        n = self.n_generated - 1  # the first token is paid for by the prompt
        return n / self.t_generate if n > 0 and self.t_generate > 0 else 0.0

    def summary(self) -> str:
        return (f"{self.tokens_per_s:.2f} tokens/s · prompt {self.n_prompt} tokens in "
                f"{self.t_prompt:.2f}s · generated {self.n_generated} tokens in {self.t_generate:.2f}s")


def generate(ctx: Context, prompt: Sequence[int], max_tokens: int,
             sampling: SamplingConfig = SamplingConfig(),
             stats: GenerationStats | None = None, stop_at_eog: bool = True) -> Iterator[int]:
    """Yield up to `max_tokens` tokens, one target forward each; stops after an
    end-of-generation token (which is yielded) unless stop_at_eog is off (benchmarks)."""
    stats = stats if stats is not None else GenerationStats()
    stats.n_prompt = len(prompt)
    sampler = TokenSampler(sampling, list(prompt))
    t0 = time.perf_counter()
    row = ctx.prefill(prompt)
    max_tokens = min(max_tokens, ctx.n_ctx - len(prompt) + 1)  # stop where the context ends
    for i in range(max_tokens):
        token = sampler.sample(ctx.logits(row))
        now = time.perf_counter()
        if i == 0:
            stats.t_prompt = now - t0
            t0 = now
        stats.n_generated += 1
        stats.t_generate = now - t0
        yield token
        if (stop_at_eog and ctx.model.is_eog(token)) or i + 1 == max_tokens:
            break
        sampler.extend([token])
        ctx.append(token)
        row = 0
