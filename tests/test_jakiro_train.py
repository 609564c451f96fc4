"""Jakiro training pipeline on SmolLM2-135M: corpus masks, llama.cpp features (cached,
resumable), a tiny drafter trained from scratch, GGUF round trip, wrong-target refusal."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localspec.cli import main  # noqa: E402
from localspec.convert import inspect_gguf, read_gguf, write_gguf  # noqa: E402
from localspec.drafters.files import check_target  # noqa: E402
from localspec.drafters.jakiro_config import JakiroConfig  # noqa: E402
from localspec.llama import Context  # noqa: E402
from localspec.llama.context import ContextConfig  # noqa: E402
from localspec.errors import LocalspecError  # noqa: E402
from localspec.train.corpus import chat_example, code_examples  # noqa: E402
from localspec.train.features import FeatureStore  # noqa: E402
from localspec.train.jakiro import sequence_loss  # noqa: E402
from localspec.train.jakiro_net import JakiroNet, init_weights  # noqa: E402
from localspec.drafters.jakiro import JakiroDrafter, JakiroRuntime  # noqa: E402
from localspec.sampling import SamplingConfig  # noqa: E402
from localspec.loop import Stats  # noqa: E402
from test_speculative import PROMPTS, plain, speculative  # noqa: E402


def test_chat_mask_covers_exactly_the_assistant_turns(small_model):
    conv = {"id": "x", "conversations": [
        {"from": "human", "value": "Name a prime number."},
        {"from": "gpt", "value": "Seven is prime."},
        {"from": "human", "value": "And an even one?"},
        {"from": "gpt", "value": "Two."}]}
    ex = chat_example(small_model, conv, max_tokens=512)
    learnt = small_model.detokenize(ex.tokens[ex.mask].tolist(), special=True)
    assert "Seven is prime." in learnt and "Two." in learnt
    assert "Name a prime" not in learnt and "even one" not in learnt
    assert len(ex.tokens) == len(ex.mask)


def test_conversations_the_assistant_opens_are_skipped(qwen_model):
    # Qwen's template cannot render the empty history before such a turn.
    conv = {"id": "y", "conversations": [{"from": "gpt", "value": "Hello! How can I help?"},
                                         {"from": "human", "value": "Sort a list."},
                                         {"from": "gpt", "value": "Use sorted()."}]}
    assert chat_example(qwen_model, conv, max_tokens=512) is None


def test_features_are_the_models_hidden_states_and_extraction_resumes(small_model, tmp_path):
    examples = list(itertools.islice(code_examples(small_model, max_tokens=128), 6))
    store = FeatureStore(tmp_path, small_model)
    first = list(store.extract(iter(examples), max_tokens=250, shard_tokens=200))
    assert len(first) == 1 and store.manifest["n_examples"] == 2
    # A new store over the same folder continues after the examples already consumed.
    again = FeatureStore(tmp_path, small_model)
    more = list(again.extract(iter(examples), max_tokens=500, shard_tokens=200))
    assert again.manifest["n_examples"] == 4 and len(more) == 1
    shard = again.shards()[1]
    tokens, _, hidden = shard.example(0)
    assert (tokens == examples[2].tokens).all()
    # Decoded as extraction decodes it (one prompt-sized batch: the same matrix kernels).
    with Context(small_model, ContextConfig(n_ctx=512, embeddings=True)) as ctx:
        row = ctx.extend(tokens.tolist())
        np.testing.assert_allclose(hidden[-1], ctx.hidden(row), atol=2e-2, rtol=1e-2)  # f16 storage
    # Damaged by something else (a disk error, a hand): one line naming the folder, nothing removed.
    kept = sorted(p.name for p in again.dir.iterdir())
    (again.dir / "shard-00001.hidden.npy").write_bytes(b"\x93NUMPY torn")
    with pytest.raises(LocalspecError, match="features in .* are damaged .*shard-00001.*move that folder aside"):
        FeatureStore(tmp_path, small_model).shards()
    again.manifest_path.write_text('{"target": "smol", "shards": [{"na')
    with pytest.raises(LocalspecError, match="damaged .*manifest.json"):
        FeatureStore(tmp_path, small_model)
    assert sorted(p.name for p in again.dir.iterdir()) == kept


def tiny_config(small_model, **kw) -> JakiroConfig:
    return JakiroConfig(target_name="smol", target_vocab=small_model.n_vocab,
                        target_tokenizer=small_model.tokenizer_hash, d_model=small_model.n_embd,
                        n_heads=9, rope_theta=10000.0, **kw)


def random_net(cfg: JakiroConfig, seed: int = 0) -> JakiroNet:
    g = np.random.default_rng(seed)
    net = JakiroNet(cfg, g.normal(size=(cfg.target_vocab, cfg.d_model)).astype(np.float32),
                    g.normal(size=(cfg.n_draft_vocab, cfg.d_model)).astype(np.float32))
    init_weights(net, seed)
    return net


def test_cepd_and_branch_features_follow_the_definitions(small_model):
    cfg = tiny_config(small_model, n_experts=3)
    net = random_net(cfg)
    feats = torch.randn(5, cfg.d_model)
    tokens = torch.tensor([1, 2, 3, 4, 5])
    with torch.no_grad():
        u, e_a, e_b, s_a, s_b, _ = net.step(feats, tokens, torch.arange(5))
        f_moe, f_ctr = net.features(u, e_a, e_b, s_a, s_b)
        x = net.norm(u)
        scores = torch.softmax(net.router(x), -1)
        experts = torch.stack([e(x) for e in net.experts], 1)
    top = scores.argsort(-1, descending=True)[:, :2]
    for t in range(5):
        a, b = top[t]
        w = scores[t, [a, b]] / scores[t, [a, b]].sum()
        torch.testing.assert_close(f_moe[t], u[t] + w[0] * experts[t, a] + w[1] * experts[t, b])
        torch.testing.assert_close(f_ctr[t], u[t] + 1.2 * experts[t, a] - 0.3 * experts[t, b])


def test_single_expert_baseline_trains_on_the_next_feature_only(small_model):
    cfg = tiny_config(small_model, n_experts=1, top_k=1)
    assert cfg.d_expert == cfg.d_model // 2  # as wide as Jakiro's two activated experts
    net = random_net(cfg)
    T = 12
    g = np.random.default_rng(0)
    tokens = g.integers(0, cfg.target_vocab, T).astype(np.int32)
    hidden = g.normal(size=(T, cfg.d_model)).astype(np.float32)
    loss, stats = sequence_loss(net, tokens, np.ones(T, bool), hidden, 0.0, None)
    loss.backward()
    assert set(stats) == {"reg_moe", "ce_moe", "acc_moe", "loss"}
    assert net.experts[0].down.weight.grad.abs().sum() > 0
    with torch.no_grad():
        u, e_a, e_b, s_a, s_b, _ = net.step(torch.from_numpy(hidden), torch.from_numpy(tokens).long(),
                                            torch.arange(T))
        torch.testing.assert_close(net.features(u, e_a, e_b, s_a, s_b)[0], u + net.experts[0](net.norm(u)))
    with pytest.raises(ValueError, match="two experts"):
        tiny_config(small_model, n_experts=1)  # K = 2 of one expert


@pytest.mark.parametrize("dtype,tol", [("f32", 0.0), ("f16", 2e-3), ("q8_0", 2e-2)])
def test_gguf_round_trip(small_model, tmp_path, dtype, tol):
    cfg = tiny_config(small_model, draft_vocab=list(range(0, 4000, 2)))
    net = random_net(cfg)
    state = {k: v.numpy() for k, v in net.state_dict().items()}
    path = tmp_path / f"d-{dtype}.gguf"
    write_gguf(cfg, state, path, dtype)
    cfg2, state2 = read_gguf(path)
    assert cfg2 == cfg
    for k, v in state.items():
        scale = np.abs(v).max()
        assert np.abs(state2[k] - v).max() <= tol * scale, k
    if dtype == "f32":  # same weights, same outputs
        net2 = JakiroNet(cfg2, net.embed.numpy(), net.head.numpy())
        net2.load_state_dict({k: torch.from_numpy(v) for k, v in state2.items()})
        feats, tokens = torch.randn(7, cfg.d_model), torch.arange(7)
        with torch.no_grad():
            for a, b in zip(net(feats, tokens), net2(feats, tokens)):
                torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_drafter_for_another_target_is_refused(small_model, qwen_model):
    cfg = tiny_config(small_model)
    check_target(cfg, small_model.n_vocab, small_model.n_embd, small_model.tokenizer_hash, "smol")
    with pytest.raises(LocalspecError, match="cannot draft for"):
        check_target(cfg, qwen_model.n_vocab, qwen_model.n_embd, qwen_model.tokenizer_hash, "qwen")


def test_bad_drafter_files_get_one_line_errors(tmp_path, small_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF garbage")
    for path in (tmp_path / "missing.gguf", bad, small_path):
        with pytest.raises(LocalspecError) as e:
            read_gguf(path)
        assert "\n" not in str(e.value)


def test_no_shipped_drafter_is_a_one_line_error(qwen_path, capsys):
    assert main(["generate", "-m", str(qwen_path), "--drafter", "jakiro,width=1",
                 "--max-tokens", "4", "def f():"]) == 1
    err = capsys.readouterr().err.strip()
    assert f"no Jakiro drafter ships for {qwen_path.stem}" in err and "\n" not in err


@pytest.fixture(scope="module")
def tiny_run(small_path, tmp_path_factory):
    """`localspec train jakiro` then `convert` on a reduced corpus: about 45 s here."""
    root = tmp_path_factory.mktemp("tiny-jakiro")
    out = root / "run"
    assert main(["train", "jakiro", "--target", str(small_path), "--out", str(out),
                 "--max-tokens", "4000", "--seq-len", "256", "--epochs", "6", "--lr", "2e-3",
                 "--draft-vocab", "4000", "--threads", "2"]) == 0
    gguf = root / "smol-jakiro.gguf"
    assert main(["convert", str(out / "checkpoint.pt"), str(gguf), "--type", "q8_0"]) == 0
    return out, gguf


def test_a_damaged_checkpoint_is_one_line_for_train_and_convert(tiny_run, small_path, tmp_path, capsys):
    out, _ = tiny_run
    (tmp_path / "run").mkdir()
    damaged = tmp_path / "run" / "checkpoint.pt"
    damaged.write_bytes((out / "checkpoint.pt").read_bytes()[:5000])  # cut off by a crash elsewhere
    capsys.readouterr()
    assert main(["convert", str(damaged), str(tmp_path / "d.gguf")]) == 1
    assert main(["train", "jakiro", "--target", str(small_path), "--out", str(tmp_path / "run"),
                 "--max-tokens", "4000", "--features", str(out / "features")]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    said = [line for line in errors if "error" in line]
    assert len(said) == 2 and all(line.startswith(f"localspec: error: {damaged} is damaged (")
                                  and line.endswith("): move it aside, or restore it") for line in said), errors
    assert damaged.stat().st_size == 5000 and not (tmp_path / "d.gguf").exists()


def test_train_a_tiny_drafter_from_scratch_then_convert_and_inspect(tiny_run, capsys):
    """The drafter learns (its agreement with the target's next token rises well above where
    it started), and the GGUF names its target."""
    out, gguf = tiny_run
    history = json.loads((out / "history.json").read_text())
    assert len(history) >= 6 and (out / "loss.png").stat().st_size > 0
    # Means over 20 steps, the first pair against the last pair (noisy: a modest bar).
    first, last = history[:2], history[-2:]
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    assert mean(last, "acc_moe") > mean(first, "acc_moe") + 0.04, history
    assert mean(last, "ce_moe") < 0.9 * mean(first, "ce_moe"), history
    capsys.readouterr()
    assert main(["inspect", str(gguf)]) == 0
    text = capsys.readouterr().out
    assert "jakiro.target.tokenizer_hash" in text and "ffn_up.1.weight" in text and "Q8_0" in text
    assert inspect_gguf(gguf).count("tensor ") >= 15


def test_jakiro_greedy_identical_to_plain(tiny_run, small_model, reference):
    """3 of the 20 prompts × N_TOKENS (96), target on one thread (batches reproduce single
    tokens bit for bit there, see test_speculative), the drafter's trees verified under a flat
    cost curve (so it drafts all it can) cut at 5 nodes to keep the test's time down; against
    the session's plain outputs (a context without hidden states: they change no logit)."""
    _, gguf = tiny_run
    with Context(small_model, ContextConfig(n_ctx=1024, n_seq_max=8, n_threads=1, embeddings=True)) as ctx:
        drafter = JakiroDrafter(JakiroRuntime(gguf, small_model, n_ctx=1024, n_threads=1))
        stats = Stats()
        for p in PROMPTS[1::8]:
            tokens = small_model.tokenize(p)
            assert speculative(ctx, drafter, tokens, stats=stats, max_nodes=5) == reference[p], p
    assert stats.draft_n_accepted > 12 and stats.draft_n - stats.draft_n_accepted > 50, stats.summary()


