"""Drafters: each answers one call, propose(context, max_nodes) -> DraftTree."""

from __future__ import annotations

from typing import Protocol

from localspec.verify import DraftTree, Verdict


class Drafter(Protocol):
    name: str

    def propose(self, context: list[int], max_nodes: int) -> DraftTree:
        """A tree of guesses for what follows `context` (which ends with the pending root
        token), with the drafter's estimate that each node is accepted."""

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        """What the target accepted of the last proposal."""

    # Feature drafters also set `feature_window` (> 0: how many of the prompt's last tokens
    # they want hidden states for) and define committed(ctx, first_pos, rows, fresh=False):
    # the target just decoded context positions first_pos, first_pos + 1, ... at those batch
    # rows (fresh: a new prompt, nothing before first_pos is known).


def rerank(parents: list[int], reach: list[float], n: int) -> tuple[list[int], list[int]]:
    """EAGLE-2's reranking of a grown tree (parents before children, a child never likelier
    than its parent): the n likeliest nodes, which on ties keep the earlier node, so every kept
    node's parent is kept too. Returns their old indices in topological order (by depth, then
    likelihood) and their parents as new indices."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    keep = sorted(range(len(parents)), key=lambda i: -reach[i])[:n]
    order = sorted(keep, key=lambda i: (depth[i], -reach[i]))
    index = {old: new for new, old in enumerate(order)}
    return order, [index[parents[i]] if parents[i] >= 0 else -1 for i in order]


class DecayingRatio:
    """A ratio of two running sums with a prior worth `weight` observations. Evidence decays
    every iteration, drafted or not, so an estimate drifts back to its prior while a drafter
    sits unused and the drafter gets tried again later. Drafters use it two ways: as a
    calibration (tokens accepted / tokens their estimates predicted) and as a chain
    acceptance rate (accepted / (accepted + rejections), a geometric run's estimate)."""

    def __init__(self, prior: float, weight: float = 4.0, decay: float = 0.97):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.num = 0.0
        self.den = 0.0

    @property
    def value(self) -> float:
        return (self.num + self.weight * self.prior) / (self.den + self.weight)

    def tick(self) -> None:
        self.num *= self.decay
        self.den *= self.decay

    def add(self, num: float, den: float) -> None:
        self.num += num
        self.den += den
