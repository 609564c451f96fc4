"""Models the user already has, from llama.cpp's -hf cache, LM Studio, Ollama and the Hugging
Face cache, laid out as those tools lay them out (SmolLM2 linked in), listed and used in place."""

import json

import pytest
from conftest import RECORDED_CURVE
from test_store_cli import assert_one_line_error, localspec

from localspec import found, store
from localspec.errors import LocalspecError


@pytest.fixture
def tools_home(tmp_path, monkeypatch, small_path):
    """A home whose other tools each hold SmolLM2 (and things that are not models)."""
    home = tmp_path / "home"
    for var in ("LLAMA_CACHE", "OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "LOCALSPEC_MODEL_DIRS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))

    def link(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(small_path)
        return path

    paths = {
        "llama.cpp:bartowski_SmolLM2-GGUF_smollm2-q8_0.gguf":
            link(home / ".cache/llama.cpp/bartowski_SmolLM2-GGUF_smollm2-q8_0.gguf"),
        "lmstudio:bartowski/SmolLM2-GGUF/smollm2-q8_0.gguf":
            link(home / ".lmstudio/models/bartowski/SmolLM2-GGUF/smollm2-q8_0.gguf"),
        "hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-instruct-q8_0.gguf":
            link(home / ".cache/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/snapshots/"
                        "abc123/smollm2-135m-instruct-q8_0.gguf"),
    }
    link(home / ".lmstudio/models/bartowski/SmolLM2-GGUF/mmproj-smollm2-f16.gguf")  # a projector
    (home / ".cache/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/refs").mkdir(parents=True)
    (home / ".cache/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/refs/main").write_text("abc123")
    ollama = home / ".ollama/models"
    digest = "sha256:" + "ab" * 32
    blob = link(ollama / "blobs" / digest.replace(":", "-"))
    for name, tag in (("smollm2", "latest"), ("smollm2", "135m")):
        manifest = ollama / "manifests/registry.ollama.ai/library" / name / tag
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"layers": [
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32},
            {"mediaType": "application/vnd.ollama.image.model", "digest": digest}]}))
        paths[f"ollama:{name}:{tag}"] = blob
    return home, paths


def test_other_tools_models_are_found_and_used_in_place(tools_home):
    home, paths = tools_home
    models = {f.name: f.path for f in found.found()}
    assert models == paths  # no projector, nothing copied
    for name, path in paths.items():
        assert store.resolve(name) == path
    assert store.resolve("ollama:smollm2") == paths["ollama:smollm2:latest"]  # Ollama's default tag
    with pytest.raises(LocalspecError, match="localspec models"):
        store.resolve("ollama:nonesuch:latest")


def test_models_lists_them_and_generate_runs_one(tools_home, tmp_path):
    home, paths = tools_home
    r = localspec("models", home=tmp_path / "ls")
    assert r.returncode == 0, r.stderr
    for name in paths:
        assert name in r.stdout
    r = localspec("generate", "-m", "ollama:smollm2", "--max-tokens", "4", "--drafter", "none",
                  "--curve", str(RECORDED_CURVE), "Hello", home=tmp_path / "ls")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert_one_line_error(localspec("generate", "-m", "lmstudio:nobody/none/x.gguf", "hi", home=tmp_path / "ls"),
                          "not found", "localspec models")


def test_auto_drafts_with_a_smaller_model_found_that_shares_the_tokenizer(tools_home, small_path, capsys):
    """No registry draft model here: auto looks among the models this machine has for one at
    most half the target's size with the target's tokenizer, and says which it took."""
    import gguf
    from gguf_files import rewrite

    from localspec.drafters.spec import DrafterSpec
    from localspec.engine import Engine, EngineConfig

    home, _ = tools_home
    tiny = home / ".lmstudio/models/acme/SmolLM2-2-layers-GGUF/smollm2-2-layers.gguf"
    tiny.parent.mkdir(parents=True)
    rewrite(small_path, tiny, {"llama.block_count": (2, gguf.GGUFValueType.UINT32)},
            keep_tensor=lambda name: not name.startswith("blk.") or int(name.split(".")[1]) < 2)
    engine = Engine(EngineConfig(model=str(small_path), n_ctx=512, threads=2, store="off", flat_cost=True))
    try:
        assert DrafterSpec("draft", model=str(tiny)) in engine.drafters.available()
    finally:
        engine.close()
    assert "auto drafts with lmstudio:acme/SmolLM2-2-layers-GGUF/smollm2-2-layers.gguf" in capsys.readouterr().err
