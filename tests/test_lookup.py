"""Prompt lookup's acceptance by depth: copying is sticky, so once the text has followed copies
deep, drafts grow as deep as the cost curve pays for (a single rate per match length, a
geometric chain, cut them short), and where copies break off at one depth, drafts stop there."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec import _native
from localspec.drafters.base import Budget
from localspec.drafters.lookup import LookupDrafter, short_match_depth
from localspec.llama.curve import CostCurve
from localspec.sampling import SamplingConfig
from localspec.verify import DraftTree

pytestmark = pytest.mark.unit

# An MoE target on a GPU (the H200's 30B-A3B curve, rounded): wide batches are cheap.
CURVE = CostCurve(seconds=[1.0, 1.25, 1.5, 1.8] + [2.2] * 4 + [2.6] * 8 + [3.0] * 16, n_context=0)


def text_copying(run: int, n: int, seed: int = 0, volatile: int | None = None) -> list[int]:
    """Fresh tokens, then again and again a copy of `run` tokens of what came before, broken
    by a fresh token (an edit: the copy is then matched again a few tokens later). `volatile`:
    a token frequent in fresh text that never survives a copy (the copy has a fresh token
    there: a counter, a name an edit changes)."""
    rng = random.Random(seed)

    def fresh() -> int:
        return volatile if volatile is not None and rng.random() < 0.08 else rng.randrange(1000, 30000)

    text = [fresh() for _ in range(200)]
    while len(text) < n:
        start = rng.randrange(0, 150)
        text += [rng.randrange(1000, 30000) if t == volatile else t for t in text[start:start + run]] + [fresh()]
    return text


def decode(drafter: LookupDrafter, text: list[int], begin: int) -> list[tuple[int, int]]:
    """Greedy decoding of `text` after text[:begin], as the loop runs it: per iteration the
    nodes verified and accepted."""
    budget = Budget(CURVE, n_seq_max=8)
    context = text[:begin]
    drafter.begin(context, SamplingConfig())
    steps = []
    while len(context) < len(text):
        tree = budget.size(drafter.propose(context, budget))
        n, _ = tree.walk(text[len(context):])
        steps.append((len(tree), n))
        context = text[:len(context) + n + 1]
    return steps


def test_drafts_grow_as_deep_as_copies_run_and_stop_where_they_break():
    drafter = LookupDrafter()
    steps = decode(drafter, text_copying(run=24, n=2400), begin=200)
    late = steps[len(steps) // 2:]
    assert np.mean([k for k, _ in late]) >= 10  # deep drafts (the curve's 31 at most) ...
    # ... mostly accepted: 0.62 with depths counted from the copy's start, 0.52 from each
    # proposal's (its drafts ran past the break as often as not)
    assert sum(n for _, n in late) / sum(k for k, _ in late) > 0.57
    rates = drafter.acceptance.rates()  # [match length bucket, depth bin]
    assert rates[0, 4] > 0.9  # a 2-token match, depths 9-16: inside a copy the text goes on
    # A 24-token match has followed its copy for about 20 tokens (depths count from where the
    # copy began): the text leaves it a few tokens on.
    assert rates[drafter.acceptance.rate_bucket(24), 5] < 0.7  # depths 17-32
    drafter = LookupDrafter()
    steps = decode(drafter, text_copying(run=3, n=2400), begin=200)
    late = steps[len(steps) // 2:]
    assert np.mean([k for k, _ in late]) <= 2  # copies of 3 tokens: nothing deep is drafted
    assert drafter.acceptance.rates()[0, 1] < 0.3  # after a 2-token match, depth 2 leaves


VOLATILE = 999


def test_drafts_learn_the_tokens_copies_break_at():
    """Where the text leaves copies at one token, drafts learn to stop before it: its factor
    falls, the other tokens' stay near 1, and the same text costs fewer forwards' time than
    with the factors held at 1 (depth rates alone)."""
    text = text_copying(run=24, n=2400, volatile=VOLATILE)
    tokens_per_second = []
    for token_weight in (LookupDrafter().acceptance.TOKEN_WEIGHT, 1e12):  # 1e12: every factor 1
        drafter = LookupDrafter()
        drafter.acceptance.TOKEN_WEIGHT = token_weight
        steps = decode(drafter, text, begin=200)
        late = steps[len(steps) // 2:]
        tokens_per_second.append(sum(n + 1 for _, n in late) / sum(CURVE.cost(1 + k) for k, _ in late))
        if token_weight < 1e12:
            assert drafter.acceptance.token_factor(VOLATILE) < 0.3
            others = [drafter.acceptance.token_factor(t) for t in set(text[300:400]) - {VOLATILE}]
            assert 0.9 < np.mean(others) < 1.1
    assert tokens_per_second[0] > 1.04 * tokens_per_second[1]  # +6-8% over seeds 0-3


def test_a_long_match_is_drafted_long_before_any_evidence():
    """A fresh drafter at a 24-token match of a long copy (an answer re-emitting an earlier
    one) drafts deep at once where each node costs a tenth of a token: the long match's prior
    (0.99) pays to about 39 nodes, a short match's 0.9 to 10."""
    rng = random.Random(1)
    earlier = [rng.randrange(1000, 30000) for _ in range(80)]
    text = [rng.randrange(1000, 30000) for _ in range(50)] + earlier + [7] + earlier
    drafter = LookupDrafter()
    context = text[:len(text) - 80 + 30]  # 30 tokens into the copy
    drafter.begin(context, SamplingConfig())
    budget = Budget(CostCurve(seconds=[1.0 + 0.1 * n for n in range(64)], n_context=0), n_seq_max=8)
    tree = budget.size(drafter.propose(context, budget))
    assert len(tree) >= 18 and tree.walk(text[len(context):])[0] == len(tree)


