"""llama.cpp's model and context on real models: decoding exactly like llama.cpp."""

import ctypes
import functools
import math
from dataclasses import replace
import time
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from localspec.llama import Context
from localspec.llama.context import ContextConfig, hidden_rows
from localspec.llama.curve import CostCurve
from localspec.llama.text import TextStream, chat_tokens, complete_utf8_prefix
from localspec.loop import generate
from localspec.sampling import SamplingConfig, TokenSampler
from localspec.verify import DraftTree, verify_tree

N_TOKENS = 48
PROMPTS = [  # plain completions llama-cpp-python's Llama class also decodes
    "def fibonacci(n):\n",
    "The capital of France is",
    "import numpy as np\n\n# compute the mean of each row\n",
    "Once upon a time, in a small village,",
    "SELECT name, COUNT(*) FROM users",
    "class Stack:\n    def __init__(self):\n",
]


def plain_greedy(ctx, text, n=N_TOKENS):
    return generate(ctx, ctx.model.tokenize(text), n, SamplingConfig(temperature=0))


def llama_cpp_python_greedy(path, prompts, n=N_TOKENS, n_ctx=2048):
    """llama-cpp-python's own high-level completion, greedy."""
    llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=512, n_threads=2, verbose=False)
    try:
        return [llm.create_completion(p, max_tokens=n, temperature=0.0, repeat_penalty=1.0)
                for p in prompts]
    finally:
        llm.close()


@pytest.mark.parametrize("which", ["small", pytest.param("qwen", marks=pytest.mark.slow)])
def test_greedy_matches_llama_cpp_python(which, request):
    path = request.getfixturevalue(f"{which}_path")
    model = request.getfixturevalue(f"{which}_model")
    expected = llama_cpp_python_greedy(path, PROMPTS)
    # The same context settings as Llama's: flash attention off, one sequence.
    cfg = ContextConfig(n_ctx=2048, n_batch=512, n_threads=2, flash_attn="off")
    with Context(model, cfg) as ctx:
        for prompt, exp in zip(PROMPTS, expected):
            tokens = plain_greedy(ctx, prompt)
            text = model.detokenize([t for t in tokens if not model.is_eog(t)])
            assert text == exp["choices"][0]["text"], prompt
            assert len(tokens) - (model.is_eog(tokens[-1])) == exp["usage"]["completion_tokens"]


def test_batch_with_positions_and_sequence_sets_matches_one_by_one(small_model):
    """A shared prefix in sequences 0-2, then three branches decoded in one batch, each
    token in its own sequence (and one token in two): logits equal decoding each
    sequence alone, token by token."""
    m = small_model
    prefix = m.tokenize("The quick brown fox")
    branches = [m.tokenize(" jumps over", add_special=False),
                m.tokenize(" runs away fast", add_special=False),
                m.tokenize(" sleeps", add_special=False)]
    n0 = len(prefix)
    with Context(m, ContextConfig(n_ctx=512, n_seq_max=4)) as ctx:
        ctx.decode(prefix, range(n0), seq_ids=[[0, 1, 2]] * n0, outputs=[False] * n0)
        toks, pos, seqs = [], [], []
        for s, br in enumerate(branches):
            for d, t in enumerate(br):
                toks.append(t), pos.append(n0 + d), seqs.append([s])
        ctx.decode(toks, pos, seq_ids=seqs, outputs=[True] * len(toks))
        batched = [ctx.logits(i).copy() for i in range(len(toks))]

    with Context(m, ContextConfig(n_ctx=512)) as ref:
        i = 0
        for br in branches:
            ref.clear()
            ref.prefill(prefix)
            for t in br:
                ref.append(t)
                np.testing.assert_allclose(batched[i], ref.logits(0), atol=2e-3, rtol=1e-3)
                i += 1


def test_shared_token_in_two_sequences(small_model):
    """Two sibling nodes with the same token each see the root, which belongs to both their
    sequences (the tree-attention mask), so their logits are equal; after verification
    every sequence holds the context and one path, and nothing else."""
    m = small_model
    a, b = m.tokenize("Hello"), m.tokenize(" world", add_special=False)
    with Context(m, ContextConfig(n_ctx=256, n_seq_max=2)) as ctx:
        ctx.extend(a)
        tree = DraftTree(np.array([b[0], b[0]], np.int32), np.array([-1, -1], np.int32), np.ones(2))
        verdict = verify_tree(ctx, tree, [b[0]], TokenSampler(SamplingConfig()))
        np.testing.assert_array_equal(ctx.logits(1), ctx.logits(2))
        assert ctx.seq_pos_max(1) == ctx.seq_pos_max(0) == len(ctx.tokens) - 1
        assert ctx.tokens == a + [b[0]] + [b[0]] * verdict.n_cached


