"""Prompt lookup: draft what followed earlier occurrences of the context's longest matching
suffix, as a tree where those occurrences continue differently."""

from __future__ import annotations

import numpy as np

from localspec import _native
from localspec.drafters.base import Budget, DecayingRatio, Drafter
from localspec.sampling import SamplingConfig
from localspec.verify import DraftTree, Verdict


class LookupDrafter(Drafter):
    name = "lookup"
    free = True

    def __init__(self, n_min: int = 2, n_max: int = 32, max_depth: int = 63, max_occurrences: int = 32):
        self.index = _native.NgramIndex(n_min, n_max)
        self.seen: list[int] = []
        self.max_depth = max_depth
        self.max_occurrences = max_occurrences
        self.acceptance = MatchAcceptance(n_min)

    def begin(self, prompt: list[int], sampling: SamplingConfig) -> None:
        self.sync(prompt, whole=True)

    def sync(self, context: list[int], whole: bool = False) -> None:
        """Index exactly `context`: extend when it continues what is indexed, rebuild when not.
        Within a request the context only grows, so there its first and last indexed tokens
        are checked (comparing all of it took a fifth of a millisecond an iteration); a new
        request's prompt (`whole`) is compared in full."""
        n = len(self.seen)
        if n > len(context) or (context[:n] != self.seen if whole else
                                n and (context[0] != self.seen[0] or context[n - 1] != self.seen[-1])):
            self.index.reset()
            self.seen = []
            n = 0
        self.index.extend(np.asarray(context[n:], np.int32))
        self.seen.extend(context[n:])

    def propose(self, context: list[int], budget: Budget) -> DraftTree:
        self.acceptance.start(context)
        self.sync(context)
        return self.acceptance.tree(*self.index.draft(budget.max_nodes, self.max_depth, self.max_occurrences))

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        self.acceptance.observe(tree, verdict)


class MatchAcceptance:
    """Acceptance of drafts of what followed earlier occurrences, by the length of the matched
    suffix, in buckets (1..8, 12, 16, 24): longer matches are safer bets, but no bucket starts
    sure of itself. Drafts grow long (up to 63 tokens, 24 forwards' worth here) only on
    evidence, text being copied, so a wrong guess about what repeats stays cheap.

    Every proposal is evidence: a verified one by how far the target accepted it, one left
    unverified (not worth a forward yet, or another drafter ran) by whether the token that
    came next was its first. Otherwise a bucket whose prior is too low to draft would never
    learn that its drafts would have been accepted."""

    def __init__(self, n_min: int = 1, base: float = 0.5, cap: float = 0.9):
        self.buckets = {n: DecayingRatio(prior=min(cap, base + 0.1 * n), weight=8.0, decay=0.99)
                        for n in (*range(n_min, 9), 12, 16, 24)}
        self.last = n_min  # the bucket of the last tree
        self._context: tuple[int, tuple[int, ...]] = (0, ())  # its length and last tokens
        # The last proposal while not verified: where it starts, the tree, its bucket.
        self._unverified: tuple[int, tuple[int, ...], DraftTree, int] | None = None

    def start(self, context: list[int]) -> None:
        """A proposal for `context` begins: evidence decays, and the last one, if it was not
        verified, is judged by the token that followed its root."""
        for ratio in self.buckets.values():
            ratio.tick()
        if self._unverified is not None:
            at, tail, tree, bucket = self._unverified
            if len(context) > at and tuple(context[at - len(tail):at]) == tail:
                self.buckets[bucket].add(tree.walk(context[at:at + 1])[0], 1.0)
            self._unverified = None
        self._context = len(context), tuple(context[-8:])

    def tree(self, tokens: np.ndarray, parents: np.ndarray, counts: np.ndarray, n_match: int,
             n_occurrences: int) -> DraftTree:
        """Reaching a node takes the text going the way that share of the earlier occurrences
        went, and the target accepting every token on the way there."""
        if n_occurrences == 0:
            return DraftTree.empty()
        self.last = max(n for n in self.buckets if n <= n_match)
        tree = DraftTree(tokens, parents, np.zeros(len(tokens)))
        tree.reach = counts / n_occurrences * self.buckets[self.last].value ** tree.depths()
        self._unverified = (*self._context, tree, self.last)
        return tree

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        """A chain's acceptance: accepted tokens over them plus the rejection that ended the
        path, if one did."""
        self._unverified = None
        reached_leaf = bool(verdict.path) and not tree.has_child()[verdict.path[-1]]
        n = len(verdict.path)
        self.buckets[self.last].add(n, n + (0 if reached_leaf else 1))