def test_a_match_with_no_room_to_draft_is_an_empty_tree():
    """The store finds occurrences but the budget leaves no node (the request's last token)."""
    acceptance = LookupDrafter().acceptance
    acceptance.start([1, 2, 3])
    empty = np.zeros(0, np.int32)
    assert len(acceptance.tree(empty, empty, np.zeros(0), n_match=4, n_occurrences=3)) == 0
    acceptance.start([1, 2, 3, 4])  # nothing open to judge


def test_a_short_match_drafts_no_deeper_than_a_cheap_chain_verifies():
    """A match shorter than 16 tokens keeps the draft's nodes no deeper than a chain that
    verifies in 6 single tokens' time: 10 drafted tokens where a row costs half a token (a CPU); a
    24-token match keeps them all, and a static K drafts its K whatever rows cost."""
    curve = CostCurve(seconds=[1.0 + 0.5 * n for n in range(64)], n_context=0)
    assert short_match_depth(Budget(curve, n_seq_max=8)) == 10
    assert short_match_depth(Budget(CURVE, n_seq_max=8)) == 31  # rows cheap: every chain it prices
    assert short_match_depth(Budget(curve, n_seq_max=8, max_nodes=16, static=True)) == 16
    # Two chains: the first 12 deep, the second branching off at depth 3, 6 deep.
    parents = np.asarray([-1] + list(range(11)) + [2, 12, 13, 14, 15, 16], np.int32)
    tokens = np.arange(100, 100 + len(parents), dtype=np.int32)
    counts = np.ones(len(parents))
    acceptance = LookupDrafter().acceptance
    acceptance.start([1, 2, 3])
    six = Budget(CostCurve(seconds=[1.0 + 0.8 * n for n in range(64)], n_context=0), n_seq_max=8)
    assert short_match_depth(six) == 6  # a chain of 6 at 5.8 single tokens, of 7 at 6.6
    short = acceptance.tree(tokens, parents, counts, n_match=4, n_occurrences=2, budget=six)
    assert max(short.depths()) == 6 and len(short) == 6 + 3  # the first chain to 6, the second to 6
    assert set(short.tokens.tolist()) == {*range(100, 106), 112, 113, 114}
    long = acceptance.tree(tokens, parents, counts, n_match=24, n_occurrences=2, budget=six)
    assert len(long) == len(parents)


FIM_SUF, FIM_MID = 5, 6


def fim_prompt(rng: random.Random, after_cursor: list[int]) -> list[int]:
    """A fill-in-the-middle prompt: code before the cursor, then the code after it."""
    before = [rng.randrange(1000, 30000) for _ in range(200)]
    return before + [FIM_SUF] + after_cursor + [FIM_MID]