def test_logits_and_hidden_are_views_into_llama_buffers(small_model):
    with Context(small_model, ContextConfig(n_ctx=256, embeddings=True)) as ctx:
        row = ctx.extend(small_model.tokenize("def add(a, b):"))
        logits, hidden = ctx.logits(row), ctx.hidden(row)
        assert logits.shape == (small_model.n_vocab,) and hidden.shape == (small_model.n_embd,)
        addr = llama_cpp.llama_get_logits_ith(ctx.ptr, row)
        assert logits.ctypes.data == ctypes.cast(addr, ctypes.c_void_p).value
        assert not logits.flags.owndata and np.isfinite(hidden).all()


def test_hidden_rows_are_the_rows_hidden_states(small_model):
    """A verified batch's rows in one view (what Jakiro commits an iteration), equal to reading
    them row by row."""
    with Context(small_model, ContextConfig(n_ctx=256, embeddings=True)) as ctx:
        tokens = small_model.tokenize("def add(a, b):\n    return a + b\n")
        ctx.decode(tokens, range(len(tokens)), outputs=[True] * len(tokens))
        block = hidden_rows(ctx, range(2, len(tokens) - 1))
        assert block.shape == (len(tokens) - 3, small_model.n_embd) and not block.flags.owndata
        np.testing.assert_array_equal(block, np.stack([ctx.hidden(r) for r in range(2, len(tokens) - 1)]))
        assert hidden_rows(ctx, []).shape == (0, small_model.n_embd)


@pytest.mark.parametrize("which", ["small", pytest.param("qwen", marks=pytest.mark.slow)])
def test_prefix_cache_reuse_equals_cold_start(which, request):
    model = request.getfixturevalue(f"{which}_model")
    first = "def bubble_sort(items):\n    \"\"\"Sort a list in place.\"\"\"\n"
    second = first + "    n = len(items)\n"
    with Context(model, ContextConfig(n_ctx=1024)) as warm:
        plain_greedy(warm, first)
        assert warm.tokens[:5] == model.tokenize(second)[:5]  # there is a prefix to re-use
        out_warm = plain_greedy(warm, second)
    with Context(model, ContextConfig(n_ctx=1024)) as cold:
        out_cold = plain_greedy(cold, second)
    assert out_warm == out_cold


def test_prefix_cache_reuses_whole_chunks(small_model):
    """A prompt is decoded in chunks that start at multiples of `chunk`; a later prompt reuses
    the chunks it shares whole (a cut one would have been computed in another batch than a
    cold start computes it), or all of an identical prompt, and decodes from there."""
    m = small_model
    a = m.tokenize("The first request shares this prefix, and then it ends here.")
    b = m.tokenize("The first request shares this prefix, but this one goes on differently.")
    n_common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert n_common > 4
    with Context(m, ContextConfig(n_ctx=256, chunk=4)) as ctx:
        decoded = []
        decode = ctx.decode
        ctx.decode = lambda toks, pos, **kw: (decoded.append(list(pos)), decode(toks, pos, **kw))
        assert ctx.prefill(a)[0] == 0
        assert all(p[0] % 4 == 0 and len(p) <= 4 for p in decoded)
        decoded.clear()
        reused, logits = ctx.prefill(b)
        assert reused == n_common // 4 * 4
        assert decoded[0][0] == n_common // 4 * 4 and ctx.tokens == b
        decoded.clear()
        again, same = ctx.prefill(b)  # the same prompt: nothing to decode
        assert again == len(b) and decoded == [] and (same == logits).all()
        assert ctx.prefill(b[:-3])[0] == (len(b) - 3) // 4 * 4  # a cut chunk is decoded again


def test_seeded_sampling_is_reproducible(small_ctx):
    cfg = SamplingConfig(temperature=0.9, seed=42)
    prompt = small_ctx.model.tokenize("Write a haiku about the sea:")
    a = generate(small_ctx, prompt, 32, cfg)
    small_ctx.clear()
    b = generate(small_ctx, prompt, 32, cfg)
    assert a == b


