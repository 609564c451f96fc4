"""Run every configuration on every prompt, interleaved prompt by prompt, against plain
decoding in the same process, and keep the numbers a table needs."""

from __future__ import annotations

import collections
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import numpy as np

from localspec import paths
from localspec.bench.ceiling import Corpus, copy_ceiling
from localspec.bench.pricing import there
from localspec.bench.workloads import Prompt, Warm
from localspec.drafters.spec import NONE, DrafterSpec
from localspec.engine import Engine, Request
from localspec.llama.curve import CostModel
from localspec.loop import Iteration
from localspec.llama.text import chat_tokens
from localspec.sampling import SamplingConfig
from localspec.serve.infill import INFILL_BATCH, INFILL_PREDICT, ExtraChunk, infill_tokens


class Step(NamedTuple):
    """One iteration after the prompt, as the bench keeps it."""
    batch: int       # tokens its target forward verified (1: no draft)
    seconds: float
    forward: float   # of them, the target's forward
    host: float      # ... and the host's (loop.Iteration.host_seconds)
    context: int     # tokens in the cache before its forward
    draft: float     # the drafters' own forwards, on their clock (here, or on a draft curve)


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
    failed: str | None = None
    # plain decoding's greedy answer only: (its seconds, a clairvoyant copier's) on the cost
    # curve (bench/ceiling.py)
    ceiling: tuple[float, float] | None = None
    iterations: list[Step] = field(default_factory=list)  # after the prompt
    ran: dict[str, int] = field(default_factory=dict)  # iterations per arm (loop.Stats.ran)
    # every repeat's (seconds, tokens timed), in the order run: a tie may flip in one repeat and
    # not the other, so the spread of two repeats is their rates'
    repeats: list[tuple[float, int]] = field(default_factory=list)


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

    @property
    def host_ms(self) -> float | None:
        """Median host milliseconds per iteration, outside the target's and drafter's forwards."""
        host = [it.host for r in self.ok_runs for it in r.iterations]
        return float(np.median(host)) * 1e3 if host else None

    def by_batch(self, which: str) -> dict[int, float]:
        """Median milliseconds per iteration by batch size (1: a step that verified no draft):
        of the host ("host"), of the whole iteration ("iteration") or of its forward."""
        by: dict[int, list[float]] = {}
        for r in self.ok_runs:
            for it in r.iterations:
                by.setdefault(it.batch, []).append({"host": it.host, "iteration": it.seconds, "forward": it.forward}[which])
        return {n: float(np.median(v)) * 1e3 for n, v in sorted(by.items())}

    def by_streak(self) -> dict[int, dict[str, tuple[float, int]]]:
        """Median forward milliseconds, and how many, by batch size and by the forward's place
        in a run of that size: "1" the size changed, "2" the second in a row, "3+" later. On
        CUDA llama.cpp rebuilds its graph at a change, and ggml-cuda captures a CUDA graph at
        the second and replays it from the third: what a change of size costs, apart."""
        by: dict[int, dict[str, list[float]]] = {}
        for r in self.ok_runs:
            last, streak = None, 0
            for it in r.iterations:
                streak = streak + 1 if it.batch == last else 1
                last = it.batch
                by.setdefault(it.batch, {}).setdefault("3+" if streak >= 3 else str(streak), []).append(it.forward)
        return {n: {k: (float(np.median(v)) * 1e3, len(v)) for k, v in sorted(d.items())}
                for n, d in sorted(by.items())}

    @property
    def ran(self) -> dict[str, int]:
        """Iterations per arm over every run ("plain", "lookup@3", "suffix sure", ...)."""
        total: collections.Counter[str] = collections.Counter()
        for r in self.ok_runs:
            total.update(r.ran)
        return dict(total.most_common())

    @property
    def forward_share(self) -> float | None:
        """The share of the iterations' time spent in the target's forwards."""
        total = sum(it.seconds for r in self.ok_runs for it in r.iterations)
        return sum(it.forward for r in self.ok_runs for it in r.iterations) / total if total else None

    def projected_tokens_per_s(self, curve: CostModel) -> float:
        """Tokens per second had every target forward cost what `curve` prices its batch at
        its context (another machine's curve, say), with the drafters' forwards on their clock
        and the host's time per iteration measured here: the same drafts and acceptance, that
        machine's forwards."""
        seconds = sum(self.projected_seconds(curve).values())
        return self.total("n_timed") / seconds if seconds else 0.0

    def projected_seconds(self, curve: CostModel) -> dict[str, float]:
        """projected_tokens_per_s's seconds by where they go: the target's forwards priced on
        `curve`, the host's time, the drafters' own forwards."""
        its = [it for r in self.ok_runs for it in r.iterations]
        return {"forwards": sum(there(curve, it.batch, it.context, 0.0) for it in its),
                "host": sum(it.host for it in its), "drafters": sum(it.draft for it in its)}


