"""The acceptance head end to end on SmolLM2-135M with a tiny drafter (SmolLM2's first 20 of 30
layers, written as a GGUF here): data collection, weighted-BCE training, GGUF, native
inference equal to torch, refusals, and drafting with it — greedy output still identical to
plain decoding, and the drafts cut where the budget's rule (the paper's P_rej > h) says."""

import gguf
import numpy as np
import pytest
import torch

from localspec.control.controllers import Fixed
from localspec.convert import convert_checkpoint
from localspec.drafters.acceptance_head import AcceptanceHead
from localspec.drafters.base import Budget
from localspec.drafters.draft_model import DraftModelDrafter, draft_context
from localspec.drafters.files import read_head_gguf
from localspec.drafters.spec import DrafterSpec
from localspec.errors import LocalspecError
from localspec.llama import Model
from localspec.llama.curve import CostCurve
from localspec.loop import Stats, run
from localspec.train.acceptance import HeadTrainConfig, collect, load, train_head
from localspec.train.acceptance_net import AcceptanceNet, head_inputs

from localspec.llama import Context
from localspec.llama.context import ContextConfig
from localspec.llama.gguf import read_header
from pathlib import Path
from gguf_files import rewrite
from test_speculative import GREEDY, N_TOKENS, PROMPTS, speculative


def truncated(src, dst, n_layers: int):
    """A copy of a GGUF model keeping its first n_layers blocks: same tokenizer, weaker."""
    arch = read_header(Path(src)).metadata["general.architecture"]
    return rewrite(src, dst, {f"{arch}.block_count": (n_layers, gguf.GGUFValueType.UINT32)},
                   lambda name: not (name.startswith("blk.") and int(name.split(".")[1]) >= n_layers))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, small_path):
    """(config, GGUF path) of a head trained on 20 short continuations of the test prompts."""
    out = tmp_path_factory.mktemp("head")
    tiny = truncated(small_path, out / "tiny.gguf", 20)
    cfg = HeadTrainConfig(target=small_path, drafter=tiny, out=out, max_new=24, epochs=8, n_threads=2)
    collect(cfg, PROMPTS)
    ckpt = train_head(cfg)
    return cfg, convert_checkpoint(ckpt, out / "head.gguf")


def test_training_data_and_calibration_report(trained):
    cfg, path = trained
    f, q, y = load(cfg.out / "data", "greedy", "train")
    # Two rows per position (the draft's top token and a drawn one), labels in {0, 1} at T = 0
    # and min(1, p/q) in [0, 1] for sampling: the tiny drafter is often wrong, so both occur.
    assert len(f) == 2 * 16 * 24 and f.shape[1] == 576  # 16 of 20 sequences train
    assert set(np.unique(y)) == {0.0, 1.0} and 0.2 < y.mean() < 0.9
    _, _, ys = load(cfg.out / "data", "sampled", "train")
    assert ys.min() >= 0 and ys.max() <= 1 and 0 < ys.mean() < 1
    assert (cfg.out / "reliability-greedy.png").stat().st_size > 10_000
    meta, layers = read_head_gguf(path)
    assert meta["label"] == "greedy" and meta["d_model"] == 576 and len(layers) == 4


def test_native_head_equals_torch(trained, small_model):
    cfg, path = trained
    ckpt = torch.load(cfg.out / "head-greedy.pt", weights_only=False)
    net = AcceptanceNet(ckpt["d_model"], ckpt["hidden"], ckpt["n_blocks"])
    net.load_state_dict(ckpt["state"])
    net.eval()
    f, q, _ = load(cfg.out / "data", "greedy", "held-out")
    with torch.no_grad():
        want = torch.sigmoid(net(head_inputs(torch.from_numpy(f), torch.from_numpy(q)))).numpy()
    head = AcceptanceHead(path, small_model, small_model)
    # Rows may be shared (siblings): give every other token the previous row's state.
    rows = np.arange(len(q)) // 2 * 2
    got = head.probs(f, rows.tolist(), q.tolist())
    with torch.no_grad():
        shared = torch.sigmoid(net(head_inputs(torch.from_numpy(f[rows]), torch.from_numpy(q)))).numpy()
    np.testing.assert_allclose(head.probs(f, list(range(len(q))), q.tolist()), want, atol=1e-5)
    np.testing.assert_allclose(got, shared, atol=1e-5)


def test_refuses_a_head_made_for_other_models(trained, small_path, qwen_model, small_model):
    _, path = trained
    with pytest.raises(LocalspecError, match="was made for"):
        AcceptanceHead(path, qwen_model, qwen_model)
    with pytest.raises(LocalspecError, match="is not an acceptance head"):
        AcceptanceHead(small_path, small_model, small_model)


