"""Timing the loop where real weights cannot travel: synthetic acceptance, as llama.cpp's own
`--spec-synth-rates` / `--spec-synth-len`, but lossless.

llama.cpp accepts draft tokens at random and its output is then not the model's. Here the
drafter proposes the target's own greedy continuation (known from a plain run of the same
prompt) broken at a depth drawn with the given rates, and verification is the real one: the
output is still plain decoding's, and the loop, its batches and its host work are what they
are with any drafter accepted that often. Random-weight models of real shapes can so be timed
at the acceptance a real drafter reaches."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from localspec.control.controllers import Fixed, Plain
from localspec.drafters.base import Budget, DraftClock, Drafter
from localspec.engine import Engine
from localspec.errors import LocalspecError
from localspec.llama.context import Context
from localspec.loop import RunOptions, Stats, generate, run
from localspec.sampling import SamplingConfig
from localspec.verify import DraftTree

DEFAULT_K = 16  # draft tokens per chain where the rates are given as a mean length


def parse_rates(text: str, k: int = DEFAULT_K) -> list[float]:
    """Unconditional per-position acceptance probabilities (P(the draft's i-th token is
    accepted)): "0.9,0.7,0.5" as given (non-increasing, within [0, 1]), or "len=L", a mean
    accepted length L (the target's own token included) over k positions of one geometric
    rate, resolved as llama.cpp's common_speculative_synth_rates_resolve does."""
    text = text.strip()
    if text.startswith("len="):
        try:
            length = float(text[4:])
        except ValueError:
            raise LocalspecError(f"--synthetic {text!r}: len= takes a number") from None
        if not (math.isfinite(length) and 1.0 <= length <= k + 1):
            raise LocalspecError(f"--synthetic {text!r}: a mean length within [1, {k + 1}] for {k} draft tokens")
        if length == k + 1:
            return [1.0] * k
        lo, hi = 0.0, 1.0
        for _ in range(48):  # the geometric rate p with p + p² + ... + p^k = L - 1
            p = (lo + hi) / 2
            lo, hi = (p, hi) if sum(p ** j for j in range(1, k + 1)) < length - 1 else (lo, p)
        p = (lo + hi) / 2
        return [p ** j for j in range(1, k + 1)]
    try:
        rates = [float(x) for x in text.split(",")]
    except ValueError:
        raise LocalspecError(f"--synthetic {text!r}: comma-separated probabilities, or len=L") from None
    if not rates or any(not (0.0 <= r <= 1.0) for r in rates) or any(b > a for a, b in zip(rates, rates[1:])):
        raise LocalspecError(f"--synthetic {text!r}: probabilities within [0, 1], never increasing")
    return rates


def mean_length(rates: Sequence[float]) -> float:
    """Tokens an iteration emits on average: the accepted drafts and the target's own."""
    return 1.0 + sum(rates)


class SyntheticDrafter(Drafter):
    """Drafts `len(rates)` tokens of `truth` (the prompt and plain decoding's answer), the
    first wrong one at a depth drawn with `rates`: position i stays right with probability
    rates[i] / rates[i - 1] once all before it did. `branches` = 2 adds a second child at
    every level, a leaf, that holds the right token, at the level where the chain broke, with
    that level's conditional rate (a second guess as good as the first): a tree of 2K nodes,
    of which the budget's max_nodes most likely to be reached are proposed (all 2K, or as many
    as a chain has: the chain's deep nodes traded for second guesses near the root, where the
    chain breaks most often). With `same_rows`, a proposal after one whose text went through a
    second guess holds as many nodes fewer as came back as pending rows (accepted after a
    rejected node's cell: verify.accept), so that every batch has the chain's rows.
    `idle_every` = n: every n-th proposal is empty (a plain step inside a speculative run).

    Batched rows may flip a near-tie that plain decoding's single rows did not (on a GPU with
    random weights, whose logits are near-flat, within a few iterations): the text is then
    another than `truth`. With `follow` (context, n -> the target's plain greedy continuation
    of the context, n tokens) the drafter takes up that text's own continuation and goes on
    at the same rates, the time it took told to its clock (a drafter's own forwards: not the
    loop's); without, it drafts nothing more."""

    name = "synthetic"
    AHEAD = 32  # tokens of a followed text's continuation decoded at a time

    def __init__(self, truth: Sequence[int], rates: Sequence[float], n_vocab: int, branches: int = 1,
                 idle_every: int = 0, seed: int = 0,
                 follow: Callable[[list[int], int], list[int]] | None = None, same_rows: bool = False):
        self.truth = list(truth)
        self.end = len(self.truth)  # where the request ends: no truth past it
        self.follow = follow
        self.flips = 0  # texts taken up after a flip
        self.rates = list(rates)
        self.conditional = [r / p if p > 0 else 0.0 for r, p in zip(self.rates, [1.0] + self.rates)]
        self.n_vocab = n_vocab
        self.branches = branches
        self.idle_every = idle_every
        self.rng = random.Random(seed)
        self.proposals = 0
        self.diverged = False
        self.same_rows = same_rows
        self.last: tuple[int, DraftTree] | None = None  # the last proposal, and its context's length

    def wrong(self, token: int, k: int = 1) -> int:
        return (token + k) % self.n_vocab

    def propose(self, context: list[int], budget: Budget) -> DraftTree:
        self.proposals += 1
        if self.idle_every and self.proposals % self.idle_every == 0:
            return DraftTree.empty()
        n = len(context)
        n_nodes = budget.max_nodes - (self.requeued(context) if self.same_rows else 0)
        k = min(len(self.rates), n_nodes)
        if self.diverged or self.truth[n - 1:n] != context[-1:]:  # a flip: another text
            if self.follow is None:
                self.diverged = True
                return DraftTree.empty()
            self.flips += 1
            self.truth = list(context)
        if len(self.truth) < min(n + k, self.end):  # a followed text's continuation, as needed
            t0 = time.perf_counter()
            self.truth += self.follow(self.truth, min(self.AHEAD, self.end - len(self.truth)))
            self.clock.forward(0, n, t0)
        right = self.truth[n:n + k]
        right += [self.wrong(right[-1] if right else context[-1])] * (k - len(right))  # past the end: wrong
        broken = next((i for i in range(k) if self.rng.random() >= self.conditional[i]), k)
        tokens, parents, reach = [], [], []
        chain_parent = -1
        for depth in range(k):
            tokens.append(right[depth] if depth < broken else self.wrong(right[depth]))
            parents.append(chain_parent)
            reach.append(self.rates[depth])
            chain_parent_next = len(tokens) - 1
            if self.branches == 2:
                second = depth == broken and self.rng.random() < self.conditional[depth]
                tokens.append(right[depth] if second else self.wrong(right[depth], 2))
                parents.append(chain_parent)
                # reached where the chain came this far, broke here, and the second guess held
                before = self.rates[depth - 1] if depth else 1.0
                reach.append(before * (1.0 - self.conditional[depth]) * self.conditional[depth])
            chain_parent = chain_parent_next
        self.last = n, best_nodes(tokens, parents, reach, n_nodes)
        return self.last[1]

    def requeued(self, context: list[int]) -> int:
        """The last proposal's accepted nodes the cache dropped, to come back as pending rows:
        those after the first node not accepted, in batch order."""
        if self.last is None or self.last[0] > len(context):
            return 0
        path = self.last[1].path(context[self.last[0]:])[0]
        return sum(1 for depth, node in enumerate(path) if node != depth)


def best_nodes(tokens: list[int], parents: list[int], reach: list[float], n: int) -> DraftTree:
    """The n nodes most likely to be reached, best first (a parent is at least as likely as its
    child and comes first among equals: the kept nodes are a tree). The selection is
    drafters.base.rerank's, but not its order by depth: best first, the chain's likeliest
    nodes come before any second guess, so the paths a text most often takes leave fewest
    rejected cells before accepted ones (verify.accept sends nodes after such a hole back
    as pending rows; by depth, a first-level second guess would sit before the whole chain)."""
    order = sorted(range(len(tokens)), key=lambda i: -reach[i])[:n]
    place = {old: new for new, old in enumerate(order)}
    return DraftTree(np.asarray([tokens[i] for i in order], np.int32),
                     np.asarray([place[parents[i]] if parents[i] >= 0 else -1 for i in order], np.int32),
                     np.asarray([reach[i] for i in order]))


@dataclass
class Arm:
    """One configuration's iterations over every prompt: (batch rows, seconds, forward
    seconds, host seconds) each, and its tokens."""
    name: str
    branches: int = 0       # 0: plain decoding
    idle_every: int = 0
    nodes: int = 0          # draft nodes an iteration (0: K per branch)
    sized: bool = False     # sized on the cost curve by the nodes' chances, as localspec's drafters are
    steps: list[tuple[int, float, float, float]] = field(default_factory=list)
    tokens: int = 0         # generated after each prompt's first token
    seconds: float = 0.0
    identical: int = 0      # prompts whose output was plain decoding's
    flips: int = 0          # near-ties that flipped, after which the drafter followed the new text
    runs: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def iterations_per_s(self) -> float:
        return len(self.steps) / self.seconds if self.seconds else 0.0

    def median_ms(self, column: int, batch: int | None = None) -> float | None:
        values = [s[column] for s in self.steps if batch is None or s[0] == batch]
        return float(np.median(values)) * 1e3 if values else None

    def by_batch(self) -> dict[int, dict]:
        """Per batch size: its iterations and their median iteration, forward and host ms."""
        return {b: {"iterations": sum(1 for s in self.steps if s[0] == b), "iteration_ms": self.median_ms(1, b),
                    "forward_ms": self.median_ms(2, b), "host_ms": self.median_ms(3, b)}
                for b in sorted({s[0] for s in self.steps})}


def arms(rates: Sequence[float], trees: bool = True) -> list[Arm]:
    """Plain, a chain of K, a tree of 2K and the tree of K nodes likeliest of it, the chain's
    rows (`trees`: a target that verifies them), a chain with every third step plain, then the
    chain and the tree as localspec runs a drafter: sized on the cost curve."""
    k = len(rates)
    tree = [Arm(f"tree 2×{k}", 2), Arm(f"tree K={k}", 2, nodes=k)] if trees else []
    sized = [Arm(f"chain ≤{k}, sized", 1, sized=True)] + ([Arm(f"tree ≤2×{k}, sized", 2, sized=True)] if trees else [])
    return [Arm("plain"), Arm(f"chain K={k}", 1)] + tree + [Arm(f"chain K={k}, every 3rd step plain", 1, 3)] + sized


def run_synthetic(engine: Engine, prompts: list[list[int]], rates: Sequence[float], max_tokens: int,
                  repeat: int = 1, seed: int = 0) -> list[Arm]:
    """Plain decoding of each prompt gives its truth; then every arm runs it `repeat` times in
    alternating order, through the loop as a request runs it (greedy, the context cold)."""
    greedy = SamplingConfig(temperature=0)
    ctx = engine.ctx
    k = len(rates)
    if ctx.rollback and k > ctx.rollback:
        raise LocalspecError(f"a chain of {k} on {engine.model.architecture}: its state rolls back by at most "
                             f"{ctx.rollback} tokens")
    # Chains only where a context has one path (a recurrent-only target, or a hybrid with
    # --rollback or --strict: one sequence, its state rolled back or undone).
    trees = ctx.n_paths > 1
    configs = arms(rates, trees=trees)
    if trees and (2 * k + 1 > ctx.config.n_batch or k + 1 > ctx.n_paths):
        raise LocalspecError(f"a tree of 2×{k} needs n_batch ≥ {2 * k + 1} and {k + 1} sequences")
    curve = engine.planning.prepare()
    follower: list[Context] = []  # a second context of the target: what a flipped text goes on as

    def follow(context: list[int], n: int) -> list[int]:
        if not follower:
            follower.append(Context(engine.model, replace(ctx.config, n_seq_max=1, shapes=())))
        return generate(follower[0], context, n, greedy, stop_at_eog=False)

    def once(arm: Arm, prompt: list[int], truth: list[int], r: int) -> list[int]:
        ctx.clear()
        clock = DraftClock()  # the time taking up a flipped text took: the bench's, not the loop's
        if arm.branches:
            drafter = SyntheticDrafter(prompt + truth, rates, engine.model.n_vocab, arm.branches, arm.idle_every,
                                       seed=seed + r, follow=follow, same_rows=arm.nodes > 0)
            drafter.clock = clock
            budget = Budget(curve, ctx.n_paths, arm.nodes or k * arm.branches, static=not arm.sized, flat=ctx.flat)
            controller = Fixed(drafter, budget, arm.name)
        else:
            controller = Plain()
        stats, out = Stats(), []
        for it in run(ctx, controller, prompt, greedy, max_tokens, stats,
                      RunOptions(stop_at_eog=False, draft_clock=clock)):
            out += it.tokens
            if it.arm != "prompt":
                arm.steps.append((it.batch, it.seconds - it.draft_seconds, it.forward_seconds, it.host_seconds))
        arm.tokens += stats.predicted_n - 1
        arm.seconds += stats.predicted_ms / 1e3 - clock.measured
        arm.flips += drafter.flips if arm.branches else 0
        return out

    try:
        with engine.turn():  # nothing of the engine's own runs beside the timed arms
            for prompt in prompts:
                ctx.clear()
                truth = generate(ctx, prompt, max_tokens, greedy, stop_at_eog=False)
                for r in range(repeat):
                    for arm in configs if r % 2 == 0 else configs[::-1]:
                        out = once(arm, prompt, truth, r)
                        arm.identical += out == truth
                        arm.runs += 1
    finally:
        for c in follower:
            c.close()
    return configs


@dataclass
class LlamaArm:
    """llama.cpp's own loop (llama-server of the same build) at the same rates: its
    ngram-simple drafter (1-token keys, K-token drafts: it drafts wherever the last token was
    seen before) with `--spec-synth-rates`, which accepts drafted tokens at random, so its
    output is not the model's and only its speed is read."""
    name: str
    extra: list[str]
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    failed: str = ""

    @property
    def iterations(self) -> int:  # each emits its accepted drafts and one token of its own
        return self.tokens - self.accepted

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def iterations_per_s(self) -> float:
        return self.iterations / self.seconds if self.seconds else 0.0


def llama_server_arms(rates: Sequence[float]) -> list[LlamaArm]:
    k = len(rates)
    spec = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
            "--spec-ngram-simple-size-m", str(k), "--spec-draft-n-min", "1",
            "--spec-synth-rates", ",".join(f"{r:.6g}" for r in rates)]
    return [LlamaArm("llama-server plain", []), LlamaArm(f"llama-server chain K={k}", spec)]


