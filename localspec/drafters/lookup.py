"""Prompt lookup: draft what followed earlier occurrences of the context's longest matching
suffix, as a tree where those occurrences continue differently."""

from __future__ import annotations

import numpy as np

from localspec import _native
from localspec.drafters import Calibration
from localspec.verify import DraftTree, Verdict


class LookupDrafter:
    name = "lookup"

    def __init__(self, n_min: int = 2, n_max: int = 6, max_depth: int = 12, max_occurrences: int = 32):
        self.index = _native.NgramIndex(n_min, n_max)
        self.seen: list[int] = []
        self.max_depth = max_depth
        self.max_occurrences = max_occurrences
        self.calibration = Calibration(prior=0.9)
        self._raw = np.zeros(0)

    def _sync(self, context: list[int]) -> None:
        """Index exactly `context`: extend when it grew, rebuild when it changed."""
        n = len(self.seen)
        if n > len(context) or context[:n] != self.seen:
            self.index.reset()
            self.seen = []
            n = 0
        self.index.extend(np.asarray(context[n:], np.int32))
        self.seen.extend(context[n:])

    def propose(self, context: list[int], max_nodes: int) -> DraftTree:
        self.calibration.tick()
        self._sync(context)
        tokens, parents, counts, n_match, n_occ = self.index.draft(
            max_nodes, self.max_depth, self.max_occurrences)
        if n_occ == 0:
            self._raw = np.zeros(0)
            return DraftTree.empty()
        # The fraction of earlier occurrences that went through a node estimates how often
        # the text will; longer matched suffixes are more trustworthy.
        self._raw = counts / n_occ * (n_match / (n_match + 1))
        return DraftTree(tokens, parents, np.minimum(1.0, self._raw * self.calibration.scale))

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        self.calibration.update(self._raw[:len(tree)], len(verdict.path))
