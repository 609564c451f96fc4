"""Where localspec keeps things: LOCALSPEC_HOME if set, else the platform's user dirs."""

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator

import platformdirs

from localspec.errors import LocalspecError
from localspec.progress import notice_on_stderr


def data_dir() -> Path:
    home = _home()
    return home if home else Path(platformdirs.user_data_dir("localspec"))


def cache_dir() -> Path:
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir("localspec"))


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A file beside `path` to write it at (a writer that takes a path: GGUF, torch, numpy):
    it takes path's place when the block ends, so a crash leaves the old file or the new one,
    never half of one; where the block fails (a full disk, an interrupt), it is removed."""
    tmp = path.with_name(path.name + ".partial")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_whole(path: Path, data: bytes) -> None:
    """Write `path` whole (see replacing), on the disk before it replaces the old one."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_cache(path: Path, data) -> None:
    """Write a cache file (JSON) whole; one the disk will not take (full) is said and skipped,
    made again next time, not a failed command. A cache folder that cannot be made (a file in
    its place) is an error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_whole(path, json.dumps(data, indent=2).encode())
    except OSError as e:
        notice_on_stderr(f"not caching {path.name}: {e.strerror or e}")


def read_cache(path: Path, default):
    """A cache file's JSON, or `default` where it is missing or unreadable (made again)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _home() -> Path | None:
    home = os.environ.get("LOCALSPEC_HOME")
    if home and Path(home).exists() and not Path(home).is_dir():
        raise LocalspecError(f"LOCALSPEC_HOME={home} is not a directory")
    return Path(home) if home else None
