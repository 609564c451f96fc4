"""The Cascade controller on simulated utility landscapes (each arm's utility a function of
the iteration), then `auto` on a real model: output identical to plain decoding."""

import numpy as np
import pytest

from localspec.control.cascade import PLAIN, Cascade, CascadeConfig
from localspec.control.controllers import CascadeController
from localspec.drafters.base import Budget, Drafter
from localspec.drafters.draft_model import DraftModelDrafter, draft_context
from localspec.drafters.jakiro import JakiroDrafter, JakiroRuntime
from localspec.drafters.lookup import LookupDrafter
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig
from localspec.llama.curve import CostCurve
from localspec.verify import DraftTree

from localspec.loop import run
from test_speculative import FLAT, N_TOKENS, PROMPTS, GREEDY, plain

T_BASE = 0.05  # seconds per plain iteration


def simulate(cascade: Cascade, utility, n: int, watched: tuple[str, ...] = ()) -> list:
    """Run n iterations: a plain one emits a token in T_BASE; arm (d, K) costs
    T_BASE * (1 + K / 4) and emits utility * cost / T_BASE tokens. On plain iterations the
    `watched` drafters report what their arm at its starting K would have done. Returns the
    arms run."""
    arms = []
    for i in range(n):
        arm = cascade.next_arm()
        arms.append(arm)
        if arm == PLAIN:
            for d in watched:
                k = cascade.k_start(d)
                cascade.shadow(d, utility((d, k), i) * (1 + k / 4), 1 + k / 4)
            cascade.record(1, T_BASE)
        else:
            seconds = T_BASE * (1 + arm[1] / 4)
            cascade.record(utility(arm, i) * seconds / T_BASE, seconds)
    return arms


def peaked(best_k: int, top: float, fall: float = 0.12, ladder=CascadeConfig().ladder):
    """Utility falling by `fall` per ladder step away from best_k (a K off the ladder: its
    nearest step's)."""
    step = lambda k: min(range(len(ladder)), key=lambda i: abs(ladder[i] - k))  # noqa: E731
    return lambda k: top * (1 - fall) ** abs(step(k) - step(best_k))


def set_phases(cascade: Cascade) -> list[tuple[tuple, int]]:
    """(arm, length) of each set phase in the trace."""
    spans: dict[int, list] = {}
    for row in cascade.trace:
        if row.phase == "set":
            spans.setdefault(row.span, [row.arm, 0])[1] += 1
    return [tuple(v) for v in spans.values()]


@pytest.mark.unit
def test_finds_the_best_drafter_and_k():
    lookup, draft = peaked(6, 2.0), peaked(2, 1.4)
    cascade = Cascade(["lookup", "draft"], predict_k=lambda d: 1)
    arms = simulate(cascade, lambda arm, i: (lookup if arm[0] == "lookup" else draft)(arm[1]), 600)
    late = [a for a, row in zip(arms[300:], cascade.trace[300:]) if row.phase == "set"]
    assert late.count(("lookup", 6)) / len(late) > 0.9


@pytest.mark.unit
def test_a_confirmed_arm_runs_longer_and_a_fall_ends_its_set_phase():
    """Where one arm is best throughout, each test phase that confirms it doubles the next set
    phase (up to max_set_len): testing costs less the longer it holds. When the text stops
    repeating (its utility falls to 0.6), the set phase ends within a window of `trial`
    iterations and plain decoding takes over."""
    cfg = CascadeConfig()
    lookup, draft = peaked(6, 2.0), peaked(2, 1.4)
    cascade = Cascade(["lookup", "draft"], cfg, predict_k=lambda d: 6 if d == "lookup" else 2)
    arms = simulate(cascade, lambda arm, i: 0.6 if i >= 600 else (lookup if arm[0] == "lookup" else draft)(arm[1]), 800)
    lengths = [n for arm, n in set_phases(cascade) if arm == ("lookup", 6)]
    assert max(lengths) == cfg.max_set_len and lengths[:4] == [16, 32, 64, cfg.max_set_len]
    assert sum(a == ("lookup", 6) for a in arms[:600]) / 600 > 0.85
    switched = next(i for i in range(600, 800) if cascade.trace[i].phase != "set")
    assert switched <= 600 + cfg.trial
    assert all(a == PLAIN for a in arms[700:]) or sum(a == PLAIN for a in arms[650:]) > 120


