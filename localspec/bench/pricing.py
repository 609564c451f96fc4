"""The bench's projection onto another machine (bench --curve, --draft-curve): every
iteration as it would cost there. The target's forward is priced on that machine's cost
curve (its batch at its context), the drafters' own forwards on the draft curve where one is
given, and the host's time is what it took here. Cascade hears iterations so priced, and the
drafters plan with their forwards so priced, so they choose as they would there."""

from __future__ import annotations

from typing import Callable

from localspec.drafters.base import DraftClock
from localspec.llama.curve import CostModel
from localspec.loop import Iteration

Price = Callable[[int, int], float]  # batch, context -> seconds


def there(curve: CostModel, batch: int, n_past: int, off_forward: float) -> float:
    """An iteration's seconds on `curve`'s machine: its target forward priced there (its batch
    after n_past tokens), plus the rest as it went here (the host's time, and the drafters'
    forwards as their clock counted them)."""
    return curve.price(batch, n_past) + off_forward


class PricedClock(DraftClock):
    """The drafters' clock with each of their forwards counted at `price`'s seconds."""

    def __init__(self, price: Price):
        super().__init__()
        self.price = price

    def counted(self, n: int, n_context: int, seconds: float, forwards: int) -> float:
        return self.price(n, n_context) * forwards


class Projection:
    def __init__(self, draft_price: Price | None = None):
        """`draft_price`: what a drafter's forward costs there (None: what it takes here).
        The target's curve is set once the engine has read it (`target`)."""
        self.clock = PricedClock(draft_price) if draft_price else DraftClock()
        self.target: CostModel | None = None

    def heard(self, it: Iteration) -> float:
        """The iteration's seconds there: its forward priced, its drafters' forwards as their
        clock counted them, the host's time as measured."""
        assert self.target is not None, "Projection.target: the curve the target's forwards are priced on"
        return there(self.target, it.batch, it.n_past, it.seconds - it.forward_seconds + it.draft_ahead)
