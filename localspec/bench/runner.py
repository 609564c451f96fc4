"""Run every configuration on every prompt, interleaved prompt by prompt, against plain
decoding in the same process, and keep the numbers a table needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from localspec.bench.workloads import Prompt
from localspec.drafters.spec import NONE, DrafterSpec
from localspec.engine import Engine, Request
from localspec.llama.text import chat_tokens
from localspec.sampling import SamplingConfig
from localspec.serve.app import ServeConfig
from localspec.serve.infill import ExtraChunk, infill_tokens


@dataclass
class Run:
    """One configuration on one prompt."""
    n_tokens: int = 0
    n_timed: int = 0          # tokens generated during `seconds`
    seconds: float = 0.0      # generation time, prompt excluded
    identical: bool | None = None   # same tokens (greedy) or text (anchors) as plain
    tie: bool | None = None   # differing: did it first differ at a measured near-tie?
    drafted: int = 0
    accepted: int = 0
    forwards: int = 0
    settled: int = 0
    failed: str | None = None


@dataclass
class Config:
    name: str
    drafter: str                    # our spec's label, or an anchor's kind
    spec: DrafterSpec | None = None  # ours
    runs: list[Run] = field(default_factory=list)

    def total(self, attr: str) -> float:
        return sum(getattr(r, attr) for r in self.runs if not r.failed)

    @property
    def ok_runs(self) -> list[Run]:
        return [r for r in self.runs if not r.failed]

    @property
    def tokens_per_s(self) -> float:
        n = self.total("n_timed")
        t = self.total("seconds")
        return n / t if t > 0 else 0.0

    @property
    def tau(self) -> float | None:
        f = self.total("forwards")
        return sum(r.n_tokens for r in self.ok_runs) / f if f else None

    @property
    def acceptance(self) -> float | None:
        d = self.total("drafted")
        return self.total("accepted") / d if d else None


def prompt_tokens(engine: Engine, p: Prompt) -> list[int]:
    if p.kind == "chat":
        return chat_tokens(engine.model, [{"role": "user", "content": p.prompt}])
    if p.kind == "fim":  # as localspec serve (and llama-server) build an editor's request
        return infill_tokens(engine.model, p.prefix, p.suffix, p.prompt,
                             [ExtraChunk(f, t) for f, t in p.extra], ServeConfig.infill_batch,
                             engine.ctx.n_ctx, ServeConfig.infill_predict)
    return engine.model.tokenize(p.prompt)


def run_ours(engine: Engine, tokens: list[int], drafter: DrafterSpec, max_tokens: int,
             sampling: SamplingConfig, on_iteration=None) -> tuple[list[int], Run]:
    engine.ctx.clear()  # every configuration starts cold: no prefix cache between them
    request = Request(prompt=tokens, sampling=sampling, max_tokens=max_tokens, drafter=drafter)
    *_, done = engine.generate(request, on_iteration=on_iteration)
    s = done.stats
    return done.tokens, Run(n_tokens=s.predicted_n, n_timed=s.predicted_n - 1,
                            seconds=s.predicted_ms / 1e3, drafted=s.draft_n, accepted=s.draft_n_accepted,
                            forwards=s.forwards + 1 if s.forwards else 0, settled=s.settled)


def near_tie(engine: Engine, prompt: list[int], plain: list[int], other: list[int]) -> bool:
    """Is the first position where `other` leaves `plain` a tie within the measured
    discrepancy bound, in plain decoding's own computation of that position?"""
    k = next(i for i, (a, b) in enumerate(zip(plain, other)) if a != b)
    ctx = engine.ctx
    ctx.clear()
    _, logits = ctx.prefill(prompt)
    for t in plain[:k]:
        ctx.append(t)
        logits = ctx.logits(0)
    top2 = np.partition(logits, -2)[-2:]
    return float(abs(top2[1] - top2[0])) <= engine.curve.discrepancy


def run_bench(engine: Engine, prompts: list[Prompt], drafters: list[DrafterSpec], max_tokens: int,
              sampling: SamplingConfig, anchors: list | None = None,
              advance: Callable[[int], None] = lambda n: None, traced: DrafterSpec | None = None,
              trace: list | None = None) -> list[Config]:
    """Plain first on each prompt, then every drafter, then every anchor. The iterations of
    `traced` go to `trace`, a list per prompt."""
    greedy = sampling.temperature <= 0
    plain = Config("plain", "none", NONE)
    suffix = " --strict" if engine.cfg.strict else ""
    ours = [Config(d.label + suffix, d.label, d) for d in drafters if d.kind != "none"]
    anchors = anchors or []
    configs = [plain, *ours, *[Config(a.name, a.kind) for a in anchors]]
    for p in prompts:
        tokens = prompt_tokens(engine, p)
        ref, run = run_ours(engine, tokens, NONE, max_tokens, sampling)
        plain.runs.append(run)
        ref_text = engine.model.detokenize([t for t in ref if not engine.model.is_eog(t)])
        for cfg in ours:
            hook = None
            if cfg.spec == traced and trace is not None:
                trace.append([])
                hook = trace[-1].append
            out, run = run_ours(engine, tokens, cfg.spec, max_tokens, sampling, hook)
            if greedy:
                run.identical = out == ref
                if not run.identical:
                    run.tie = near_tie(engine, tokens, ref, out)
            cfg.runs.append(run)
        for anchor, cfg in zip(anchors, configs[1 + len(ours):]):
            run, text = anchor.run(p, tokens, max_tokens, sampling)
            if greedy and not run.failed:
                run.identical = text == ref_text
            cfg.runs.append(run)
        advance(1)
    return configs