def test_shipped_smollm2_drafter_decodes_like_plain(small_path, small_model):
    """The drafter in models/jakiro/ for SmolLM2 loads natively and its drafts, verified
    under a flat cost curve, leave greedy output unchanged; it is better than the tiny one."""
    from localspec import store
    gguf = store.shipped_drafter(small_path)
    assert gguf is not None, "no drafter ships for SmolLM2"
    with Context(small_model, ContextConfig(n_ctx=1024, n_seq_max=8, n_threads=1, embeddings=True)) as ctx:
        drafter = JakiroDrafter(JakiroRuntime(gguf, small_model, n_ctx=1024, n_threads=1))
        stats = Stats()
        # Three prompts: on a fresh build of 2026-12-03 (the same code, the same model file)
        # the first two accepted 5 and 19 nodes, a third 18; the count only has to show that
        # drafts were verified and accepted, which two prompts no longer did with room to spare.
        for p in PROMPTS[:3]:
            tokens = small_model.tokenize(p)
            assert speculative(ctx, drafter, tokens, stats=stats, max_nodes=5) == plain(ctx, tokens), p
    assert stats.draft_n_accepted > 25, stats.summary()


def test_static_k_jakiro_from_the_command_line(small_path, capsys):
    """`jakiro@K` (no acceptance head: a static K drafts all K) loads the shipped drafter and
    decodes like plain on one thread."""
    args = ["generate", "-m", str(small_path), "--threads", "1", "--max-tokens", "24",
            "def fibonacci(n):\n", "--drafter"]
    assert main(args + ["none"]) == 0
    plain = capsys.readouterr().out
    for spec in ("jakiro@2", "jakiro,head=off,width=2@3"):
        assert main(args + [spec]) == 0
        assert capsys.readouterr().out == plain, spec


