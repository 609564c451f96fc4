"""The bench's workloads shaped like real use: sessions answered turn by turn, a suffix store
warmed and rolled back between configurations, repeats, intervals, llama.cpp's lookup cache."""

from __future__ import annotations

import json
from pathlib import Path
import struct

import numpy as np
import pytest
from conftest import RECORDED_CURVE

from localspec.bench import workloads
from localspec.bench.anchors import LLAMA_TOOLS, SERVER_CONFIGS, ServerAnchor, make_anchors, write_ngram_cache
from localspec.bench import report
from localspec.bench.report import speedup_interval
from localspec.bench.runner import (Config, Learnt, Run, Step, bench_configs, finished_turns, run_bench, run_ours,
                                   warm_documents)
from localspec.drafters.spec import DrafterSpec
from localspec.errors import LocalspecError
from localspec.engine import Engine, EngineConfig
from localspec.loop import Iteration
from localspec.sampling import SamplingConfig
from localspec.verify import DraftTree

from test_store_cli import localspec


@pytest.mark.unit
def test_session_workloads_are_several_turns_from_held_out_data():
    chats = workloads.chat_sessions(3)
    assert len(chats) == 3 and all(p.kind == "session" and len(p.turns) >= 2 for p in chats)
    train_ids = {p.id.split("/")[1] for p in workloads.sharegpt(200, part="train")}
    assert not train_ids & {p.id.split("/")[1] for p in chats}
    edits = workloads.edit_sessions(2)
    assert edits[0].turns == workloads.EDIT_FOLLOW_UPS and "```python" in edits[0].prompt
    prompts, warm = workloads.load_warm("humaneval-warm", 64)
    assert [p.id for p in prompts][::63] == ["HumanEval/100", "HumanEval/163"]
    assert [p.id for p in warm.prompts][::99] == ["HumanEval/0", "HumanEval/99"]


def test_sessions_run_turn_by_turn_on_a_store_rolled_back_for_each_configuration(small_path):
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=2048, threads=2, store=":memory:"))
    try:
        session = workloads.Prompt("s", "session", "Name three colours.", turns=("Name three more.",))
        warm = [engine.model.tokenize("Red, green and blue are colours.", add_special=False)]
        configs = run_bench(engine, [session], bench_configs(engine, [DrafterSpec("suffix"), DrafterSpec("auto")]),
                            24, SamplingConfig(), repeat=2, warm=warm)
        assert [len(c.runs) for c in configs] == [2, 2, 2]  # a median run per turn
        assert all(r.identical or r.tie for c in configs for r in c.runs)
        # plain's answers carry the copy ceiling: a clairvoyant copier never takes longer than plain
        assert all(0 < r.ceiling[1] <= r.ceiling[0] * (1 + 1e-9) for r in configs[0].runs)
        assert all(r.ceiling is None for c in configs[1:] for r in c.runs)
        # The store ends as a user's would: the warm-up, then plain's answer to each turn once.
        assert engine.drafters.suffix_store(":memory:").native.n_docs == 1 + 2
    finally:
        engine.close()


def test_each_configuration_learns_only_from_its_own_runs(small_path):
    """auto's suffix drafter is the suffix configuration's own object: each configuration runs
    a turn from its own copy of what the drafter learnt, so one run after another has not
    learnt that turn's text from it."""
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=2, store=":memory:"))
    try:
        configs = [Config("suffix", "suffix", DrafterSpec("suffix")), Config("auto", "auto", DrafterSpec("auto"))]
        suffix = engine.drafters.get(DrafterSpec("suffix"))
        assert suffix in engine.controller(DrafterSpec("auto")).drafters

        def counts():
            return [suffix.acceptance.followed.sum(), suffix.lookup.acceptance.followed.sum()]

        fresh = counts()
        learnt = Learnt(engine, configs)
        tokens = engine.model.tokenize("one two three four five six. one two three four five six. one two")
        learnt.before("suffix")
        run_ours(engine, tokens, DrafterSpec("suffix"), 24, SamplingConfig())
        learnt.ran("suffix")
        after_suffix = counts()
        assert after_suffix != fresh  # it learnt how the text follows its drafts
        learnt.before("auto")
        assert counts() == fresh  # auto starts the turn from what it learnt itself: nothing
        learnt.next_turn()
        learnt.before("suffix")
        assert counts() == after_suffix  # the next turn goes on from the configuration's own
    finally:
        engine.close()


