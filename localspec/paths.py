"""Where localspec keeps things: LOCALSPEC_HOME if set, else the platform's user dirs."""

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    home = os.environ.get("LOCALSPEC_HOME")
    return Path(home) if home else Path(platformdirs.user_data_dir("localspec"))


def cache_dir() -> Path:
    home = os.environ.get("LOCALSPEC_HOME")
    return Path(home) / "cache" if home else Path(platformdirs.user_cache_dir("localspec"))
