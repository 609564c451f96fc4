"""No model file can take the process down: corrupted copies of SmolLM2 (truncated, flipped
header fields, every hyperparameter llama.cpp sizes arrays by with a wrong type or an
out-of-range value, shapes that lie, missing tensors) each give one line, in generate, serve
and chat alike."""

import json
import struct
import subprocess
import sys
from pathlib import Path

from test_chat import Recording, config, run, until
from test_store_cli import assert_one_line_error, localspec

import corrupt_gguf

from localspec.llama import gguf
from localspec.llama.model import check_gguf

HERE = Path(__file__).parent


def test_every_corrupted_copy_is_one_line_and_no_crash(small_path, tmp_path):
    # In a process of its own: before the header was checked, a block_count of 2^30 aborted it.
    r = subprocess.run([sys.executable, "-X", "faulthandler", str(HERE / "corrupt_gguf.py"), str(small_path),
                        str(tmp_path)], capture_output=True, text=True, timeout=600)
    outcomes = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    ended = [o for o in outcomes if o["outcome"] != "starting"]
    assert r.returncode == 0, f"the process died on {outcomes[-1]['case']}: {r.stderr[-2000:]}"
    assert len(ended) >= 80
    for o in ended:
        assert o["outcome"] == "error", f"{o['case']}: loaded"  # no answer from a corrupt file
        line = o["line"]
        assert "\n" not in line and ("cannot load" in line or "not a GGUF" in line), (o["case"], line)
    # Those llama.cpp would have aborted on, or let through, say what is wrong in the file.
    said = {o["case"]: o["line"] for o in ended}
    assert "block_count is 1073741824 (expected 1 to 512)" in said["llama.block_count = 1073741824 (type 4)"]
    assert "ends past the end of the file" in said[f"truncated at {small_path.stat().st_size // 2} bytes"]


def test_the_header_of_a_good_file(small_path):
    header = gguf.read_header(small_path)
    meta = header.metadata
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 30
    assert meta["tokenizer.ggml.tokens"] == ("strings", 49152)
    assert len(header.tensors) == 272 and header.data_start % 32 == 0
    check_gguf(small_path)  # passes


def bad_copy(small_path: Path, dest: Path) -> Path:
    """SmolLM2 with the block_count of 2^30 that aborted the process."""
    parsed = corrupt_gguf.parse(small_path)
    corrupt_gguf.write(corrupt_gguf.with_kv(parsed, "llama.block_count", 4, struct.pack("<I", 1 << 30)),
                       small_path, dest)
    return dest


def test_generate_and_serve_refuse_a_bad_model_in_one_line(small_path, tmp_path):
    bad = bad_copy(small_path, tmp_path / "bad.gguf")
    assert_one_line_error(localspec("generate", "-m", str(bad), "hi"), "block_count", "bad.gguf")
    r = localspec("serve", "-m", str(bad), "--port", "0", timeout=120)
    assert_one_line_error(r, "block_count", "bad.gguf")


def test_chat_switching_to_a_bad_model_keeps_the_one_it_had(small_path, tmp_path):
    bad = bad_copy(small_path, tmp_path / "bad.gguf")

    async def go():
        app = Recording(config(small_path, tmp_path))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.engine is not None)
            app.switch_model(str(bad))
            await until(pilot, lambda: app.engine is not None and not app.loading, timeout=120)
            return app.notices, app.is_running, app.engine.model.path
    notices, running, path = run(go())
    assert running and path == small_path
    assert any("block_count" in n and "back to" in n for n in notices), notices
