"""Exactly one copy of ggml and llama in the process, and it is llama-cpp-python's."""

import os
import subprocess
import sys
from pathlib import Path

import llama_cpp

LIB_DIR = Path(llama_cpp.__file__).parent / "lib"


def loaded_libraries(pid: int | str = "self") -> dict[str, set[str]]:
    """Distinct files mapped for each shared-library base name (libggml-base, libllama...)."""
    libs: dict[str, set[str]] = {}
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        name = os.path.basename(path)
        if name.startswith(("libggml", "libllama")):
            libs.setdefault(name.split(".so")[0], set()).add(os.path.realpath(path))
    return libs


def test_one_copy_of_ggml_and_llama(small_ctx):
    from localspec import _native

    # Both bindings ask the same libllama: they report the same build.
    assert _native.system_info() == llama_cpp.llama_print_system_info().decode()
    libs = loaded_libraries()
    for base in ("libggml", "libggml-base", "libllama"):
        assert base in libs, f"{base} not loaded"
    for base, paths in libs.items():
        assert len(paths) == 1, f"{base} loaded from {len(paths)} files: {paths}"
        (path,) = paths
        assert Path(path).parent == LIB_DIR.resolve(), f"{base} came from {path}, not {LIB_DIR}"


def test_native_module_links_llama_cpp_python_libraries():
    """The native module's own dependencies resolve to llama_cpp/lib even when it is
    loaded first, in a fresh interpreter."""
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.find_spec('localspec._native')\n"
            "print(spec.origin)\n")
    origin = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    ldd = subprocess.run(["ldd", origin], capture_output=True, text=True, check=True).stdout
    for line in ldd.splitlines():
        if "libllama" in line or "libggml" in line:
            resolved = line.split("=>")[1].split("(")[0].strip()
            assert Path(resolved).resolve().parent == LIB_DIR.resolve(), line
