"""Targets whose layers keep a recurrent state (hybrids: Qwen3.5 and its MoE, Qwen3-Next, LFM2
and its MoE, Granite 4, Nemotron-H and its MoE, Falcon-H1, Jamba, Kimi-Linear; Mamba-2 and
RWKV-7 alone), as tiny random-weight GGUFs (random_gguf.py). llama.cpp cannot cut such a
state back to an earlier position: the prompt cache and a cancelled request restore a saved
state or decode what they keep again, and verification rolls the state back by what it
rejects where llama.cpp can and the engine keeps rollback steps (n_rs_seq: Qwen3.5's, LFM2's,
Nemotron-H's); otherwise (the default) a hybrid verifies trees flattened, each path in a
sequence of its own, and one sequence without a path keeps the state after the batch's pending
tokens (native/step.h), and a recurrent-only target (Mamba-2, RWKV-7) verifies chains, a batch
that rejects a node undone from a checkpoint taken before it. What they answer must be what a
cold start and plain decoding answer."""

from __future__ import annotations

import threading

import numpy as np

import pytest

from localspec.drafters.spec import DrafterSpec
from localspec.bench.runner import near_tie, run_ours
from localspec.bench.synthetic import SyntheticDrafter
from localspec.control.controllers import Fixed
from localspec.drafters.base import Budget
from localspec.drafters.spec import NONE
from localspec.loop import RunOptions, Stats, run
from localspec.engine import Done, Engine, EngineConfig, Request
from localspec.sampling import SamplingConfig

from random_gguf import make

RECURRENT = ["qwen35", "qwen35moe", "qwen3next", "lfm2", "lfm2moe", "granitehybrid", "nemotron_h",
             "nemotron_h_moe", "falcon-h1", "jamba", "kimi-linear", "mamba2", "rwkv7"]
