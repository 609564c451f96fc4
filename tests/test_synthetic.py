"""bench --synthetic: llama.cpp's synthetic acceptance rates, kept lossless."""

from __future__ import annotations

import time

import pytest

from conftest import RECORDED_CURVE
from localspec.bench import synthetic
from localspec.engine import Engine, EngineConfig
from localspec.llama import planning
from localspec.errors import LocalspecError


@pytest.mark.unit
def test_rates_as_llama_cpp_resolves_them():
    """len=L over k positions: one geometric rate whose mean accepted length is L (the target's
    own token included); given rates must lie in [0, 1] and never increase."""
    for length in (1.5, 2.0, 4.0, 8.0):
        rates = synthetic.parse_rates(f"len={length}", 8)
        assert len(rates) == 8 and synthetic.mean_length(rates) == pytest.approx(length, abs=1e-6)
        assert all(b <= a for a, b in zip(rates, rates[1:]))
    assert synthetic.parse_rates("len=9", 8) == [1.0] * 8
    assert synthetic.parse_rates("0.9,0.5,0.5") == [0.9, 0.5, 0.5]
    for bad in ("len=0.5", "len=10", "len=x", "0.5,0.9", "1.2", "a,b", ""):
        with pytest.raises(LocalspecError):
            synthetic.parse_rates(bad, 8)


def test_synthetic_runs_are_plain_decodings_output_at_the_rates(small_path):
    """Certain acceptance (rates of 1) emits K + 1 tokens an iteration wherever the answer
    runs on; none (rates of 0) emits one. Every arm's output is plain decoding's (SmolLM2 on one
    thread with flash attention on, where batched rows reproduce single ones), the trees verify
    2K nodes (the tree of K: the chain's K + 1 rows), the idle arm has plain steps among its
    drafted ones, and the arms sized on the curve draft where it pays and nothing where it
    cannot."""
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=1, store="off", n_seq_max=5,
                                 flash_attn="on", curve=str(RECORDED_CURVE)))
    try:
        prompt = engine.model.tokenize("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")
        sure = synthetic.run_synthetic(engine, [prompt], [1.0] * 4, 40)
        never = synthetic.run_synthetic(engine, [prompt], [0.0] * 4, 16)
    finally:
        engine.close()
    for arm in sure + never:
        assert arm.identical == arm.runs == 1, arm.name
    plain, chain, tree, tree_k, idle, sized_chain, sized_tree = sure
    assert chain.tokens / len(chain.steps) > 4.0 and max(s[0] for s in chain.steps) == 5
    assert 9 in {s[0] for s in tree.steps}  # the root and 2K nodes (later batches carry pending rows too)
    assert max(s[0] for s in tree_k.steps) == 5 and tree_k.tokens / len(tree_k.steps) > 4.0  # all K on the chain
    assert {s[0] for s in idle.steps} >= {1, 5}
    assert all(len(a.steps) == a.tokens for a in never)  # one token an iteration
    assert sized_chain.tokens / len(sized_chain.steps) > 2.0  # sure drafts are worth rows on any curve
    assert {s[0] for a in never[-2:] for s in a.steps} == {1}  # sized: nothing worth a row at rate 0
    assert "no-draft step inside a speculative run" in synthetic.report(sure, [1.0] * 4)
    saved = synthetic.to_json(sure, [1.0] * 4, [], {"workload": "test"})  # --json
    assert [c["name"] for c in saved["configs"]] == [a.name for a in sure] and saved["meta"]["rates"] == [1.0] * 4
    assert saved["configs"][1]["by_batch"]["5"]["iterations"] == sum(1 for s in chain.steps if s[0] == 5)