def prompt_tokens(engine: Engine, p: Prompt) -> list[int]:
    if p.kind == "chat":
        return chat_tokens(engine.model, [{"role": "user", "content": p.prompt}])
    if p.kind == "fim":  # as localspec serve (and llama-server) build an editor's request
        return infill_tokens(engine.model, p.prefix, p.suffix, p.prompt,
                             [ExtraChunk(f, t) for f, t in p.extra], INFILL_BATCH,
                             engine.ctx.n_ctx, INFILL_PREDICT)
    return engine.model.tokenize(p.prompt)


def run_ours(engine: Engine, tokens: list[int], drafter: DrafterSpec, max_tokens: int,
             sampling: SamplingConfig, on_iteration=None) -> tuple[list[int], Run]:
    engine.ctx.clear()  # every configuration starts cold: no prefix cache between them
    request = Request(prompt=tokens, sampling=sampling, max_tokens=max_tokens, drafter=drafter)
    iterations: list[Step] = []

    def seen(it: Iteration) -> None:
        if it.arm != "prompt":
            iterations.append(Step(it.batch, it.seconds, it.forward_seconds, it.host_seconds, it.n_past,
                                   it.draft_seconds + it.draft_ahead))
        if on_iteration:
            on_iteration(it)
    *_, done = engine.generate(request, on_iteration=seen)
    s = done.stats
    return done.tokens, Run(n_tokens=s.predicted_n, n_timed=s.predicted_n - 1,
                            seconds=s.predicted_ms / 1e3, drafted=s.draft_n, accepted=s.draft_n_accepted,
                            forwards=s.forwards + 1 if s.forwards else 0,
                            iterations=iterations, ran=dict(s.ran))


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
    return float(abs(top2[1] - top2[0])) <= engine.exactness()[0]


def answers_cache() -> Path:
    """Where the bench keeps the model's plain answers to warm prompts (warm_documents)."""
    return paths.cache_dir() / "bench" / "answers.json"


def warm_documents(engine: Engine, warm: Warm, max_tokens: int, cache: Path | None = None,
                   advance: Callable[[int], None] = lambda n: None) -> list[list[int]]:
    """The token documents `warm` stands for: its texts, and the model's plain greedy answers
    to its prompts (kept in `cache`, keyed by model and prompt, as they take a while)."""
    docs = [engine.model.tokenize(t, add_special=False, parse_special=False) for t in warm.texts]
    known = paths.read_cache(cache, {}) if cache else {}
    if not isinstance(known, dict):
        known = {}
    for p in warm.prompts:
        key = f"{engine.model.path.stem}/{max_tokens}/{p.id}/{zlib.crc32(p.prompt.encode())}"
        if key not in known:
            known[key], _ = run_ours(engine, prompt_tokens(engine, p), NONE, max_tokens, SamplingConfig())
            if cache:
                paths.write_cache(cache, known)
        docs.append([t for t in known[key] if not engine.model.is_eog(t)])
        advance(1)
    return docs


def turns(engine: Engine, p: Prompt) -> Iterator[list[int]]:
    """The prompt tokens of each turn; a session's next turn is built on the answer sent back
    (plain decoding's: every configuration then sees the same history)."""
    if p.kind != "session":
        yield prompt_tokens(engine, p)
        return
    messages = []
    for text in (p.prompt, *p.turns):
        messages.append({"role": "user", "content": text})
        answer = yield chat_tokens(engine.model, messages)
        messages.append({"role": "assistant", "content": answer})


def bench_configs(engine: Engine, drafters: list[DrafterSpec], anchors: list = ()) -> list[Config]:
    """What a bench runs: plain decoding first, then every drafter of ours, then every anchor."""
    suffix = " --strict" if engine.cfg.strict else ""
    ours = [Config(d.label + suffix, d.label, d) for d in drafters if d.kind != "none"]
    return [Config("plain", "none", NONE), *ours, *[Config(a.name, a.kind) for a in anchors]]


def finished_turns(configs: list[Config]) -> int:
    """After an interruption: drop the turn only some configurations finished; how many turns
    every one did."""
    n = min(len(c.runs) for c in configs)
    for c in configs:
        del c.runs[n:]
    return n