@pytest.mark.unit
def test_switches_off_below_one_and_backs_off():
    cascade = Cascade(["lookup", "draft"], predict_k=lambda d: 4)
    arms = simulate(cascade, lambda arm, i: 0.6, 1000)
    speculated = sum(a != PLAIN for a in arms)
    assert speculated / len(arms) < 0.05
    # Time against plain decoding of the same tokens: within the paper's 5%.
    tokens = sum(r.tokens for r in cascade.trace)
    seconds = sum(r.seconds for r in cascade.trace)
    assert tokens * T_BASE / seconds > 0.95
    # Each switch-off doubles the set phase.
    lengths = [n for arm, n in set_phases(cascade) if arm == PLAIN]
    assert lengths == sorted(lengths) and sorted(set(lengths))[:3] == [32, 64, 128]


@pytest.mark.unit
def test_switches_back_on_when_utility_rises():
    cascade = Cascade(["lookup"], predict_k=lambda d: 2)
    arms = simulate(cascade, lambda arm, i: 0.5 if i < 300 else peaked(4, 1.8)(arm[1]), 1500)
    assert sum(a != PLAIN for a in arms[:300]) < 30
    assert sum(a == ("lookup", 4) for a in arms[-300:]) > 250


@pytest.mark.unit
def test_each_drafter_backs_off_on_its_own():
    """A drafter that never pays is tried less and less while a good one keeps running."""
    cascade = Cascade(["good", "bad"], predict_k=lambda d: 2)
    arms = simulate(cascade, lambda arm, i: 1.5 if arm[0] == "good" else 0.3, 1000)
    bad = [i for i, a in enumerate(arms) if a[0] == "bad"]
    assert len(bad) <= 4 * 5  # a handful of trials, not one per test phase
    assert sum(a[0] == "good" for a in arms) > 800


@pytest.mark.unit
def test_a_near_miss_is_tried_again_next_phase():
    """A trial just below 1 switches speculation off for a set phase but does not sit the
    drafter out: four iterations cannot tell 0.97 from 1.03 (code-edit's first trial)."""
    cascade = Cascade(["lookup"], predict_k=lambda d: 2)
    arms = simulate(cascade, lambda arm, i: 0.97 if i < 40 else 1.3, 300)
    first_set = next(i for i, (a, row) in enumerate(zip(arms, cascade.trace))
                     if row.phase == "set" and a != PLAIN)
    assert set_phases(cascade)[0][0] == PLAIN and first_set < 60


@pytest.mark.unit
def test_a_near_miss_of_a_drafter_that_sizes_itself_runs_its_set_phase():
    """A free drafter's proposals are sized on the cost curve, so where they do not pay it
    runs plain steps anyway: a trial of it within `converge` below 1 runs the set phase, one
    clearly below does not; a drafter whose K is a cap is held to 1."""
    def first_set(utility, sizes_itself):
        cascade = Cascade(["lookup"], predict_k=lambda d: 4, sizes_itself=lambda d: sizes_itself)
        simulate(cascade, lambda arm, i: utility, 60)
        return set_phases(cascade)[0][0]
    assert first_set(0.95, True) == ("lookup", 4)
    assert first_set(0.85, True) == PLAIN
    assert first_set(0.95, False) == PLAIN