def test_the_background_curve_measurement_waits_for_the_synthetic_runs(small_path, monkeypatch):
    """The runs drive the engine's context themselves: they hold the engine's request turn, so
    the whole cost curve's measurement, which goes on once the engine has idled a while, does
    not run its forwards beside theirs (it did: every figure of a first start was slowed)."""
    monkeypatch.setattr(planning, "REFINE_IDLE", 0.2)
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=1, store="off", n_seq_max=5,
                                 flash_attn="on", refine_curve=True))
    try:
        engine.prepare()  # a coarse curve: its whole measurement waits for the engine to idle
        prompt = engine.model.tokenize("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")
        t0 = time.monotonic()
        arms = synthetic.run_synthetic(engine, [prompt], [0.5] * 4, 32)
        assert time.monotonic() - t0 > 1.0  # (some 130 forwards) long past the idle wait
        assert not engine.planning.refining.is_set()
    finally:
        engine.close()
    assert all(arm.identical == arm.runs == 1 for arm in arms)


def test_llama_cpp_loop_at_the_same_rates(small_path):
    """llama.cpp's own loop at the same rates: its ngram-simple drafter drafting K tokens with
    --spec-synth-rates, in a llama-server of the same build where scripts/build-llama-tools.sh
    built one (else each arm says what is missing, and the report shows it)."""
    from localspec.bench.anchors import LLAMA_TOOLS
    from localspec.llama import Model

    rates = [1.0] * 4
    prompt = Model(small_path).tokenize("def add(a, b):\n    return a + b\n\n" * 8)
    arms = synthetic.run_llama_server(small_path, [prompt], rates, 24, 1, 1024, 1, 0)
    assert [a.name for a in arms] == ["llama-server plain", "llama-server chain K=4"]
    assert "--spec-synth-rates" in arms[1].extra and "1,1,1,1" in arms[1].extra
    ours = [synthetic.Arm("plain", tokens=20, seconds=1.0), synthetic.Arm("chain K=4", 1, tokens=20, seconds=0.5),
            synthetic.Arm("tree K=4", 2, nodes=4, tokens=20, seconds=0.4)]
    text = synthetic.report_llama(arms, ours)
    if not (LLAMA_TOOLS / "llama-server").exists():
        assert all("build-llama-tools.sh" in a.failed for a in arms)
        assert "failed" in text
        return
    plain, chain = arms
    assert not plain.failed and not chain.failed
    assert plain.tokens == chain.tokens == 23 and plain.accepted == 0
    # every drafted token is accepted at rate 1: ngram-simple drafts on this repeating text
    assert chain.accepted == chain.drafted > 0 and chain.iterations < plain.iterations
    assert "llama-server chain K=4" in text


def test_a_flipped_text_is_followed_at_the_same_rates(small_path):
    """A near-tie that flips makes the text another than the precomputed truth (a GPU's
    near-flat random logits do so within a few iterations). Flipped here by a truth that is
    wrong at one token: the drafter takes up the new text's own continuation (plain decoding
    in a second context), on its clock, and drafts on at the same rates; without `follow` it
    drafts nothing more. Either way the output is plain decoding's."""
    from localspec.control.controllers import Fixed
    from localspec.drafters.base import Budget, DraftClock
    from localspec.llama.context import Context
    from localspec.loop import RunOptions, generate, run
    from localspec.sampling import SamplingConfig

    greedy = SamplingConfig(temperature=0)
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=1, store="off", n_seq_max=5,
                                 flash_attn="on", curve=str(RECORDED_CURVE)))
    follower = Context(engine.model, engine.ctx.config)
    try:
        ctx, curve = engine.ctx, engine.planning.prepare()
        prompt = engine.model.tokenize("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")
        truth = generate(ctx, prompt, 48, greedy, stop_at_eog=False)
        wrong = list(truth)
        wrong[6] = (wrong[6] + 1) % engine.model.n_vocab  # the text "flips" at its 7th token
        runs = {}
        for following in (False, True):
            clock = DraftClock()
            drafter = synthetic.SyntheticDrafter(
                prompt + wrong, [1.0] * 4, engine.model.n_vocab,
                follow=(lambda c, n: generate(follower, c, n, greedy, stop_at_eog=False)) if following else None)
            drafter.clock = clock
            ctx.clear()
            its = list(run(ctx, Fixed(drafter, Budget(curve, 5, 4, static=True), "chain"), prompt, greedy, 48,
                           None, RunOptions(stop_at_eog=False, draft_clock=clock)))
            assert [t for it in its for t in it.tokens] == truth
            runs[following] = its, drafter, clock
    finally:
        follower.close()
        engine.close()
    stopped, followed = runs[False][0], runs[True][0]
    drafter, clock = runs[True][1:]
    assert runs[False][1].flips == 0 and drafter.flips == 1
    assert len(followed) < len(stopped) - 10  # it went on drafting 4 at a time, not one token a step
    assert max(len(it.tokens) for it in followed[4:]) == 5
    assert clock.measured > 0 and sum(it.draft_seconds for it in followed) == pytest.approx(clock.measured)