def run_bench(engine: Engine, prompts: list[Prompt], configs: list[Config], max_tokens: int,
              sampling: SamplingConfig, anchors: list | None = None,
              advance: Callable[[int], None] = lambda n: None, traced: DrafterSpec | None = None,
              trace: list | None = None, repeat: int = 1,
              warm: list[list[int]] = ()) -> list[Config]:
    """Every configuration (from bench_configs, with these anchors) on every turn of every
    prompt, `repeat` times in alternating order (plain first, then every drafter and anchor;
    then the other way round), keeping each configuration's median run per turn. The
    iterations of `traced` (its first repeat) go to `trace`, a list per turn.

    The engine's suffix store (in memory) learns `warm` first; before each configuration runs
    a turn it is rolled back to what it held before the turn, and after the turn it learns
    plain decoding's answer once, as a user's store would. What the drafters learn from turn
    to turn is each configuration's own (`Learnt`); an anchor that learns across requests runs
    each repeat on a server of its own (anchors.Replicas), which saw the earlier turns once.
    Each configuration's runs grow a turn at a time (interrupted: see finished_turns)."""
    greedy = sampling.temperature <= 0
    plain = configs[0]
    anchor_of = {cfg.name: a for cfg, a in zip([c for c in configs if c.spec is None], anchors or [])}
    store = engine.drafters.suffix_store() if engine.cfg.store.kind == "memory" else None
    if store is not None:
        store.rollback(0)  # what generating the warm answers taught it, among others
        for doc in warm:
            store.add(doc)
    learnt = Learnt(engine, [c for c in configs if c.spec is not None])
    for p in prompts:
        steps = turns(engine, p)
        tokens = next(steps)
        while tokens is not None:
            mark = store.checkpoint() if store is not None else 0
            runs: dict[str, list[tuple[Run, list[int] | str]]] = {c.name: [] for c in configs}
            for r in range(repeat):
                for cfg in configs if r % 2 == 0 else configs[::-1]:
                    if store is not None:
                        store.rollback(mark)
                    if cfg.spec is not None:
                        hook = None
                        if cfg.spec == traced and trace is not None and r == 0:
                            trace.append([])
                            hook = trace[-1].append
                        learnt.before(cfg.name)
                        runs[cfg.name].append(run_ours(engine, tokens, cfg.spec, max_tokens, sampling, hook)[::-1])
                        learnt.ran(cfg.name)
                    else:
                        runs[cfg.name].append(anchor_of[cfg.name].run(p, tokens, max_tokens, sampling, repeat=r))
            _, ref = runs["plain"][0]
            ref_text = engine.model.detokenize([t for t in ref if not engine.model.is_eog(t)])
            for cfg in configs:
                run, out = median_run(runs[cfg.name])
                run.repeats = [(each.seconds, each.n_timed) for each, _ in runs[cfg.name]]
                if greedy and not run.failed:
                    run.identical = out == (ref if cfg.spec is not None else ref_text)
                    if cfg.spec is not None and not run.identical:
                        run.tie = near_tie(engine, tokens, ref, out)
                cfg.runs.append(run)
            learnt.next_turn()
            if store is not None:
                store.rollback(mark)
            if greedy:  # copying from what the store held before the turn
                stored = Corpus.joined(store.native.corpus()) if store is not None else Corpus()
                plain.runs[-1].ceiling = copy_ceiling(ref, tokens, stored, engine.planning.prepare())
            if store is not None:
                store.add([t for t in ref if not engine.model.is_eog(t)])
            try:
                tokens = steps.send(ref_text) if p.kind == "session" else None
            except StopIteration:
                tokens = None
        advance(1)
    return configs


class Learnt:
    """Each configuration's own copy of what its drafters learn from turn to turn (the drafter
    objects are shared: auto's suffix drafter is the suffix configuration's, and one that ran
    a turn after auto had learnt from auto's run how that very text follows its drafts). Every
    repeat of a turn runs from what the configuration had learnt by the turn's start, as if it
    ran alone."""

    def __init__(self, engine: Engine, configs: list[Config]):
        self.drafters = {c.name: engine.controller(c.spec).drafters for c in configs}
        self.at_turn = {name: self._copy(name) for name in self.drafters}  # nothing run yet
        self.after: dict[str, dict[int, dict]] = {}

    def _copy(self, name: str) -> dict[int, dict]:
        return {id(d): d.learned() for d in self.drafters[name]}

    def before(self, name: str) -> None:
        for d in self.drafters[name]:
            d.relearn(self.at_turn[name][id(d)])

    def ran(self, name: str) -> None:
        self.after[name] = self._copy(name)

    def next_turn(self) -> None:
        self.at_turn.update(self.after)
        self.after = {}


def median_run(runs: list[tuple[Run, list[int] | str]]) -> tuple[Run, list[int] | str]:
    """The run of median speed (the lower middle one of an even count); a failure if any failed."""
    failed = [x for x in runs if x[0].failed]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda x: x[0].n_timed / x[0].seconds if x[0].seconds else 0.0)
    return ordered[(len(ordered) - 1) // 2]
