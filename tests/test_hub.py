"""`localspec pull hf:OWNER/REPO[:QUANT]` as llama-server -hf names models, through
huggingface_hub, against a local server in the Hub's layout (the Hub itself cannot be reached
here): into the Hugging Face cache, sha256-checked, resumed, gated, offline, split."""

import hashlib
import os
import subprocess
import sys

import pytest
from hub_server import COMMIT, Hub, serve

from localspec import found, store
from localspec.cli import main

REPO = "acme/SmolLM2-135M-Instruct-GGUF"


@pytest.fixture
def hub_home(tmp_path, monkeypatch, small_path):
    """A Hub holding SmolLM2 as Q4_K_M (the real file) and a few other files; HF_HOME empty."""
    for var in ("HF_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    state = Hub()
    state.add(REPO, "smollm2-135m-instruct-Q4_K_M.gguf", small_path)
    state.add(REPO, "smollm2-135m-instruct-Q8_0.gguf", b"GGUF but not this one")
    state.add(REPO, "mmproj-smollm2-f16.gguf", b"a projector")
    state.add(REPO, "README.md", b"# SmolLM2\n")
    server, url = serve(state)
    monkeypatch.setenv("HF_ENDPOINT", url)
    yield state, tmp_path / "hf" / "hub"
    server.shutdown()


def assert_one_line_error(code: int, capsys, needle: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("localspec: error:") and needle in err[-1], err
    assert not any("Traceback" in line for line in err), err


def pulled(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_pull_by_repository_and_quantization_into_the_hf_cache(hub_home, small_path, capsys):
    state, cache = hub_home
    assert main(["pull", f"hf:{REPO}"]) == 0  # no quantization named: Q4_K_M, as llama-server's
    path = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT / "smollm2-135m-instruct-Q4_K_M.gguf"
    assert pulled(capsys) == str(path)
    assert path.resolve().name == hashlib.sha256(small_path.read_bytes()).hexdigest()  # blob by its sha256
    assert store.resolve(f"hf:{REPO}") == path == store.resolve(f"hf:{REPO}:q4_k_m")  # in place, no network
    assert f"hf:{REPO}/smollm2-135m-instruct-Q4_K_M.gguf" in {f.name for f in found.found()}
    gets = len(state.ranges)
    assert main(["pull", f"hf:{REPO}:Q4_K_M"]) == 0 and pulled(capsys) == str(path)
    assert len(state.ranges) == gets  # already there: nothing downloaded again
    assert_one_line_error(main(["pull", f"hf:{REPO}:Q2_K"]), capsys,
                          f"{REPO} has no GGUF for Q2_K: it has smollm2-135m-instruct-Q4_K_M.gguf, "
                          "smollm2-135m-instruct-Q8_0.gguf")


def test_a_pulled_model_runs_offline(hub_home, capsys):
    assert main(["pull", f"hf:{REPO}"]) == 0
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")  # nothing there
    out = subprocess.run([sys.executable, "-m", "localspec.cli", "generate", "-m", f"hf:{REPO}", "--drafter", "none",
                          "--max-tokens", "4", "The capital of France is"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip()


def test_offline_unknown_and_gated_are_one_line(hub_home, monkeypatch, capsys):
    state, _ = hub_home
    assert_one_line_error(main(["pull", "hf:acme/nonesuch"]), capsys, "acme/nonesuch was not found on")
    assert_one_line_error(main(["pull", f"hf:{REPO}/nonesuch.gguf"]), capsys, f"hf:{REPO}/nonesuch.gguf: not on")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_one_line_error(main(["pull", f"hf:{REPO}"]), capsys, f"hf:{REPO} is not in the Hugging Face cache")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    state.gated[REPO] = "secret"
    assert_one_line_error(main(["pull", f"hf:{REPO}"]), capsys, f"{REPO} is gated")
    monkeypatch.setenv("HF_TOKEN", "secret")
    assert main(["pull", f"hf:{REPO}"]) == 0


def test_a_corrupt_download_is_refused_and_not_kept(hub_home, capsys):
    state, cache = hub_home
    state.wrong_sha.add("smollm2-135m-instruct-Q4_K_M.gguf")
    assert_one_line_error(main(["pull", f"hf:{REPO}"]), capsys,
                          f"download of smollm2-135m-instruct-Q4_K_M.gguf from {REPO} is corrupt")
    assert found.hub_cached(f"hf:{REPO}") is None
    assert not [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size > 1000]  # no model bytes kept


def test_an_interrupted_download_resumes(hub_home, small_path, capsys):
    state, _ = hub_home
    state.drop_once.add("smollm2-135m-instruct-Q4_K_M.gguf")
    if main(["pull", f"hf:{REPO}"]) != 0:  # the library may resume on its own, or say so in one line
        assert "pull it again to resume" in capsys.readouterr().err
        assert main(["pull", f"hf:{REPO}"]) == 0
    starts = [start for name, start in state.ranges if name == "smollm2-135m-instruct-Q4_K_M.gguf"]
    assert starts[0] == 0 and starts[-1] > 0  # the second GET started where the first stopped
    assert found.hub_cached(f"hf:{REPO}").read_bytes() == small_path.read_bytes()


def test_a_split_gguf_is_pulled_whole(hub_home, capsys):
    state, _ = hub_home
    parts = [f"big/model-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    for i, name in enumerate(parts):
        state.add("acme/big-GGUF", name, bytes([i]) * 5000)
    state.add("acme/big-GGUF", "model-Q8_0.gguf", b"not this")
    assert main(["pull", "hf:acme/big-GGUF"]) == 0
    path = found.hf_hub() / "models--acme--big-GGUF" / "snapshots" / COMMIT / parts[0]
    assert pulled(capsys) == str(path)
    assert all((path.parents[1] / name).read_bytes() == bytes([i]) * 5000 for i, name in enumerate(parts))
    assert found.hub_cached("hf:acme/big-GGUF") == path


@pytest.mark.unit
def test_hub_names_parse():
    assert found.parse_hub("hf:a/b") == ("a/b", None, None)
    assert found.parse_hub("hf:a/b:Q8_0") == ("a/b", "Q8_0", None)
    assert found.parse_hub("hf:a/b/sub/c.gguf") == ("a/b", None, "sub/c.gguf")
    with pytest.raises(Exception, match="not hf:OWNER/REPO"):
        found.parse_hub("hf:a/")