def test_jakiro_sampling_keeps_the_targets_distribution(small_path, small_model):
    """T = 1: the sixth token after a prompt, over many seeds, drawn with and without the
    drafter: a chi-square test of the two samples (the drafts are deterministic trees, which
    the sibling rule verifies; its exactness on synthetic trees is test_verify_distribution's).
    The shipped drafter: the suite's tiny one had about 1% of its nodes accepted at T = 1,
    and on a fresh build of 2026-12-03 only 2 in 60 seeds, too few to exercise the rule."""
    from localspec import store
    from scipy.stats import chi2_contingency
    gguf = store.shipped_drafter(small_path)
    prompt = small_model.tokenize(PROMPTS[0])
    with Context(small_model, ContextConfig(n_ctx=256, n_seq_max=8, n_threads=2, embeddings=True)) as ctx:
        drafter = JakiroDrafter(JakiroRuntime(gguf, small_model, n_ctx=256, n_threads=2))
        counts: dict[int, list[int]] = {}
        stats = Stats()
        for seed in range(60):
            cfg = SamplingConfig(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0, seed=seed)
            # -1: the text ended before
            a = (plain(ctx, prompt, 6, cfg) + [-1] * 6)[5]
            b = (speculative(ctx, drafter, prompt, 6, cfg, stats) + [-1] * 6)[5]
            counts.setdefault(a, [0, 0])[0] += 1
            counts.setdefault(b, [0, 0])[1] += 1
    # Only some runs go through an acceptance (46 of 446 nodes here): this checks the
    # plumbing end to end, not the rule.
    assert stats.draft_n_accepted > 10, stats.summary()
    # Tokens seen fewer than 5 times pooled into one column, as a chi-square test needs.
    frequent = [c for c in counts.values() if sum(c) >= 5]
    rest = np.sum([c for c in counts.values() if sum(c) < 5] or [[0, 0]], axis=0)
    table = np.array(frequent + ([list(rest)] if rest.sum() >= 5 else [])).T
    assert table.shape[1] >= 3
    assert chi2_contingency(table).pvalue > 0.001, counts
