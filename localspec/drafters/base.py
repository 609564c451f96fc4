"""What every drafter is: one base class with a lifecycle, and the budget it drafts within.

A request's life, as the loop (localspec/loop.py) drives it:

    begin(prompt, sampling)          a request starts: per-request state (sampler, seed, head)
    propose(context, budget)         -> DraftTree: guesses for what follows `context`
    observe(tree, verdict)           what the target accepted of that proposal (if any of it
                                     was verified)
    commit(ctx, first_pos, rows)     feature drafters only: the target's hidden states of the
                                     positions it just committed (batch rows of its last decode)
    close()                          the engine is done with the drafter

Drafters are loaded once per engine and serve any sampling settings: nothing about a request
is fixed at construction."""

from __future__ import annotations

import copy
import operator
import time

from localspec.llama.context import Context
from localspec.llama.curve import CostCurve, CostModel
from localspec.sampling import SamplingConfig
from localspec.verify import DraftTree, Verdict, depths_of


class Budget:
    """What one proposal may hold: at most `max_nodes` nodes, each worth its place by the cost
    curve (expected tokens per second), or, with `static`, up to max_nodes whatever they cost
    (a static K: the configurations Cascade is measured against). `flat`: a hybrid target's
    tree is verified flattened and priced so, forward by forward (DraftTree.hybrid_forwards)."""

    def __init__(self, curve: CostModel, n_seq_max: int, max_nodes: int | None = None,
                 static: bool = False, flat: bool = False):
        self.curve = curve
        self.n_seq_max = n_seq_max
        self.static = static
        self.flat = flat
        n_curve = len(curve.seconds) - 1
        self.max_nodes = n_curve if max_nodes is None else max_nodes if static else min(max_nodes, n_curve)
        # The last few trees size() was asked about, by id, and its answers: a proposal is
        # weighed against another (the suffix drafter's two sources, a controller's "sure?"),
        # then sized for verification, and each sizing walks every node in Python.
        self._sized: dict[int, tuple[DraftTree, DraftTree]] = {}

    def at(self, n_context: int) -> Budget:
        """This budget after n_context tokens of context (a wide batch costs more there)."""
        curve = self.curve.at(n_context)
        return self if curve is self.curve else Budget(curve, self.n_seq_max, self.max_nodes, self.static, self.flat)

    def within(self, n: int) -> Budget:
        """This budget, holding at most n nodes (the room left in the request or context)."""
        if n >= self.max_nodes:
            return self
        smaller = Budget(self.curve, self.n_seq_max, n, self.static, self.flat)
        if not self.static:  # a tree this one sized to n nodes or fewer sizes the same there
            smaller._sized = {i: seen for i, seen in self._sized.items() if len(seen[1]) <= n}
        return smaller

    def size(self, tree: DraftTree) -> DraftTree:
        """The prefix of `tree` (nodes best first) to verify. Cost-aware: the one with the best
        expected rate, (1 + sum of reach) tokens for cost(1 + n) seconds, or none (a plain
        step: 1 token for cost(1)); drafting time is spent by now, so it does not count. At
        most n_seq_max root-to-leaf paths either way (one sequence each)."""
        n_max = min(len(tree), self.max_nodes)
        if self.static:
            while n_max and tree.prefix(n_max).n_leaves() > self.n_seq_max:
                n_max -= 1
            return tree.prefix(n_max)
        if (seen := self._sized.get(id(tree))) is not None and seen[0] is tree:
            return seen[1]
        # Plain floats: a few dozen nodes, every iteration, where numpy's calls cost more.
        rates, gain = [1.0 / self.curve.seconds[0]], 1.0
        prices = self._flat_prices(tree, n_max) if self.flat else self.curve.seconds  # seconds[n] = cost(1 + n)
        for n, reach in enumerate(tree.reach[:min(n_max, len(prices) - 1)].tolist(), 1):
            gain += reach
            rates.append(gain / prices[n])
        n_max = len(rates) - 1
        best = max(range(n_max + 1), key=rates.__getitem__)  # the first best: fewer nodes
        # (a prefix has at most the whole tree's leaves: most trees need no count of the prefix's)
        if best and tree.n_leaves() > self.n_seq_max and tree.prefix(best).n_leaves() > self.n_seq_max:
            best = next((n for n in sorted(range(n_max + 1), key=lambda n: -rates[n])
                         if n == 0 or tree.prefix(n).n_leaves() <= self.n_seq_max), 0)
        kept = tree.prefix(best)
        if len(self._sized) >= 4:
            del self._sized[next(iter(self._sized))]  # the oldest
        self._sized[id(tree)] = (tree, kept)
        return kept

    def speedup(self, tree: DraftTree) -> float:
        """The expected speed of verifying what size() keeps of `tree`, relative to a plain
        step (1.0: nothing worth verifying)."""
        kept = self.size(tree)
        if not len(kept):
            return 1.0
        price = self._flat_prices(kept, len(kept))[-1] if self.flat else self.curve.cost(1 + len(kept))
        return (1.0 + float(kept.reach.sum())) * self.curve.cost(1) / price

    def _flat_prices(self, tree: DraftTree, n: int) -> list[float]:
        """What verifying each prefix of 0..n nodes costs on a hybrid target, its forwards
        priced one by one; up to the first with a forward wider than the curve."""
        seconds, prices = self.curve.seconds, []
        for rows in tree.hybrid_forwards(n):
            if max(rows) > len(seconds):
                break
            prices.append(sum(seconds[r - 1] for r in rows))
        return prices

    def worth_drafting(self, reach: float, t_draft_token: float, depth: int) -> bool:
        """Should a sequential drafter draft one more token? Its expected gain `reach` must
        pay for drafting it and for the larger verification batch."""
        return reach > self.min_reach(t_draft_token, depth)

    def min_reach(self, t_draft_token: float, depth: int) -> float:
        """The reach a token drafted at `depth` needs to be worth drafting (0 for a static K:
        it drafts all K)."""
        if self.static:
            return 0.0
        extra = self.curve.cost(depth + 2) - self.curve.cost(depth + 1) + t_draft_token
        return extra / self.curve.cost(1)


