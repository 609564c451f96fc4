"""Run every configuration on every prompt, interleaved prompt by prompt, against plain
decoding in the same process, and keep the numbers a table needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from localspec.bench.workloads import Prompt
from localspec.engine.text import chat_tokens
from localspec.sampling import SamplingConfig
from localspec.session import Session, split_budget, split_spec
from localspec.speculative import SpecStats


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
    drafter: str                    # "none", "lookup", "draft:..." or an anchor's kind
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


def prompt_tokens(session: Session, p: Prompt) -> list[int]:
    if p.kind == "chat":
        return chat_tokens(session.model, [{"role": "user", "content": p.prompt}])
    return session.model.tokenize(p.prompt)


def run_ours(session: Session, tokens: list[int], drafter: str, max_tokens: int,
             sampling: SamplingConfig) -> tuple[list[int], Run]:
    session.ctx.clear()  # every configuration starts cold: no prefix cache between them
    stats = SpecStats()
    out = list(session.generate(tokens, max_tokens, sampling, drafter, stats))
    return out, Run(n_tokens=stats.n_generated, n_timed=stats.n_generated - 1, seconds=stats.t_generate,
                    drafted=stats.n_drafted, accepted=stats.n_accepted,
                    forwards=stats.n_forwards + 1 if stats.n_forwards else 0,
                    settled=stats.n_settled)


def near_tie(session: Session, prompt: list[int], plain: list[int], other: list[int]) -> bool:
    """Is the first position where `other` leaves `plain` a tie within the measured
    discrepancy bound, in plain decoding's own computation of that position?"""
    k = next(i for i, (a, b) in enumerate(zip(plain, other)) if a != b)
    ctx = session.ctx
    ctx.clear()
    row = ctx.prefill(prompt)
    for t in plain[:k]:
        ctx.append(t)
        row = 0
    top2 = np.partition(ctx.logits(row), -2)[-2:]
    return float(abs(top2[1] - top2[0])) <= session.curve.discrepancy


def short_label(spec: str) -> str:
    """`jakiro:/some/dir/x.gguf,cepd=off@4` -> `jakiro:x,cepd=off@4`: tables name files, not paths."""
    base, k = split_budget(spec)
    kind, arg = split_spec(base)
    path, comma, opts = arg.partition(",")
    if "/" in path or path.endswith(".gguf"):
        base = f"{kind}:{Path(path).stem}{comma}{opts}"
    return base + (f"@{k}" if k else "")


def run_bench(session: Session, prompts: list[Prompt], drafters: list[str], max_tokens: int,
              sampling: SamplingConfig, anchors: list | None = None,
              advance: Callable[[int], None] = lambda n: None) -> list[Config]:
    """Plain first on each prompt, then every drafter, then every anchor."""
    greedy = sampling.temperature <= 0
    plain = Config("plain", "none")
    suffix = " --strict" if session.cfg.strict else ""
    ours = [Config(short_label(d) + suffix, d) for d in drafters if d != "none"]
    anchors = anchors or []
    configs = [plain, *ours, *[Config(a.name, a.kind) for a in anchors]]
    for p in prompts:
        tokens = prompt_tokens(session, p)
        ref, run = run_ours(session, tokens, "none", max_tokens, sampling)
        plain.runs.append(run)
        ref_text = session.model.detokenize([t for t in ref if not session.model.is_eog(t)])
        for cfg in ours:
            out, run = run_ours(session, tokens, cfg.drafter, max_tokens, sampling)
            if greedy:
                run.identical = out == ref
                if not run.identical:
                    run.tie = near_tie(session, tokens, ref, out)
            cfg.runs.append(run)
        for anchor, cfg in zip(anchors, configs[1 + len(ours):]):
            run, text = anchor.run(p, tokens, max_tokens, sampling)
            if greedy and not run.failed:
                run.identical = text == ref_text
            cfg.runs.append(run)
        advance(1)
    return configs
