"""The drafters models ship with, run by llama.cpp (MTP layers in the target's GGUF, EAGLE-3
GGUFs), as tiny random-weight GGUFs (random_gguf.py): a glm4moe target with an MTP layer, and
EAGLE-3 drafters for the SmolLM2 test model. "Echo" ones pass the target's hidden state
through to its own head, so they predict the token the target just predicted and are accepted
where the text repeats; plain random ones are almost never accepted. Whatever they draft, the
answer is plain decoding's, and at T > 0 its distribution."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.bench.runner import near_tie, run_ours
from localspec.drafters.spec import NONE, DrafterSpec
from localspec.engine import Engine, EngineConfig, Request
from localspec.errors import LocalspecError
from localspec.sampling import SamplingConfig

from random_gguf import make, make_dflash, make_drafter

GREEDY = SamplingConfig(temperature=0.0)
REPEATS = "Repeat after me: ha ha ha ha ha ha ha ha ha ha ha ha ha ha"
HA = 421  # " ha" in SmolLM2's vocabulary


@pytest.fixture(scope="module")
def files(tmp_path_factory, small_path):
    d = tmp_path_factory.mktemp("heads")
    glm = make("glm4moe", "tiny", d / "glm-mtp.gguf", tokenizer=small_path, mtp=True, echo=True)
    return {"glm": glm, "qwen35": make("qwen35", "tiny", d / "qwen35-mtp.gguf", tokenizer=small_path, mtp=True,
                                       echo=True, repeats=True),
            "glm-plain": make("glm4moe", "tiny", d / "glm.gguf", tokenizer=small_path),
            "echo": make_drafter("eagle3", d / "eagle3-echo.gguf", small_path, echo=True),
            "random": make_drafter("eagle3", d / "eagle3.gguf", small_path, seed=1),
            "wide": make_drafter("eagle3", d / "eagle3-wide.gguf", small_path, embd=1024),
            "for-glm": make_drafter("eagle3", d / "eagle3-glm.gguf", glm),
            # its block's mask token is " ha": each position predicts it (SmolLM2's head is tied)
            "dflash": make_dflash("dflash", d / "dflash-echo.gguf", small_path, echo=True, mask=HA),
            "dflash-wide": make_dflash("dflash", d / "dflash-wide.gguf", small_path, embd=1024)}


@pytest.fixture(scope="module")
def smollm2(small_path):
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=1024, threads=2))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def glm(files):
    engine = Engine(EngineConfig(model=str(files["glm"]), n_ctx=1024, threads=2))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def qwen35(files):
    """A hybrid (recurrent) target: chains, its state rolled back by what they reject."""
    engine = Engine(EngineConfig(model=str(files["qwen35"]), n_ctx=1024, threads=2))
    yield engine
    engine.close()


def same_or_tie(engine, prompt, truth, out) -> bool:
    return out == truth or near_tie(engine, prompt, truth, out)


PLAIN: dict[tuple, list[int]] = {}


def plain(engine, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding's answer, once per engine and prompt."""
    key = (id(engine), tuple(prompt), n)
    if key not in PLAIN:
        PLAIN[key] = run_ours(engine, prompt, NONE, n, GREEDY)[0]
    return PLAIN[key]


@pytest.mark.parametrize("drafter", ["eagle3:{echo}@3", "eagle3:{echo},width=1@3", "eagle3:{echo}",
                                     "eagle3:{random}", "auto:suffix+eagle3:{echo}", "dflash:{dflash}@4",
                                     "dflash:{dflash}", "dflash:{dflash},branch=1@6"])
def test_greedy_with_an_eagle3_or_dflash_drafter_is_plain_decodings(smollm2, files, drafter):
    spec = DrafterSpec.parse(drafter.format(**files))
    for text in (REPEATS, "The capital of France is"):
        prompt = smollm2.model.tokenize(text)
        truth = plain(smollm2, prompt, 32)
        out, run = run_ours(smollm2, prompt, spec, 32, GREEDY)
        assert same_or_tie(smollm2, prompt, truth, out), (text, drafter)
        if text == REPEATS and spec.k:  # a static K drafts every step: the echo is accepted
            assert run.accepted > 15, run


@pytest.mark.parametrize("target", ["glm", "qwen35"])
@pytest.mark.parametrize("drafter", ["mtp@3", "mtp,width=1@3", "mtp", "auto"])
def test_greedy_with_the_targets_mtp_layers_is_plain_decodings(request, target, drafter):
    engine = request.getfixturevalue(target)
    assert engine.model.mtp and engine.model.mtp_layers == 1
    spec = DrafterSpec.parse(drafter)
    prompt = engine.model.tokenize("1 2 3 4 5 6 7 8")
    truth = plain(engine, prompt, 48)
    out, run = run_ours(engine, prompt, spec, 48, GREEDY)
    assert same_or_tie(engine, prompt, truth, out), drafter
    if spec.k:
        assert run.accepted > 0, run  # the random targets repeat themselves, now and then or mostly
    # The same prompt again, the cache holding it and the answer.
    request = Request(prompt=prompt, sampling=GREEDY, max_tokens=48, ignore_eog=True, drafter=spec)
    assert list(engine.generate(request))[-1].tokens == out


def test_auto_drafts_with_the_mtp_layers_a_target_has(glm, files):
    assert DrafterSpec("mtp") in glm.drafters.available()
    plain = Engine(EngineConfig(model=str(files["glm-plain"]), n_ctx=512, threads=2))
    try:
        assert not plain.model.mtp and DrafterSpec("mtp") not in plain.drafters.available()
        with pytest.raises(LocalspecError, match="has no MTP layers") as e:
            run_ours(plain, plain.model.tokenize("1 2 3"), DrafterSpec.parse("mtp"), 4, GREEDY)
        assert "\n" not in str(e.value)
    finally:
        plain.close()


