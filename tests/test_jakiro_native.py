"""The native Jakiro runtime (ggml) against the torch reference on the same weights: one
causal pass, then a tree-masked pass over its KV cache, the head, rollback, and refusals."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localspec.convert import write_gguf  # noqa: E402
from localspec.drafters.jakiro import JakiroRuntime  # noqa: E402
from localspec.drafters.jakiro_config import JakiroConfig  # noqa: E402
from localspec.errors import LocalspecError  # noqa: E402
from localspec.train.features import tokenizer_hash  # noqa: E402
from localspec.train.jakiro_net import JakiroNet, init_weights  # noqa: E402
from localspec.train.target_weights import TargetWeights  # noqa: E402

NEG = float("-inf")


@pytest.fixture(scope="module")
def drafter(small_model, small_path, tmp_path_factory):
    """A randomly initialised drafter for SmolLM2 with a reduced vocabulary, as f32 GGUF."""
    vocab = list(range(0, small_model.n_vocab, 7))
    cfg = JakiroConfig(target_name=small_model.name, target_vocab=small_model.n_vocab,
                       target_tokenizer=tokenizer_hash(small_model), d_model=small_model.n_embd,
                       n_heads=9, rope_theta=100000.0, n_experts=3, draft_vocab=vocab)
    w = TargetWeights(small_path)
    net = JakiroNet(cfg, w.embedding(), w.head(np.asarray(vocab)))
    init_weights(net, seed=3)
    with torch.no_grad():  # break init's near-identity so every part of the layer matters
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("jakiro") / "d.gguf"
    write_gguf(cfg, {k: v.numpy() for k, v in net.state_dict().items()}, path, "f32")
    return net, path


def causal(n: int, n_past: int = 0) -> np.ndarray:
    m = np.full((n, n_past + n), NEG, np.float32)
    for i in range(n):
        m[i, :n_past + i + 1] = 0.0
    return m


def test_native_layer_and_head_match_torch(drafter, small_model):
    net, path = drafter
    rt = JakiroRuntime(path, small_model, n_ctx=64, n_threads=2)
    g = torch.Generator().manual_seed(0)
    d = net.cfg.d_model
    feats = torch.randn(6, d, generator=g) * 3
    tokens = torch.tensor([5, 900, 17, 4000, 33, 12000])
    pos = torch.arange(6)
    u, experts, router = rt.layer(feats.numpy(), tokens.numpy(), pos.numpy(), causal(6))
    with torch.no_grad():
        u_ref, e_ref, r_ref, cache = net.layer(feats, tokens, pos)
    np.testing.assert_allclose(u, u_ref.numpy(), atol=2e-3, rtol=1e-3)
    np.testing.assert_allclose(experts, e_ref.numpy(), atol=2e-3, rtol=1e-3)
    np.testing.assert_allclose(router, r_ref.numpy(), atol=2e-3, rtol=1e-3)

    # A tree over the cache: two siblings at position 6, a child of the second at 7.
    tree_feats = torch.randn(3, d, generator=g)
    tree_tokens = torch.tensor([40, 41, 42])
    tree_pos = torch.tensor([6, 6, 7])
    visible = np.array([[1, 0, 0], [0, 1, 0], [0, 1, 1]], bool)
    mask = np.concatenate([np.zeros((3, 6), np.float32), np.where(visible, 0.0, NEG)], 1).astype(np.float32)
    u2, e2, r2 = rt.layer(tree_feats.numpy(), tree_tokens.numpy(), tree_pos.numpy(), mask)
    with torch.no_grad():
        u2_ref, e2_ref, r2_ref, _ = net.layer(tree_feats, tree_tokens, tree_pos,
                                              mask=torch.from_numpy(mask == 0.0), cache=cache)
    np.testing.assert_allclose(u2, u2_ref.numpy(), atol=2e-3, rtol=1e-3)
    np.testing.assert_allclose(e2, e2_ref.numpy(), atol=2e-3, rtol=1e-3)
    assert rt.n_cached == 9

    logits = rt.logits(u2)
    with torch.no_grad():
        ref = net.logits(torch.from_numpy(u2)).numpy()
    # The head stays quantized as in the target, and ggml quantizes the activations for it
    # (to 8 bits), as llama.cpp's own LM head does: agreement to about 1% of the logit range.
    np.testing.assert_allclose(logits, ref, atol=0.01 * np.abs(ref).max())
    assert (logits.argmax(1) == ref.argmax(1)).all()
    assert (rt.draft_vocab == np.asarray(net.cfg.draft_vocab)).all()

    # Rollback: dropping the tree and running its second branch again gives the same rows.
    rt.truncate(6)
    u3, _, _ = rt.layer(tree_feats[1:].numpy(), tree_tokens[1:].numpy(), tree_pos[1:].numpy(),
                        np.concatenate([np.zeros((2, 6), np.float32), causal(2)], 1))
    np.testing.assert_allclose(u3, u2[1:], atol=1e-5)


def test_runtime_refuses_another_target(drafter, qwen_model):
    _, path = drafter
    with pytest.raises(LocalspecError, match="cannot draft for"):
        JakiroRuntime(path, qwen_model)
