"""One request's generation, iteration by iteration: the controller picks a drafter and a
budget (or plain decoding), the drafter proposes a tree, the target decodes the pending tokens
and the tree in one forward, exact acceptance keeps precisely what the target would have
produced (greedy: the same tokens; T > 0: the same distribution), and the controller hears
what the iteration emitted and cost. Plain decoding is the same iteration with an empty tree.

The files one iteration runs through: this one, drafters/base.py (Drafter, Budget),
verify.py (DraftTree, launch, accept) and llama/context.py (decode, the KV cache)."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

from localspec.control.controllers import Plain
from localspec.drafters.base import Budget, Drafter, Ledger
from localspec.llama.context import Context
from localspec.sampling import SamplingConfig, TokenSampler
from localspec.verify import DraftTree, accept, launch


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
    forwards: int = 0          # target forwards while generating (one per iteration, and
    settled: int = 0           # --strict: one more per near-tie settled by a single token)
    ran: collections.Counter = field(default_factory=collections.Counter)  # iterations per arm

    @property
    def predicted_per_second(self) -> float:
        """After the first token (which comes with the prompt's forward)."""
        n = self.predicted_n - 1
        return n / self.predicted_ms * 1e3 if n > 0 and self.predicted_ms > 0 else 0.0

    @property
    def tau(self) -> float:
        """Tokens per target forward (the prompt's emits the first)."""
        return self.predicted_n / (self.forwards + 1) if self.predicted_n else 0.0

    @property
    def acceptance(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    def summary(self) -> str:
        line = (f"{self.predicted_per_second:.2f} tokens/s · prompt {self.prompt_n} tokens in "
                f"{self.prompt_ms / 1e3:.2f}s" + (f" ({self.cache_n} cached)" if self.cache_n else "")
                + f" · generated {self.predicted_n} tokens in {self.predicted_ms / 1e3:.2f}s")
        if self.draft_n:
            line += (f"\nτ {self.tau:.2f} tokens/forward · acceptance {self.acceptance:.1%} · drafted "
                     f"{self.draft_n} · accepted {self.draft_n_accepted}"
                     + (f" · settled {self.settled}" if self.settled else "")
                     + " · ran " + ", ".join(f"{arm} ×{n}" for arm, n in self.ran.most_common()))
        return line

    def as_dict(self) -> dict:
        return {"prompt_n": self.prompt_n, "prompt_ms": self.prompt_ms, "cache_n": self.cache_n,
                "predicted_n": self.predicted_n, "predicted_ms": self.predicted_ms,
                "predicted_per_second": self.predicted_per_second, "draft_n": self.draft_n,
                "draft_n_accepted": self.draft_n_accepted, "tau": self.tau,
                "ran": dict(self.ran)}


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
    draft_charged: float = 0.0    # what those are charged (Ledger: priced on another curve)

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
    # > 0 (strict, greedy): a position whose top-two gap in the batched logits is below it is
    # decided by a single-token forward, as plain decoding would.
    tie_bound: float = 0.0
    # Caps every target forward (strict: the largest batch that reproduces single tokens).
    max_batch: int | None = None
    # Hears how much of a long prompt is decoded (done, total).
    progress: Callable[[int, int], None] | None = None
    # Hears what each verification forward cost: its rows (padding included), context before
    # it, seconds (LiveCurve.observe).
    on_forward: Callable[[int, int, float], None] | None = None
    # Batch size, context -> seconds on another machine's curve: the controller hears each
    # iteration's time with its forward priced so, as if it ran there.
    price: Callable[[int, int], float] | None = None
    # Where the drafters book their own forwards: the controller hears them as charged there.
    ledger: Ledger | None = None


def run(ctx: Context, controller: Controller, prompt: Sequence[int], sampling: SamplingConfig,
        max_tokens: int, stats: Stats | None = None, options: RunOptions = RunOptions()) -> Iterator[Iteration]:
    """Generate up to `max_tokens` after `prompt`, an iteration at a time. Closing the
    generator between iterations leaves the KV cache holding exactly ctx.tokens."""
    tie_bound, max_batch, stop_at_eog = options.tie_bound, options.max_batch, options.stop_at_eog
    progress, on_forward, price, ledger = options.progress, options.on_forward, options.price, options.ledger
    t0 = time.perf_counter()
    stats = stats if stats is not None else Stats()
    prompt = list(prompt)
    drafters = controller.drafters
    for d in drafters:
        d.begin(prompt, sampling)
    controller.begin()
    sampler = TokenSampler(sampling, prompt)
    ctx.sample_on_device(device_sampling(sampling, tie_bound) if ctx.config.sample_on_device else None)
    followers = [d for d in drafters if d.feature_window]  # they read the target's features

    def commit(first_pos: int, rows: list[int]) -> None:
        for d in followers:
            d.commit(ctx, first_pos, rows)

    window = max((d.feature_window for d in followers), default=1)
    reused, last = ctx.prefill(prompt, window, commit if followers else None, progress)
    max_tokens = min(max_tokens, ctx.n_ctx - len(prompt) + 1)  # stop where the context ends
    first = last if isinstance(last, int) else sampler.sample(last)
    sampler.extend([first])
    t_start = time.perf_counter()
    stats.cache_n += reused
    stats.prompt_n += len(prompt) - reused
    stats.prompt_ms += (t_start - t0) * 1e3
    stats.predicted_n += 1
    yield Iteration("prompt", "", None, [first], 0, 0, t_start - t0, DraftTree.empty())
    # An iteration's time runs from the end of the last one, so what the caller does with an
    # iteration (text, events) is paid by the next: the iterations' times add up to the wall
    # clock's.
    t_iter = time.perf_counter()
    n_out = 1
    pending = [first]  # emitted, not yet in the KV cache; the last is the next tree's root

    def launch_next() -> tuple[DraftTree, Drafter | None, str, str, int, int, float, float]:
        """Choose, draft and size the next iteration's tree and start its forward."""
        booked = (ledger.measured, ledger.charged) if ledger else (0.0, 0.0)
        context = ctx.tokens + pending
        room = min(max_tokens - n_out - 1, ctx.n_ctx - len(context) - 1,
                   (max_batch or ctx.n_ctx) - len(pending))
        choice = controller.choose(context, room)
        tree, drafter = DraftTree.empty(), None
        if choice is not None:
            drafter, budget, proposal = choice
            tree = budget.size(proposal)
        launch(ctx, tree, pending, all_pending_rows=bool(followers), speculating=choice is not None)
        drafted = (ledger.measured - booked[0], ledger.charged - booked[1]) if ledger else (0.0, 0.0)
        return tree, drafter, controller.arm, controller.phase, len(ctx.tokens), len(pending), *drafted

    # The next iteration's forward is launched before this one is handed out: on a GPU the
    # device computes it while the caller turns this one into text and events.
    ended = n_out >= max_tokens or (stop_at_eog and ctx.model.is_eog(first))
    try:
        flight = None if ended else launch_next()
        while flight is not None:
            tree, drafter, arm, phase, n_past, n_pending, draft_seconds, draft_charged = flight
            verdict = accept(ctx, tree, sampler, tie_bound)
            forward = verdict.seconds
            if on_forward:  # in the shape it ran in (a GPU pads batches to a few)
                on_forward(ctx.shape, n_past, verdict.seconds)
            if followers:  # the pending rows, then the accepted nodes the cache kept
                commit(n_past, list(range(n_pending + verdict.n_cached)))
            if len(tree):  # a proposal sized to nothing was not verified: nothing to observe
                drafter.observe(tree, verdict)
            emitted = verdict.tokens
            pending = emitted[verdict.n_cached:len(verdict.path)]  # accepted, not cached
            forwards = 1
            sampler.extend(emitted)
            if verdict.unsettled:
                t_settle = time.perf_counter()
                emitted.append(settle(ctx, sampler, pending))
                forward += time.perf_counter() - t_settle
                sampler.extend(emitted[-1:])
                pending = []
                forwards += 1
                stats.settled += 1
            pending.append(emitted[-1])
            n_accepted = len(verdict.path)
            for i, token in enumerate(emitted):  # the request may end inside what was emitted
                if (stop_at_eog and ctx.model.is_eog(token)) or n_out + i + 1 == max_tokens:
                    del emitted[i + 1:]
                    n_accepted = min(n_accepted, len(emitted))
                    break
            t_end = time.perf_counter()
            seconds, t_iter = t_end - t_iter, t_end
            priced = seconds - draft_seconds + draft_charged
            if price is not None:
                priced += price(n_pending + len(tree), n_past) - forward
            controller.record(len(emitted), priced, len(tree), len(verdict.path))
            n_out += len(emitted)
            stats.predicted_n += len(emitted)
            stats.predicted_ms += seconds * 1e3
            stats.forwards += forwards
            stats.draft_n += len(tree)
            stats.draft_n_accepted += len(verdict.path)
            stats.ran[arm] += 1
            done = Iteration(arm, phase, drafter.name if drafter else None, emitted, n_accepted,
                             len(tree), seconds, tree, forward, draft_seconds, draft_charged)
            ended = n_out >= max_tokens or (stop_at_eog and ctx.model.is_eog(emitted[-1]))
            flight = None if ended else launch_next()
            yield done
    finally:
        ctx.abandon()  # the caller stopped with a forward in flight: the cache holds ctx.tokens


# The most candidates a row hands back from the device: beyond it, the full row costs little more.
MAX_DEVICE_TOP_K = 256


def device_sampling(sampling: SamplingConfig, tie_bound: float) -> int | None:
    """What of each row the request needs from a sampler on the device: greedy without
    penalties or near-ties to settle its argmax (0); T > 0 with top-k and without penalties
    its top-k candidates (k); anything else the whole row (None: on the host)."""
    if sampling.repeat_penalty != 1.0:
        return None
    if sampling.temperature <= 0:
        return 0 if tie_bound <= 0 else None
    return sampling.top_k if 0 < sampling.top_k <= MAX_DEVICE_TOP_K else None


def settle(ctx: Context, sampler: TokenSampler, pending: list[int]) -> int:
    """Draw the token after the accepted path (already in the sampler's history) from
    single-token forwards of what is not yet in the cache (at least the path's last token),
    as plain decoding computes it."""
    if not pending:
        pending = ctx.tokens[-1:]
        ctx.truncate(len(ctx.tokens) - 1)
    for token in pending:
        ctx.append(token)
    return sampler.sample(ctx.logits(0))


def generate(ctx: Context, prompt: Sequence[int], max_tokens: int,
             sampling: SamplingConfig = SamplingConfig(), stop_at_eog: bool = True,
             stats: Stats | None = None) -> list[int]:
    """Plain decoding: the reference every speculative output is compared with."""
    return [t for it in run(ctx, Plain(), prompt, sampling, max_tokens, stats, RunOptions(stop_at_eog=stop_at_eog))
            for t in it.tokens]
