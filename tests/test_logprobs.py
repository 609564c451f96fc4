"""Log-probabilities of generated tokens (OpenAI's logprobs): each token's, read off the row
verification drew it from, must be what plain decoding's single-token forward gives it, with
drafts accepted from chains, trees, and a hybrid's trees verified flattened (whose nodes sit in
rows of their own order)."""

from __future__ import annotations

import numpy as np

from localspec.bench.synthetic import SyntheticDrafter
from localspec.control.controllers import Fixed, Plain
from localspec.drafters.base import Budget
from localspec.drafters.lookup import LookupDrafter
from localspec.engine import Engine, EngineConfig, Request
from localspec.llama.context import Context, ContextConfig
from localspec.loop import RunOptions, Stats, run
from localspec.sampling import SamplingConfig, token_logprob

from random_gguf import make

PROMPT = ("Copy the list.\nList: apple, pear, plum, fig, kiwi, lime, date, yam\n"
          "Copy: apple, pear, plum, fig, kiwi, lime, date, yam\n"
          "List: red, blue, green, pink, gold, teal, gray, navy\nCopy:")  # copied, then repeated


def single_token_logprobs(model, prompt: list[int], tokens: list[int], k: int, threads: int,
                          flash_attn: str = "auto") -> list:
    """Each token's log-probability from a fresh context fed one token at a time (numpy's own
    log-softmax, not the engine's), with its k likeliest alternatives; `flash_attn` as the
    context under test has it (the two kernels round differently)."""
    out = []
    with Context(model, ContextConfig(n_ctx=1024, n_threads=threads, flash_attn=flash_attn)) as ctx:
        _, last = ctx.prefill(prompt)
        for token in tokens:
            row = np.asarray(last, np.float64)
            norm = row.max() + np.log(np.exp(row - row.max()).sum())
            best = np.argsort(-row, kind="stable")[:k]
            out.append((token, row[token] - norm, [(int(i), row[i] - norm) for i in best]))
            ctx.append(token)
            last = ctx.logits(0)
    return out


def generated(ctx: Context, controller, prompt: list[int], sampling: SamplingConfig, n: int):
    stats, tokens, logprobs = Stats(), [], []
    for it in run(ctx, controller, prompt, sampling, n, stats, RunOptions(stop_at_eog=False)):
        tokens += it.tokens
        logprobs += it.logprobs
    return tokens, logprobs, stats


def assert_close(logprobs, expected, tol: float) -> None:
    assert [lp.token for lp in logprobs] == [t for t, _, _ in expected]
    for lp, (_, want, top) in zip(logprobs, expected):
        assert abs(lp.logprob - want) <= tol
        assert [t for t, _ in lp.top] == [t for t, _ in top] or abs(top[-1][1] - top[-2][1]) <= tol
        assert np.allclose([p for _, p in lp.top], [p for _, p in top], atol=tol)


def test_a_speculative_answers_logprobs_are_plain_decodings(target):
    """SmolLM2 on one thread (batched rows are single tokens' bit for bit), prompt lookup's
    trees, greedy and at T = 0.8: every token's log-probability and alternatives are a
    single-token forward's."""
    prompt = target.model.tokenize(PROMPT)
    sixteen = Budget(CostFree(), target.n_paths, 16, static=True)
    for sampling in (SamplingConfig(logprobs=3), SamplingConfig(temperature=0.8, seed=3, logprobs=2)):
        target.clear()
        plain, plain_lps, _ = generated(target, Plain(), prompt, sampling, 40)
        target.clear()
        tokens, lps, stats = generated(target, Fixed(LookupDrafter(), sixteen, "lookup"), prompt, sampling, 40)
        assert stats.draft_n_accepted > 10
        expected = single_token_logprobs(target.model, prompt, tokens, sampling.logprobs, threads=1)
        assert_close(lps, expected, 1e-6)
        if sampling.temperature == 0:
            assert tokens == plain and all(lp.top[0][0] == lp.token for lp in lps)
            assert_close(plain_lps, expected, 1e-6)


class CostFree:
    """A cost model where every batch costs one forward (only a static budget reads it)."""
    seconds = [1.0] * 65

    def at(self, n_context: int):
        return self

    def cost(self, n: int) -> float:
        return 1.0