def test_stream_decoder_never_splits_a_character(small_model):
    text = "naïve café — 日本語のテキスト 🎉🚀 ok"
    tokens = small_model.tokenize(text, add_special=False)
    stream = TextStream(small_model)
    pieces = []
    for t in tokens:
        stream.feed(t)
        pieces += [text for text, _ in stream.take()]
    pieces += [text for text, _ in stream.take(final=True)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert any(len(small_model.token_bytes(t)) and
               complete_utf8_prefix(small_model.token_bytes(t)) < len(small_model.token_bytes(t))
               for t in tokens), "the text should contain a token that splits a character"


@pytest.mark.unit
def test_utf8_prefix():
    e = "é".encode()
    assert complete_utf8_prefix(b"ab" + e[:1]) == 2
    assert complete_utf8_prefix(b"ab" + e) == 4
    rocket = "🚀".encode()
    for cut in range(1, 4):
        assert complete_utf8_prefix(rocket[:cut]) == 0


def test_metadata_and_chat_template(small_model):
    m = small_model
    assert m.architecture == "llama" and m.n_vocab == 49152 and m.n_embd == 576
    assert m.special.eos >= 0
    tokens = chat_tokens(m, [{"role": "user", "content": "Hi!"}])
    text = m.detokenize(tokens, special=True)
    assert "<|im_start|>user\nHi!<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_qwen_metadata_has_fim_tokens(qwen_model):
    s = qwen_model.special
    assert qwen_model.architecture == "qwen2"
    assert min(s.fim_pre, s.fim_suf, s.fim_mid) >= 0
    assert qwen_model.detokenize([s.fim_pre], special=True) == "<|fim_prefix|>"


def test_cost_curve_is_measured_once_and_cached(small_model, tmp_path, monkeypatch):
    from localspec.llama.curve_cache import cache_path
    from localspec.llama.measure import cost_curve

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    with Context(small_model, ContextConfig(n_ctx=512, n_threads=2)) as ctx:
        curve = cost_curve(ctx, max_batch=6, repeats=2)
        assert len(curve.seconds) == 6 and all(s > 0 for s in curve.seconds)
        assert curve.ratio(1) == 1.0
        assert cache_path(ctx).exists() and str(tmp_path) in str(cache_path(ctx))
        assert cost_curve(ctx, max_batch=6) == curve  # read back, not measured again
        assert curve.measured_at.startswith("20")  # when, for `localspec cost` to say
        assert ctx.tokens == []  # the measurement leaves the context empty
        assert all(a <= b for a, b in zip(curve.seconds, curve.seconds[1:]))
        assert curve.per_context == () and curve.at(4096) is curve  # too small a context to tell


def test_cost_curve_measures_what_context_adds(tiny_moe_path, tmp_path, monkeypatch):
    """On a tiny random-weight model (three measurements, each with a long context's prefill:
    half a minute of SmolLM2's)."""
    from localspec.llama import Model
    from localspec.llama.measure import cost_curve

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    with Model(tiny_moe_path) as model:
        # 1024: the long context is 1018 tokens, enough to tell (measure.long_context)
        with Context(model, ContextConfig(n_ctx=1024, n_threads=2)) as ctx:
            curve = cost_curve(ctx, max_batch=6, repeats=2)
            assert len(curve.per_context) == 6 and all(k >= 0 for k in curve.per_context)
            assert cost_curve(ctx, max_batch=6) == curve  # per_context is cached with the rest
            assert ctx.tokens == []
        with Context(model, ContextConfig(n_ctx=256, n_threads=2)) as small:
            assert cost_curve(small, max_batch=6) == curve  # a small context reads the same curve
            cost_curve(small, max_batch=6, refresh=True)  # its own, cached without per_context
        with Context(model, ContextConfig(n_ctx=1024, n_threads=2)) as ctx:
            assert len(cost_curve(ctx, max_batch=6, repeats=2).per_context) == 6  # measured again


def test_a_cached_curve_the_loop_strays_from_is_measured_again(small_path, tmp_path, monkeypatch):
    """The curve a fresh install cached while another build ran priced a single token at 4x
    what the loop paid and a batch of 2 as free, and every later run planned with it. The loop
    keeps how far its forwards strayed beside the curve, and the next start measures it again."""
    import json

    from conftest import RECORDED_CURVE

    from localspec.drafters.spec import DrafterSpec
    from localspec.engine import Engine, EngineConfig, Request
    from localspec.llama.curve_cache import cache_path, read_loop, record_loop, strayed
    from localspec.llama.live import LiveCurve
    from localspec.llama.measure import cost_curve

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    recorded = json.loads(RECORDED_CURVE.read_text())
    s = recorded["seconds"]
    skewed = recorded | {"seconds": [4 * s[0]] * 2 + [4 * x for x in s[2:]], "measured_at": "2026-01-01 00:00:00"}
    cfg = EngineConfig(model=str(small_path), n_ctx=1024, threads=2, drafter=DrafterSpec("lookup"))
    engine = Engine(cfg)
    try:
        path = cache_path(engine.ctx)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(skewed))
        assert engine.planning.prepare().base.seconds == skewed["seconds"]  # planned with, as it was cached
        for prompt in ("def fibonacci(n):\n", "Count from 1 to 40: 1, 2, 3,"):
            list(engine.generate(Request(prompt=prompt, sampling=SamplingConfig(temperature=0.0), max_tokens=48)))
        assert read_loop(path) is None  # kept when the engine closes, not on a request's path
    finally:
        engine.close()
    engine = Engine(cfg)
    try:
        loop = read_loop(path)
        assert loop["forwards"] >= 32  # every verification forward of both requests
        assert loop["ratio"] < 0.6 and strayed(loop)  # 4x dearer than what it paid
        curve = cost_curve(engine.ctx, max_batch=6, repeats=2)  # the next start
        assert curve.measured_at != skewed["measured_at"] and curve.seconds[0] < s[0] * 2
        assert read_loop(path) is None and cost_curve(engine.ctx, max_batch=6) == curve  # kept
        # A loop that strays from the new one too does not measure at every start.
        live = LiveCurve(curve)
        for _ in range(40):
            live.observe(1, 100, 2 * float(curve.seconds_at(100)[0]))
        record_loop(path, live)
        assert strayed(read_loop(path)) and cost_curve(engine.ctx, max_batch=6) == curve
    finally:
        engine.close()
    assert not strayed({"forwards": 100, "ratio": 1.1}) and not strayed({"forwards": 10, "ratio": 0.2})
    assert strayed({"forwards": 32, "ratio": 1.3}) and strayed({"forwards": 40, "ratio": 0.7})


