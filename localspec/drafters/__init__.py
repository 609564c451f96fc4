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


class Calibration:
    """Scales a drafter's raw reach estimates by how often its nodes really were accepted.
    Evidence decays every iteration, drafted or not, so the scale drifts back to the prior
    when a drafter stops being used and it gets tried again later."""

    def __init__(self, prior: float, weight: float = 4.0, decay: float = 0.97):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.predicted = 0.0
        self.accepted = 0.0

    @property
    def scale(self) -> float:
        return (self.accepted + self.weight * self.prior) / (self.predicted + self.weight)

    def tick(self) -> None:
        self.predicted *= self.decay
        self.accepted *= self.decay

    def update(self, raw_reach, n_accepted: int) -> None:
        self.predicted += float(sum(raw_reach))
        self.accepted += n_accepted


class ChainAcceptance:
    """The probability that the target accepts the next drafted token given it accepted the
    previous ones, estimated from verifications as accepted / (accepted + rejections): the
    maximum-likelihood rate of a geometric run. Decays like Calibration, toward the prior."""

    def __init__(self, prior: float, weight: float = 8.0, decay: float = 0.98):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.accepted = 0.0
        self.rejected = 0.0

    @property
    def rate(self) -> float:
        a = self.accepted + self.weight * self.prior
        return a / (a + self.rejected + self.weight * (1 - self.prior))

    def tick(self) -> None:
        self.accepted *= self.decay
        self.rejected *= self.decay

    def update(self, n_accepted: int, reached_leaf: bool) -> None:
        self.accepted += n_accepted
        self.rejected += 0 if reached_leaf else 1