@pytest.mark.parametrize("drafter,why", [
    ("eagle3:{wide}", "made for a target of width 1024"),
    ("eagle3:{for-glm}", "made for a target of width 128"),
    ("eagle3:{glm}", "is a glm4moe model, not an EAGLE-3 drafter"),
    ("eagle3:{dflash}", "is a dflash model, not an EAGLE-3 drafter"),
    ("dflash:{dflash-wide}", "made for a target of width 1024"),
    ("dflash:{echo}", "is a eagle3 model, not a DFlash drafter"),
    ("dflash", "dflash needs its file"),
    ("eagle3:/nonexistent/eagle3.gguf", "nonexistent"),
    ("eagle3", "eagle3 needs its file")])
def test_a_drafter_made_for_another_target_is_refused_in_one_line(smollm2, files, drafter, why):
    with pytest.raises(LocalspecError, match=why) as e:
        run_ours(smollm2, smollm2.model.tokenize("Hi"), DrafterSpec.parse(drafter.format(**files)), 4, GREEDY)
    assert "\n" not in str(e.value)
    out, _ = run_ours(smollm2, smollm2.model.tokenize("Hi"), NONE, 4, GREEDY)  # the engine goes on
    assert len(out) == 4


def test_eagle3_on_a_target_llama_cpp_hands_no_layer_inputs_is_refused(qwen_path, files):
    engine = Engine(EngineConfig(model=str(qwen_path), n_ctx=256, threads=2))
    try:
        with pytest.raises(LocalspecError, match="cannot hand an EAGLE-3 drafter") as e:
            run_ours(engine, engine.model.tokenize("Hi"), DrafterSpec.parse(f"eagle3:{files['echo']}"), 4, GREEDY)
        assert "\n" not in str(e.value)
    finally:
        engine.close()


@pytest.mark.parametrize("target,drafter,text", [("smollm2", "eagle3:{echo}@3", REPEATS),
                                                  ("smollm2", "dflash:{dflash}@4", REPEATS),
                                                  ("glm", "mtp,width=1@3", "1 2 3 4 5 6 7 8"),
                                                  ("qwen35", "mtp@3", "1 2 3 4 5 6 7 8")])
def test_sampling_with_a_model_drafter_keeps_the_targets_distribution(request, files, target, drafter, text):
    """T = 1, top-k 3: the fourth token over many seeds, plain and with the drafter's tree or
    chain drawn from its own distribution and accepted by rejection sampling: a chi-square
    test of the two samples."""
    from scipy.stats import chi2_contingency

    engine = request.getfixturevalue(target)
    spec = DrafterSpec.parse(drafter.format(**files))
    prompt = engine.model.tokenize(text)
    counts: dict[int, list[int]] = {}
    accepted = 0
    for seed in range(70 if target == "smollm2" else 100):  # SmolLM2 is the slower target
        sampling = SamplingConfig(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=seed)
        for column, d in enumerate((NONE, spec)):  # the prompt from the cache: no prefill
            done = list(engine.generate(Request(prompt=prompt, sampling=sampling, max_tokens=4,
                                                ignore_eog=True, drafter=d)))[-1]
            accepted += done.stats.draft_n_accepted
            counts.setdefault(done.tokens[3], [0, 0])[column] += 1
    assert accepted > 20
    table = np.array([c for c in counts.values() if sum(c) >= 5]).T
    assert table.shape[1] >= 2
    assert chi2_contingency(table).pvalue > 0.001, counts


def test_an_engine_started_with_an_eagle3_drafter_drafts_with_it(files, small_path):
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=512, threads=2,
                                 drafter=DrafterSpec.parse(f"eagle3:{files['echo']},width=1@3")))
    try:
        done = list(engine.generate(Request(prompt=engine.model.tokenize(REPEATS), sampling=GREEDY,
                                            max_tokens=16)))[-1]
        assert len(done.tokens) == 16 and done.stats.draft_n_accepted > 0
        assert list(done.stats.ran) == ["eagle3:eagle3-echo,width=1@3"]
    finally:
        engine.close()


def test_models_says_which_targets_carry_mtp_layers_and_which_files_are_drafters(files, tmp_path, monkeypatch):
    from test_store_cli import localspec
    for var in ("LLAMA_CACHE", "OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "LOCALSPEC_MODEL_DIRS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    folder = tmp_path / "home/.lmstudio/models/acme/GLM-GGUF"
    folder.mkdir(parents=True)
    for name, key in (("glm-mtp.gguf", "glm"), ("glm.gguf", "glm-plain"), ("eagle3.gguf", "echo"),
                      ("dflash.gguf", "dflash")):
        (folder / name).symlink_to(files[key])
    r = localspec("models", home=tmp_path / "ls")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("lmstudio:")}
    assert "1 MTP layer: --drafter mtp" in rows["lmstudio:acme/GLM-GGUF/glm-mtp.gguf"]
    assert "MTP" not in rows["lmstudio:acme/GLM-GGUF/glm.gguf"]
    assert "an EAGLE-3 drafter: --drafter eagle3:" in rows["lmstudio:acme/GLM-GGUF/eagle3.gguf"]
    assert "a DFlash drafter: --drafter dflash:" in rows["lmstudio:acme/GLM-GGUF/dflash.gguf"]
