"""Cost-aware sizing: keep the prefix of a draft tree that maximises expected tokens per
second, by the measured cost curve of the target and the drafter's reach estimates."""

from __future__ import annotations

import numpy as np

from localspec.engine.cost import CostCurve
from localspec.verify import DraftTree


class Planner:
    def __init__(self, curve: CostCurve, n_seq_max: int, max_nodes: int | None = None):
        self.curve = curve
        self.n_seq_max = n_seq_max
        self.max_nodes = min(max_nodes or len(curve.seconds) - 1, len(curve.seconds) - 1)

    def size(self, tree: DraftTree) -> DraftTree:
        """The prefix of `tree` (nodes best first) with the best expected rate,
        (1 + sum of reach) tokens for cost(1 + n) seconds; empty (a plain step: 1 token for
        cost(1)) when no prefix beats it. Drafting time is spent by now, so it does not count."""
        n_max = min(len(tree), self.max_nodes)
        gain = 1.0 + np.concatenate([[0.0], np.cumsum(tree.reach[:n_max])])
        cost = np.array([self.curve.cost(1 + n) for n in range(n_max + 1)])
        # n_seq_max bounds the number of root-to-leaf paths: take the best size that fits.
        for n in np.argsort(-(gain / cost), kind="stable"):
            if n == 0 or tree.prefix(int(n)).n_leaves() <= self.n_seq_max:
                return tree.prefix(int(n))
        return tree.prefix(0)

    def worth_drafting(self, reach: float, t_draft_token: float, depth: int) -> bool:
        """Should a sequential drafter draft one more token? Its expected gain `reach` must
        pay for drafting it and for the larger verification batch."""
        return reach > self.min_reach(t_draft_token, depth)

    def min_reach(self, t_draft_token: float, depth: int) -> float:
        """The reach a token drafted at `depth` needs to be worth drafting."""
        extra = self.curve.cost(depth + 2) - self.curve.cost(depth + 1) + t_draft_token
        return extra / self.curve.cost(1)


class FixedPlanner(Planner):
    """Static K: draft up to K tokens and verify all of them, whatever they cost — the
    static configurations Cascade is measured against."""

    def __init__(self, curve: CostCurve, n_seq_max: int, k: int):
        super().__init__(curve, n_seq_max, k)
        self.max_nodes = k  # beyond the measured curve too: a static K is what it says

    def size(self, tree: DraftTree) -> DraftTree:
        n = min(len(tree), self.max_nodes)
        while n and tree.prefix(n).n_leaves() > self.n_seq_max:
            n -= 1
        return tree.prefix(n)

    def min_reach(self, t_draft_token: float, depth: int) -> float:
        return 0.0