def test_an_engine_starts_from_what_the_last_ones_loop_learnt(small_path, tmp_path, monkeypatch):
    """The live curve's corrections are kept beside the cached curve when the engine closes,
    and the next engine on that model starts from them (a `localspec generate` is a run of
    its own every time: it would start uncorrected)."""
    import json
    import math

    from conftest import RECORDED_CURVE

    from localspec.drafters.spec import DrafterSpec
    from localspec.engine import Engine, EngineConfig, Request
    from localspec.llama.curve_cache import cache_path, read_loop
    from localspec.llama.live import CARRIED

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    recorded = json.loads(RECORDED_CURVE.read_text())
    learned = {"same": {"1": [40, math.log(1.2)], "3": [5, math.log(0.9)]}, "after_another": {}}
    cfg = EngineConfig(model=str(small_path), n_ctx=1024, threads=2, drafter=DrafterSpec("lookup"))
    engine = Engine(cfg)
    try:
        path = cache_path(engine.ctx)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(recorded | {"loop": {"forwards": 45, "ratio": 1.1, "learned": learned}}))
        live = engine.planning.prepare()
        assert live.count[0][0] == CARRIED and live.count[0][2] == 2.5  # half, at most CARRIED
        assert live.at(100).cost(1) == pytest.approx(live.base.at(100).cost(1) * 1.2 ** (CARRIED / (CARRIED + 4)))
        list(engine.generate(Request(prompt="Count from 1 to 40: 1, 2, 3,", sampling=SamplingConfig(temperature=0.0),
                                     max_tokens=32)))
        seen = sum(live.count[0])
    finally:
        engine.close()
    kept = read_loop(path)["learned"]["same"]
    assert sum(count for count, _ in kept.values()) == seen > CARRIED + 5  # this run's forwards added


def test_a_coarse_curve_from_a_busy_moment_stays_positive_and_a_broken_cached_one_is_replaced(
        small_model, tmp_path, monkeypatch):
    """A busy moment made the widest size time below the one before; extended along that
    slope to 64 tokens the coarse curve went below zero, was cached, and every later request
    of that model failed (math domain error). Now the slope cannot fall, and a cached curve
    whose times are not positive is measured again."""
    import json

    from localspec.llama.curve_cache import cache_path
    from localspec.llama.measure import cost_curve, fill_curve

    seconds = fill_curve({1: 0.020, 2: 0.030, 4: 0.050, 8: 0.041}, 64)
    assert len(seconds) == 64 and min(seconds) >= 0.020
    assert all(a <= b for a, b in zip(seconds, seconds[1:]))
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    with Context(small_model, ContextConfig(n_ctx=512, n_threads=2)) as ctx:
        path = cache_path(ctx)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"seconds": [-0.01] * 6, "n_context": 256, "coarse": True}))
        curve = cost_curve(ctx, max_batch=6, quick=True)
        assert curve.coarse and all(x > 0 for x in curve.seconds)
        assert json.loads(path.read_text())["seconds"] == curve.seconds


@pytest.mark.unit
def test_cost_curve_at_another_context():
    from localspec.drafters.base import Budget
    from localspec.verify import DraftTree

    curve = CostCurve([1.0, 1.5, 2.0, 2.5], 256, per_context=(0.001, 0.002, 0.003, 0.004))
    assert curve.at(256) is curve
    assert curve.at(1256).seconds == pytest.approx([2.0, 3.5, 5.0, 6.5])
    assert curve.at(1256).n_context == 1256
    assert curve.at(0).seconds == pytest.approx([0.744, 0.988, 1.232, 1.476])
    assert curve.at(-10**6).seconds == pytest.approx([0.5, 0.75, 1.0, 1.25])  # never below half
    # Still non-decreasing where context adds more to a single token than to a batch.
    odd = CostCurve([1.0, 1.1], 0, per_context=(0.01, 0.0))
    assert odd.at(100).seconds == pytest.approx([1.1, 1.1])
    # A draft that pays after a short prompt may not after a long one: wide batches cost more.
    chain = DraftTree(np.arange(3), np.array([-1, 0, 1]), np.array([0.9, 0.8, 0.7]))
    budget = Budget(curve, 8)
    assert len(budget.size(chain)) == 3
    assert len(budget.at(20000).size(chain)) < 3


