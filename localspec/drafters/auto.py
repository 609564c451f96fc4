"""`--drafter auto`: Cascade (control/cascade.py) over several drafters. Each iteration it
asks the controller for an arm (a drafter and K, the most draft tokens it may propose; K = 0
plain decoding), and it measures each iteration from one proposal to the next: the seconds
between them and the tokens the context grew by, which is everything the iteration cost
(drafting, verification, sampling) and everything it emitted — except the time a drafter
switched in spends catching up with the context it missed while others ran: that is paid once
per switch, not per iteration, so it is left out of the trial's utility and charged instead in
the prediction that decides whether the drafter gets a trial at all.

Drafters that draft for free (prompt lookup) are watched while plain decoding runs: each plain
iteration they propose as if their arm ran, and once the context shows how far plain decoding
went along that proposal, Cascade hears what the arm would have emitted and cost (`shadow`)."""

from __future__ import annotations

import time

import numpy as np

from localspec.control.cascade import PLAIN, Cascade, CascadeConfig
from localspec.control.planner import Planner
from localspec.drafters import DecayingRatio, Drafter
from localspec.verify import DraftTree, Verdict


class AutoDrafter:
    def __init__(self, drafters: dict[str, Drafter], planner: Planner,
                 cfg: CascadeConfig = CascadeConfig()):
        self.name = "auto(" + "+".join(drafters) + ")"
        self.drafters = drafters
        self.planner = planner  # sizes the proposals of watched drafters as the loop would
        self.curve = planner.curve
        # Per drafter, accepted / drafted tokens: the cost curve turns it into a starting K.
        self.acceptance = {d: DecayingRatio(prior=0.5, decay=1.0) for d in drafters}
        self.cascade = Cascade(drafters, cfg, self.predict_k)
        # Feature drafters (Jakiro) follow every committed token, drafting or not.
        self.feature_drafters = [d for d in drafters.values() if getattr(d, "feature_window", 0)]
        self.feature_window = max((d.feature_window for d in self.feature_drafters), default=0)
        self._last: tuple[int, float] | None = None  # context length and time at the last proposal
        self._context: list[int] = []
        self._excluded = 0.0  # catch-up seconds of this iteration's drafter switching in
        self.watched = [n for n, d in drafters.items() if not hasattr(d, "drafting_seconds")]
        self._shadows: list[tuple[str, int, DraftTree]] = []  # (drafter, context length, proposal)

    @property
    def requests(self) -> list:
        """Cascade's trace of every request so far (for `bench --trace`)."""
        return [t for t in self.cascade.history if t]

    def new_request(self) -> None:
        self.cascade.new_request()
        self._last = None
        self._shadows = []

    def propose(self, context: list[int], max_nodes: int) -> DraftTree:
        now = time.perf_counter()
        self._context = context
        self._score_shadows(context)
        previous = self.cascade.next_arm()[0]
        if self._last is not None:
            self.cascade.record(len(context) - self._last[0], now - self._last[1] - self._excluded)
        self._last = (len(context), now)
        name, k = self.cascade.next_arm()
        self._excluded = 0.0
        if (name, k) == PLAIN:
            for w in self.watched:
                proposal = self.drafters[w].propose(context, self.cascade.k_start(w))
                self._shadows.append((w, len(context), self.planner.size(proposal)))
            return DraftTree.empty()
        tree = self.drafters[name].propose(context, min(max_nodes, k))
        if name != previous:
            self._excluded = getattr(self.drafters[name], "t_catch_up", 0.0)
        return tree

    def _score_shadows(self, context: list[int]) -> None:
        """Report to Cascade each watched proposal whose outcome the context now decides."""
        waiting = []
        for name, start, tree in self._shadows:
            n, final = tree.walk(context[start:])
            if final:
                self.cascade.shadow(name, 1 + n, self.curve.cost(1 + len(tree)) / self.curve.cost(1))
            else:
                waiting.append((name, start, tree))
        self._shadows = waiting

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        name = self.cascade.next_arm()[0]  # still this iteration's: it is recorded next proposal
        self.acceptance[name].add(len(verdict.path), len(tree))
        self.drafters[name].observe(tree, verdict)

    def committed(self, ctx, first_pos: int, rows: list[int], fresh: bool = False) -> None:
        for d in self.feature_drafters:
            d.committed(ctx, first_pos, rows, fresh)

    def predict_k(self, name: str) -> int:
        """The K that maximises expected speed over a trial for a chain whose tokens are each
        accepted at this drafter's measured rate a, cost its drafting time t per token, after
        catching up with the context once (c seconds): per iteration
        (1 + a + ... + a^K) / (cost(1 + K) + K t + c / trial), against 1 / cost(1) for plain
        decoding; 0 when no K beats plain. A drafter that drafts for free (prompt lookup) is
        never predicted out: its trials judge it."""
        d = self.drafters[name]
        t, c = d.drafting_seconds(self._context, self.curve.cost(1)) \
            if hasattr(d, "drafting_seconds") else (0.0, 0.0)
        a = min(0.99, self.acceptance[name].value)
        ks = np.arange(1, len(self.curve.seconds))
        gain = (1 - a ** (ks + 1)) / (1 - a)  # 1 + a + ... + a^K
        cost = np.array([self.curve.cost(1 + k) for k in ks]) + ks * t + c / self.cascade.cfg.trial
        rate = gain / cost
        best = int(np.argmax(rate))
        if rate[best] * self.curve.cost(1) >= 1.0 or (t == 0 and c == 0):
            return int(ks[best])
        return 0
