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
from localspec.train.jakiro_net import JakiroNet, init_weights  # noqa: E402
from localspec.train.target_weights import TargetWeights  # noqa: E402

NEG = float("-inf")


def random_drafter(model, path, folder, n_experts):
    """A randomly initialised drafter for SmolLM2 with a reduced vocabulary, as f32 GGUF."""
    vocab = list(range(0, model.n_vocab, 7))
    cfg = JakiroConfig(target_name=model.name, target_vocab=model.n_vocab,
                       target_tokenizer=model.tokenizer_hash, d_model=model.n_embd,
                       n_heads=9, rope_theta=100000.0, n_experts=n_experts,
                       top_k=min(2, n_experts), draft_vocab=vocab)
    w = TargetWeights(path)
    net = JakiroNet(cfg, w.embedding(), w.head(np.asarray(vocab)))
    init_weights(net, seed=3)
    g = torch.Generator().manual_seed(n_experts)  # the same drafter whatever ran before
    with torch.no_grad():  # break init's near-identity so every part of the layer matters
        for p in net.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    out = folder / f"d{n_experts}.gguf"
    write_gguf(cfg, {k: v.numpy() for k, v in net.state_dict().items()}, out, "f32")
    return net, out


@pytest.fixture(scope="module")
def drafter(small_model, small_path, tmp_path_factory):
    return random_drafter(small_model, small_path, tmp_path_factory.mktemp("jakiro"), 3)


@pytest.fixture(scope="module")
def single_expert(small_model, small_path, tmp_path_factory):
    return random_drafter(small_model, small_path, tmp_path_factory.mktemp("eagle"), 1)


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


def reference_tree(net, head_logits, feats, tokens, width, branch, max_nodes, cepd):
    """Algorithm 1 in torch, written for reading rather than speed: the context's layer pass,
    then per depth the two branches (or f_moe/f_ctr at CEPD's step) of every frontier node,
    `branch` tokens from each, and a tree-masked pass over the `width` likeliest new nodes.
    Head logits come from `head_logits` (the native head keeps the target's quantized rows,
    and the layer is what this compares)."""
    cfg = net.cfg
    n = len(tokens)
    with torch.no_grad():
        u, experts, router, cache = net.layer(feats, tokens, torch.arange(n))
        out = (u[-1:], experts[-1:], router[-1:])
        nodes = []  # [token, parent, reach, feed, slot]
        frontier = [-1]
        single = cfg.n_experts == 1  # one branch of 2 * branch tokens, no CEPD
        cepd = cepd and not single
        last = cfg.gamma - 1 if cepd else cfg.gamma
        for depth in range(1, last + 1):
            u, experts, router = out
            if single:
                f_moe = u + experts[:, 0]
                first, second = f_moe, f_moe[:0]
            else:
                scores = torch.softmax(router, -1)
                s, top = scores.topk(2, -1)
                s = s / s.sum(-1, keepdim=True)
                e_a = experts[torch.arange(len(u)), top[:, 0]]
                e_b = experts[torch.arange(len(u)), top[:, 1]]
                f_moe = u + s[:, :1] * e_a + s[:, 1:] * e_b
                f_ctr = u + cfg.beta1 * e_a - cfg.beta2 * e_b
                first, second = (f_moe, f_ctr) if cepd and depth == cfg.gamma - 1 else (u + e_a, u + e_b)
            at_cepd = cepd and depth == cfg.gamma - 1
            logits = torch.from_numpy(head_logits(torch.cat([first, second]).numpy()))
            # by logit: probabilities can underflow to ties
            ids = logits.topk(2 * branch if single else branch, -1).indices
            p = torch.softmax(logits.double(), -1).gather(-1, ids)
            ids = torch.from_numpy(np.asarray(net.cfg.draft_vocab))[ids]
            added = []
            for r, node in enumerate(frontier):
                base = nodes[node][2] if node >= 0 else 1.0
                if at_cepd:
                    kids = []
                    for x, q in zip(ids[r].tolist(), p[r].tolist()):
                        nodes.append([x, node, base * q, f_moe[r], -1])
                        kids.append(len(nodes) - 1)
                    for x, q in zip(ids[len(frontier) + r].tolist(), p[len(frontier) + r].tolist()):
                        nodes.append([x, kids[0], nodes[kids[0]][2] * q, f_moe[r], -1])
                    continue
                mine = {}
                for row in (r,) if single else (r, len(frontier) + r):
                    for x, q in zip(ids[row].tolist(), p[row].tolist()):
                        if x in mine:
                            nodes[mine[x]][2] = max(nodes[mine[x]][2], base * q)
                        else:
                            nodes.append([x, node, base * q, f_moe[r], -1])
                            mine[x] = len(nodes) - 1
                            added.append(mine[x])
            if depth == last or len(nodes) >= max_nodes:
                break
            best = sorted(added, key=lambda i: -nodes[i][2])[:width]
            n_cache = cache[0].shape[-2]
            visible = torch.zeros(len(best), n_cache + len(best), dtype=torch.bool)
            visible[:, :n] = True
            for r, i in enumerate(best):
                a = nodes[i][1]
                while a >= 0:
                    visible[r, nodes[a][4]] = True
                    a = nodes[a][1]
                visible[r, n_cache + r] = True
                nodes[i][4] = n_cache + r
            u, experts, router, cache = net.layer(
                torch.stack([nodes[i][3] for i in best]), torch.tensor([nodes[i][0] for i in best]),
                torch.full((len(best),), n + depth - 1), mask=visible, cache=cache)
            frontier, out = best, (u, experts, router)
    return [x[0] for x in nodes], [x[1] for x in nodes], np.array([x[2] for x in nodes])


