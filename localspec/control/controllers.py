"""Controllers: before each iteration of the loop, which drafter drafts, within what budget,
and its proposal (the controller asks for it; the loop sizes it to the budget), or plain
decoding (None); after it, what that iteration emitted and cost.

- Plain: never drafts.
- Fixed: one drafter every iteration, its tree sized by the cost curve or a static K.
- CascadeController (`--drafter auto`): Cascade (cascade.py) over several drafters."""

from __future__ import annotations

import numpy as np

from localspec.control.cascade import PLAIN, Cascade, CascadeConfig
from typing import Callable

from localspec.drafters.base import Budget, DecayingRatio, Drafter
from localspec.drafters.loaded import Drafters
from localspec.drafters.spec import DrafterSpec
from localspec.llama.curve import CostModel
from localspec.verify import DraftTree

# What runs an iteration: the drafter, its budget, and its proposal.
Choice = tuple[Drafter, Budget, DraftTree]


def controller_for(spec: DrafterSpec, drafters: Drafters, curve: Callable[[], CostModel],
                   n_seq_max: int, flat: bool = False,
                   cascade: CascadeConfig = CascadeConfig()) -> Plain | Fixed | CascadeController:
    """What runs requests with this spec, its drafters built (the ones that cannot be had say
    so here, before `curve` is asked for: measuring it may take seconds). n_seq_max: the
    paths a tree may have; flat: each verified in rows of its own (Budget); cascade: auto's
    settings."""
    if spec.kind == "none":
        return Plain()
    if spec.kind != "auto":
        drafter = drafters.get(spec)
        return Fixed(drafter, Budget(curve(), n_seq_max, spec.k, static=spec.k is not None, flat=flat), spec.label)
    members = {d.label: drafters.get(d) for d in spec.members or drafters.available()}
    return CascadeController(members, curve(), n_seq_max, cascade, flat=flat)


class Plain:
    drafters: tuple[Drafter, ...] = ()
    arm = "plain"
    phase = ""

    def begin(self) -> None:
        pass

    def choose(self, context: list[int], room: int) -> Choice | None:
        """The next iteration's drafter, budget and proposal after `context`, with room for
        at most `room` draft tokens; None: a plain step."""
        return None

    def record(self, tokens: int, seconds: float, drafted: int, accepted: int) -> None:
        pass

    def listening(self, drafter: Drafter) -> bool:
        return True


class Fixed(Plain):
    def __init__(self, drafter: Drafter, budget: Budget, label: str):
        self.drafter, self.budget = drafter, budget
        self.drafters = (drafter,)
        self.arm = label

    def choose(self, context: list[int], room: int) -> Choice | None:
        if room <= 0:
            return None
        budget = self.budget.at(len(context)).within(room)
        return self.drafter, budget, self.drafter.propose(context, budget)


