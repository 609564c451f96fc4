"""The acceptance head end to end on SmolLM2-135M with a tiny drafter (SmolLM2's first 20 of 30
layers, written as a GGUF here): data collection, weighted-BCE training, GGUF, native
inference equal to torch, refusals, and drafting with it — greedy output still identical to
plain decoding, and the drafts cut where the planner's rule (the paper's P_rej > h) says."""

import gguf
import numpy as np
import pytest
import torch

from localspec.control.acceptance import AcceptanceHead
from localspec.control.planner import Planner
from localspec.convert import convert_checkpoint, read_head_gguf
from localspec.drafters.draft_model import DraftModelDrafter
from localspec.engine import Model
from localspec.engine.cost import CostCurve
from localspec.errors import LocalspecError
from localspec.speculative import SpecStats
from localspec.train.acceptance import HeadTrainConfig, collect, load, train_head
from localspec.train.acceptance_net import AcceptanceNet, head_inputs

from test_speculative import GREEDY, PROMPTS, speculative


def truncated(src, dst, n_layers: int):
    """A copy of a GGUF model keeping its first n_layers blocks: same tokenizer, weaker."""
    r = gguf.GGUFReader(str(src))
    arch = r.get_field("general.architecture").contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        value = n_layers if f.name == f"{arch}.block_count" else f.contents()
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, value, f.types[0], sub_type=sub)
    kept = [t for t in r.tensors if not (t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layers)]
    for t in kept:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in kept:
        w.write_tensor_data(t.data, tensor_endianess=r.endianess)
    w.close()
    return dst


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
    curve = CostCurve([0.1] * 16, 0)
    with Model(cfg.drafter) as tiny:
        head = AcceptanceHead(path, tiny, target.model)
        planner = Planner(curve, 8)
        drafter = DraftModelDrafter(tiny, target.model, GREEDY, planner, n_threads=1, head=head)
        lengths, cut = [], []
        propose = drafter.propose

        def spy(context, max_nodes):
            t_token = drafter.t_token  # the drafting time the rule uses (updated after drafting)
            tree = propose(context, max_nodes)
            lengths.append(len(tree))
            # Every kept token passed the rule: reach (1 - P_rej) above the planner's bound.
            cut.extend(bool(r > planner.min_reach(t_token, d)) for d, r in enumerate(tree.reach))
            return tree
        drafter.propose = spy
        stats = SpecStats()
        for p in PROMPTS[:6]:
            assert speculative(target, drafter, target.model.tokenize(p), stats=stats) == reference[p], p
        drafter.close()
    assert all(cut) and stats.n_accepted > 50
    # Lengths adapt to the context (not one fixed K), within K_max = 8.
    assert len(set(lengths)) >= 3 and max(lengths) <= 8


def test_draft_spec_options():
    from localspec.session import draft_options
    assert draft_options("") == ("", "auto")
    assert draft_options("qwen,head=off") == ("qwen", "off")
    assert draft_options(",head=/x/h.gguf") == ("", "/x/h.gguf")
    for bad in ("m,heads=on", "m,head="):
        with pytest.raises(LocalspecError, match="bad draft option"):
            draft_options(bad)


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
    plain_rt = JakiroRuntime(drafter_path, target.model, n_ctx=1024, n_threads=1)
    target.set_embeddings(True)
    try:
        with_head = JakiroDrafter(rt, Planner(CostCurve([0.1] * 16, 0), 8, max_nodes=5), head=head)
        without = JakiroDrafter(plain_rt, Planner(CostCurve([0.1] * 16, 0), 8, max_nodes=5))
        stats = {}
        for name, d in (("head", with_head), ("q", without)):
            stats[name] = SpecStats()
            for p in PROMPTS[:4]:
                out = speculative(target, d, target.model.tokenize(p), stats=stats[name], max_nodes=5)
                assert out == reference[p], (name, p)
    finally:
        target.set_embeddings(False)
    assert stats["head"].n_drafted > 0 and stats["head"].n_accepted > 0
    # The head changes which nodes are kept: the two runs draft differently.
    assert (stats["head"].n_drafted, stats["head"].n_accepted) != (stats["q"].n_drafted, stats["q"].n_accepted)