@pytest.mark.parametrize("cepd", [True, False])
def test_native_tree_matches_torch_reference(drafter, small_model, cepd):
    net, path = drafter
    check_tree_against_reference(net, path, small_model, cepd)


def test_single_expert_tree_has_one_branch_and_no_cepd(single_expert, small_model):
    net, path = single_expert
    check_tree_against_reference(net, path, small_model, cepd=True)


def check_tree_against_reference(net, path, small_model, cepd):
    rt = JakiroRuntime(path, small_model, n_ctx=128, n_threads=2)
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(5, net.cfg.d_model, generator=g) * 3
    tokens = torch.tensor([11, 2000, 345, 7000, 21])
    outs = rt.layer(feats.numpy(), tokens.numpy(), np.arange(5), causal(5))
    tree = rt.grow_tree(outs, 5, width=3, branch=2, max_nodes=64, cepd=cepd, min_reach=np.zeros(0))
    ref = reference_tree(net, rt.logits, feats, tokens, width=3, branch=2, max_nodes=64, cepd=cepd)
    assert rt.n_cached == 5  # the tree's slots are gone again
    # Identical trees, except that from a genuine tie on (float32 vs torch's rounding of two
    # candidates' reach within 2%) the order may differ.
    nodes, ref_nodes = list(zip(tree[0].tolist(), tree[1].tolist())), list(zip(ref[0], ref[1]))
    split = next((i for i, (a, b) in enumerate(zip(nodes, ref_nodes)) if a != b), None)
    if split is None:
        assert nodes == ref_nodes
        np.testing.assert_allclose(tree[2], ref[2], rtol=2e-2, atol=1e-6)
    else:
        np.testing.assert_allclose(tree[2][:split + 1], ref[2][:split + 1], rtol=2e-2, atol=1e-6)
    # gamma = 6: expansions at depths 1-4 with CEPD (its last forward gives steps 5 and 6), 1-5 without.
    cepd = cepd and net.cfg.n_experts > 1
    assert tree[3] == (4 if cepd else 5)
    depth = [0] * len(ref[1])
    for i, p in enumerate(ref[1]):
        depth[i] = 1 if p < 0 else depth[p] + 1
    assert max(depth) == 6
    if cepd:  # of each expanded node's step-5 tokens, only the best has step-6 children
        at = lambda k: [i for i in range(len(depth)) if depth[i] == k]  # noqa: E731
        fathers = {ref[1][i] for i in at(6)}
        assert len(fathers) == len({ref[1][i] for i in at(5)})
        assert all(ref[2][f] == max(ref[2][j] for j in at(5) if ref[1][j] == ref[1][f]) for f in fathers)


def test_drafter_options_full_vocabulary_and_refusals(drafter, small_model):
    from localspec.drafters.spec import DrafterSpec
    net, path = drafter
    assert DrafterSpec.parse(f"jakiro:{path},width=1,cepd=off,vocab=full") == \
        DrafterSpec("jakiro", str(path), width=1, cepd=False, full_vocab=True)
    assert DrafterSpec.parse(f"jakiro:{path},cepd=off@2").label == f"jakiro:{path.stem},cepd=off@2"
    assert DrafterSpec.parse("jakiro,branch=1,head=off") == DrafterSpec("jakiro", branch=1, head="off")
    for bad in ("width=0", "depth=3", "cepd=maybe", "vocab=half", "head="):
        with pytest.raises(LocalspecError, match="bad jakiro option"):
            DrafterSpec.parse(f"jakiro:{path},{bad}")
    full = JakiroRuntime(path, small_model, n_ctx=16, n_threads=2, full_vocab=True)
    assert (full.draft_vocab == np.arange(small_model.n_vocab)).all()
    feats = np.random.default_rng(0).normal(size=(2, net.cfg.d_model)).astype(np.float32)
    reduced = JakiroRuntime(path, small_model, n_ctx=16, n_threads=2)
    # The reduced head is the full head's rows of the draft vocabulary.
    np.testing.assert_allclose(full.logits(feats)[:, reduced.draft_vocab], reduced.logits(feats), atol=1e-4)