@pytest.mark.unit
def test_a_near_miss_climbs_to_the_k_that_pays_and_a_rising_climb_goes_on():
    """Where the starting K nearly pays (0.97) and a longer draft does (1.1 at K = 2), the
    climb goes up rather than switching speculation off: a small gain (chat, HumanEval) is
    kept. A climb that keeps rising goes past max_trials, so a cold start reaches K = 6 in
    its second test phase rather than its fourth."""
    cascade = Cascade(["lookup", "draft"], predict_k=lambda d: 1)
    simulate(cascade, lambda arm, i: (peaked(2, 1.1) if arm[0] == "lookup" else peaked(1, 0.7))(arm[1]), 200)
    assert set_phases(cascade)[0][0] == ("lookup", 2)
    cascade = Cascade(["lookup", "draft"], predict_k=lambda d: 1)
    simulate(cascade, lambda arm, i: (peaked(6, 2.0) if arm[0] == "lookup" else peaked(2, 1.4))(arm[1]), 100)
    assert [arm for arm, _ in set_phases(cascade)][:2] == [("draft", 2), ("lookup", 6)]


@pytest.mark.unit
def test_a_watched_drafter_ends_a_plain_set_phase_once_it_would_pay():
    """Prompt lookup drafts for free, so while plain decoding runs its proposals are checked
    against what plain decoding emits; once they would clearly pay, the plain set phase ends
    and lookup is tried. A code-edit answer opens with new prose (lookup loses: it backs off)
    and then copies the prompt's code (lookup wins)."""
    def first_lookup_set_after(change: int, watched: tuple[str, ...]) -> int:
        cascade = Cascade(["lookup"], predict_k=lambda d: 2)
        arms = simulate(cascade, lambda arm, i: 0.6 if i < change else 1.5, 400, watched)
        return next(i for i, (a, row) in enumerate(zip(arms, cascade.trace))
                    if i >= change and row.phase == "set" and a != PLAIN)

    assert first_lookup_set_after(40, ("lookup",)) < 40 + 16
    assert first_lookup_set_after(40, ()) > 40 + 32  # unwatched, the back-off runs its course


@pytest.mark.unit
def test_watching_a_drafter_that_never_pays_changes_nothing():
    cascade = Cascade(["lookup", "draft"], predict_k=lambda d: 4)
    arms = simulate(cascade, lambda arm, i: 0.6, 1000, watched=("lookup",))
    assert sum(a != PLAIN for a in arms) / len(arms) < 0.05


@pytest.mark.unit
def test_a_proposal_is_scored_by_how_far_the_text_went_along_it():
    #        0    1    2    3     tokens; node 3 is a second child of the root
    tree = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, 0, 1, -1]), np.ones(4))
    assert tree.walk([]) == (0, False)
    assert tree.walk([5, 6]) == (2, False)   # waiting: node 2 may match next
    assert tree.walk([5, 6, 7, 1]) == (3, True)  # a leaf
    assert tree.walk([5, 9]) == (1, True)
    assert tree.walk([8]) == (1, True)
    assert tree.walk([4]) == (0, True)
    assert DraftTree.empty().walk([1]) == (0, True)


@pytest.mark.unit
def test_a_drafter_predicted_not_to_pay_is_explored_within_a_share_of_the_time():
    """A drafter for which the cost curve predicts no paying K (predict_k = 0) loses without
    trials until its back-off is long; then it is explored, but only while what its trials
    were predicted to lose stays within `explore_share` of the time decoded. (Set phases kept
    at one length: a confirmed arm's longer ones leave fewer test phases to explore in.)"""
    cfg = CascadeConfig(max_set_len=CascadeConfig().set_len)
    cascade = Cascade(["good", "slow"], cfg, predict_k=lambda d: 0 if d == "slow" else 2,
                      trial_cost=lambda d: 3.0)
    arms = simulate(cascade, lambda arm, i: 1.5 if arm[0] == "good" else 0.3, 8000)
    seconds = np.cumsum([row.seconds for row in cascade.trace])
    starts = [i for i, (row, a) in enumerate(zip(cascade.trace, arms))
              if a[0] == "slow" and (i == 0 or arms[i - 1][0] != "slow")]
    # Explored, not given up: each trial as soon as the share allows it, give or take a phase.
    assert len(starts) >= cfg.explore_share * seconds[-1] / 3.0 - 1 >= 2
    for n, i in enumerate(starts, 1):  # n trials' predicted cost within the share of the time
        assert n * 3.0 <= cfg.explore_share * seconds[i - 1]
    # A cheap trial is explored as soon as the back-off allows it.
    cascade = Cascade(["good", "slow"], cfg, predict_k=lambda d: 0 if d == "slow" else 2)
    arms = simulate(cascade, lambda arm, i: 1.5 if arm[0] == "good" else 0.3, 8000)
    cheap = sum(1 for i, a in enumerate(arms) if a[0] == "slow" and arms[i - 1][0] != "slow")
    assert cheap > 2 * len(starts)


