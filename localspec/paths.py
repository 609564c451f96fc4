"""Where localspec keeps things: LOCALSPEC_HOME if set, else the platform's user dirs."""

import os
from pathlib import Path

import platformdirs

from localspec.errors import LocalspecError


def data_dir() -> Path:
    home = _home()
    return home if home else Path(platformdirs.user_data_dir("localspec"))


def cache_dir() -> Path:
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir("localspec"))


def write_whole(path: Path, data: bytes) -> None:
    """Write `path` so a crash leaves the old file or the new one, never half of one; where
    the disk refuses it (full), no half file is left beside the old one either."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _home() -> Path | None:
    home = os.environ.get("LOCALSPEC_HOME")
    if home and Path(home).exists() and not Path(home).is_dir():
        raise LocalspecError(f"LOCALSPEC_HOME={home} is not a directory")
    return Path(home) if home else None