def test_a_hybrids_flattened_trees_give_each_token_its_own_rows_logprob(tmp_path, small_path):
    """A qwen35 verifies trees flattened, each path in rows of its own: a token's
    log-probability comes from the row of the node that drew it, within what batched rows are
    measured to differ by (a row of another node would be off by far more)."""
    path = make("qwen35", "tiny", tmp_path / "qwen35.gguf", tokenizer=small_path)
    engine = Engine(EngineConfig(model=str(path), n_ctx=1024, threads=2))
    try:
        ctx = engine.ctx
        assert ctx.flat
        prompt = engine.model.tokenize(PROMPT)
        sampling = SamplingConfig(logprobs=2)
        truth, _, _ = generated(ctx, Plain(), prompt, sampling, 32)
        ctx.clear()
        drafter = SyntheticDrafter(prompt + truth, [0.9, 0.8, 0.7, 0.6], engine.model.n_vocab, branches=2)
        budget = Budget(engine.planning.prepare(), ctx.n_paths, 8, static=True, flat=True)
        tokens, lps, stats = generated(ctx, Fixed(drafter, budget, "tree"), prompt, sampling, 32)
        assert stats.draft_n_accepted > 5
        bound = 2 * engine.exactness()[0] + 1e-4
        expected = single_token_logprobs(engine.model, prompt, tokens, 2, threads=2,
                                         flash_attn=ctx.config.flash_attn)
        for lp, (_, want, _) in zip(lps, expected):
            assert abs(lp.logprob - want) <= bound
        spread = np.std([want for _, want, _ in expected])
        assert bound < spread  # the check can tell one row from another
    finally:
        engine.close()


def test_token_logprob_is_a_log_softmax():
    logits = np.array([1.0, 3.0, 3.0, -2.0], np.float32)
    lp = token_logprob(logits, 3, 2)
    z = np.log(np.exp(logits.astype(np.float64)).sum())
    assert abs(lp.logprob - (-2.0 - z)) < 1e-6
    assert [t for t, _ in lp.top] == [1, 2]  # a tie: the lower id first
    assert np.allclose([p for _, p in lp.top], [3.0 - z, 3.0 - z], rtol=0, atol=1e-6)
    assert token_logprob(logits, 0, 0).top == ()


def test_an_impossible_token_or_a_row_of_nan_gives_a_number_json_can_carry():
    logits = np.array([0.0, -np.inf, 1.0], np.float32)
    assert token_logprob(logits, 1, 3).logprob == -9999.0 and token_logprob(logits, 1, 3).top[-1] == (1, -9999.0)
    nan = token_logprob(np.full(4, np.nan, np.float32), 2, 2)
    assert nan.logprob == -9999.0 and all(p == -9999.0 for _, p in nan.top)


def test_a_stop_strings_tokens_carry_no_logprobs(small_path):
    """A token's log-probability comes with its text, so a stop string's tokens, whose text is
    never given out, carry none (as in llama-server's answers); one whose text runs into the
    stop string does. Without a stop, every token written has one."""
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=2, store=":memory:",
                                 refine_curve=False))
    try:
        def answer(stop: tuple[str, ...]) -> tuple[str, list[str]]:
            *events, done = engine.generate(Request(prompt=PROMPT, max_tokens=24, stop=stop, ignore_eog=True,
                                                    sampling=SamplingConfig(logprobs=0)))
            pieces = [engine.model.token_bytes(lp.token).decode("utf-8", "replace")
                      for e in events for lp in e.logprobs]
            assert len(pieces) <= len(done.tokens)
            return done.text, pieces

        whole, pieces = answer(())
        assert "".join(pieces) == whole and len(pieces) == 24
        for stop in (whole[9:14], whole[10:12]):
            text, pieces = answer((stop,))
            assert text == whole[:whole.index(stop)]
            starts = [len("".join(pieces[:i])) for i in range(len(pieces))]
            assert "".join(pieces).startswith(text) and all(start < len(text) for start in starts)
            assert len("".join(pieces)) >= len(text)
    finally:
        engine.close()