@pytest.mark.unit
def test_a_trial_ends_once_its_first_iteration_shows_no_k_pays():
    """A drafter predicted to pay before it was ever timed, whose first iteration shows its
    drafting too slow for any K (predict_k turns 0), gives up the rest of that trial; one
    predicted not to pay and explored on purpose keeps its whole trial."""
    cfg = CascadeConfig()
    timed = set()
    predict = lambda d: 0 if d in timed else 2  # noqa: E731
    cascade = Cascade(["slow"], cfg, predict_k=predict)

    def utility(arm, i):
        timed.add(arm[0])  # its first iteration times it
        return 0.7

    arms = simulate(cascade, utility, cfg.base_len + cfg.trial)
    assert arms[cfg.base_len:] == [("slow", 2)] + [PLAIN] * (cfg.trial - 1)
    assert cascade.memory["slow"].utility == {2: pytest.approx(0.7)}
    explored = Cascade(["slow"], cfg, predict_k=lambda d: 0)
    explored.memory["slow"].losses = cfg.explore_after  # its back-off is long: explored
    arms = simulate(explored, lambda arm, i: 0.7, cfg.base_len + cfg.trial)
    assert arms[cfg.base_len:] == [("slow", 1)] * cfg.trial


@pytest.mark.unit
def test_a_drafter_predicted_well_below_a_measured_arm_gets_no_trial_until_that_arm_falls():
    """A slow drafter not yet measured waits behind the free one, and while that one measures
    far more than the slow one's predicted utility (copying at 4x against 1.2x), it is not
    tried at all; once the copying stops, it is."""
    copying = 2000
    cascade = Cascade(["slow", "free"], predict_utility=lambda d: 1.2 if d == "slow" else float("inf"))
    utility = lambda arm, i: (4.0 if i < copying else 0.9) if arm[0] == "free" else 1.3
    arms = simulate(cascade, utility, 3000)
    assert arms[CascadeConfig().base_len][0] == "free"  # the one predicted higher first
    assert "slow" not in {a[0] for a in arms[:copying]}
    assert "slow" in {a[0] for a in arms[copying:]}
    assert set_phases(cascade)[-1][0][0] == "slow"


@pytest.mark.unit
def test_a_drafter_predicted_to_pay_by_less_than_a_trial_can_tell_waits():
    """A drafter never measured and predicted at 1.05 (within `converge` of plain decoding)
    gets no trial: four iterations could not tell it from plain, and its first drafting pays
    a catch-up with the context. Predicted at 1.2 it is tried at once; the first waits for
    its back-off to grow long, as one predicted not to pay at all."""
    cfg = CascadeConfig()
    for predicted, tried in ((1.05, False), (1.2, True)):
        cascade = Cascade(["slow"], cfg, predict_utility=lambda d: predicted)
        arms = simulate(cascade, lambda arm, i: 1.3, 100)
        assert (arms[cfg.base_len][0] == "slow") == tried
        assert ("slow" in {a[0] for a in arms}) == tried


@pytest.mark.unit
def test_the_baseline_carries_over_requests_until_it_is_due():
    """A request after the first goes straight to its trials: the plain baseline measured in
    the first carries over (measured at every request's start, it cost short requests their
    first plain iterations), until `base_every` iterations after it was measured."""
    cfg = CascadeConfig()
    cascade = Cascade(["lookup"], cfg)
    simulate(cascade, lambda arm, i: 2.0, 20)
    assert [row.phase for row in cascade.trace[:cfg.base_len + 1]] == ["base"] * cfg.base_len + ["test"]
    cascade.new_request()
    assert cascade.next_arm() != PLAIN and cascade.phase.startswith("test")
    simulate(cascade, lambda arm, i: 2.0, cfg.base_every + cfg.max_set_len)  # the set phase may run past it
    assert "base" in {row.phase for row in cascade.trace}  # due again, within this request