def run_llama_server(model_path, prompts: list[list[int]], rates: Sequence[float], max_tokens: int,
                     repeat: int, n_ctx: int, threads: int, n_gpu_layers: int) -> list[LlamaArm]:
    """Each arm in a server of its own on loopback, every prompt `repeat` times, greedy;
    tokens and seconds after the first token, as localspec's arms count them."""
    from localspec.bench.anchors import ServerAnchor
    from localspec.bench.workloads import Prompt

    configs = llama_server_arms(rates)
    greedy = SamplingConfig(temperature=0)
    for arm in configs:
        try:
            server = ServerAnchor(arm.name, model_path, None, n_ctx, threads, arm.extra,
                                  n_gpu_layers=n_gpu_layers)
        except LocalspecError as e:
            arm.failed = str(e)
            continue
        try:
            for tokens in prompts:
                for _ in range(repeat):
                    r, _text = server.run(Prompt("synthetic", "code", ""), tokens, max_tokens, greedy,
                                          ignore_eos=True)  # as localspec's arms run on
                    if r.failed:
                        arm.failed = r.failed
                        break
                    arm.tokens += r.n_timed
                    arm.seconds += r.seconds
                    arm.drafted += r.drafted
                    arm.accepted += r.accepted
        finally:
            server.close()
    return configs


