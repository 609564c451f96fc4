"""The model store: a registry of known models, the GGUF files pulled to disk, and where a
name's file is on this machine. Only what is here: pull.py downloads."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from localspec import found
from localspec.llama.model import check_gguf
from localspec.errors import LocalspecError
from localspec.paths import data_dir, write_whole

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT_MODEL = "qwen2.5-coder-0.5b-instruct"  # auto's, and --drafter draft's


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


def builtin_registry() -> dict:
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


def local_registry_path() -> Path:
    return store_dir() / "local.json"


def read_local_registry() -> dict:
    path = local_registry_path()
    if not path.exists():
        return {}
    try:
        local = json.loads(path.read_text())
        if not isinstance(local, dict):
            raise ValueError("not an object")
        return local
    except (ValueError, UnicodeDecodeError) as e:
        raise LocalspecError(f"{path} is not a model registry ({e}): move it aside, "
                             "then `localspec pull` the local models again") from None


def write_local_registry(local: dict) -> None:
    write_whole(local_registry_path(), json.dumps(local, indent=2).encode())


def registry() -> dict[str, ModelEntry]:
    entries = {}
    for source in (builtin_registry(), read_local_registry()):
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


class NotPulled(LocalspecError):
    """A model known by name that is not on this machine yet (pull.py gets it)."""

    def __init__(self, spec: str):
        super().__init__(f"model '{spec}' is not pulled: run `localspec pull {spec}`")


def resolve(spec: str) -> Path:
    """A registry name, a GGUF path, a Hub name or a model found in another tool's folder
    (SOURCE:WHAT, localspec/found.py) -> the GGUF file on this machine to load."""
    if found.is_hub_name(spec):
        path = found.find(spec) or found.hub_cached(spec)
        if path is None:
            raise NotPulled(spec)
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
    raise NotPulled(spec)


def remove(name: str) -> Path:
    lookup(name)
    path = stored_path(name)
    if not path.exists():
        raise LocalspecError(f"model '{name}' is not on disk")
    path.unlink()
    local = read_local_registry()
    if local.pop(name, None) is not None:
        write_local_registry(local)
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