def test_an_interrupted_bench_keeps_the_turns_every_configuration_finished(small_path):
    """Ctrl+C after the first prompt, in the middle of the second's turns: the first is kept
    whole for every configuration (the CLI prints and writes it, then exits 130), the
    unfinished turn for none."""
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=2048, threads=2, store=":memory:"))
    ran = []

    def interrupting(engine, tokens, spec, *args, **kw):
        ran.append(spec.label)
        if len(ran) == 6:  # the second prompt: plain and suffix ran, auto is next
            raise KeyboardInterrupt
        return run_ours(engine, tokens, spec, *args, **kw)
    try:
        prompts = workloads.humaneval(3)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("localspec.bench.runner.run_ours", interrupting)
            configs, done = bench_configs(engine, [DrafterSpec("suffix"), DrafterSpec("auto")]), []
            with pytest.raises(KeyboardInterrupt):
                run_bench(engine, prompts, configs, 8, SamplingConfig(), advance=done.append)
        assert done == [1] and finished_turns(configs) == 1 and [len(c.runs) for c in configs] == [1, 1, 1]
        assert all(r.identical or r.tie for c in configs for r in c.runs)
    finally:
        engine.close()


def test_warm_answers_are_generated_once_and_cached(small_path, tmp_path):
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=2, store=":memory:"))
    try:
        warm = workloads.Warm(texts=("def f(): pass",), prompts=tuple(workloads.humaneval(2)))
        cache = tmp_path / "answers.json"
        docs = warm_documents(engine, warm, 6, cache)
        assert len(docs) == 3 and all(len(d) <= 6 for d in docs[1:])
        cached = json.loads(cache.read_text())
        assert len(cached) == 2
        for key in cached:  # tampered answers are what the next warm-up reads: no generation
            cached[key] = [7, 8, 9]
        cache.write_text(json.dumps(cached))
        assert warm_documents(engine, warm, 6, cache)[1:] == [[7, 8, 9], [7, 8, 9]]
        cache.write_text('{"torn')  # a cache cut off mid-write is made again, not a traceback
        assert warm_documents(engine, warm, 6, cache) == docs
        assert len(json.loads(cache.read_text())) == 2
    finally:
        engine.close()


@pytest.mark.unit
def test_ngram_cache_file_is_what_llama_cpp_reads(tmp_path):
    path = tmp_path / "bench" / "lcd.bin"  # a folder not yet made, as on a fresh machine
    write_ngram_cache([[1, 2, 3], [1, 2, 4]], path)
    data, entries, at = path.read_bytes(), {}, 0
    while at < len(data):
        *ngram, n = struct.unpack_from("<4ii", data, at)
        at += 20
        entries[tuple(ngram)] = dict(struct.unpack_from("<ii", data, at + 8 * i) for i in range(n))
        at += 8 * n
    assert entries[(1, -1, -1, -1)] == {2: 2}
    assert entries[(2, -1, -1, -1)] == {3: 1, 4: 1}
    assert entries[(1, 2, -1, -1)] == {3: 1, 4: 1}
    expected = {tuple(d[i - n:i]) for d in ([1, 2, 3], [1, 2, 4]) for n in range(1, 5) for i in range(n, len(d))}
    assert len(entries) == len(expected)


@pytest.mark.skipif(not (LLAMA_TOOLS / "llama-server").exists(), reason="scripts/build-llama-tools.sh not run")
def test_llama_servers_draft_configurations_speculate(qwen_path):
    """Its draft-model configurations speculate (a -md alone loads the draft model and never
    uses it: they ran plain decoding so until 2026-12-01), and one that would not is refused
    at start rather than measured as speculation."""
    for name in ("llama-server draft n-max 3", "llama-server draft n-max 8"):
        anchor = ServerAnchor(name, qwen_path, qwen_path, 1024, 2, SERVER_CONFIGS[name])
        try:
            run, _ = anchor.run(workloads.Prompt("p", "completion", "x"), list(range(100, 140)) * 2, 16,
                                SamplingConfig())
        finally:
            anchor.close()
        assert not run.failed and run.drafted > 0
        # its forwards as ours are counted (the prompt's too), so the report gives its τ
        assert run.forwards == run.n_tokens - run.accepted and run.forwards < run.n_tokens
    with pytest.raises(LocalspecError, match="without speculative decoding"):
        ServerAnchor("draft model alone", qwen_path, qwen_path, 1024, 2,
                     ["--spec-type", "none", "--spec-draft-n-max", "3"])