def report_llama(configs: list[LlamaArm], ours: list[Arm]) -> str:
    """llama.cpp's loop beside localspec's chain at the same rates."""
    plain = configs[0]
    rows = ["llama.cpp's own loop at the same rates (llama-server, ngram-simple drafts, "
            "--spec-synth-rates; its output is not the model's):", "",
            "| arm | tokens/s | × its plain | iterations/s | tokens/iteration | draft tokens/iteration | "
            "localspec's same arm, tokens/s | localspec / llama.cpp | localspec's other arms / llama.cpp |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    same = {"plain": ours[0], "chain": ours[1]}
    others = [a for a in ours[2:] if a.branches and not a.idle_every]  # the trees, and the sized arms
    ratio = lambda mine, theirs: f"{mine.tokens_per_s / theirs.tokens_per_s if theirs.tokens_per_s else 0:.2f}×"  # noqa: E731
    for a in configs:
        if a.failed:
            rows.append(f"| {a.name} | failed: {a.failed} | | | | | | | |")
            continue
        chain = "chain" in a.name
        mine = same["chain" if chain else "plain"]
        rows.append(f"| {a.name} | {a.tokens_per_s:.1f} | "
                    f"{a.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else 0:.2f}× | "
                    f"{a.iterations_per_s:.1f} | {a.tokens / max(1, a.iterations):.2f} | "
                    f"{a.drafted / max(1, a.iterations):.2f} | {mine.tokens_per_s:.1f} | {ratio(mine, a)} | "
                    + (", ".join(f"{o.name} {ratio(o, a)}" for o in others) if chain else "-") + " |")
    return "\n".join(rows)


def to_json(configs: list[Arm], rates: Sequence[float], theirs: list[LlamaArm], meta: dict) -> dict:
    """The report's figures for --json: each arm's rates, and its medians by batch size."""
    def ours(a: Arm) -> dict:
        return {"name": a.name, "tokens_per_s": a.tokens_per_s, "iterations_per_s": a.iterations_per_s,
                "identical": a.identical, "runs": a.runs, "flips": a.flips,
                "by_batch": {str(b): row for b, row in a.by_batch().items()}}
    return {"meta": meta | {"rates": list(rates)}, "configs": [ours(a) for a in configs],
            "llama_server": [{"name": a.name, "tokens_per_s": a.tokens_per_s, "iterations_per_s": a.iterations_per_s,
                              "drafted": a.drafted, "accepted": a.accepted, "failed": a.failed} for a in theirs]}


def report(configs: list[Arm], rates: Sequence[float]) -> str:
    """The arms side by side, then each arm's milliseconds by batch size."""
    plain = configs[0]
    rows = [f"synthetic acceptance: rates {', '.join(f'{r:.2f}' for r in rates)} (mean length "
            f"{mean_length(rates):.2f} for a chain)", "",
            "| arm | tokens/s | × plain | iterations/s | tokens/iteration | host ms/iter (median) | "
            "forward share | identical to plain |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for a in configs:
        share = sum(s[2] for s in a.steps) / sum(s[1] for s in a.steps) if a.steps else 0.0
        rows.append(f"| {a.name} | {a.tokens_per_s:.1f} | {a.tokens_per_s / plain.tokens_per_s:.2f}× | "
                    f"{a.iterations_per_s:.1f} | {a.tokens / max(1, len(a.steps)):.2f} | "
                    f"{a.median_ms(3):.3f} | {share:.0%} | {a.identical}/{a.runs}"
                    f"{f' (near-tie flips followed: {a.flips})' if a.flips else ''} |")
    rows += ["", "| arm | batch | iterations | iteration ms | forward ms | host ms |", "|---|---:|---:|---:|---:|---:|"]
    for a in configs:
        for batch, r in a.by_batch().items():
            rows.append(f"| {a.name} | {batch} | {r['iterations']} | {r['iteration_ms']:.3f} | {r['forward_ms']:.3f} | "
                        f"{r['host_ms']:.3f} |")
    mixed = next(a for a in configs if a.idle_every)
    step, plain_step = mixed.median_ms(1, 1), plain.median_ms(1, 1)
    if step and plain_step:
        rows += ["", f"a no-draft step inside a speculative run: {step:.3f} ms against plain's {plain_step:.3f} ms "
                 f"({step / plain_step:.3f}×)"]
    return "\n".join(rows)