@pytest.mark.parametrize("seam", [0, 1, 2])
def test_a_middle_running_into_the_code_after_the_cursor_is_drafted_as_a_copy(seam):
    """A middle that starts rewriting the code after the cursor (small models' middles run on
    into it) is a copy from its first tokens: with the fill-in-the-middle suffix token known,
    a 3-token match there drafts as deep as the short-match depth allows (10 here) at once, as it does
    when the match begins one or two tokens into the suffix (a newline merged into the
    middle's last token); without it, the same match drafts no deeper than a short one."""
    rng = random.Random(2)
    after_cursor = [rng.randrange(1000, 30000) for _ in range(60)]
    prompt = fim_prompt(rng, after_cursor)
    context = prompt + [rng.randrange(1000, 30000) for _ in range(5)] + after_cursor[seam:seam + 3]
    # This CPU's curve in single tokens (the 1.5B at 4k context): 16 rows at 7.7, 32 at 19.2.
    seconds = np.interp(np.arange(32), [0, 1, 2, 3, 15, 31], [1, 1.75, 2.25, 3.05, 7.7, 19.2])
    budget = Budget(CostCurve(seconds=seconds.tolist(), n_context=0), n_seq_max=8)
    depths = {}
    for fim_suffix in (FIM_SUF, -1):
        drafter = LookupDrafter(fim_suffix=fim_suffix)
        drafter.begin(prompt, SamplingConfig())
        tree = budget.size(drafter.propose(context, budget))
        assert tree.walk(after_cursor[seam + 3:])[0] == len(tree)  # a chain along the copy
        depths[fim_suffix] = len(tree)
    assert depths[-1] < short_match_depth(budget) <= depths[FIM_SUF]


def test_a_short_match_elsewhere_in_a_fim_prompt_stays_a_short_bet():
    """The same 3-token match in the code before the cursor, or in the code after it but not
    at its start, is a short match like any other."""
    rng = random.Random(3)
    after_cursor = [rng.randrange(1000, 30000) for _ in range(60)]
    prompt = fim_prompt(rng, after_cursor)
    drafter = LookupDrafter(fim_suffix=FIM_SUF)
    drafter.begin(prompt, SamplingConfig())
    for copied in (prompt[50:53], after_cursor[10:13]):
        assert not drafter.copies_after_cursor(prompt + [7] + copied, 3)
    assert drafter.copies_after_cursor(prompt + [7] + after_cursor[:3], 3)
    drafter.begin(prompt[:150], SamplingConfig())  # a prompt without a cursor
    assert not drafter.copies_after_cursor(prompt + [7] + after_cursor[:3], 3)


def test_a_budget_sizes_each_of_several_proposals_as_a_fresh_one_would():
    """Budget.size remembers its last few answers (a proposal is weighed against another,
    then sized for verification, perhaps within fewer nodes): whatever order trees come in,
    each gets what a budget that never saw another tree gives it."""
    rng = np.random.default_rng(0)
    trees = []
    for n in (3, 12, 30, 7, 20, 1):
        parents = np.array([-1] + [rng.integers(0, i) for i in range(1, n)], np.int32)
        reach = np.sort(rng.uniform(0.05, 1.0, n))[::-1].copy()
        trees.append(DraftTree(np.arange(n, dtype=np.int32), parents, reach))
    budget = Budget(CURVE, n_seq_max=8)
    for i in rng.integers(0, len(trees), 60):
        kept = budget.size(trees[i])
        fresh = Budget(CURVE, n_seq_max=8).size(trees[i])
        assert kept.tokens.tolist() == fresh.tokens.tolist()
        assert budget.speedup(trees[i]) == Budget(CURVE, n_seq_max=8).speedup(trees[i])
        # A smaller budget made from it (an arm's K, the room left) keeps what still holds.
        n = int(rng.integers(1, 12))
        capped = budget.within(n).size(trees[i])
        assert capped.tokens.tolist() == Budget(CURVE, n_seq_max=8, max_nodes=n).size(trees[i]).tokens.tolist()


