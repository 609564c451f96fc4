"""The exact head (native/head.h): on the CPU, greedy's argmax from a 4-bit copy of the output
layer and the few rows that could beat it, computed as llama.cpp computes them. Every row's
argmax is the whole layer's, so greedy output with it is greedy output without it, plain and
speculative, on a real model (Qwen2.5-Coder-0.5B, its output layer Q8_0) and on a random MoE
quantized as llama.cpp's Q4_K_M (its output layer Q6_K, the type most GGUFs ship)."""

from __future__ import annotations

import ctypes
import math

import llama_cpp as ll
import numpy as np
import pytest

from localspec import _native
from localspec.bench.runner import run_ours
from localspec.drafters.spec import NONE, DrafterSpec
from localspec.engine import Engine, EngineConfig
from localspec.llama import Context, Model, gguf
from localspec.llama import model as model_module
from localspec.llama.context import ContextConfig, hidden_rows
from localspec.sampling import SamplingConfig

from test_speculative import PROMPTS

GREEDY = SamplingConfig(temperature=0.0)
Q4_0, Q4_K = 2, 12  # ggml's type ids


@pytest.fixture(scope="module")
def q6k_path(tmp_path_factory, small_path):
    """A small random qwen3moe quantized by llama.cpp as Q4_K_M: its output layer Q6_K."""
    from random_gguf import make
    folder = tmp_path_factory.mktemp("head")
    f32 = make("qwen3moe", "small", folder / "f32.gguf", tokenizer=small_path)
    out = folder / "q4_k_m.gguf"
    params = ll.llama_model_quantize_default_params()
    params.ftype = ll.LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert ll.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params)) == 0
    assert next(t.type for t in gguf.read_header(out).tensors if t.name == "output.weight") == 14  # Q6_K
    return out


@pytest.fixture
def head_always_pays(monkeypatch):
    """A random model's head is used whatever its timing says (a small vocabulary's may not pay)."""
    monkeypatch.setattr(model_module, "HEAD_PAYS", math.inf)


@pytest.mark.parametrize("which", ["qwen", "q6k"])
def test_every_rows_argmax_is_the_whole_layers(which, qwen_path, q6k_path, head_always_pays):
    path = qwen_path if which == "qwen" else q6k_path
    with Model(path) as model, Context(model, ContextConfig(n_ctx=512, embeddings=True)) as ctx:
        head = model.exact_head(2)
        assert head is not None, model.head_note
        text = " ".join(PROMPTS[:6])
        tokens = model.tokenize(text)[:200]
        ctx.decode(tokens, range(len(tokens)), outputs=[True] * len(tokens))
        hidden = np.ascontiguousarray(hidden_rows(ctx, range(len(tokens))))
        want = [int(np.argmax(ctx.logits(r))) for r in range(len(tokens))]
        assert head.argmax(hidden) == want
        assert head.rescored < head.rows * model.n_vocab / 4  # it skipped most of the layer
        # The second bound, focused on the dimensions four rows carry their energy in, keeps
        # every argmax and computes fewer rows exactly.
        first_bound = head.rescored
        head.focus(hidden[:4])
        assert head.argmax(hidden) == want
        assert head.rescored - first_bound < first_bound / 2
        assert head.decide_seconds > 0
        # ... on more dimensions too (bench/s56/head_dims.py.txt weighs them), a head of its own
        wider, _ = model.build_head(2)
        wider.focus(hidden[:4], 64)
        assert wider.argmax(hidden) == want
        assert wider.rescored < first_bound / 2
        # The copy is the 4-bit type whose matmul quantizes h as the exact type's does (Q8_0's
        # Q4_0, Q6_K's Q4_K); a Q4_0 copy of the Q6_K layer, whose h differs (Q8_0 against Q8_K;
        # bench/s57/head_copy.py.txt), is exact too. (The 0.5B's rows, 896 wide, take no Q4_K.)
        assert head.copy_type == (Q4_0 if which == "qwen" else Q4_K)
        if which == "q6k":
            other, note = model.build_head(2, Q4_0)
            assert other is not None, note
            other.focus(hidden[:4])
            assert other.argmax(hidden) == want
            assert other.rescored > head.rescored - first_bound  # its focused pass


