"""One request's generation, iteration by iteration: the controller picks a drafter and a
budget (or plain decoding), the drafter proposes a tree, the target decodes the pending tokens
and the tree in one forward, exact acceptance keeps precisely what the target would have
produced (greedy: the same tokens; T > 0: the same distribution), and the controller hears
what the iteration emitted and cost. Plain decoding is the same iteration with an empty tree.

The files one iteration runs through: this one, drafters/base.py (Drafter, Budget),
verify.py (DraftTree, launch, accept) and llama/context.py (decode, the KV cache)."""

from __future__ import annotations

import collections
import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

from localspec.control.controllers import Plain
from localspec.drafters.base import Budget, DraftClock, Drafter
from localspec.llama.context import Context
from localspec.sampling import SamplingConfig, TokenLogprob, TokenSampler, token_logprob
from localspec.verify import DraftTree, Verdict, accept, launch


class Controller(Protocol):
    """What the loop asks of a controller (control/controllers.py has them)."""

    drafters: Sequence[Drafter]  # every drafter it may choose: they follow the request
    arm: str    # what the last choice runs, "plain" or a drafter and its K ("lookup@3")
    phase: str  # the phase that choice belongs to ("test 3"; "" for controllers without)

    def begin(self) -> None: ...

    def choose(self, context: list[int], room: int) -> tuple[Drafter, Budget, DraftTree] | None:
        """The drafter, its budget (within `room` draft tokens) and its proposal, which the
        controller asks the drafter for; None: a plain step."""

    def record(self, tokens: int, seconds: float, drafted: int, accepted: int) -> None: ...

    def listening(self, drafter: Drafter) -> bool:
        """Does this feature drafter need the target's hidden states of what is committed
        now (False: it will not be asked for a while, and can resume without them)?"""