def drafting_estimate(curve: CostCurve, t_token: float, share: float, t_prefill_token: float,
                      behind: int) -> tuple[float, float]:
    """(seconds per drafted token, seconds to catch up `behind` positions first), as measured
    or, before that, estimated from the target's cost curve: a drafted token as a target
    forward times the share of its weights the drafter reads, a position caught up as a
    drafted token times what a token of the target's widest batch costs against a single one
    (a GPU prefills nearly for free; two CPU cores at about 0.4 of a decoded token)."""
    t = t_token or curve.cost(1) * share
    wide = len(curve.seconds)
    return t, behind * (t_prefill_token or t * curve.ratio(wide) / wide)


class DraftClock:
    """Times the drafters' own forwards (a draft model's, Jakiro's layer), and tells them what
    a forward took: what they plan with, so they draft as long as their time per token pays.
    Here that is what it measured; a subclass may count a forward at another price (the
    bench's, on another machine's curve), and then now() runs ahead of perf_counter by what
    it counted beyond what it measured, so a drafter's own timing runs on the same clock."""

    def __init__(self):
        self.measured = 0.0  # seconds the forwards took here
        self.ahead = 0.0     # seconds now() runs ahead of perf_counter

    def forward(self, n: int, n_context: int, t0: float, forwards: int = 1) -> float:
        """A forward of n tokens after n_context (or `forwards` of them) ran from t0
        (perf_counter) until now: the seconds it counts for."""
        seconds = time.perf_counter() - t0
        counted = self.counted(n, n_context, seconds, forwards)
        self.measured += seconds
        self.ahead += counted - seconds
        return counted

    def counted(self, n: int, n_context: int, seconds: float, forwards: int) -> float:
        return seconds

    def now(self) -> float:
        return time.perf_counter() + self.ahead


class Drafter:
    """The base of every drafter; each method's default does nothing."""

    name = "drafter"
    # > 0: the drafter reads the target's hidden states (Jakiro): of this many of the prompt's
    # last positions, and of every position committed after them.
    feature_window = 0
    # A feature drafter that drafts again from whatever features it is given after a gap (a
    # fresh cache at the first position it knows): the controller may stop committing to it
    # while it will not be asked, which saves the copy of every iteration's rows.
    rests = False
    # Drafts at no cost (prompt lookup): Cascade may watch what it would have proposed while
    # plain decoding runs.
    free = False
    t_catch_up = 0.0  # seconds the last proposal spent catching up with the context
    clock = DraftClock()  # times drafters' forwards of their own (the engine's: Drafters sets it)
    # What it learns from request to request (attribute paths): the bench gives each
    # configuration its own copy, so one that runs a turn after another has not learnt the
    # turn's text from it.
    learns: tuple[str, ...] = ()

    def learned(self) -> dict:
        """A copy of what it has learnt so far (`learns`)."""
        return {path: copy.deepcopy(operator.attrgetter(path)(self)) for path in self.learns}

    def relearn(self, learned: dict) -> None:
        """Back to what `learned()` copied."""
        for path, value in learned.items():
            owner, _, name = path.rpartition(".")
            setattr(operator.attrgetter(owner)(self) if owner else self, name, copy.deepcopy(value))

    def begin(self, prompt: list[int], sampling: SamplingConfig) -> None:
        """A request starts from `prompt` (the whole of it) with these sampling settings."""

    def propose(self, context: list[int], budget: Budget) -> DraftTree:
        """A tree of guesses for what follows `context` (which ends with the root: the last
        token emitted), with the drafter's estimate that the target accepts each node."""
        return DraftTree.empty()

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        """What the target accepted of the last proposal; not called when it was sized to
        nothing."""

    def commit(self, ctx: Context, first_pos: int, rows: list[int]) -> None:
        """The target just decoded context positions first_pos, first_pos + 1, ... at these
        batch rows of its last decode; anything known of later positions is stale."""

    def drafting_seconds(self, context: list[int], curve: CostCurve) -> tuple[float, float]:
        """(seconds per drafted token, seconds to catch up with `context` first): what Cascade
        weighs against what the drafter may gain. curve: the target's, at this context."""
        return 0.0, 0.0

    def close(self) -> None:
        """Free what the drafter holds (model contexts, native runtimes)."""


def rerank(parents: list[int], reach: list[float], n: int) -> tuple[list[int], list[int]]:
    """EAGLE-2's reranking of a grown tree (parents before children, a child never likelier
    than its parent): the n likeliest nodes, which on ties keep the earlier node, so every kept
    node's parent is kept too. Returns their old indices in topological order (by depth, then
    likelihood) and their parents as new indices."""
    depth = depths_of(parents)
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
