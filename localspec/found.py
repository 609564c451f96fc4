"""GGUF files the user already has from other tools, used in place and never copied: llama.cpp's
`-hf` cache, LM Studio's models folder, Ollama's blobs (read through its manifests), the
Hugging Face cache, and the folders in LOCALSPEC_MODEL_DIRS. Each gets a name `-m` takes,
SOURCE:WHAT (`ollama:qwen2.5-coder:1.5b`, `hf:OWNER/REPO/FILE.gguf`, ...), and a model pulled from
the Hub is found by the name it was pulled by (hf:OWNER/REPO[:QUANT]). Nothing here downloads."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from localspec.errors import LocalspecError

DEFAULT_QUANT = "Q4_K_M"  # what llama-server -hf picks when no quantization is named
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
OLLAMA_MODEL = "application/vnd.ollama.image.model"
LATER_PART = re.compile(r"-000(0[2-9]|[1-9]\d)-of-\d{5}\.gguf$")  # llama.cpp loads a split from its first part


@dataclass(frozen=True)
class Found:
    name: str    # what -m takes
    path: Path
    source: str  # where it was found


def _ggufs(paths) -> list[Path]:
    """The model files among `paths`: GGUFs, not vision projectors, a split by its first part."""
    return sorted(p for p in paths if p.is_file() and "mmproj" not in p.name.lower() and not LATER_PART.search(p.name))


def llama_cpp_cache() -> Path:
    return Path(os.environ.get("LLAMA_CACHE") or platformdirs.user_cache_dir("llama.cpp", appauthor=False))


def lmstudio_dirs() -> list[Path]:
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def ollama_dir() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def hf_hub() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"


def found() -> list[Found]:
    """Every model file found, in the order above."""
    out = []
    cache = llama_cpp_cache()
    out += [Found(f"llama.cpp:{p.name}", p, "llama.cpp -hf cache") for p in _ggufs(cache.glob("*.gguf"))]
    for root in lmstudio_dirs():
        out += [Found(f"lmstudio:{p.relative_to(root).as_posix()}", p, "LM Studio")
                for p in _ggufs(root.glob("*/*/*.gguf"))]
    out += list(_ollama())
    hub = hf_hub()
    for repo in sorted(hub.glob("models--*--*")):
        owner_repo = repo.name[len("models--"):].replace("--", "/", 1)
        for snapshot in snapshots(repo):
            out += [Found(f"hf:{owner_repo}/{p.relative_to(snapshot).as_posix()}", p, "Hugging Face cache")
                    for p in _ggufs(snapshot.rglob("*.gguf"))]
    for folder in (Path(d).expanduser() for d in os.environ.get("LOCALSPEC_MODEL_DIRS", "").split(os.pathsep) if d):
        out += [Found(f"folder:{p.stem}", p, str(folder)) for p in _ggufs(folder.glob("*.gguf"))]
    return out


def snapshots(repo: Path) -> list[Path]:
    """The snapshot `main` points at, else every snapshot."""
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text().strip()
        if snapshot.is_dir():
            return [snapshot]
    return sorted(p for p in (repo / "snapshots").glob("*") if p.is_dir())


def _ollama():
    """Ollama's models: a manifest per name and tag, whose model layer is a blob by digest."""
    root = ollama_dir()
    manifests = root / "manifests"
    for manifest in sorted(p for p in manifests.glob("*/*/*/*") if p.is_file()):
        host, namespace, model, tag = manifest.relative_to(manifests).parts
        try:
            layers = json.loads(manifest.read_text()).get("layers", [])
            digest = next(l["digest"] for l in layers if l.get("mediaType") == OLLAMA_MODEL)
        except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError):
            continue  # not a model (or not a manifest we read)
        blob = root / "blobs" / digest.replace(":", "-")
        if not blob.is_file():
            continue
        name = model if (host, namespace) == ("registry.ollama.ai", "library") else \
            f"{namespace}/{model}" if host == "registry.ollama.ai" else f"{host}/{namespace}/{model}"
        yield Found(f"ollama:{name}:{tag}", blob, "Ollama")


SOURCES = ("llama.cpp", "lmstudio", "ollama", "hf", "folder")


def is_found_name(spec: str) -> bool:
    return spec.split(":", 1)[0] in SOURCES and ":" in spec


def find(spec: str) -> Path | None:
    """The file a SOURCE:WHAT name stands for (`ollama:NAME` is NAME:latest, as in Ollama)."""
    if spec.startswith("ollama:") and spec.count(":") == 1:
        spec += ":latest"
    return next((f.path for f in found() if f.name == spec), None)


# --- the Hugging Face Hub's names (hub.py pulls them) ---


def is_hub_name(spec: str) -> bool:
    """hf:OWNER/REPO or hf:OWNER/REPO:QUANT (hf:OWNER/REPO/FILE is found.py's too)."""
    return spec.startswith("hf:") and spec[3:].count("/") >= 1


def parse_hub(spec: str) -> tuple[str, str | None, str | None]:
    """hf:... -> (OWNER/REPO, QUANT or None, FILE or None)."""
    parts = spec[3:].split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise LocalspecError(f"'{spec}' is not hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf")
    if len(parts) > 2:
        return "/".join(parts[:2]), None, "/".join(parts[2:])
    repo, _, quant = "/".join(parts).partition(":")
    return repo, quant or None, None


def choose_gguf(files: list[str], quant: str | None, repo: str) -> list[str]:
    """The files of the GGUF a quantization names (every part of a split), as llama.cpp picks:
    the first whose name holds it, case aside; with none named, Q4_K_M, else the first GGUF."""
    ggufs = sorted(f for f in files if f.endswith(".gguf") and "mmproj" not in f.lower())
    want = (quant or DEFAULT_QUANT).lower()
    matching = [f for f in ggufs if want in Path(f).name.lower()] or ([] if quant else ggufs)
    if not matching:
        have = ", ".join(Path(f).name for f in ggufs) or "no GGUF files"
        raise LocalspecError(f"{repo} has no GGUF for {quant or DEFAULT_QUANT}: it has {have}")
    first = matching[0]
    split = SPLIT.search(first)
    if not split:
        return [first]
    stem = first[:split.start()]
    return [f"{stem}-{i:05d}-of-{split.group(2)}.gguf" for i in range(1, int(split.group(2)) + 1)]


def hub_cached(spec: str) -> Path | None:
    """The file hf:... stands for in the Hugging Face cache (every part there), or None."""
    repo, quant, file = parse_hub(spec)
    folder = hf_hub() / f"models--{repo.replace('/', '--')}"
    for snapshot in snapshots(folder) if folder.is_dir() else []:
        files = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf")]
        try:
            wanted = [file] if file else choose_gguf(files, quant, repo)
        except LocalspecError:
            continue
        if all((snapshot / f).is_file() for f in wanted):
            return snapshot / wanted[0]
    return None