@pytest.mark.unit
def test_a_batch_is_padded_where_a_wider_one_costs_less():
    """This CPU's flash attention goes tiled from 64 rows: after a long context a batch of 64
    costs less than one of 55 (2.9 s against 4.0 after 3,841 tokens). A batch is priced as the
    cheapest width that holds it and padded to it, by a held curve and a live one alike; after
    a short context, and where nothing wider is cheaper, it runs as itself."""
    from localspec.llama.live import LiveCurve

    seconds = [1.0 + 0.1 * n for n in range(8)]
    curve = CostCurve(seconds, 256, per_context=(1e-4,) * 4 + (4e-4, 4e-4, 4e-4, 1e-4))
    assert [curve.pad_to(n, 256) for n in range(1, 9)] == list(range(1, 9))
    long = curve.unpadded_at(4256)
    assert long[4] > long[7] and long[3] < long[7]  # 5-7 rows cost more than 8 there
    assert [curve.pad_to(n, 4256) for n in range(1, 9)] == [1, 2, 3, 4, 8, 8, 8, 8]
    assert curve.at(4256).seconds == pytest.approx(list(long[:4]) + [long[7]] * 4)
    assert curve.pad_to(9, 4256) == 9  # beyond the curve
    live = LiveCurve(curve)
    assert [live.pad_to(n, 4256) for n in range(1, 9)] == [1, 2, 3, 4, 8, 8, 8, 8]
    assert live.at(4256).seconds == pytest.approx(curve.at(4256).seconds)
    for _ in range(20):  # the wide batch turns out dear, the narrow ones as priced: no padding
        live.observe(8, 4256, 3 * long[7])
        for n in range(4, 8):
            live.observe(n, 4256, long[n - 1])
    assert [live.pad_to(n, 4256) for n in range(5, 9)] == [5, 6, 7, 8]
    assert CostCurve(seconds, 256).pad_to(5, 4256) == 5  # no context term: nothing to gain


@pytest.mark.unit
def test_a_batch_is_padded_where_the_kernels_block_makes_a_wider_one_cheaper(tmp_path):
    """This CPU's matrix kernels run a batch in blocks of 16 rows, then 4, then single rows:
    12 rows measured 7.9 single tokens where 16 took 7.7. The curve keeps what each width
    costs as measured (unpadded) beside its price (the cheapest width that holds it), so a
    batch of 12 is priced and run as 16, at the curve's own context too; the file keeps both,
    and a file whose unpadded times do not fit is refused in one line."""
    import json
    from dataclasses import asdict

    from localspec.errors import LocalspecError
    from localspec.llama.curve import read_curve
    from localspec.llama.live import LiveCurve
    from localspec.llama.measure import non_decreasing

    unpadded = [1.0, 1.8, 2.4, 3.1, 3.6, 4.5, 5.3, 7.1, 7.2, 7.4, 8.6, 7.9, 8.3, 9.1, 9.4, 7.7]
    curve = CostCurve(non_decreasing(unpadded), 256, unpadded=tuple(unpadded))
    assert [curve.pad_to(n, 256) for n in (7, 8, 11, 12, 15, 16)] == [7, 8, 16, 16, 16, 16]
    assert curve.cost(12) == curve.cost(16) == 7.7 and curve.cost(8) == 7.1
    assert LiveCurve(curve).pad_to(12, 256) == 16 and LiveCurve(curve).at(256).cost(12) == pytest.approx(7.7)
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(asdict(curve)))
    assert read_curve(path) == curve
    path.write_text(json.dumps(asdict(curve) | {"unpadded": unpadded[:-1]}))
    with pytest.raises(LocalspecError, match="unpadded"):
        read_curve(path)


@pytest.mark.unit
def test_a_live_curve_learns_what_forwards_cost():
    """A curve measured while the cores were busy (one token 40 ms, a batch of 2 1.4 of
    them), then forwards that cost 33 and 59 ms: the live curve follows the forwards, slowly
    while they are few, and sizes not yet seen take their neighbours' correction."""
    from localspec.drafters.base import Budget
    from localspec.llama.live import LiveCurve
    from localspec.verify import DraftTree

    measured = CostCurve([0.040, 0.056, 0.072, 0.088], 256, per_context=(1e-5, 2e-5, 3e-5, 4e-5))
    live = LiveCurve(measured)
    assert live.at(1256) == measured.at(1256) and live.exact_batch == measured.exact_batch
    chain = DraftTree(np.arange(1), np.array([-1]), np.array([0.6]))
    assert len(Budget(live, 8).at(256).size(chain)) == 1  # 1.6 tokens for 1.4: pays, says the curve
    live.observe(1, 256, 0.033)
    assert 0.033 < live.at(256).cost(1) < 0.040  # one forward moves it a little
    for _ in range(60):
        live.observe(1, 256, 0.033)
        live.observe(2, 1256, 0.059 + 1000 * 2e-5)  # after 1,256 tokens: the same correction
    curve = live.at(256)
    assert curve.cost(1) == pytest.approx(0.033, rel=0.03)
    assert curve.ratio(2) == pytest.approx(59 / 33, rel=0.05)
    assert curve.cost(4) == pytest.approx(0.088 * 59 / 56, rel=0.05)  # as its neighbour
    assert len(Budget(live, 8).at(256).size(chain)) == 0  # 1.6 tokens for 1.8: it does not
    # One forward ten times slower (a new batch shape's first, a hiccup) is one small step.
    live.observe(2, 256, 0.59)
    assert live.at(256).cost(2) < 1.01 * curve.cost(2)
    fresh = LiveCurve(measured)
    fresh.observe(2, 256, 0.56)
    assert fresh.at(256).cost(2) < 1.07 * measured.cost(2)