# llama.cpp's llm_arch_supports_rs_rollback
ROLLS_BACK = {"qwen35", "qwen35moe", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe"}
GREEDY = SamplingConfig(temperature=0.0)
# Longer than a prompt chunk (128), so a later prompt would reuse whole chunks of it.
PROMPT = "def add(a, b):\n    return a + b\n\n" * 24


@pytest.fixture(scope="module", params=RECURRENT)
def engine(request, tmp_path_factory, small_path):
    path = make(request.param, "tiny", tmp_path_factory.mktemp("hybrid") / f"{request.param}.gguf",
                tokenizer=small_path)
    notices = []
    # rollback 8 for the families that can roll back; the other hybrids verify trees flattened
    # (the default: test_a_hybrids_trees... tests it on qwen35), Mamba-2 and RWKV-7 undo chains
    # from checkpoints (as --strict does for all, and test_a_plain_engine... on qwen35)
    rollback = 8 if request.param in ROLLS_BACK else 0
    engine = Engine(EngineConfig(model=str(path), n_ctx=1024, threads=2, rollback=rollback), notice=notices.append)
    engine.notices = notices
    yield engine
    engine.close()


def answer(engine: Engine, prompt: str, cache: bool = True, drafter: str | None = None,
           cancel_after: int | None = None) -> Done:
    request = Request(prompt=prompt, sampling=GREEDY, max_tokens=24, ignore_eog=True, cache=cache,
                      drafter=DrafterSpec.parse(drafter) if drafter else None)
    cancel = threading.Event()
    for i, event in enumerate(engine.generate(request, cancel)):
        if cancel_after is not None and i + 1 >= cancel_after:
            cancel.set()
    return event


def test_a_recurrent_target_answers_as_a_cold_start_after_any_cut(engine):
    assert engine.model.recurrent
    cold = answer(engine, PROMPT, cache=False).tokens
    assert len(cold) == 24
    # The same prompt again (the cache holds it and the answer: cut back to the prompt).
    assert answer(engine, PROMPT).tokens == cold
    # A prompt sharing whole chunks with what the cache holds, then going elsewhere.
    other = PROMPT + "def sub(a, b):\n"
    other_cold = answer(engine, other, cache=False).tokens
    answer(engine, PROMPT)
    shared = answer(engine, other)  # from the state saved at PROMPT's last whole chunk
    assert shared.tokens == other_cold and shared.stats.cache_n >= 128
    # A request cancelled with a forward in flight leaves the cache consistent.
    stopped = answer(engine, other, cancel_after=3)
    assert stopped.reason.value == "cancelled" and len(stopped.tokens) < 24
    assert answer(engine, PROMPT).tokens == cold
    assert answer(engine, other).tokens == other_cold


def test_greedy_speculation_on_a_recurrent_target_is_plain_decodings(engine):
    """Chains verified in one batch, the state rolled back by what was rejected (or undone
    from its checkpoint), and on hybrids that cannot roll back trees verified flattened:
    plain decoding's output (or first different at a measured near-tie). The synthetic
    drafter proposes plain decoding's own answer broken at drawn depths, so every rollback
    from one token to all but the root happens (and, with a second branch per level, both a
    first path accepted whole and one left for another); lookup, suffix and auto run as a
    user's would; then the cache answers as a cold start does and, after a tree, every
    sequence holds what a prefill of the context holds."""
    ctx, curve = engine.ctx, engine.planning.prepare()
    rolls_back = engine.model.architecture in ROLLS_BACK
    flat = engine.model.hybrid and not rolls_back
    assert (ctx.rollback > 0) == rolls_back and ctx.flat == flat and ctx.checkpoints == (not rolls_back)
    assert ctx.n_paths == (8 if flat else 1)
    prompt = engine.model.tokenize(PROMPT)
    truth, _ = run_ours(engine, prompt, NONE, 48, GREEDY)
    stats = Stats()
    for seed, (rates, branches) in enumerate((([0.9, 0.7, 0.5, 0.3], 1), ([0.95] * (ctx.rollback or 8), 1),
                                              ([0.9, 0.7, 0.5, 0.3], 2))):
        ctx.clear()
        drafter = SyntheticDrafter(prompt + truth, rates, engine.model.n_vocab, branches=branches, seed=seed)
        budget = Budget(curve, ctx.n_paths, len(rates) * branches, static=True, flat=ctx.flat)
        out = [t for it in run(ctx, Fixed(drafter, budget, "synthetic"), prompt, GREEDY, 48, stats,
                               RunOptions(stop_at_eog=False)) for t in it.tokens]
        assert out == truth or near_tie(engine, prompt, truth, out), rates
    assert stats.draft_n > stats.draft_n_accepted > 0  # accepted, and rolled back
    if flat:
        every_sequence_holds_a_prefill(engine)
    for drafter in ("lookup", "suffix", "auto"):
        out, _ = run_ours(engine, prompt, DrafterSpec.parse(drafter), 48, GREEDY)
        assert out == truth or near_tie(engine, prompt, truth, out), drafter
    cold = answer(engine, PROMPT, cache=False).tokens
    answer(engine, PROMPT, drafter="suffix")
    assert answer(engine, PROMPT).tokens == cold


def every_sequence_holds_a_prefill(engine: Engine) -> None:
    """Each sequence of the engine's context decodes a next token as sequence 0 does, and that
    as a fresh context holding the same tokens does: closer than one missing the last token
    comes (the states were built by batches of other sizes, so not bit for bit)."""
    from localspec.llama.context import Context, ContextConfig
    ctx, token = engine.ctx, 42
    n = len(ctx.tokens)

    def fresh(tokens):
        with Context(engine.model, ContextConfig(n_ctx=ctx.n_ctx, n_threads=2)) as c:
            c.extend(tokens)
            c.append(token)
            return c.logits(0).copy()
    want, short = fresh(ctx.tokens), fresh(ctx.tokens[:-1])
    rows = []
    for s in range(ctx.config.n_seq_max):
        ctx.decode([token], [n], [[s]], outputs=[True])
        rows.append(ctx.logits(0).copy())
    for s, row in enumerate(rows):
        assert np.abs(row - rows[0]).max() <= 1e-5, s
    assert np.abs(rows[0] - want).max() < np.abs(short - want).max() / 10
    ctx.clear()


def test_a_hybrids_trees_are_verified_flattened_and_decode_as_plain(tmp_path, small_path):
    """A tree drafter on a hybrid (a draft model's trees, the SmolLM2 test model drafting for
    a qwen35 that shares its tokenizer): its output is plain decoding's, some trees branch,
    and afterwards every sequence holds what a prefill holds."""
    path = make("qwen35", "tiny", tmp_path / "qwen35.gguf", tokenizer=small_path)
    engine = Engine(EngineConfig(model=str(path), n_ctx=1024, threads=2))
    try:
        assert engine.ctx.flat and engine.ctx.n_paths == 8
        prompt = engine.model.tokenize(PROMPT)
        truth, _ = run_ours(engine, prompt, NONE, 32, GREEDY)
        spec = DrafterSpec.parse(f"draft-tree:{small_path}@8")  # a static K: trees whatever they cost
        drafter, leaves = engine.drafters.get(spec), []
        observe = drafter.observe
        drafter.observe = lambda tree, verdict: (leaves.append(tree.n_leaves()), observe(tree, verdict))
        out, _ = run_ours(engine, prompt, spec, 32, GREEDY)
        assert out == truth or near_tie(engine, prompt, truth, out)
        assert max(leaves) > 1  # trees were verified
        every_sequence_holds_a_prefill(engine)  # as the last iteration left them
    finally:
        engine.close()


def test_a_plain_engine_keeps_no_rollback_and_speculates_from_checkpoints(tmp_path, small_path):
    """--drafter none keeps no rollback steps (each costs a copy of the state per decode), even
    where asked for; a request that names a drafter undoes rejected batches from checkpoints,
    as every engine does by default, and answers as plain decoding does."""
    path = make("qwen35", "tiny", tmp_path / "qwen35.gguf", tokenizer=small_path)
    engine = Engine(EngineConfig(model=str(path), n_ctx=512, threads=2, drafter=DrafterSpec("none"), rollback=8))
    try:
        ctx = engine.ctx
        assert ctx.rollback == 0 and ctx.checkpoints
        prompt = engine.model.tokenize(PROMPT)
        truth, _ = run_ours(engine, prompt, NONE, 32, GREEDY)
        ctx.clear()
        stats, drafter = Stats(), SyntheticDrafter(prompt + truth, [0.9, 0.7, 0.5], engine.model.n_vocab)
        controller = Fixed(drafter, Budget(engine.planning.prepare(), 1, 3, static=True), "synthetic")
        out = [t for it in run(ctx, controller, prompt, GREEDY, 32, stats, RunOptions(stop_at_eog=False))
               for t in it.tokens]
        assert out == truth or near_tie(engine, prompt, truth, out)
        assert stats.draft_n > stats.draft_n_accepted > 0
        assert answer(engine, PROMPT, drafter="lookup").tokens == answer(engine, PROMPT, cache=False).tokens
    finally:
        engine.close()


def test_a_server_on_recurrent_targets(tmp_path, small_path):
    """Over HTTP (the server's defaults: trees verified flattened): a family that could roll
    back and one that cannot both speculate when a request names a drafter, and chat."""
    import httpx

    from test_serve import serving

    for arch in ("qwen35", "granitehybrid"):
        path = make(arch, "tiny", tmp_path / f"{arch}.gguf", tokenizer=small_path)
        with serving(path, threads=2) as (url, _):
            body = {"prompt": PROMPT, "n_predict": 16, "drafter": "lookup", "temperature": 0}
            r = httpx.post(f"{url}/completion", json=body, timeout=60)
            assert r.status_code == 200 and r.json()["tokens_predicted"] > 0, r.text
            chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
            assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).status_code == 200


