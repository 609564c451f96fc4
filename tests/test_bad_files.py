"""A drafter or acceptance-head GGUF with a mistyped or missing metadata key, or cut short,
ends in one clear line: from the command line (a real process, so an abort inside ggml would
show as a signal) and from the native runtime on its own."""

import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from localspec import store
from localspec.drafters.acceptance_head import AcceptanceHead
from localspec.errors import LocalspecError

from gguf_files import DROP, rewrite, cut_short
from test_store_cli import assert_one_line_error, localspec

T = gguf.GGUFValueType
BROKEN = {  # name -> metadata changes (None: the file cut in half)
    "mistyped-int": {"jakiro.embedding_length": ("576", T.STRING)},
    "mistyped-float": {"jakiro.rope.freq_base": (10000, T.UINT32)},
    "mistyped-string": {"jakiro.target.tokenizer_hash": (7, T.UINT32)},
    "missing": {"jakiro.draft_steps": DROP},
    "cut-short": None,
}


@pytest.fixture(scope="module")
def broken_drafters(small_path, tmp_path_factory):
    shipped = store.shipped_drafter(small_path)
    out = tmp_path_factory.mktemp("broken")
    return {name: (cut_short(shipped, out / f"{name}.gguf") if keys is None
                   else rewrite(shipped, out / f"{name}.gguf", keys)) for name, keys in BROKEN.items()}


@pytest.mark.parametrize("name", BROKEN)
def test_a_broken_drafter_is_one_line_from_the_command_line(broken_drafters, small_path, name):
    r = localspec("generate", "-m", str(small_path), "--max-tokens", "4", "--drafter",
                  f"jakiro:{broken_drafters[name]}", "hello")
    assert r.returncode == 1, r.stderr  # an exit, not a signal
    assert_one_line_error(r, f"{name}.gguf")


@pytest.mark.parametrize("name", ["mistyped-int", "mistyped-float", "mistyped-string", "missing"])
def test_the_native_runtime_checks_each_key_itself(broken_drafters, small_path, name):
    """Past the Python checks: ggml would abort the process on a mistyped read."""
    code = ("from localspec import _native\n"
            f"try:\n    _native.JakiroModel({str(broken_drafters[name])!r}, {str(small_path)!r}, 64, 1)\n"
            "except RuntimeError as e:\n    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused:") and f"{name}.gguf" in r.stdout, r.stdout


HEAD = Path(__file__).parents[1] / "models" / "heads" / \
    "qwen2.5-coder-0.5b-instruct--qwen2.5-coder-1.5b-instruct.greedy.gguf"


@pytest.mark.parametrize("keys", [
    {"acceptance-head.block_count": ("1", T.STRING)},
    {"acceptance-head.label": (1.5, T.FLOAT32)},
    {"acceptance-head.embedding_length": DROP},
    None,
], ids=["mistyped-int", "mistyped-string", "missing", "cut-short"])
def test_a_broken_acceptance_head_is_one_line(keys, qwen_model, tmp_path):
    bad = cut_short(HEAD, tmp_path / "head.gguf") if keys is None else rewrite(HEAD, tmp_path / "head.gguf", keys)
    with pytest.raises(LocalspecError) as e:
        AcceptanceHead(bad, qwen_model, qwen_model)
    assert "head.gguf" in str(e.value) and "\n" not in str(e.value)


def test_a_context_too_small_for_the_engines_sequences_is_one_line(small_path):
    """llama.cpp aborts the process where a context holds fewer tokens than sequences (its
    outputs' buffer is sized by the smaller): refused before it gets there."""
    r = localspec("generate", "-m", str(small_path), "--max-tokens", "4", "--ctx", "8", "hello there, my friend")
    assert r.returncode == 1, r.stderr  # an exit, not a signal
    assert_one_line_error(r, "a context of 8 tokens is too small", "--ctx")
    r = localspec("generate", "-m", str(small_path), "--ctx", "-5", "hello")
    assert r.returncode == 2 and "argument --ctx: must be 0 or more" in r.stderr