@pytest.mark.skipif(not (LLAMA_TOOLS / "llama-server").exists(), reason="scripts/build-llama-tools.sh not run")
def test_each_repeat_of_an_anchor_that_learns_across_requests_runs_on_a_server_of_its_own(small_path, small_model):
    """ngram-mod's pool keeps every prompt and answer its server saw: asked the same prompt
    again, a server drafts from its own earlier answer. The bench's repeats of it each run on
    a server of their own, so the second repeat runs as the first did, as ours do."""
    [anchor] = make_anchors(["llama-server-ngram-mod"], small_path, None, 1024, 2, repeat=2)
    tokens = small_model.tokenize('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
                                  add_special=True, parse_special=False)
    prompt = workloads.Prompt("p", "completion", "")
    try:
        first, second, again = (anchor.run(prompt, tokens, 128, SamplingConfig(), repeat=r)[0] for r in (0, 1, 0))
    finally:
        anchor.close()
    assert not first.failed and first.n_tokens > 64
    assert (second.n_tokens, second.drafted, second.accepted) == (first.n_tokens, first.drafted, first.accepted)
    assert again.drafted > first.drafted  # the first server, asked again, drew on its pool


@pytest.mark.unit
def test_speedup_interval_covers_the_ratio_and_narrows_with_agreement():
    plain = Config("plain", "none", runs=[Run(n_timed=100, seconds=10.0) for _ in range(8)])
    steady = Config("x", "x", runs=[Run(n_timed=100, seconds=5.0) for _ in range(8)])
    noisy = Config("y", "y", runs=[Run(n_timed=100, seconds=s) for s in (3, 8, 4, 7, 5, 6, 3, 8)])
    assert speedup_interval(steady, plain) == (2.0, 2.0)
    lo, hi = speedup_interval(noisy, plain)
    assert lo < (800 / 44) / 10 < hi and hi - lo > 0.2
    assert speedup_interval(Config("z", "z", runs=steady.runs[:2]), plain) is None


def test_forwards_by_their_place_in_a_run_of_one_size():
    """A size change, the second forward of a size in a row and the later ones, apart (what a
    CUDA graph's rebuild, capture and replay cost on a GPU)."""
    sizes = [1, 16, 16, 16, 16, 1, 16, 1, 1, 1]
    steps = [Step(n, 0.0, (10 + i) / 1e3, 0.0, 0, 0.0) for i, n in enumerate(sizes)]
    streak = Config("x", "x", runs=[Run(iterations=steps)]).by_streak()
    assert streak[16] == {"1": (13.5, 2), "2": (12.0, 1), "3+": (13.5, 2)}
    assert streak[1] == {"1": (15.0, 3), "2": (18.0, 1), "3+": (19.0, 1)}


def test_bench_repeat_and_a_session_workload_from_the_command_line(small_path, tmp_path):
    out = tmp_path / "bench.json"
    r = localspec("bench", "-m", str(small_path), "--threads", "2", "--workload", "edit-session",
                  "--limit", "1", "--max-tokens", "4", "--repeat", "2", "--drafter", "suffix",
                  "--curve", str(RECORDED_CURVE), "--json", str(out), timeout=900)  # no curve measured
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert result["meta"]["repeat"] == 2 and result["configs"][1]["speedup_95"] is not None
    assert sum(n for by in result["configs"][1]["forward_ms_by_streak"].values() for _, n in by.values()) > 0
    assert "median of 2" in r.stdout
    turns = result["configs"][1]["runs"]  # a session's turns in order, each with its own time
    assert len(turns) == len(result["configs"][0]["runs"]) >= 2 and all(t["seconds"] > 0 for t in turns)
    # every repeat's time and tokens beside the median's: the lower middle of two is the slower
    for t in turns:
        rates = [n / s for n, s in zip(t["repeat_tokens"], t["repeat_seconds"])]
        assert len(rates) == 2 and t["tokens"] / t["seconds"] == min(rates) and t["tokens"] in t["repeat_tokens"]
    assert len(result["meta"]["prompts"]) == 1
    assert result["meta"]["copy_ceiling"] >= 1.0 and "copy ceiling:" in r.stdout
    bad = localspec("bench", "-m", str(small_path), "--repeat", "0")
    assert bad.returncode == 1 and "--repeat" in bad.stderr