def test_sampling_on_a_recurrent_target_keeps_its_distribution(engine):
    """T = 1, top-k 2: the third token over many seeds, plain and speculative (chains of the
    greedy answer, accepted by rejection sampling, the state rolled back or undone): a
    chi-square test of the two samples."""
    from scipy.stats import chi2_contingency

    from localspec.control.controllers import Plain
    if engine.model.architecture not in {"qwen35", "lfm2", "nemotron_h", "granitehybrid"}:
        pytest.skip("one family of each kind that rolls back, one undone from checkpoints")
    ctx, curve = engine.ctx, engine.planning.prepare()
    prompt = engine.model.tokenize(PROMPT[:64])  # short: every run reads it again
    truth, _ = run_ours(engine, prompt, NONE, 8, GREEDY)
    counts: dict[int, list[int]] = {}
    stats = Stats()
    for seed in range(150):
        sampling = SamplingConfig(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=seed)
        for column, controller in enumerate((Plain(), Fixed(SyntheticDrafter(prompt + truth, [1.0] * 4,
                                                                              engine.model.n_vocab),
                                                             Budget(curve, 1, 4, static=True), "chain"))):
            ctx.clear()
            out = [t for it in run(ctx, controller, prompt, sampling, 4, stats if column else None,
                                   RunOptions(stop_at_eog=False)) for t in it.tokens]
            counts.setdefault(out[2], [0, 0])[column] += 1
    assert stats.draft_n > stats.draft_n_accepted > 20, stats.summary()
    table = np.array([c for c in counts.values() if sum(c) >= 5]).T
    assert table.shape[1] >= 3
    assert chi2_contingency(table).pvalue > 0.001, counts