def test_a_flattened_tree_is_priced_by_its_forwards():
    """On a hybrid target a chain is one forward, and a tree is verified flattened, every
    root-to-leaf path in rows of its own, which llama.cpp decodes as the root, then a forward
    per distinct path length: the budget prices (and so sizes) a tree by those forwards,
    keeping fewer branches than where its nodes are one forward."""
    # root -> 0 -> 1 -> 2, and 0 -> 3, 1 -> 4: paths 0-1-2 (3), 0-3 (2), 0-1-4 (3)
    tree = DraftTree(np.arange(5, dtype=np.int32), np.array([-1, 0, 1, 0, 1], np.int32),
                     np.array([0.9, 0.8, 0.7, 0.3, 0.2]))
    assert tree.hybrid_forwards(5) == [[1], [2], [3], [4], [1, 4, 1], [1, 6, 2]]
    chain = DraftTree(np.arange(4, dtype=np.int32), np.array([-1, 0, 1, 2], np.int32), np.full(4, 0.9))
    assert chain.hybrid_forwards(4) == [[1], [2], [3], [4], [5]]  # a chain: one forward
    curve = CostCurve([0.01 * (1 + 0.03 * n) for n in range(16)], 0)  # rows nearly free, forwards not
    shared, flat = Budget(curve, 8).size(tree), Budget(curve, 8, flat=True).size(tree)
    assert len(shared) == 5 and len(flat) == 3  # the chain 0-1-2
    assert Budget(curve, 8, flat=True).speedup(tree) < Budget(curve, 8).speedup(tree)
    assert Budget(curve, 8, flat=True).size(chain).tokens.tolist() == Budget(curve, 8).size(chain).tokens.tolist()


def brute_force_draft(text: list[int], n_min: int, n_max: int, max_nodes: int, max_depth: int,
                      max_occurrences: int):
    """NgramIndex.draft as documented (native/ngram.h), by brute force: the most recent
    occurrences of the text's longest suffix (n_max .. n_min tokens) seen before, and a trie of
    what followed them, its nodes best-first by count, then the shallower, then the older."""
    n = len(text)
    for k in range(min(n_max, n), n_min - 1, -1):
        starts = [p for p in range(n - 1, k - 1, -1) if text[p - k:p] == text[n - k:]][:max_occurrences]
        if starts:
            break
    else:
        return [], [], [], 0, 0
    trie: list[list[int]] = []  # [token, parent, count, depth]
    child_of: dict[tuple[int, int], int] = {}
    for s in starts:
        parent = -1
        for d in range(min(max_depth, n - s)):
            j = child_of.setdefault((parent, text[s + d]), len(trie))
            if j == len(trie):
                trie.append([text[s + d], parent, 0, d + 1])
            trie[j][2] += 1
            parent = j
    frontier = [j for j, node in enumerate(trie) if node[1] < 0]
    out, index = [], {}
    while frontier and len(out) < max_nodes:
        j = min(frontier, key=lambda j: (-trie[j][2], trie[j][3], j))
        frontier.remove(j)
        index[j] = len(out)
        out.append(j)
        frontier += [c for c, node in enumerate(trie) if node[1] == j]
    return ([trie[j][0] for j in out], [index[trie[j][1]] if trie[j][1] >= 0 else -1 for j in out],
            [trie[j][2] for j in out], k, len(starts))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=120), st.integers(1, 3), st.integers(3, 40),
       st.integers(1, 40), st.integers(1, 70), st.integers(1, 40), st.integers(0, 119))
def test_the_ngram_index_drafts_what_brute_force_finds(text, n_min, n_max, max_nodes, max_depth,
                                                       max_occurrences, cut):
    """Small alphabets, so matches are long, many and overlapping; indexed in two pieces, as
    a request's context grows."""
    index = _native.NgramIndex(n_min, n_max)
    cut = min(cut, len(text))
    index.extend(np.asarray(text[:cut], np.int32))
    index.extend(np.asarray(text[cut:], np.int32))
    tokens, parents, counts, n_match, n_occurrences = index.draft(max_nodes, max_depth, max_occurrences)
    got = (tokens.tolist(), parents.tolist(), counts.tolist(), n_match, n_occurrences)
    assert got == brute_force_draft(text, n_min, n_max, max_nodes, max_depth, max_occurrences)