def test_bench_plans_and_prices_on_another_machines_curve(small_path, tmp_path):
    """`--curve FILE`: drafts are planned with the H200's curve, every output is still checked
    against plain decoding here, and the report adds each configuration's speedup with its
    forwards priced on that curve (plain: 1.0 by definition); `--draft-curve` prices the
    drafters' own forwards (test_speculative checks how)."""
    curve = Path(__file__).parents[1] / "docs" / "bench" / "gpu" / "h200-2026-11-26" / "curve-rand-7b.json"
    out = tmp_path / "bench.json"
    r = localspec("bench", "-m", str(small_path), "--threads", "2", "--workload", "code-edit",
                  "--limit", "1", "--max-tokens", "24", "--drafter", "lookup", "--drafter", "auto:lookup",
                  "--curve", str(curve), "--draft-curve", str(curve), "--json", str(out),
                  "--trace", str(tmp_path / "trace.json"), timeout=900)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    plain, lookup, auto = result["configs"]
    # Cascade's iterations (a .json trace; the chart's test is below), with those a sure copy
    # ran outside it ("lookup", no K) too: every accepted token is a node of what was verified
    trace = json.loads((tmp_path / "trace.json").read_text())
    iterations = [it for request in trace["requests"] for it in request]
    assert auto["identical"] == 1 and len(trace["requests"]) == 1 and iterations
    assert {it["arm"].split("@")[0] for it in iterations} <= {"prompt", "plain", "lookup"}
    for it in iterations:
        assert len(it["tree_reach"]) == len(it["tree_parents"]) == it["n_drafted"] < it["batch"]
        assert len(it["accepted_nodes"]) == it["n_accepted"] <= it["n_drafted"]
    assert plain["projected_speedup"] == 1.0 and lookup["projected_speedup"] > 0
    # where the projected seconds go, adding up to the speedup (the same tokens, both runs)
    plain_ms, lookup_ms = plain["projected_ms"], lookup["projected_ms"]
    assert plain_ms["drafters"] == 0 and plain_ms["forwards"] > plain_ms["host"] > 0
    assert sum(plain_ms.values()) / sum(lookup_ms.values()) == pytest.approx(lookup["projected_speedup"])
    assert lookup["identical"] == 1 and result["meta"]["projected_on"] == str(curve)
    assert result["meta"]["drafts_priced_on"] == str(curve)
    assert result["meta"]["rows_read_on"] == "device"  # as the GPU whose curve it is reads them
    assert set(plain["ran"]) == {"plain"} and set(lookup["ran"]) == {"lookup"}  # iterations per arm
    assert "projected: every forward priced on the curve in" in r.stdout and "the drafters' forwards on" in r.stdout


@pytest.mark.unit
def test_a_trace_is_a_chart_or_the_iterations_with_the_path_verification_accepted(tmp_path):
    """--trace writes a PNG, or with a .json name each iteration: of a tree (two branches),
    the nodes its accepted tokens walk."""
    tree = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, -1, 1, 2]), np.array([0.5, 0.4, 0.3, 0.2]))
    plain = Iteration("plain", "plain 1", None, [9], 0, 0, 0.03, DraftTree.empty(), 0.03)
    drafted = Iteration("lookup@4", "set 2", "lookup", [6, 7, 1], 2, 4, 0.05, tree, 0.04, batch=5)
    report.write_trace([[plain, drafted]], "t", tmp_path / "t.png")
    report.write_trace([[plain, drafted]], "t", tmp_path / "t.json")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    (request,) = json.loads((tmp_path / "t.json").read_text())["requests"]
    assert [it["accepted_nodes"] for it in request] == [[], [1, 2]]
    assert request[1]["tree_reach"] == [0.5, 0.4, 0.3, 0.2] and request[1]["host_seconds"] == pytest.approx(0.01)


@pytest.mark.unit
def test_the_benchs_auto_is_a_users_auto():
    """With auto among the bench's drafters, the bench's engine defaults to it, so it decides
    whether the target returns hidden states as a user's auto engine does (the Jakiro drafter
    that ships for a target is then among auto's members, not only the first drafter's)."""
    from localspec.cli import engine_config, parser

    a = parser().parse_args(["bench", "--drafter", "suffix", "--drafter", "auto", "--drafter", "lookup"])
    assert engine_config(a, a.drafter).drafter.kind == "auto"
    a = parser().parse_args(["bench", "--drafter", "suffix", "--drafter", "lookup"])
    assert engine_config(a, a.drafter).drafter.kind == "suffix"