# "features": the context returns hidden states, as for a Jakiro drafter, and llama.cpp then
# outputs every row of a batch whatever it asked for (a prompt's last chunk: all of its rows).
@pytest.mark.parametrize("which", ["qwen", "qwen-features", "q6k"])
def test_greedy_with_the_head_is_greedy_without(which, qwen_path, q6k_path, head_always_pays):
    path = q6k_path if which == "q6k" else qwen_path
    outputs = {}
    for exact_head in (False, True):
        engine = Engine(EngineConfig(model=str(path), n_ctx=2048, threads=2, exact_head=exact_head,
                                     features=which == "qwen-features" or None))
        try:
            assert engine.ctx.exact_head == exact_head, engine.model.head_note
            for drafter in ("none", "lookup", "suffix", "auto"):
                spec = NONE if drafter == "none" else DrafterSpec.parse(drafter)
                engine.prepare(spec)
                for prompt in PROMPTS[:3]:
                    out, _ = run_ours(engine, engine.model.tokenize(prompt), spec, 48, GREEDY)
                    outputs[exact_head, drafter, prompt] = out
            if exact_head:
                assert engine.model.exact_head(2).rows > 0  # it decided the rows
        finally:
            engine.close()
    for (exact_head, drafter, prompt), out in outputs.items():
        assert out == outputs[False, "none", prompt], (exact_head, drafter, prompt)


def test_sampling_reads_the_whole_layer(qwen_path):
    """T > 0 needs every logit: the head stays off for it, on for the greedy request after."""
    engine = Engine(EngineConfig(model=str(qwen_path), n_ctx=1024, threads=2))
    try:
        tokens = engine.model.tokenize(PROMPTS[0])
        run_ours(engine, tokens, NONE, 8, SamplingConfig(temperature=0.8, seed=1))
        assert engine.ctx.rows_from == 0
        run_ours(engine, tokens, NONE, 8, GREEDY)
        assert engine.ctx.rows_from == 1 and engine.ctx.exact_head
    finally:
        engine.close()


def test_a_head_that_is_not_the_models_is_refused(q6k_path, head_always_pays):
    """Its start checks the head against llama.cpp's own logits: one built over another matrix
    (here the token embeddings) is not bound, and the context reads whole rows."""
    with Model(q6k_path) as model:
        header = gguf.read_header(model.path)
        embd = next(t for t in header.tensors if t.name == "token_embd.weight")
        weights = np.memmap(model.path, mode="r")
        wrong = _native.ExactHead(weights.ctypes.data + header.data_start + embd.offset, embd.type,
                                  model.n_embd, model.n_vocab, 2)
        model._head = (wrong, "another matrix")
        with Context(model, ContextConfig(n_ctx=256, exact_head=True)) as ctx:
            assert not ctx.exact_head
            _, logits = ctx.prefill(model.tokenize(PROMPTS[0]))  # the whole layer's
            assert np.isfinite(logits).all() and len(np.unique(logits)) > 1000


def test_wide_forwards_read_the_whole_layer(qwen_path):
    """From WHOLE_LAYER_ROWS output rows a forward runs llama.cpp's whole output layer (its
    matmul reuses weights across rows, where the copy stops paying): its rows read the same."""
    with Model(qwen_path) as model, Context(model, ContextConfig(n_ctx=512)) as whole, \
            Context(model, ContextConfig(n_ctx=512, exact_head=True)) as ctx:
        assert ctx.exact_head
        tokens = model.tokenize(" ".join(PROMPTS))[:60]
        for n in (60, 20):  # over the threshold (48), and under it
            whole.clear()
            whole.decode(tokens[:n], range(n), outputs=[True] * n)
            want = [int(np.argmax(whole.logits(r))) for r in range(n)]
            ctx.clear()
            ctx.sample_on_device(0)
            ctx.decode(tokens[:n], range(n), outputs=[True] * n)
            assert [_native.sampled_token(ctx.ptr, r) for r in range(n)] == want, n


def test_hidden_states_come_back_with_the_head(qwen_path):
    """Feature drafters (Jakiro) read the output layer's input: the head stops the graph right
    after it, and the rows it hands back are the same."""
    with Model(qwen_path) as model, Context(model, ContextConfig(n_ctx=512, embeddings=True)) as whole, \
            Context(model, ContextConfig(n_ctx=512, embeddings=True, exact_head=True)) as ctx:
        assert ctx.exact_head
        tokens = model.tokenize(PROMPTS[1])
        n = len(tokens)
        whole.decode(tokens, range(n), outputs=[True] * n)
        ctx.sample_on_device(0)
        ctx.decode(tokens, range(n), outputs=[True] * n)
        assert np.array_equal(hidden_rows(ctx, range(n)), hidden_rows(whole, range(n)))
        assert [_native.sampled_token(ctx.ptr, r) for r in range(n)] == \
            [int(np.argmax(whole.logits(r))) for r in range(n)]
