"""The copy ceiling (bench/ceiling.py): what a clairvoyant copier could draft, and the cheapest
plan of verification batches for it, against brute force."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.bench.ceiling import Corpus, copyable, fastest_plan, model_drafter_ceiling

pytestmark = pytest.mark.unit  # no model on disk


def test_an_answer_stored_verbatim_is_copyable_to_its_end():
    answer = [5, 6, 7, 8, 9, 10]
    runs = copyable(answer, prompt=[1, 2], store=Corpus([[3, 5, 6, 7, 8, 9, 10, 4]]), max_draft=63)
    # at i the copier has answer[:i] and drafts answer[i:] (all but the last token: it always
    # comes from the target as the bonus of the forward that verifies the rest)
    assert runs == [0, 4, 3, 2, 1, 0]


def test_copies_follow_the_token_just_produced_and_stay_in_known_text():
    # 8 follows 7 nowhere; 5 6 follows 9 only in the store; the prompt's 5 6 ends the known text
    runs = copyable([9, 5, 6, 7, 8, 1], prompt=[9, 5, 6], store=Corpus([[2, 9, 5, 6, 3]]), max_draft=63)
    assert runs[1] == 2       # 5 6 after 9: in the prompt and the store
    assert runs[3] == 0       # 7 after 6: nowhere
    assert runs[4] == 0       # 8 after 7: nowhere (the answer's own 7 is the last known token)
    stored = Corpus([[1, 2, 3], [4, 5, 6]])
    assert copyable([3, 4, 5, 0], prompt=[], store=stored, max_draft=63)[1] == 0  # no run across documents


def test_a_longer_match_asked_for_leaves_the_copies_a_single_token_found():
    # after "1 9", 5 6 7 follows 9 in the store ("4 9 5 6 7") but "1 9" stands only in the prompt
    answer, prompt, stored = [9, 5, 6, 7, 8], [1], Corpus([[4, 9, 5, 6, 7]])
    assert copyable(answer, prompt, stored, max_draft=63)[1] == 3
    assert copyable(answer, prompt, stored, max_draft=63, min_match=2)[1] == 0
    assert copyable(answer, [4], stored, max_draft=63, min_match=2)[1] == 3  # "4 9" does stand there
    # the request's own text too: "2 3" is followed by 7 once, after "1 2 3"
    own = [1, 2, 3, 7, 0, 2, 3]
    assert copyable([3, 7, 5], own[:-1], Corpus(), max_draft=63)[1] == 1
    assert copyable([3, 7, 5], own[:-1], Corpus(), max_draft=63, min_match=3)[1] == 0  # "0 2 3" is new
    assert copyable([3, 7, 5], own[:-1], Corpus(), max_draft=63, min_match=2)[1] == 1


def test_nothing_to_copy_means_plain_decoding():
    runs = copyable(list(range(10, 30)), prompt=list(range(5)), store=Corpus([[1, 2, 3]]), max_draft=63)
    assert runs == [0] * 20
    linear = lambda n_context: [float(n) for n in range(1, 65)]  # noqa: E731
    assert fastest_plan(runs, linear, 5) == 19.0


def brute_force(runs, seconds):
    """Every way of cutting tokens 1..n-1 into forwards, each within what can be drafted."""
    n, best = len(runs), float("inf")
    for cuts in itertools.product([False, True], repeat=max(0, n - 2)):
        i, total, ok = 1, 0.0, True
        while i < n:
            j = i + 1
            while j < n and not cuts[j - 2]:
                j += 1
            if j - i - 1 > runs[i]:
                ok = False
                break
            total += seconds[j - i - 1]
            i = j
        if ok:
            best = min(best, total)
    return best if n > 1 else 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=11),
       st.lists(st.floats(0.1, 3.0), min_size=8, max_size=8))
def test_the_plan_is_the_cheapest_of_all(runs, steps):
    seconds = list(np.cumsum(steps))  # a batch never costs less than a smaller one
    assert abs(fastest_plan(runs, lambda n_context: seconds, 0) - brute_force(runs, seconds)) < 1e-9


def test_a_model_drafter_pays_only_where_batches_are_cheap():
    linear = lambda n: float(n)  # noqa: E731  every drafted token costs a forward
    assert model_drafter_ceiling(linear, 0.99, 0.0, 64) == (1.0, 0)
    flat = lambda n: 1.0  # noqa: E731
    assert model_drafter_ceiling(flat, 1.0, 0.0, 8) == (8.0, 7)
    speedup, k = model_drafter_ceiling(flat, 0.5, 0.0, 64)
    assert 1.99 < speedup <= 2.0 and k > 8
    # a drafter costing a third of the target per token (a draft model on a CPU)
    assert model_drafter_ceiling(lambda n: 1 + 0.8 * (n - 1), 1.0, 1 / 3, 64) == (1.0, 0)
