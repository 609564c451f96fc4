"""Models from the Hugging Face Hub, named as `llama-server -hf` names them: hf:OWNER/REPO
(llama.cpp's default quantization, Q4_K_M), hf:OWNER/REPO:QUANT or hf:OWNER/REPO/FILE.gguf.
They go into the Hugging Face cache, where found.py (and every other tool) finds them, through
huggingface_hub: an interrupted download resumes, HF_TOKEN opens gated repositories,
HF_ENDPOINT and HF_HUB_OFFLINE are honoured. A file counts as pulled once its sha256 is the
one the Hub gave for it; a split GGUF is pulled whole."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from localspec import found
from localspec.errors import LocalspecError

DEFAULT_QUANT = "Q4_K_M"  # what llama-server -hf picks when no quantization is named
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def is_hub_name(spec: str) -> bool:
    """hf:OWNER/REPO or hf:OWNER/REPO:QUANT (hf:OWNER/REPO/FILE is found.py's too)."""
    return spec.startswith("hf:") and spec[3:].count("/") >= 1


def parse(spec: str) -> tuple[str, str | None, str | None]:
    """hf:... -> (OWNER/REPO, QUANT or None, FILE or None)."""
    parts = spec[3:].split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise LocalspecError(f"'{spec}' is not hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf")
    if len(parts) > 2:
        return "/".join(parts[:2]), None, "/".join(parts[2:])
    repo, _, quant = "/".join(parts).partition(":")
    return repo, quant or None, None


def choose(files: list[str], quant: str | None, repo: str) -> list[str]:
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


def cached(spec: str) -> Path | None:
    """The file hf:... stands for in the Hugging Face cache (every part there), or None."""
    repo, quant, file = parse(spec)
    folder = found.hf_hub() / f"models--{repo.replace('/', '--')}"
    for snapshot in found.snapshots(folder) if folder.is_dir() else []:
        files = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf")]
        try:
            wanted = [file] if file else choose(files, quant, repo)
        except LocalspecError:
            continue
        if all((snapshot / f).is_file() for f in wanted):
            return snapshot / wanted[0]
    return None


def pull(spec: str, force: bool = False) -> Path:
    """Download hf:... into the Hugging Face cache (what is there already is kept, or resumed)
    and return the file to load (a split's first part)."""
    import huggingface_hub as hub
    from huggingface_hub import errors

    repo, quant, file = parse(spec)
    endpoint = os.environ.get("HF_ENDPOINT") or None  # read here: the library reads it at import
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    token = os.environ.get("HF_TOKEN") or None  # None: the token `hf auth login` stored, if any
    where = endpoint or "huggingface.co"
    if offline and (path := cached(spec)) is not None and not force:
        return path
    try:
        if offline:
            raise errors.OfflineModeIsEnabled()
        files = [file] if file else choose(
            hub.HfApi(endpoint=endpoint, token=token).list_repo_files(repo), quant, repo)
        paths = []
        for name in files:
            known = hub.try_to_load_from_cache(repo, name, cache_dir=found.hf_hub())
            path = hub.hf_hub_download(repo, name, cache_dir=found.hf_hub(), endpoint=endpoint,
                                       token=token, force_download=force)
            if force or not isinstance(known, str):
                check_sha256(Path(path), repo, name)
            paths.append(Path(path))
        return paths[0]
    except errors.OfflineModeIsEnabled:
        raise LocalspecError(f"{spec} is not in the Hugging Face cache ({found.hf_hub()}) and "
                             "HF_HUB_OFFLINE is set") from None
    except errors.GatedRepoError:
        raise LocalspecError(f"{repo} is gated: accept its terms on the Hub, then set HF_TOKEN to a "
                             "token of that account") from None
    except errors.RepositoryNotFoundError:
        raise LocalspecError(f"{repo} was not found on {where} (if it is private, set HF_TOKEN)") from None
    except (errors.EntryNotFoundError, errors.RevisionNotFoundError) as e:
        raise LocalspecError(f"{spec}: not on {where} ({_first_line(e)})") from None
    except errors.HfHubHTTPError as e:
        raise LocalspecError(f"{where} refused {spec}: {_first_line(e)}") from None
    except (OSError, ConnectionError) as e:  # the network: what was written so far is kept to resume
        raise LocalspecError(f"could not download {spec} from {where}: {_first_line(e)} "
                             "(pull it again to resume)") from None


def check_sha256(path: Path, repo: str, name: str) -> None:
    """The cache names a blob by the Hub's sha256 of it (large files): the download must hash to
    that, or it is removed and refused."""
    blob = path.resolve()
    if not SHA256.match(blob.name):
        return  # a small file, named by its git id: the Hub gives no sha256 for it
    sha = hashlib.sha256()
    with open(blob, "rb") as f:
        while chunk := f.read(1 << 24):
            sha.update(chunk)
    if sha.hexdigest() != blob.name:
        blob.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise LocalspecError(f"download of {name} from {repo} is corrupt: sha256 {sha.hexdigest()[:16]}… "
                             f"is not the Hub's {blob.name[:16]}…; nothing was kept")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