@pytest.mark.unit
def test_a_gpus_first_plain_steps_after_a_batch_do_not_count_in_the_baseline():
    """On a GPU the first two plain forwards after a batch of another size cost more (a new
    graph, then the capture of a CUDA graph: 2x and 3x a step here, as on the H200's MoE).
    Counted in the baseline, they make a drafter that loses 20% look as if it paid; left out
    (`settle` 2: run, not counted), speculation goes off."""
    def speculated(settle: int) -> tuple[float, float]:
        """The share of iterations that speculated, and the speed against plain decoding in a run."""
        cascade = Cascade(["lookup"], CascadeConfig(settle=settle), predict_k=lambda d: 4)
        since_batch = 0  # plain steps since the last batch (the prompt's, then a draft's)
        for _ in range(1000):
            arm = cascade.next_arm()
            if arm == PLAIN:
                since_batch += 1
                cascade.record(1, T_BASE * {1: 2.0, 2: 3.0}.get(since_batch, 1.0))
            else:
                since_batch, seconds = 0, T_BASE * (1 + arm[1] / 4)
                cascade.record(0.8 * seconds / T_BASE, seconds)
        tokens, seconds = sum(row.tokens for row in cascade.trace), sum(row.seconds for row in cascade.trace)
        return sum(row.arm != PLAIN for row in cascade.trace) / len(cascade.trace), tokens * T_BASE / seconds
    share, speed = speculated(0)
    assert share > 0.5 and speed < 0.85
    share, speed = speculated(2)
    assert share < 0.1 and speed > 0.95


@pytest.mark.unit
def test_starts_from_the_predicted_k():
    cascade = Cascade(["lookup"], predict_k=lambda d: 9)
    simulate(cascade, lambda arm, i: 1.2, CascadeConfig().base_len)
    assert cascade.next_arm() == ("lookup", 8)  # the ladder's nearest K


@pytest.mark.unit
def test_a_free_drafter_starts_uncapped_a_timed_one_at_its_predicted_k():
    """Prompt lookup's proposals are sized by the curve already: its first trial is at the
    largest K (a cap could only cut them). A drafter with a cost starts where the curve and
    its acceptance predict."""

    class Costly(Drafter):
        def drafting_seconds(self, context, curve):
            return 0.01, 0.0

    curve = CostCurve([0.1 * (1 + 0.05 * n) for n in range(64)], 0)
    auto = CascadeController({"lookup": LookupDrafter(), "model": Costly()}, curve, 8)
    assert auto.cascade.k_start("lookup") == len(curve.seconds) - 1 > CascadeConfig().ladder[-1]
    assert 1 <= auto.cascade.k_start("model") < CascadeConfig().ladder[-1]
    assert auto.cascade.sizes_itself("lookup") and not auto.cascade.sizes_itself("model")


@pytest.mark.unit
def test_a_drafter_that_sizes_itself_is_never_climbed():
    """A free drafter's proposals are sized on the cost curve from its own estimates, so a cap
    could only cut them: it runs at its starting K or not at all, where a drafter whose K is
    a cap is climbed to the K that pays best."""
    landscape = peaked(6, 2.0)
    arms = lambda cascade: {a for a in simulate(cascade, lambda arm, i: landscape(arm[1]), 300) if a != PLAIN}
    assert arms(Cascade(["lookup"], predict_k=lambda d: 64, sizes_itself=lambda d: True)) == {("lookup", 64)}
    assert ("lookup", 6) in arms(Cascade(["lookup"], predict_k=lambda d: 64))