def test_drafting_with_the_head_is_greedy_identical_and_cuts_by_the_rule(trained, target, reference):
    cfg, path = trained
    # A curve where verification is free but drafting is not: the head decides the lengths.
    budget = Budget(CostCurve([0.1] * 16, 0), 8)
    with Model(cfg.drafter) as tiny, draft_context(tiny, 2048, 1) as dctx:
        head = AcceptanceHead(path, tiny, target.model)
        drafter = DraftModelDrafter(dctx, target.model, heads={"greedy": head, "sampled": None})
        lengths, cut = [], []
        propose = drafter.propose

        def spy(context, budget):
            t_token = drafter.t_token  # the drafting time the rule uses (updated after drafting)
            tree = propose(context, budget)
            lengths.append(len(tree))
            # Every kept token passed the rule: reach (1 - P_rej) above the budget's bound.
            cut.extend(bool(r > budget.min_reach(t_token, d)) for d, r in enumerate(tree.reach))
            return tree
        drafter.propose = spy
        stats = Stats()
        for p in PROMPTS[:6]:
            target.clear()
            out = [t for it in run(target, Fixed(drafter, budget, "head"), target.model.tokenize(p),
                                   GREEDY, N_TOKENS, stats) for t in it.tokens]
            assert out == reference[p], p
    assert all(cut) and stats.draft_n_accepted > 50
    # Lengths adapt to the context (not one fixed K), within K_max = 8.
    assert len(set(lengths)) >= 3 and max(lengths) <= 8


@pytest.mark.unit
def test_draft_spec_options():
    assert DrafterSpec.parse("draft") == DrafterSpec("draft")
    assert DrafterSpec.parse("draft:qwen,head=off") == DrafterSpec("draft", "qwen", head="off")
    assert DrafterSpec.parse("draft,head=/x/h.gguf@3") == DrafterSpec("draft", head="/x/h.gguf", k=3)
    for bad in ("draft:m,heads=on", "draft:m,head=", "draft,width=2"):
        with pytest.raises(LocalspecError, match="bad draft option"):
            DrafterSpec.parse(bad)


@pytest.fixture(scope="module")
def jakiro_head(tmp_path_factory, small_path):
    """(runtime path, GGUF path) of a head on the branch features of the Jakiro drafter that
    ships for SmolLM2, trained on 20 short continuations of the test prompts."""
    from localspec import store
    out = tmp_path_factory.mktemp("jakiro-head")
    drafter = store.shipped_drafter(small_path)
    cfg = HeadTrainConfig(target=small_path, drafter=drafter, out=out, max_new=32, epochs=8, n_threads=2)
    collect(cfg, PROMPTS)
    return drafter, convert_checkpoint(train_head(cfg), out / "jakiro-head.gguf")


def test_jakiro_head_on_branch_features(jakiro_head, small_path, small_model, target, reference):
    """Data from the drafter's two branch features (teacher-forced on the target's), a head
    that reads them, refused for a draft model of the same width and accepted by the runtime;
    drafting with it keeps greedy output and builds every branch token's reach from it."""
    from localspec.drafters.jakiro import JakiroDrafter, JakiroRuntime
    from localspec.train.acceptance import PARTS
    reaches = {}  # drafter -> the reach of every tree it proposed

    class Recording(JakiroDrafter):
        def propose(self, context, budget):
            tree = super().propose(context, budget)
            reaches.setdefault(self, []).append(tree.reach.copy())
            return tree

    drafter_path, path = jakiro_head
    meta, _ = read_head_gguf(path)
    assert meta["drafter_kind"] == "jakiro" and meta["d_model"] == small_model.n_embd
    f, q, y = load(path.parent / "data", "greedy", "train")
    assert f.shape[1] == small_model.n_embd and 0 < y.mean() < 1 and ((q > 0) & (q <= 1)).all()
    assert set(PARTS) == {"train", "validation", "held-out"}
    with pytest.raises(LocalspecError, match="was made for"):
        AcceptanceHead(path, small_model, small_model)  # same width, but a draft model's state
    rt = JakiroRuntime(drafter_path, target.model, n_ctx=1024, n_threads=1)
    head = AcceptanceHead(path, rt, target.model)
    with Context(target.model, ContextConfig(n_ctx=1024, n_seq_max=8, n_threads=1, embeddings=True)) as ctx:
        with_head = Recording(rt, heads={"greedy": head, "sampled": None})
        without = Recording(rt)  # the same runtime: drafters share it
        stats = {}
        for name, d in (("head", with_head), ("q", without)):
            stats[name] = Stats()
            for p in PROMPTS[:2]:
                out = speculative(ctx, d, target.model.tokenize(p), stats=stats[name], max_nodes=5)
                assert out == reference[p], (name, p)
    assert stats["head"].draft_n > 0 and stats["head"].draft_n_accepted > 0
    # The head, not the drafter's q, gives the reach: the first tree (the same context for
    # both) is scored differently, whether or not that changes which nodes are kept.
    first_head, first_q = reaches[with_head][0], reaches[without][0]
    assert len(first_head) and len(first_q)
    n = min(len(first_head), len(first_q))
    assert not np.allclose(first_head[:n], first_q[:n])