class CascadeController:
    """Each iteration it asks Cascade for an arm (a drafter and K, the most draft tokens it may
    propose; K = 0 plain decoding) and reports what the iteration emitted and cost: all of it
    (drafting, verification, sampling) except the time a drafter switched in spends catching
    up with the context it missed while others ran. That is paid once per switch, not per
    iteration, so it is left out of the trial's utility and counted instead in the prediction
    that decides whether the drafter gets a trial at all (predict_k).

    Drafters that draft for free (prompt lookup) are watched while plain decoding runs: each
    plain iteration they propose as if their arm ran, and once the context shows how far
    plain decoding went along that proposal, Cascade hears what the arm would have emitted and
    cost (`shadow`). They are also asked first, every iteration: a proposal they are sure of
    (its expected speedup, by their calibrated estimates and the cost curve, at least
    `sure_at`: text being copied) runs whatever phase Cascade is in, outside its accounting,
    so a request that copies does not wait for a test phase to find out."""

    def __init__(self, members: dict[str, Drafter], curve: CostModel, n_seq_max: int,
                 cfg: CascadeConfig = CascadeConfig(), sure_at: float = 1.3, flat: bool = False):
        self.members = members
        self.drafters = tuple(members.values())
        self._names = {id(d): name for name, d in members.items()}
        self.curve, self.n_seq_max, self.flat = curve, n_seq_max, flat
        # Per drafter, accepted / drafted tokens: the cost curve turns it into a starting K.
        self.acceptance = {d: DecayingRatio(prior=0.5, decay=1.0) for d in members}
        self._context: list[int] = []
        self._curve = curve  # at the context of the iteration being chosen
        self.cascade = Cascade(members, cfg, self.predict_k, self.trial_cost, self.predict_utility,
                               sizes_itself=lambda name: members[name].free)
        self.watched = [name for name, d in members.items() if d.free]
        # (drafter, context length, proposal, its verification's cost in plain forwards)
        self._shadows: list[tuple[str, int, DraftTree, float]] = []
        self._previous = ""  # the drafter of the last iteration
        self.sure_at = sure_at
        self._sure: str | None = None  # the free drafter this iteration runs outside Cascade
        self.arm, self.phase = "plain", ""

    def begin(self) -> None:
        self.cascade.new_request()
        self._shadows = []
        self._previous = ""
        self._sure = None

    def choose(self, context: list[int], room: int) -> Choice | None:
        self._context = context
        self._curve = curve = self.curve.at(len(context))
        self._score_shadows(context)
        # One proposal per free drafter and iteration, with the whole budget the request has
        # room for: it decides whether the drafter is sure, and is what a plain iteration
        # watches or a set phase of that drafter verifies (sized to the arm's K). (Drafted
        # past the room, a sure copy near the request's end was cut to a shorter best prefix
        # than one drafted within it: an iteration more.)
        proposals, budgets = {}, {}
        self._sure = None
        for w in self.watched:
            budget = budgets[w] = Budget(curve, self.n_seq_max, flat=self.flat).within(max(room, 1))
            proposals[w] = self.members[w].propose(context, budget)
            if budget.speedup(proposals[w]) >= self.sure_at:
                self._sure = w
                self.arm, self.phase = w, "sure"
                return (self.members[w], budget, proposals[w]) if room > 0 else None
        name, k = self.cascade.next_arm()
        self.arm, self.phase = f"{name}@{k}" if k else "plain", self.cascade.phase
        if (name, k) == PLAIN:
            for w, proposal in proposals.items():
                tree = Budget(curve, self.n_seq_max, self.cascade.k_start(w), flat=self.flat).size(proposal)
                self._shadows.append((w, len(context), tree, curve.ratio(1 + len(tree))))
            return None
        if room <= 0:
            return None
        budget = (budgets[name] if name in budgets else Budget(curve, self.n_seq_max, flat=self.flat)).within(min(k, room))
        proposal = proposals.get(name)
        return self.members[name], budget, proposal if proposal is not None else self.members[name].propose(context, budget)

    def record(self, tokens: int, seconds: float, drafted: int, accepted: int) -> None:
        if self._sure:
            self.acceptance[self._sure].add(accepted, drafted)
            self._previous = self._sure
            return
        name = self.cascade.next_arm()[0]
        if name:
            self.acceptance[name].add(accepted, drafted)
            if name != self._previous:
                seconds -= self.members[name].t_catch_up
        self._previous = name
        self.cascade.record(tokens, seconds)

    def listening(self, drafter: Drafter) -> bool:
        """A feature drafter that can resume after a gap is given the target's features of
        this iteration only if the next may ask it to draft (an iteration's copy of them is
        host time on every iteration of a request it is not part of): after an iteration run
        outside Cascade, if the arm Cascade waits with is its own; else if Cascade may run one
        of its arms next."""
        if not drafter.rests:
            return True
        name = self._names[id(drafter)]
        return self.cascade.arm[0] == name if self._sure else self.cascade.may_ask_next(name)

    def _score_shadows(self, context: list[int]) -> None:
        """Report to Cascade each watched proposal whose outcome the context now decides."""
        waiting = []
        for name, start, tree, cost in self._shadows:
            n, final = tree.walk(context[start:])
            if final:
                self.cascade.shadow(name, 1 + n, cost)
            else:
                waiting.append((name, start, tree, cost))
        self._shadows = waiting

    def predict_k(self, name: str) -> int:
        """The K that maximises expected speed over a trial for a chain whose tokens are each
        accepted at this drafter's measured rate a, cost its drafting time t per token, after
        catching up with the context once (c seconds): per iteration
        (1 + a + ... + a^K) / (cost(1 + K) + K t + c / trial), against 1 / cost(1) for plain
        decoding; 0 when no K beats plain. One that costs nothing (as far as it has been
        timed) is never predicted out: its trials judge it. A drafter that drafts for free
        (prompt lookup) runs at the largest K, never climbed: its proposals are sized by the
        curve from its own estimates already, which a cap could only cut (climbing K from a
        small start cost humaneval-warm a dozen trials a request, and climbing down from the
        top cost chat-session 3% on the MoE curve)."""
        if self.members[name].free:
            return len(self._curve.seconds) - 1
        ks, gain, cost, free = self._trial_terms(name)
        rate = gain / cost
        best = int(np.argmax(rate))
        if rate[best] * self._curve.cost(1) >= 1.0 or free:
            return int(ks[best])
        return 0

    def predict_utility(self, name: str) -> float:
        """The utility a trial at the best K is expected to measure, by the terms of predict_k
        (a drafter's time estimated before it is timed, see drafting_seconds);
        unbounded for one that drafts for free (its proposals, not a rate, decide)."""
        if self.members[name].free:
            return float("inf")
        _, gain, cost, _ = self._trial_terms(name)
        return float(np.max(gain / cost)) * self._curve.cost(1)

    def trial_cost(self, name: str) -> float:
        """The seconds a trial of this drafter at its starting K is expected to lose against
        plain decoding (catching up included), by the same terms as predict_k."""
        ks, gain, cost, _ = self._trial_terms(name)
        i = min(self.cascade.k_start(name), len(ks)) - 1
        trial = self.cascade.cfg.trial
        return max(0.0, trial * (cost[i] - gain[i] * self._curve.cost(1)))

    def _trial_terms(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """For K = 1, 2, ...: the tokens an iteration is expected to emit and its seconds
        (a trial's catch-up spread over its iterations); and whether the drafter is free."""
        curve = self._curve
        t, c = self.members[name].drafting_seconds(self._context, curve)
        a = min(0.99, self.acceptance[name].value)
        ks = np.arange(1, len(curve.seconds))
        gain = (1 - a ** (ks + 1)) / (1 - a)  # 1 + a + ... + a^K
        cost = np.asarray(curve.seconds[1:]) + ks * t + c / self.cascade.cfg.trial  # cost(1 + k)
        return ks, gain, cost, t == 0 and c == 0