@pytest.mark.unit
def test_a_live_curve_replans_only_where_a_price_moved():
    """A replan is a few dozen numpy calls, 0.1-0.4 ms of a CPU iteration whose caches the
    forward has just evicted: the plan is kept until a correction moves by more than TOLERANCE
    from the one it was made with, a size seen for the first time included (it was priced with
    its neighbours' correction, none here), so a first forward near its price replans nothing."""
    from localspec.llama.live import TOLERANCE, LiveCurve

    measured = CostCurve([0.040, 0.056, 0.072, 0.088], 256)
    live = LiveCurve(measured)
    plan = live.at(256)
    live.observe(2, 256, 0.056 * 1.1)  # 10% dearer: a fifth of it after one forward (shrunk)
    assert live.at(256) is plan
    live.observe(2, 256, 0.056 * 1.1)  # a third of it after two: past TOLERANCE
    assert live.at(256) is not plan and live.at(256).cost(2) > 0.056 * math.exp(TOLERANCE)


@pytest.mark.unit
def test_a_live_curve_resumes_what_an_earlier_run_learnt():
    """What the loop's forwards taught a live curve is kept when the engine closes (as JSON)
    and the next start's live curve begins from it, counted as a few forwards: its first wide
    batch is priced as the loop pays it, and its own forwards soon outweigh the record. A
    record that is not one (a cache file edited by hand) leaves the curve uncorrected."""
    import json

    from localspec.llama.live import CARRIED, LiveCurve

    measured = CostCurve([0.040, 0.056, 0.072, 0.088], 256)
    live = LiveCurve(measured)
    for _ in range(60):
        live.observe(1, 256, 0.040)
        live.observe(4, 256, 0.088 * 1.15)  # a wide batch 15% dearer in the loop
    learned = json.loads(json.dumps(live.learned()))
    resumed = LiveCurve(measured)
    resumed.resume(learned)
    assert resumed.count[0][3] == CARRIED and resumed.count[0][1] == 0
    assert resumed.at(256).cost(4) == pytest.approx(0.088 * 1.15 ** (CARRIED / (CARRIED + 4)), rel=1e-6)
    assert resumed.at(256).cost(1) == pytest.approx(0.040) and LiveCurve(measured).at(256).cost(4) == 0.088
    again = LiveCurve(measured)  # a run that drafted no 4 rows: the next start has less of it
    again.resume(json.loads(json.dumps(resumed.learned())))
    assert again.count[0][3] == CARRIED / 2
    for _ in range(48):
        resumed.observe(4, 256, 0.088)  # this run's machine: as measured
    assert resumed.at(256).cost(4) < 0.088 * 1.15 ** (CARRIED / (CARRIED + 48))  # a mean over both
    for broken in ({"same": {"4": ["x", 0.1]}}, {"same": [1, 2]}, {"sideways": {"4": [3, 0.1]}}, None, "text",
                   {"same": {"4": [3, float("nan")]}}, {"same": {"99": [3, 0.1]}}, {"same": {"4": [-2, 0.1]}}):
        fresh = LiveCurve(measured)
        fresh.resume(broken)
        assert fresh.at(256).seconds == measured.seconds, broken


