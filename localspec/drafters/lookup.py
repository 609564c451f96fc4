"""Prompt lookup: draft what followed earlier occurrences of the context's longest matching
suffix, as a tree where those occurrences continue differently."""

from __future__ import annotations

import numpy as np

from localspec import _native
from localspec.drafters.base import Budget, DecayingRatio, Drafter
from localspec.verify import DraftTree, Verdict


class LookupDrafter(Drafter):
    name = "lookup"
    free = True

    def __init__(self, n_min: int = 2, n_max: int = 32, max_depth: int = 63, max_occurrences: int = 32):
        self.index = _native.NgramIndex(n_min, n_max)
        self.seen: list[int] = []
        self.max_depth = max_depth
        self.max_occurrences = max_occurrences
        self.acceptance = match_acceptance(n_min)
        self._n_match = n_min

    def _sync(self, context: list[int]) -> None:
        """Index exactly `context`: extend when it grew, rebuild when it changed."""
        n = len(self.seen)
        if n > len(context) or context[:n] != self.seen:
            self.index.reset()
            self.seen = []
            n = 0
        self.index.extend(np.asarray(context[n:], np.int32))
        self.seen.extend(context[n:])

    def propose(self, context: list[int], budget: Budget) -> DraftTree:
        for a in self.acceptance.values():
            a.tick()
        self._sync(context)
        tokens, parents, counts, n_match, n_occ = self.index.draft(
            budget.max_nodes, self.max_depth, self.max_occurrences)
        if n_occ == 0:
            return DraftTree.empty()
        # Reaching a node takes the text going the way that share of the earlier occurrences
        # went, and the target accepting every token on the way there.
        self._n_match = bucket(self.acceptance, n_match)
        tree = DraftTree(tokens, parents, np.zeros(len(tokens)))
        tree.reach = counts / n_occ * self.acceptance[self._n_match].value ** tree.depths()
        return tree

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        reached_leaf = bool(verdict.path) and not tree.has_child()[verdict.path[-1]]
        n = len(verdict.path)
        self.acceptance[self._n_match].add(n, n + (0 if reached_leaf else 1))


def match_acceptance(n_min: int = 1, base: float = 0.5, cap: float = 0.9) -> dict[int, DecayingRatio]:
    """Acceptance of drafts by the length of the matched suffix, in buckets (1..8, 12, 16, 24):
    longer matches are safer bets, but no bucket starts sure of itself. Drafts grow long (up
    to 63 tokens, 24 forwards' worth here) only on evidence, text being copied, so a wrong
    guess about what repeats stays cheap."""
    return {n: DecayingRatio(prior=min(cap, base + 0.1 * n), weight=8.0, decay=0.99)
            for n in (*range(n_min, 9), 12, 16, 24)}


def bucket(acceptance: dict[int, DecayingRatio], n_match: int) -> int:
    return max(n for n in acceptance if n <= n_match)
