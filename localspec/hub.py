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

SHA256 = re.compile(r"^[0-9a-f]{64}$")


def pull(spec: str, force: bool = False) -> Path:
    """Download hf:... into the Hugging Face cache (what is there already is kept, or resumed)
    and return the file to load (a split's first part)."""
    import huggingface_hub as hub
    from huggingface_hub import errors

    repo, quant, file = found.parse_hub(spec)
    endpoint = os.environ.get("HF_ENDPOINT") or None  # read here: the library reads it at import
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    token = os.environ.get("HF_TOKEN") or None  # None: the token `hf auth login` stored, if any
    where = endpoint or "huggingface.co"
    if offline and (path := found.hub_cached(spec)) is not None and not force:
        return path
    try:
        if offline:
            raise errors.OfflineModeIsEnabled()
        files = [file] if file else found.choose_gguf(
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