@dataclass
class Stats:
    """A request's numbers, under the names llama.cpp's server uses (given to several
    requests, their sums)."""
    prompt_n: int = 0          # prompt tokens decoded (not taken from the cache)
    cache_n: int = 0           # prompt tokens taken from the cache
    prompt_ms: float = 0.0     # preparing the request, decoding its prompt, the first token
    predicted_n: int = 0       # tokens generated
    predicted_ms: float = 0.0  # generating them after the first
    draft_n: int = 0           # draft tokens verified
    draft_n_accepted: int = 0  # of those, accepted
    ran: collections.Counter = field(default_factory=collections.Counter)  # iterations per arm
    # draft tokens accepted per iteration that verified a draft -> iterations
    accepted_lengths: collections.Counter = field(default_factory=collections.Counter)

    @property
    def predicted_per_second(self) -> float:
        """After the first token (which comes with the prompt's forward)."""
        n = self.predicted_n - 1
        return n / self.predicted_ms * 1e3 if n > 0 and self.predicted_ms > 0 else 0.0

    @property
    def forwards(self) -> int:
        """Target forwards while generating: one per iteration."""
        return sum(self.ran.values())

    @property
    def tau(self) -> float:
        """Tokens per target forward (the prompt's emits the first)."""
        return self.predicted_n / (self.forwards + 1) if self.predicted_n else 0.0

    @property
    def acceptance(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    def add(self, it: Iteration) -> None:
        """One iteration after the first token."""
        self.predicted_n += len(it.tokens)
        self.predicted_ms += it.seconds * 1e3
        self.draft_n += it.n_drafted
        self.draft_n_accepted += it.n_verified_accepted
        self.ran[it.arm] += 1
        if it.n_drafted:
            self.accepted_lengths[it.n_verified_accepted] += 1

    def summary(self) -> str:
        line = (f"{self.predicted_per_second:.2f} tokens/s · prompt {self.prompt_n} tokens in "
                f"{self.prompt_ms / 1e3:.2f}s" + (f" ({self.cache_n} cached)" if self.cache_n else "")
                + f" · generated {self.predicted_n} tokens in {self.predicted_ms / 1e3:.2f}s")
        if self.draft_n:
            line += (f"\nτ {self.tau:.2f} tokens/forward · acceptance {self.acceptance:.1%} · drafted "
                     f"{self.draft_n} · accepted {self.draft_n_accepted}"
                     + " · ran " + ", ".join(f"{arm} ×{n}" for arm, n in self.ran.most_common()))
        return line

    def as_dict(self) -> dict:
        return {"prompt_n": self.prompt_n, "prompt_ms": self.prompt_ms, "cache_n": self.cache_n,
                "predicted_n": self.predicted_n, "predicted_ms": self.predicted_ms,
                "predicted_per_second": self.predicted_per_second, "draft_n": self.draft_n,
                "draft_n_accepted": self.draft_n_accepted, "tau": self.tau,
                "ran": dict(self.ran), "accepted_lengths": dict(sorted(self.accepted_lengths.items()))}


@dataclass(frozen=True)
class Iteration:
    arm: str             # the controller's choice ("plain", "lookup@3", ...; "prompt": the first token)
    phase: str           # its phase ("test 3"), for traces
    drafter: str | None  # the drafter's name, if one proposed
    tokens: list[int]    # emitted: accepted draft tokens first, then the target's own
    n_accepted: int      # how many of `tokens` came from the draft
    n_drafted: int       # draft tokens verified
    seconds: float
    tree: DraftTree      # what was verified (empty: a plain step)
    forward_seconds: float = 0.0  # of `seconds`, the target's forwards
    draft_seconds: float = 0.0    # ... and the drafter's own (the rest is the host's)
    draft_ahead: float = 0.0      # seconds the drafters' clock ran ahead while drafting it
    batch: int = 1                # tokens its forward verified: the pending ones, then the tree
    n_past: int = 0               # tokens in the cache before its forward
    n_verified_accepted: int = 0  # draft tokens verification accepted (n_accepted before the
    #                               request's end cut what was emitted)
    logprobs: tuple[TokenLogprob, ...] = ()  # per token, where the request asks (SamplingConfig.logprobs)

    @property
    def host_seconds(self) -> float:
        """What the iteration spent outside the forwards: drafting, sizing, acceptance, KV
        edits, bookkeeping (a GPU's forward does not hide it)."""
        return self.seconds - self.forward_seconds - self.draft_seconds


@dataclass(frozen=True)
class RunOptions:
    """How run() decodes, beyond what to decode."""
    # Stop after an end-of-generation token (which is emitted).
    stop_at_eog: bool = True
    # Caps every target forward (strict: the largest batch that reproduces single tokens).
    max_batch: int | None = None
    # Hears how much of a long prompt is decoded (done, total).
    progress: Callable[[int, int], None] | None = None
    # Hears what each verification forward cost: its rows (padding included), context before
    # it, seconds (LiveCurve.observe).
    on_forward: Callable[[int, int, float], None] | None = None
    # What times the drafters' own forwards (the engine's): an iteration reports their share.
    draft_clock: DraftClock | None = None
    # What the controller hears an iteration took, where not its seconds and the time its
    # drafters' clock ran ahead (a bench projecting another machine: bench/pricing.py).
    heard: Callable[[Iteration], float] | None = None


@dataclass(frozen=True)
class Flight:
    """An iteration whose forward is launched: what the controller chose and the drafter
    proposed, where the cache stood, and what drafting took."""
    tree: DraftTree
    drafter: Drafter | None
    arm: str
    phase: str
    n_past: int                 # tokens in the cache before the forward
    n_pending: int              # emitted tokens the forward puts in the cache before the tree
    draft_seconds: float = 0.0  # the drafter's own forwards while proposing
    draft_ahead: float = 0.0    # ... and how far the drafters' clock ran ahead meanwhile


def run(ctx: Context, controller: Controller, prompt: Sequence[int], sampling: SamplingConfig,
        max_tokens: int, stats: Stats | None = None, options: RunOptions = RunOptions()) -> Iterator[Iteration]:
    """Generate up to `max_tokens` after `prompt`, an iteration at a time. Closing the
    generator between iterations leaves the KV cache holding exactly ctx.tokens."""
    t0 = time.perf_counter()
    stats = stats if stats is not None else Stats()
    prompt = list(prompt)
    sampler, followers = begin(ctx, controller, prompt, sampling)
    commit = functools.partial(commit_features, ctx, controller, followers) if followers else None
    window = max((d.feature_window for d in followers), default=1)
    reused, last = ctx.prefill(prompt, window, commit, options.progress)
    max_tokens = min(max_tokens, ctx.n_ctx - len(prompt) + 1)  # stop where the context ends
    first = last if isinstance(last, int) else sampler.sample(last)
    k = sampling.logprobs
    first_logprob = () if k is None else (token_logprob(last, first, k),)  # (rows on the host: begin())
    sampler.extend([first])
    t_first = time.perf_counter()
    stats.prompt_n, stats.cache_n = stats.prompt_n + len(prompt) - reused, stats.cache_n + reused
    stats.prompt_ms, stats.predicted_n = stats.prompt_ms + (t_first - t0) * 1e3, stats.predicted_n + 1
    yield Iteration(arm="prompt", phase="", drafter=None, tokens=[first], n_accepted=0, n_drafted=0,
                    seconds=t_first - t0, tree=DraftTree.empty(), logprobs=first_logprob)
    # An iteration's time runs from the end of the last one, so what the caller does with an
    # iteration (text, events) is paid by the next: the iterations' times add up to the wall
    # clock's.
    t_iter = time.perf_counter()
    n_out, pending = 1, [first]  # pending: emitted, not yet in the cache; the last is the next root
    context = prompt + pending  # what the drafters continue, ctx.tokens + pending, kept as it grows

    def launch_next(last: int) -> Flight | None:
        """The next iteration's flight, or None where the request ended with `last`."""
        if ends(ctx, options, last, n_out, max_tokens):
            return None
        room = min(max_tokens - n_out - 1, ctx.n_ctx - len(context) - 1,
                   (options.max_batch or ctx.n_ctx) - len(pending))
        return launch_flight(ctx, controller, context, pending, room, options.draft_clock, bool(followers))

    # The next iteration's forward is launched before this one is handed out: on a GPU the
    # device computes it while the caller turns this one into text and events.
    try:
        flight = launch_next(first)
        while flight is not None:
            verdict = land(ctx, flight, sampler, options, commit)
            emitted = verdict.tokens
            pending = verdict.requeued + emitted[verdict.n_cached:len(verdict.path)]
            pending.append(emitted[-1])
            # the request may end inside what was emitted
            n_emitted = next((i + 1 for i, t in enumerate(emitted) if ends(ctx, options, t, n_out + i + 1,
                                                                             max_tokens)), len(emitted))
            t_end = time.perf_counter()
            done = handed_out(flight, verdict, n_emitted, t_end - t_iter)
            t_iter = t_end
            heard = options.heard(done) if options.heard else done.seconds + done.draft_ahead
            controller.record(n_emitted, heard, len(flight.tree), len(verdict.path))
            n_out += n_emitted
            stats.add(done)
            context += emitted
            flight = launch_next(done.tokens[-1])
            yield done
    finally:
        ctx.abandon()  # the caller stopped with a forward in flight: the cache holds ctx.tokens


def begin(ctx: Context, controller: Controller, prompt: list[int],
          sampling: SamplingConfig) -> tuple[TokenSampler, list[Drafter]]:
    """A request starts: its drafters and controller hear it, and the context reads its rows
    on the device where the settings allow. Returns the request's sampler and the drafters
    that read the target's features."""
    for d in controller.drafters:
        d.begin(prompt, sampling)
    controller.begin()
    on_device = device_sampling(sampling)
    if not ctx.config.sample_on_device:  # on the CPU, greedy's argmax from the exact head where there is one
        on_device = 0 if on_device == 0 and ctx.exact_head else None
    ctx.sample_on_device(on_device)
    return TokenSampler(sampling, prompt), [d for d in controller.drafters if d.feature_window]


def commit_features(ctx: Context, controller: Controller, followers: list[Drafter], first_pos: int,
                    rows: list[int]) -> None:
    for d in followers:
        if controller.listening(d):
            d.commit(ctx, first_pos, rows)


def launch_flight(ctx: Context, controller: Controller, context: list[int], pending: list[int], room: int,
                  clock: DraftClock | None, all_pending_rows: bool) -> Flight:
    """Choose, draft and size the next iteration's tree (within `room` nodes) after `context`
    (the cache's tokens, then `pending`; kept by the caller, as copying it each iteration
    took 55 us at 32k tokens) and start its forward over the pending tokens and the tree."""
    assert len(context) == len(ctx.tokens) + len(pending)
    before = (clock.measured, clock.ahead) if clock else (0.0, 0.0)
    n_past = len(ctx.tokens)
    choice = controller.choose(context, room)
    tree, drafter = DraftTree.empty(), None
    if choice is not None:
        drafter, budget, proposal = choice
        tree = budget.size(proposal)
    launch(ctx, tree, pending, all_pending_rows, speculating=choice is not None)
    drafted = (clock.measured - before[0], clock.ahead - before[1]) if clock else (0.0, 0.0)
    return Flight(tree, drafter, controller.arm, controller.phase, n_past, len(pending), *drafted)


def land(ctx: Context, flight: Flight, sampler: TokenSampler, options: RunOptions,
         commit: Callable[[int, list[int]], None] | None) -> Verdict:
    """Wait for the flight's forward and accept exactly; the drafter and the feature readers
    hear what was kept. Returns the verdict (its tokens: everything emitted)."""
    verdict = accept(ctx, flight.tree, sampler)
    if options.on_forward:  # in the shape it ran in (a GPU pads batches to a few)
        options.on_forward(ctx.shape, flight.n_past, verdict.seconds)
    kept = flight.n_pending - len(verdict.requeued) + verdict.n_cached
    if commit and kept:  # the pending rows, then the accepted nodes the cache kept
        commit(flight.n_past, list(range(kept)))
    if len(flight.tree):  # a proposal sized to nothing was not verified: nothing to observe
        flight.drafter.observe(flight.tree, verdict)
    sampler.extend(verdict.tokens)
    return verdict


def handed_out(flight: Flight, verdict: Verdict, n_emitted: int, seconds: float) -> Iteration:
    """What the caller is handed of a landed flight: its first n_emitted tokens (the request
    may end inside what was emitted) and what they took."""
    return Iteration(arm=flight.arm, phase=flight.phase, drafter=flight.drafter.name if flight.drafter else None,
                     tokens=verdict.tokens[:n_emitted], n_accepted=min(len(verdict.path), n_emitted),
                     n_drafted=len(flight.tree), seconds=seconds, tree=flight.tree, forward_seconds=verdict.seconds,
                     draft_seconds=flight.draft_seconds, draft_ahead=flight.draft_ahead,
                     n_verified_accepted=len(verdict.path), batch=flight.n_pending + len(flight.tree),
                     n_past=flight.n_past, logprobs=tuple(verdict.logprobs[:n_emitted]))


def ends(ctx: Context, options: RunOptions, token: int, n_out: int, max_tokens: int) -> bool:
    """Does the request end with `token`, its n_out-th?"""
    return n_out >= max_tokens or (options.stop_at_eog and ctx.model.is_eog(token))


# The most candidates a row hands back from the device: beyond it, the full row costs little more.
MAX_DEVICE_TOP_K = 256


def device_sampling(sampling: SamplingConfig) -> int | None:
    """What of each row the request needs from a sampler on the device: greedy without
    penalties its argmax (0); T > 0 with top-k and without penalties
    its top-k candidates (k); anything else, log-probabilities too, the whole row (None: on
    the host)."""
    if sampling.repeat_penalty != 1.0 or sampling.logprobs is not None:
        return None
    if sampling.temperature <= 0:
        return 0
    return sampling.top_k if 0 < sampling.top_k <= MAX_DEVICE_TOP_K else None


def generate(ctx: Context, prompt: Sequence[int], max_tokens: int,
             sampling: SamplingConfig = SamplingConfig(), stop_at_eog: bool = True,
             stats: Stats | None = None) -> list[int]:
    """Plain decoding: the reference every speculative output is compared with."""
    return [t for it in run(ctx, Plain(), prompt, sampling, max_tokens, stats, RunOptions(stop_at_eog=stop_at_eog))
            for t in it.tokens]