class Copying(LookupDrafter):
    """A free drafter whose proposal is a sure chain when `sure` is set, else a weak guess."""

    def __init__(self):
        super().__init__()
        self.sure = False

    def propose(self, context, budget):
        n = 12
        reach = np.full(n, 0.95) ** np.arange(1, n + 1) if self.sure else np.full(n, 0.01)
        return DraftTree(np.arange(n), np.arange(-1, n - 1), reach)


@pytest.mark.unit
def test_a_sure_proposal_of_a_free_drafter_runs_outside_cascades_phases():
    from localspec.llama.curve import CostCurve
    curve = CostCurve([0.1 * (1 + 0.3 * n) for n in range(64)], 0)  # a CPU's shape
    drafter = Copying()
    controller = CascadeController({"lookup": drafter}, curve, n_seq_max=8)
    controller.begin()
    assert controller.choose([1, 2, 3], 64) is None or controller.phase != "sure"
    controller.record(1, 0.1, 0, 0)
    drafter.sure = True
    state = (controller.cascade.next_arm(), len(controller.cascade.trace))
    chosen = controller.choose([1, 2, 3], 64)
    assert chosen is not None and chosen[0] is drafter and controller.phase == "sure"
    assert len(chosen[1].size(drafter.propose([], chosen[1]))) >= 8  # a long chain, not K
    controller.record(12, 0.5, 11, 11)
    assert (controller.cascade.next_arm(), len(controller.cascade.trace)) == state  # untouched


@pytest.mark.unit
def test_a_free_drafter_drafts_within_the_room_the_request_has_left():
    """Near the request's end a copy is drafted within the room left, not the whole budget
    (drafted past it and cut there by the loop, a sure copy was sized to a shorter best
    prefix: an iteration more)."""
    curve = CostCurve([0.1 * (1 + 0.02 * n) for n in range(64)], 0)  # a GPU's: long drafts pay
    controller = CascadeController({"lookup": LookupDrafter()}, curve, n_seq_max=8)
    controller.begin()
    text = list(range(100, 160))
    chosen = controller.choose(text + text[:10], 5)  # copying: the rest of `text` follows
    assert chosen is not None and controller.phase == "sure"
    assert 0 < len(chosen[2]) <= 5


def test_auto_greedy_identical_to_plain(target, reference, small_path):
    """Cascade switches between lookup, the draft model (SmolLM2 itself here) and plain
    decoding by measured time, so which arm runs where depends on the machine; the output
    must not (5 prompts of N_TOKENS)."""
    with Model(small_path) as dm, draft_context(dm, 2048, 1) as dctx:
        drafters = {"lookup": LookupDrafter(), "draft": DraftModelDrafter(dctx, target.model)}
        # No prediction gate, no exploring budget: SmolLM2 drafting for itself costs as much as
        # the target, so the cost curve would keep it out, and this test wants every arm to run.
        auto = CascadeController(drafters, FLAT, 8, CascadeConfig(explore_after=0, explore_share=float("inf")))
        auto.cascade.predict_utility = lambda d: float("inf")  # nor a trial skipped behind lookup's
        used = set()
        for p in PROMPTS[:5]:  # enough for every arm to run; the suite stays short
            target.clear()
            out = [t for it in run(target, auto, target.model.tokenize(p), GREEDY, N_TOKENS) for t in it.tokens]
            assert out == reference[p], p
            used |= {row.arm[0] for row in auto.cascade.trace}
    assert used == {"", "lookup", "draft"}