@pytest.mark.unit
def test_padded_shapes_price_a_forward_after_another_shape_and_stay_where_that_costs_less():
    """On a GPU a batch whose shape differs from the last forward's runs without the graph the
    last one reused (H200, a 30B-A3B MoE: one row 3.5 ms after one row, 9.4 after 16 rows; 16
    rows 12.9 after 16, 17.9 after one row). With padded shapes the live curve learns both
    prices, prices each size after the last forward's shape, and a smaller batch stays in
    that shape, padded, where leaving and coming back costs more than staying."""
    from localspec.drafters.base import Budget
    from localspec.llama.live import LiveCurve
    from localspec.verify import DraftTree

    shapes = (1, 2, 4, 8, 16)
    base = CostCurve([0.0035, 0.0045, 0.0060, 0.0060, 0.0085, 0.0085, 0.0085, 0.0085] + [0.0129] * 8, 256)

    def machine(same: dict[int, float], after_another: dict[int, float]):
        """A live curve and a forward that costs what the machine charges for the shape the
        curve pads it to."""
        live = LiveCurve(replace(base, seconds=[same.get(n, x) for n, x in enumerate(base.seconds, 1)]))
        live.pad_with(shapes)

        def forward(n: int, speculating: bool = True) -> None:
            shape = live.pad_to(n, 256) if speculating else live.shape(n)
            live.observe(shape, 256, (same if shape == live.last_shape else after_another)[shape])
        return live, forward

    moe, forward = machine({1: 0.0035, 16: 0.0129}, {1: 0.0094, 16: 0.0179})
    assert moe.at(256).cost(16) == 0.0129 and moe.pad_to(3, 256) == 4  # nothing seen: the base
    for _ in range(60):  # 16-row steps and a no-draft step in every third, padded once it pays
        for n in (1, 16, 16):
            forward(n)
    assert moe.last_shape == 16
    after_16 = moe.at(256)
    # A no-draft step costs 9.4 ms and the next 16 rows 5 ms more: it stays in 16 rows.
    assert moe.pad_to(1, 256) == 16 and after_16.cost(1) == after_16.cost(16) == pytest.approx(0.0129, rel=0.05)
    for _ in range(60):  # plain steps (no drafter chose) after plain steps
        forward(1, speculating=False)
    after_1 = moe.at(256)
    assert moe.last_shape == 1 and after_1.cost(1) == pytest.approx(0.0035, rel=0.05)
    assert after_1.cost(16) == pytest.approx(0.0179, rel=0.05)  # 16 rows after one row
    assert moe.pad_to(1, 256) == 1 and moe.pad_to(5, 256) == 8  # in a plain run, a no-draft step stays too
    # A chain of 4 with reach 0.6 each: 3.4 tokens for 17.9 ms after a plain step does not
    # pay; for 12.9 ms in a run of 16-row steps it does.
    chain = DraftTree(np.arange(4), np.array([-1, 0, 1, 2]), np.full(4, 0.6))
    assert len(Budget(after_1, 8).size(chain)) == 0
    forward(16)
    assert len(Budget(moe.at(256), 8).size(chain)) == 4
    # Where staying costs more than leaving (a dense 7B: one row 4.8 ms after 16 rows, 16 rows
    # 9.7 after one, 7.7 after 16), a no-draft step leaves.
    dense, forward = machine({1: 0.0037, 16: 0.0077}, {1: 0.0048, 16: 0.0097})
    for _ in range(60):
        for n in (1, 16, 16):
            forward(n)
    assert dense.pad_to(1, 256) == 1 and dense.at(256).cost(1) == pytest.approx(0.0048 + 0.0020, rel=0.1)
    # Without padded shapes (a CPU) one correction per size, as before.
    plain = LiveCurve(base)
    for n, seconds in ((1, 0.0094), (16, 0.0179)) * 60:  # every forward after another size
        plain.observe(n, 256, seconds)
    assert plain.last_shape == 0 and plain.pad_to(1, 256) == 1
    assert plain.at(256).cost(1) == pytest.approx(0.0094, rel=0.1)