def test_strict_where_no_batch_reproduces_single_tokens_decodes_one_at_a_time(tmp_path, small_path):
    """The tiny qwen35 on one thread: its batches of 2 already differ from single tokens, so
    whatever a verification batch wrote into the cache and the recurrent state would differ
    from plain decoding's for the rest of the answer. --strict says so once and decodes one
    token at a time, prompts too: a cached prompt is then computed as a cold one is."""
    from conftest import RECORDED_CURVE

    path = make("qwen35", "tiny", tmp_path / "qwen35.gguf", tokenizer=small_path)
    notices = []
    engine = Engine(EngineConfig(model=str(path), n_ctx=1024, threads=1, strict=True, curve=str(RECORDED_CURVE),
                                 store=":memory:"), notice=notices.append)
    try:
        assert engine.exactness()[1] == 1 and not engine.speculates
        assert [n for n in notices if n.startswith("--strict")], notices
        first = answer(engine, PROMPT, drafter="auto")
        assert first.stats.draft_n == 0 and set(first.stats.ran) == {"plain"}
        assert engine.ctx.chunk == 1
        again = answer(engine, PROMPT + "def sub(a, b):\n", drafter="suffix")  # the cache reused
        cold = answer(engine, PROMPT + "def sub(a, b):\n", cache=False, drafter="none")
        assert again.stats.cache_n > 0 and again.tokens == cold.tokens
    finally:
        engine.close()


def test_a_chat_on_a_hybrid_target_stops_and_answers_as_a_cold_start(tmp_path, small_path):
    """`localspec chat` on a qwen35 under Textual's pilot: an answer is a cold plain engine's;
    Esc stops the next with its forward in flight; the turn after it, decoded from the
    recurrent state the prompt cache saved, is again a cold start's answer to the whole
    conversation. Strict and one thread, byte for byte: no batch of this target reproduces
    single tokens, so it decodes one token at a time (the test above), prompts too."""
    import asyncio

    from conftest import RECORDED_CURVE
    from test_chat import Recording, ready, say, send_now, until
    from tui.app import ChatConfig

    path = make("qwen35", "tiny", tmp_path / "qwen35.gguf", tokenizer=small_path)
    settings = dict(model=str(path), n_ctx=4096, threads=1, strict=True, curve=str(RECORDED_CURVE),
                    store=str(tmp_path / "store"))

    def cold(messages, max_tokens):
        e = Engine(EngineConfig(**settings, drafter=NONE))
        try:
            *_, done = e.generate(Request(messages=messages, sampling=GREEDY, max_tokens=max_tokens))
            return done.text
        finally:
            e.close()

    async def go():
        # Long answers (a random model rarely ends one; this one writes 1,500 tokens a second),
        # so Esc, pressed once the second shows text, lands while it is being written.
        app = Recording(ChatConfig(EngineConfig(**settings), db=tmp_path / "chats.db", max_tokens=1500))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await say(pilot, "def add(a, b):")
            app.query_one("#prompt").insert("Tell me a long story.")
            send_now(pilot)
            await until(pilot, lambda: app.answer is not None and app.answer.text != "")
            await pilot.press("escape")
            await until(pilot, lambda: app.answer is None)
            await say(pilot, "Again.")
            return app.store.messages(app.conversation.id)

    saved = asyncio.run(go())
    assert [m.role for m in saved] == ["user", "assistant"] * 3
    assert saved[3].stopped and 0 < saved[3].stats["predicted_n"] < 1500
    history = lambda n: [{"role": m.role, "content": m.text} for m in saved[:n]]  # noqa: E731
    assert saved[1].text == cold(history(1), 1500)
    assert saved[5].text == cold(history(5), 1500)