@pytest.mark.unit
def test_a_tree_of_k_nodes_trades_the_chains_deep_nodes_for_second_guesses_near_the_root():
    """At a mean length of 4 over 15 positions, the K nodes likeliest to be reached of the
    2K-node tree hold 3.44 expected draft tokens against the chain's 3.0: second guesses at the
    first levels (the chain breaks at the first a quarter of the time) are likelier than the
    chain's deep tokens. Every kept node's parent is kept, and comes first."""
    from localspec.drafters.base import Budget
    from localspec.llama.curve import CostCurve
    from localspec.verify import depths_of

    rates = synthetic.parse_rates("len=4", 15)
    truth = list(range(100, 140))
    curve = CostCurve([0.01] * 32, 0)
    propose = lambda branches, nodes: synthetic.SyntheticDrafter(truth, rates, 1000, branches).propose(  # noqa: E731
        truth[:20], Budget(curve, 16, nodes, static=True))
    chain, tree, full = propose(1, 15), propose(2, 15), propose(2, 30)
    assert len(chain) == len(tree) == 15 and len(full) == 30
    assert chain.reach.sum() == pytest.approx(3.0) and tree.reach.sum() > 3.4
    assert full.reach.sum() == pytest.approx(sum(rates) + sum(
        (rates[d - 1] if d else 1.0) * (1 - c) * c for d, c in enumerate(r / p for r, p in zip(rates, [1.0] + rates))))
    parents = tree.parents.tolist()
    assert all(p < i for i, p in enumerate(parents)) and list(tree.reach) == sorted(tree.reach, reverse=True)
    assert max(depths_of(parents)) < 15 and tree.n_leaves() > 1  # shallower, with second guesses
    # A text through the first level's second guess: that node sits after the chain's (rejected)
    # first node, so it comes back as a pending row, and the next proposal holds a node fewer.
    drafter = synthetic.SyntheticDrafter(truth, rates, 1000, branches=2, same_rows=True)
    wrong_first = synthetic.best_nodes([999, 121, 122, truth[20]], [-1, 0, 1, -1], [0.75, 0.5, 0.3, 0.19], 4)
    drafter.last = (20, wrong_first)
    assert drafter.requeued(truth[:22]) == 1 and drafter.requeued([*truth[:20], 999, 121, 5]) == 0
    assert len(drafter.propose(truth[:22], Budget(curve, 16, 15, static=True))) == 14


@pytest.mark.unit
def test_options_the_synthetic_bench_cannot_apply_are_refused_in_one_line(capsys):
    """--synthetic drafts plain decoding's own answer, greedy: a drafter, a temperature or
    another anchor given with it is said to not apply, before any model loads."""
    from localspec.cli import main

    for extra in (["--drafter", "lookup"], ["--temperature", "0.8"], ["--anchor", "llama-server-ngram-mod"],
                  ["--trace", "t.png"]):
        assert main(["bench", "-m", "/nonexistent.gguf", "--synthetic", "0.9,0.5", *extra]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("localspec: error: --synthetic") and extra[0] in err and "\n" not in err