def test_layers_that_fit_a_gpu(qwen_path, monkeypatch):
    """With a GPU build, a model goes where it fits: every layer, a share, or none. The
    arithmetic reads the model's metadata (asking a model loaded without weights for its layer
    hyperparameters aborts llama.cpp, as it did on the first GPU run). No GPU here: its free
    memory is given."""
    from localspec.llama import placement

    size = qwen_path.stat().st_size
    for free, expect in ((16 << 30, placement.ALL_LAYERS), (size // 2 + placement.RESERVE, range(1, 24)),
                         (placement.RESERVE // 2, range(0, 1))):
        monkeypatch.setattr(placement, "gpus", lambda: [("a GPU", free, 16 << 30)])
        n = placement.layers_that_fit(qwen_path, 4096)
        assert n == expect if isinstance(expect, int) else n in expect, (free, n)


@pytest.mark.unit
def test_a_curve_from_another_machine_as_json_or_as_the_printed_table(tmp_path, capsys):
    """`--curve FILE` takes the JSON `localspec cost` caches or the table it prints; anything
    else is one line."""
    from localspec.errors import LocalspecError
    from localspec.llama.curve import read_curve

    curve = read_curve(Path(__file__).parent / "data" / "smollm2-2-threads.curve.json")
    table = tmp_path / "h200.txt"
    table.write_text("cost curve of rand-7b.gguf (16 threads, after 256 tokens of context; cached in x)\n"
                     "| batch | ms/forward | × batch of 1 | after 4,096 tokens: ms | × batch of 1 |\n"
                     "|---:|---:|---:|---:|---:|\n| 1 | 4.4 | 1.00 | 6.4 | 1.00 |\n| 2 | 4.8 | 1.08 | 7.2 | 1.12 |\n")
    printed = read_curve(table)
    assert printed.seconds == [0.0044, 0.0048] and printed.n_context == 256
    assert printed.at(4096).cost(2) == pytest.approx(0.0072)
    # A forward wider than the curve (a draft model catching up): its widest batch per token.
    assert printed.price(1, 4096) == pytest.approx(0.0064) and printed.price(6, 256) == pytest.approx(0.0144)
    assert len(curve.seconds) == 64 and curve.per_context
    (tmp_path / "bad.json").write_text("{\"seconds\": \"fast\"}")
    (tmp_path / "negative.json").write_text("{\"seconds\": [0.01, -0.02], \"n_context\": 256}")
    for bad in (tmp_path / "bad.json", tmp_path / "negative.json", tmp_path / "missing.json",
                Path(__file__).parent / "conftest.py"):
        with pytest.raises(LocalspecError, match="not a cost curve"):
            read_curve(bad)
    from localspec.cli import main
    missing = str(tmp_path / "missing.gguf")  # the bench refuses before any model loads
    assert main(["bench", "-m", missing, "--draft-curve", str(table)]) == 1
    assert "give both" in capsys.readouterr().err
    assert main(["bench", "-m", missing, "--curve", str(table), "--draft-curve", str(tmp_path / "bad.json")]) == 1
    assert "not a cost curve" in capsys.readouterr().err


def test_a_new_model_starts_on_a_quick_curve_and_measures_the_whole_one_between_requests(
        tiny_moe_path, tmp_path, monkeypatch):
    """A first start plans on a coarse curve measured in seconds; the whole curve is measured
    in a context of its own between requests, a forward at a time, without touching what they
    answer, then cached and planned on (by the same LiveCurve every drafter's budget holds).
    On a tiny random-weight model: the whole curve is some 400 forwards of up to 64 rows, a
    minute of SmolLM2's on two cores, and nothing here depends on what the weights say."""
    import json

    from localspec.drafters.spec import DrafterSpec
    from localspec.engine import Engine, EngineConfig, Request
    from localspec.llama.curve_cache import cache_path

    from localspec.llama import planning
    from localspec.llama.measure import measure

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    # The whole measurement, each size timed fewer times: its steps and turns are the same.
    monkeypatch.setattr(planning, "measure", functools.partial(measure, repeats=2))
    config = EngineConfig(model=str(tiny_moe_path), n_ctx=512, threads=2, drafter=DrafterSpec("lookup"),
                          refine_curve=True)
    request = Request(prompt="Count from 1 to 40: 1, 2, 3,", sampling=SamplingConfig(temperature=0.0), max_tokens=24)
    engine = Engine(config)
    try:
        live = engine.planning.prepare()
        assert live.base.coarse and len(live.seconds) == 64
        assert all(a <= b for a, b in zip(live.base.seconds, live.base.seconds[1:]))
        assert json.loads(cache_path(engine.ctx).read_text())["coarse"]
        first = list(engine.generate(request))[-1].tokens
        deadline = time.time() + 900
        for _ in range(3):  # requests between its forwards
            time.sleep(1.5)  # idle long enough for its turn
            assert list(engine.generate(request))[-1].tokens == first
        while live.base.coarse and time.time() < deadline:
            time.sleep(0.5)
        assert not live.base.coarse and engine.curve is live
        assert engine.exactness() == (live.base.discrepancy, live.base.exact_batch) and live.base.discrepancy >= 0
        cached = json.loads(cache_path(engine.ctx).read_text())
        assert not cached["coarse"] and cached["seconds"] == live.base.seconds
    finally:
        engine.close()
    engine = Engine(config)
    try:
        assert not engine.planning.prepare().base.coarse and engine.planning._refiner is None  # the cached whole curve
    finally:
        engine.close()
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "again"))
    engine = Engine(config)
    assert engine.planning.prepare().base.coarse and engine.planning.refining.wait(60)
    engine.close()  # closes mid-measurement: the measuring thread ends with it, the curve not kept
    assert not engine.planning._refiner.is_alive() and engine.curve.base.coarse
    assert json.loads(cache_path(engine.ctx).read_text())["coarse"]


def test_an_engine_nothing_closes_is_freed_without_the_collector(small_path):
    """A script that never closes its engine frees it with the script's globals: nothing the
    engine's parts hold refers back to it (a cycle leaves it to the interpreter's last
    collection, where a native runtime's teardown crashed the process: seen with a bound
    method of the engine handed to its planning)."""
    import gc
    import weakref

    from localspec.drafters.spec import DrafterSpec
    from localspec.engine import Engine, EngineConfig, Request

    engine = Engine(EngineConfig(model=str(small_path), threads=1, n_ctx=512, store="off", drafter=DrafterSpec("lookup")))
    list(engine.generate(Request(prompt="1, 2, 3,", sampling=SamplingConfig(temperature=0.0), max_tokens=8)))
    alive = weakref.ref(engine)
    gc.disable()
    try:
        del engine
        assert alive() is None
    finally:
        gc.enable()


def test_a_target_on_the_cpu_runs_without_flash_attention_unless_asked(small_path):
    """ggml's CPU flash attention walks the cache once per row of a batch, so the engine turns
    it off for a target on the CPU (cpu_flash_attn); asked for it, or strict, it keeps it. A
    draft model's context follows the target's choice."""
    from localspec.drafters.spec import DrafterSpec
    from localspec.engine import Engine, EngineConfig, cpu_flash_attn

    for asked, strict, runs in (("auto", False, "off"), ("on", False, "on"), ("auto", True, "auto")):
        assert cpu_flash_attn(EngineConfig(flash_attn=asked, strict=strict)) == runs
    engine = Engine(EngineConfig(model=str(small_path), threads=1, n_ctx=512, store="off", drafter=DrafterSpec("lookup")))
    try:
        assert engine.ctx.config.flash_attn == "off"
        assert engine.drafters.draft_context(small_path).config.flash_attn == "off"
    finally:
        engine.close()