def test_a_resting_feature_drafter_is_given_features_only_where_it_may_be_asked_next(small_path, small_model):
    """auto over lookup and the Jakiro drafter that ships for SmolLM2, Jakiro resting at the
    start (a back-off carried over from an earlier request): the loop commits none of the
    target's features to it (a copy of the rows every iteration) in the prompt, the base
    phase or the test phase it sits out, only from the iteration before one of its arms may
    run; yet whenever it is asked it has the feature it drafts from. The output is plain
    decoding's throughout."""
    from localspec import store
    rt = JakiroRuntime(store.shipped_drafter(small_path), small_model, n_ctx=2048, n_threads=1)
    handed_out, commits, ready = [], [], []

    class Counting(JakiroDrafter):
        def commit(self, ctx, first_pos, rows):
            commits.append(len(auto.cascade.trace))  # iterations Cascade has heard of
            super().commit(ctx, first_pos, rows)

        def propose(self, context, budget):
            last = len(context) - 2  # the root's predecessor, whose feature it drafts from
            ready.append(last < len(self.rt.known) and bool(self.rt.known[last]))
            return super().propose(context, budget)

    # Short phases, no prediction gate: Jakiro's trial comes early in the request.
    cfg = CascadeConfig(set_len=4, max_set_len=4, max_trials=2, explore_after=0, explore_share=float("inf"))
    auto = CascadeController({"lookup": LookupDrafter(), "jakiro": Counting(rt)}, FLAT, 8, cfg)
    with Context(small_model, ContextConfig(n_ctx=2048, n_seq_max=8, n_threads=1, embeddings=True)) as ctx:
        tokens = small_model.tokenize(PROMPTS[0])
        expected = plain(ctx, tokens, 2 * N_TOKENS)
        ctx.clear()
        memory = auto.cascade.memory["jakiro"]
        memory.losses, memory.skip = 1, 1  # sits out the first test phase (a request keeps it)
        out = []
        for it in run(ctx, auto, tokens, GREEDY, 2 * N_TOKENS):
            handed_out.append(it)
            out.extend(it.tokens)
    assert out == expected
    # None in the prompt, the base phase or the first test phase (its back-off ends there).
    first_set = next(i for i, row in enumerate(auto.cascade.trace) if row.phase == "set")
    assert commits and min(commits) >= first_set
    assert len(commits) < len(handed_out) - 1
    assert ready and all(ready)
    assert any(it.drafter == auto.members["jakiro"].name and it.n_drafted for it in handed_out)


def test_an_untimed_jakiro_is_priced_before_its_first_trial(small_path, small_model):
    """Before its first step is timed, Cascade weighs Jakiro as it weighs a draft model: a
    step as the target's forward times the share of its weights a step reads (a layer and the
    output head), and the positions it would catch up with first (the prompt's features, up
    to its window) as a wide batch prices a token. Once it follows the context, it has
    nothing to catch up with, and what a step took is what it is weighed by."""
    from localspec import store
    rt = JakiroRuntime(store.shipped_drafter(small_path), small_model, n_ctx=2048, n_threads=1)
    jakiro = JakiroDrafter(rt)
    curve = CostCurve([0.01 * (1 + 0.1 * n) for n in range(64)], 0)
    per_position = 0.01 * small_model.head_share * curve.ratio(64) / 64
    tokens = small_model.tokenize(PROMPTS[0] * 8)
    assert len(tokens) > jakiro.feature_window
    with Context(small_model, ContextConfig(n_ctx=2048, n_seq_max=8, n_threads=1, embeddings=True)) as ctx:
        jakiro.begin(tokens, GREEDY)
        t, c = jakiro.drafting_seconds(tokens, curve)
        assert t == pytest.approx(0.01 * small_model.head_share) and 0 < small_model.head_share < 1
        assert c == 0  # no feature to draft from yet: nothing it could catch up with
        ctx.prefill(tokens, n_outputs=len(tokens), on_outputs=lambda first, rows: jakiro.commit(ctx, first, rows))
        context = [*tokens, 0]  # the next token emitted: the prompt's last feature drafts it
        t, c = jakiro.drafting_seconds(context, curve)
        assert c == pytest.approx(jakiro.feature_window * per_position)
        jakiro.propose(context, Budget(FLAT, 8))
        assert jakiro.t_token > 0 and jakiro.t_catch_up > 0
        t, c = jakiro.drafting_seconds(context, curve)
        assert (t, c) == (jakiro.t_token, jakiro.rt.behind(context, jakiro.feature_window) * jakiro.t_prefill_token)
        assert jakiro.rt.behind(context, jakiro.feature_window) == 1  # it follows: the root's predecessor again
