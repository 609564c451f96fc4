"""Cascade (Saxena et al., "Utility-Driven Speculative Decoding"): per request, measure the
utility of speculation and choose by test-and-set which arm the next iterations use. An arm
is a drafter and K, the most draft tokens it may propose per iteration; K = 0 is plain
decoding.

Utility U = (tokens per iteration) / (iteration time / plain iteration time), i.e. tokens per
second relative to plain decoding: above 1 speculation pays, and maximising it minimises the
time per token. A test phase tries up to `max_trials` arms for `trial` iterations each; the
best then runs for a set phase of `set_len` iterations, or plain decoding when no arm reached
1, in which case the next set phase is twice as long (adaptive back-off).

Beyond the paper, for requests where one arm is best throughout (chat, HumanEval): a test phase
that confirms the arm that just ran doubles the next set phase too (up to `max_set_len`), so
testing costs less the longer an arm holds; and a speculative set phase ends early when its
last `trial` iterations fall clearly (by `converge`) below the utility that chose it, so a
text that stops repeating is followed within a few iterations. A drafter that sizes its own
proposals (see below) runs the set phase from a trial within `converge` below 1: where its
drafts would not pay, its sizing makes plain steps of them.

Beyond the paper: the arms span several drafters. A test phase first tries each drafter at
its starting K (the K of its best recent utility, else what the cost curve predicts from its
acceptance), then hill-climbs K on the best one not yet at a known maximum (of those near
the best arm; never one that sizes its own proposals, as prompt lookup does), up from a K
that nearly pays too, and past `max_trials` while each step gains; what was measured carries
over, so the climb goes on across test phases. A drafter whose trials stay clearly below 1
(by more than `converge`) sits out 1, 3, 7, ... test phases (its own back-off), and
a drafter for which the cost curve predicts no paying K (predict_k = 0: its drafting and
catching-up time outweigh what its acceptance can gain; a trial ends there too, once its
first iterations time the drafter), or, not yet measured, one that pays by less than a trial
can tell (`converge`), loses without a trial until its
back-off is long; it is then explored (the prediction may rest on a prior) only while the
seconds such trials were predicted to lose (`trial_cost`) stay within `explore_share` of the
seconds decoded, so a drafter that never pays costs a bounded share of the time to keep in
the set, however short the answers. Drafters are tried the most promising first: by their
best recent utility, else by the one predicted from their acceptance so far (`predict_utility`;
unbounded for one that drafts for free); one not yet measured is not tried at all in a test
phase where an arm already measured more than its prediction by two steps of `converge` (a
slow drafter's trial against one that copies at 4x would cost more than the chance it wins).
A drafter that drafts for free (prompt lookup) is also watched while plain decoding runs:
the caller reports what its proposals would have emitted and cost (`shadow`), and once they
clearly pay the plain set phase ends and the drafter is back in the next test phase (an
answer that opens with new prose and then copies the prompt's code).

Pure logic: the caller reports each iteration's tokens and seconds, so it runs the same on
simulated utility landscapes and on the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator, Iterable

Arm = tuple[str, int]  # (drafter, K); K = 0: plain decoding
PLAIN: Arm = ("", 0)


@dataclass(frozen=True)
class CascadeConfig:
    trial: int = 4           # iterations per trial (the paper's t)
    max_trials: int = 4      # trials per test phase (M)
    set_len: int = 16        # iterations per set phase (S), doubled each time speculation goes off
    max_set_len: int = 128   # ... or each time a test phase confirms the arm that ran, up to this
    base_len: int = 4        # plain iterations measuring the baseline
    # A plain run's first iterations, run but left out of the baseline: on a GPU the first two
    # forwards after a batch of another size pay for a new graph and for capturing a CUDA graph
    # (H200, MoE: 6.5 and 9.7 ms, then 3.3), which would rate speculation up to 1.7x too high.
    # The engine sets 2 where the target is offloaded; 0 on a CPU, where steps do not slow so.
    settle: int = 0
    base_every: int = 100    # iterations between baseline measurements
    ladder: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)  # the Ks hill-climbing steps through
    converge: float = 0.10   # neighbouring utilities this close: stop climbing
    max_skip: int = 15       # test phases a losing drafter sits out at most
    explore_after: int = 4   # losses after which a drafter predicted not to pay is tried anyway,
    explore_share: float = 0.02  # ... while such trials cost at most this share of the time


@dataclass
class TraceRow:
    phase: str      # base, test, set
    span: int       # which base run, trial or set phase of the request
    arm: Arm
    tokens: int
    seconds: float
    utility: float  # of the trial or set phase this iteration belonged to (NaN: unfinished)


@dataclass
class _DrafterMemory:
    utility: dict[int, float] = field(default_factory=dict)  # K -> latest measured utility
    losses: int = 0  # consecutive test phases below 1
    skip: int = 0    # test phases still to sit out


class Cascade:
    def __init__(self, drafters: Iterable[str], cfg: CascadeConfig = CascadeConfig(),
                 predict_k: Callable[[str], int] | None = None,
                 trial_cost: Callable[[str], float] | None = None,
                 predict_utility: Callable[[str], float] | None = None,
                 sizes_itself: Callable[[str], bool] | None = None):
        """`sizes_itself(d)`: d's proposals are sized by the cost curve from its own estimates
        (a free drafter's): it runs at its starting K and is never climbed."""
        self.drafters = list(drafters)
        self.cfg = cfg
        self.predict_k = predict_k or (lambda d: cfg.ladder[0])
        self.trial_cost = trial_cost or (lambda d: 0.0)  # seconds a trial loses against plain
        self.predict_utility = predict_utility or (lambda d: float("inf"))  # before any trial
        self.sizes_itself = sizes_itself or (lambda d: False)
        self.memory = {d: _DrafterMemory() for d in self.drafters}
        self.decoded = self.explored = 0.0  # seconds recorded, and predicted lost exploring
        self.t_base = 0.0  # seconds per token of plain decoding, measured at iteration base_at
        self.iteration = self.base_at = 0
        self.new_request()

    # --- the caller's side -------------------------------------------------------------------

    def new_request(self) -> None:
        """Start a request: reset the set length. Of what was learnt about each drafter, its
        best K (the next start) and its back-off carry over; the rest of its landscape is the
        last request's and is forgotten. The baseline carries over until `base_every`
        iterations after it was measured: measuring it again at the start of every request
        cost short requests (a chat turn, an edit) their first plain iterations."""
        for m in self.memory.values():
            if m.utility:
                k = max(m.utility, key=m.utility.get)
                m.utility = {k: m.utility[k]}
        self.set_len = self.cfg.set_len
        self.last_set = PLAIN  # the arm of the last set phase
        self.trace: list[TraceRow] = []  # this request's iterations
        self._span = -1
        self._testing: set[str] = set()  # the drafters the running test phase tries
        self._plan = self._run()
        self.arm = next(self._plan)

    def next_arm(self) -> Arm:
        return self.arm

    @property
    def phase(self) -> str:
        """The phase the next arm belongs to and its number in the request ("test 3")."""
        return f"{self._phase} {self._span}"

    def may_ask_next(self, drafter: str) -> bool:
        """Could the iteration after the one running now (`next_arm()`'s) be one of
        `drafter`'s, by what Cascade knows before hearing how this one went? Yes while its own
        arm runs or a test phase that tries it; and where this iteration may end its phase (its
        last planned one, a speculative set phase's window, a plain one a watched drafter's
        shadows may end) unless it sits out the next test phase."""
        if self.arm[0] == drafter:
            return True
        if self._phase == "test":  # another trial follows, or a set phase of a tried arm
            return drafter in self._testing
        i, n, chosen_at = self._at
        may_end = i == n or bool(chosen_at) and i % self.cfg.trial == 0 or \
            self.arm == PLAIN and self._phase == "set" and self._waking() is not None
        return may_end and not self.memory[drafter].skip

    def shadow(self, drafter: str, tokens: int, cost: float) -> None:
        """Had `drafter` run the last decided plain iteration, it would have emitted `tokens`
        for `cost` plain iterations' time (its proposal checked against what plain decoding
        emitted: greedy verification would have accepted exactly the matching nodes; at T > 0
        the match has the acceptance's distribution for a deterministic draft)."""
        self._shadows.setdefault(drafter, []).append((tokens, cost))

    def record(self, tokens: int, seconds: float) -> None:
        """The iteration run with `next_arm()` emitted `tokens` in `seconds`."""
        self.iteration += 1
        self.decoded += seconds
        self.trace.append(TraceRow(self._phase, self._span, self.arm, tokens, seconds, float("nan")))
        self.arm = self._plan.send((tokens, seconds))

    # --- the policy, as a generator: each yield is the arm of one iteration -------------------

    def _iterations(self, arm: Arm, n: int, phase: str, chosen_at: float = 0.0,
                    until_unpaid: bool = False) -> Generator[Arm, tuple, float]:
        """Run `arm` for n iterations; return their utility (and refresh the baseline on
        plain ones). `chosen_at`: the utility that chose a speculative set phase's arm, which
        ends once a window of `trial` iterations falls clearly below it; `until_unpaid`: the
        run ends once the cost curve predicts no K of the arm's drafter pays."""
        self._phase, self._span = phase, self._span + 1
        self._shadows: dict[str, list[tuple[int, float]]] = {}
        tokens = seconds = 0.0
        base_tokens = base_seconds = 0.0  # after the first `settle` iterations: a plain run's baseline
        first = len(self.trace)
        window = self.cfg.trial
        for i in range(1, n + 1):
            self._at = (i, n, chosen_at)
            t, s = yield arm
            tokens, seconds = tokens + t, seconds + s
            if i > self.cfg.settle:
                base_tokens, base_seconds = base_tokens + t, base_seconds + s
            if arm == PLAIN and phase == "set" and (woken := self._waking()) is not None:
                self.memory[woken].skip = self.memory[woken].losses = 0  # its back-off is over
                break
            if until_unpaid and self.predict_k(arm[0]) == 0:
                break
            if chosen_at and i % window == 0 and i < n:
                recent = self.trace[-window:]
                fell = sum(r.tokens for r in recent) * self.t_base < \
                    (1.0 - self.cfg.converge) * chosen_at * sum(r.seconds for r in recent)
                if fell:
                    break
        if arm == PLAIN and not base_tokens and not self.t_base:  # a run too short to settle, and no baseline yet
            base_tokens, base_seconds = tokens, seconds
        if arm == PLAIN and base_tokens:
            self.t_base, self.base_at = base_seconds / base_tokens, self.iteration
        u = tokens / seconds * self.t_base if seconds > 0 else 0.0
        for row in self.trace[first:]:
            row.utility = u
        return u

    def _run(self) -> Generator[Arm, tuple, None]:
        while True:
            if not self.t_base or self.iteration - self.base_at >= self.cfg.base_every:
                yield from self._iterations(PLAIN, self.cfg.base_len + self.cfg.settle, "base")
            best, chosen_at = yield from self._test()
            u = yield from self._iterations(best, self.set_len, "set", chosen_at if best != PLAIN else 0.0)
            self.last_set = best
            if best != PLAIN:
                self.memory[best[0]].utility[best[1]] = u

    def _test(self) -> Generator[Arm, tuple, tuple[Arm, float]]:
        cfg = self.cfg
        tried: dict[Arm, float] = {}
        candidates = []
        for d in self.drafters:
            m = self.memory[d]
            if m.skip:
                m.skip -= 1
                continue
            if self.predict_k(d) == 0 or self._marginal(d):
                # The cost curve says no K pays, or pays by less than a trial can tell: a
                # loss without a trial (a slow draft model would cost more than it gains),
                # unless it is time to explore.
                if m.losses < cfg.explore_after or \
                        self.explored + (cost := self.trial_cost(d)) > cfg.explore_share * self.decoded:
                    self._lose(m)
                    continue
                self.explored += cost
            candidates.append(d)
        # The most promising first (by what was measured, else predicted): if there are more
        # drafters than trials, the rest wait.
        candidates.sort(key=lambda d: -self._expected(d))
        candidates = candidates[:cfg.max_trials]
        self._testing = set(candidates)
        for d in candidates:
            if not self.memory[d].utility and self.predict_utility(d) < self._near(tried):
                self._testing.discard(d)  # predicted well below an arm measured already
                continue
            arm = (d, self.k_start(d))
            tried[arm] = yield from self._trial(arm)
        # Climb the best drafter that is not at a known maximum, of those near the best arm
        # (and predicted to pay at some K: a step of K cannot turn a drafter too slow for all).
        for arm in sorted(tried, key=tried.get, reverse=True):
            if tried[arm] < self._near(tried):
                break
            if self._next_k(arm[0], tried) is not None and self.predict_k(arm[0]) != 0:
                yield from self._climb(arm[0], tried)
                break
        for d in {d for d, _ in tried}:
            m = self.memory[d]
            # Only a clear loss sits the drafter out: four iterations cannot tell 0.95 from
            # 1.05, and a drafter that nearly pays is worth another trial next phase.
            if max(u for (dd, _), u in tried.items() if dd == d) < 1.0 - cfg.converge:
                self._lose(m)
            else:
                m.losses = 0
        if not tried:  # every drafter is sitting out
            return PLAIN, 1.0
        best = max(tried, key=tried.get)
        if tried[best] < self._runs_from(best[0]):
            self.set_len *= 2
            return PLAIN, 1.0
        confirmed = best == self.last_set
        self.set_len = min(2 * self.set_len, cfg.max_set_len) if confirmed else cfg.set_len
        return best, tried[best]

    def _runs_from(self, d: str) -> float:
        """The utility from which a trial's arm runs the set phase rather than plain decoding:
        1, or within `converge` below it for a drafter that sizes its own proposals. That one
        drafts only what the cost curve says pays and otherwise runs a plain step, and four
        iterations cannot tell 0.95 from 1.05: a plain phase after such a near miss lost the
        copies the drafter would have found (edit-session: 1.78x against suffix alone's 1.80x,
        priced on this CPU's curve; level after)."""
        return 1.0 - self.cfg.converge if self.sizes_itself(d) else 1.0

    def _expected(self, d: str) -> float:
        """d's best recent utility, else its predicted one."""
        seen = self.memory[d].utility
        return max(seen.values()) if seen else self.predict_utility(d)

    def _marginal(self, d: str) -> bool:
        """Never measured, and predicted to pay by less than `converge`: its trial could not
        tell it from plain decoding (four iterations cannot tell 0.95 from 1.05) and would
        pay its first catch-up with the context (a feature drafter predicted at 1.05 on an
        MoE curve spent three plain iterations' time on the one token of its trial)."""
        return not self.memory[d].utility and self.predict_utility(d) < 1.0 + self.cfg.converge

    def _near(self, tried: dict[Arm, float]) -> float:
        """Within two steps of `converge` below the best arm tried: an arm further below would
        have to gain more than a step of K gives to overtake it."""
        return (1.0 - 2 * self.cfg.converge) * max(tried.values(), default=0.0)

    def _waking(self) -> str | None:
        """A watched drafter whose last `trial` shadow iterations of this phase clearly paid
        (by `converge`, as a trial would have to), if any."""
        n = self.cfg.trial
        for d, rows in self._shadows.items():
            if len(rows) >= n and sum(t for t, _ in rows[-n:]) >= \
                    (1.0 + self.cfg.converge) * sum(c for _, c in rows[-n:]):
                return d
        return None

    def _lose(self, m: _DrafterMemory) -> None:
        m.losses += 1
        m.skip = min(2 ** m.losses - 1, self.cfg.max_skip)

    def _trial(self, arm: Arm) -> Generator[Arm, tuple, float]:
        """A trial of `arm`. One predicted to pay ends as soon as the prediction, with what
        its iterations so far measured (the drafter's own time per token, its first
        acceptance), says no K does: a drafter's first iteration is what times it, and each
        further iteration of a trial that cannot pay costs a drafter forward."""
        pays = self.predict_k(arm[0]) != 0  # else explored on purpose: the whole trial judges it
        u = yield from self._iterations(arm, self.cfg.trial, "test", until_unpaid=pays)
        self.memory[arm[0]].utility[arm[1]] = u
        return u

    def _climb(self, d: str, tried: dict[Arm, float]) -> Generator[Arm, tuple, None]:
        """Hill-climb K for drafter d with the trials left, stepping from its best K so far to
        a neighbour not known to be worse (see _next_k); stop when none is left, utility fell
        twice in a row, or a step changed it by less than `converge`. A step that raised it
        by more than that earns another trial beyond `max_trials` (up to twice as many): it
        beat every arm this phase, and the next may too."""
        falls, rising = 0, False
        while (len(tried) < self.cfg.max_trials or rising and len(tried) < 2 * self.cfg.max_trials) \
                and (k := self._next_k(d, tried)) is not None:
            best = max(self.memory[d].utility.values())
            u = tried[(d, k)] = yield from self._trial((d, k))
            if abs(u - best) <= self.cfg.converge * max(u, best):
                return
            rising = u > best
            falls = falls + 1 if u < best else 0
            if falls == 2:
                return

    def _next_k(self, d: str, tried: dict[Arm, float] | None = None) -> int | None:
        """The neighbour of d's best K worth a trial: up first while its utility is at least
        1 or within `converge` below it (a longer draft may pay where this one nearly did),
        else only down (so K = 1 clearly below 1 ends the search: speculation off); never one
        measured worse than the best, nor one tried this phase. None: a known maximum, or a
        drafter that sizes its own proposals: a cap only cuts what its sizing judged to pay, and
        each step is a trial (chat-session on the H200 MoE curve ran eleven caps down to K = 1
        in 355 of 595 iterations; 526 iterations in all without the climb)."""
        ladder, mem = self.cfg.ladder, self.memory[d].utility
        if not mem or self.sizes_itself(d):
            return None
        k = max(mem, key=mem.get)
        u, i = mem[k], ladder.index(k)
        for j in ((i + 1, i - 1) if u >= 1.0 - self.cfg.converge else (i - 1,)):
            if 0 <= j < len(ladder) and (d, ladder[j]) not in (tried or {}) \
                    and not mem.get(ladder[j], float("inf")) < u:
                return ladder[j]
        return None

    def k_start(self, drafter: str) -> int:
        """The K with the best recent utility, else the cost curve's prediction, on the ladder
        for a drafter that is climbed; one that sizes its own proposals keeps the prediction
        (the largest K the curve prices: the ladder's top, 48, had capped it below that)."""
        seen = self.memory[drafter].utility
        if seen:
            return max(seen, key=seen.get)
        k = self.predict_k(drafter)
        return k if self.sizes_itself(drafter) else min(self.cfg.ladder, key=lambda x: abs(x - k))
