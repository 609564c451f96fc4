"""A Mixture-of-Experts target (qwen3moe, as Qwen3-30B-A3B; a tiny random-weight GGUF made by
random_gguf.py): every drafter that applies gives plain decoding's greedy output, or leaves it
first at a measured near-tie, as on a dense target. Its router picks experts per token, so a
verification batch wakes experts that single tokens would not: the output must not care."""

from __future__ import annotations

import pytest

from localspec.bench.runner import near_tie, run_ours
from localspec.drafters.spec import NONE, DrafterSpec
from localspec.engine import Engine, EngineConfig
from localspec.sampling import SamplingConfig

from test_speculative import PROMPTS

GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def moe_engine(tiny_moe_path):
    engine = Engine(EngineConfig(model=str(tiny_moe_path), n_ctx=2048, threads=2))
    yield engine
    engine.close()


def test_a_moe_target_loads_as_one(moe_engine):
    assert moe_engine.model.architecture == "qwen3moe" and not moe_engine.model.recurrent


# SmolLM2 shares the tiny MoE's tokenizer (random_gguf.py copies it): a draft model for it.
# The draft model at a static K: the tiny target's forward costs less than the draft model's,
# so a cost-aware draft model drafts or not by the timings of the moment (CI once saw none).
@pytest.mark.parametrize("drafter", ["lookup", "suffix", "lookup@16", "auto", "draft:smollm2-135m-instruct@4"])
def test_greedy_on_a_moe_target_is_plain_decodings(moe_engine, drafter):
    spec = DrafterSpec.parse(drafter)
    moe_engine.prepare(spec)
    drafted = 0
    for prompt in PROMPTS[:4]:
        tokens = moe_engine.model.tokenize(prompt)
        ref, _ = run_ours(moe_engine, tokens, NONE, 64, GREEDY)
        out, run = run_ours(moe_engine, tokens, spec, 64, GREEDY)
        drafted += run.drafted
        if out != ref:
            assert near_tie(moe_engine, tokens, ref, out), (drafter, prompt)
    if drafter != "auto":  # random weights repeat themselves: every drafter finds drafts
        assert drafted > 0
