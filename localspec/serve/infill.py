"""Fill-in-the-middle prompts, built as llama-server builds them (format_prompt_infill), so
editors get the completions they get from llama.cpp: the extra chunks in the repository
format where the vocabulary has it (Qwen2.5-Coder's <|repo_name|> and <|file_sep|>), then
[FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]; the prefix keeps its end, the suffix its
start, the extra chunks their newest tokens."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.errors import LocalspecError
from localspec.llama.model import Model

SNIPPET = "\n\n--- snippet ---\n\n"  # between chunks when the vocabulary has no file separator


@dataclass(frozen=True)
class ExtraChunk:
    filename: str
    text: str


def missing_fim_tokens(model: Model) -> str:
    """What a model lacks for infill ('' if nothing), in llama-server's words."""
    s = model.special
    return "".join(f"{what} token is missing. " for what, tok in
                   (("prefix", s.fim_pre), ("suffix", s.fim_suf), ("middle", s.fim_mid)) if tok < 0)


# The extra chunks of /infill fill the context beyond one batch, keeping room for this many
# tokens of answer twice over (llama-server: its -n; here the editors' usual n_predict).
INFILL_PREDICT = 128
INFILL_BATCH = 2048


def infill_tokens(model: Model, prefix: str, suffix: str, prompt: str, extra: list[ExtraChunk],
                  n_batch: int, n_ctx: int, n_predict: int) -> list[int]:
    """The token sequence llama-server decodes for an /infill request. `n_batch` bounds what the
    prefix and suffix keep (3/4 and 1/4 of it); the extra chunks fill the context beyond that,
    keeping room for 2 * n_predict tokens."""
    missing = missing_fim_tokens(model)
    if missing:
        raise LocalspecError(f"Infill is not supported by this model: {missing}")
    s = model.special

    def text(t: str) -> list[int]:  # what the user typed: never special tokens
        return model.tokenize(t, add_special=False, parse_special=False)

    extra_tokens: list[int] = []
    if s.fim_rep >= 0:
        extra_tokens += [s.fim_rep] + text("myproject\n")
    for chunk in extra:
        extra_tokens += [s.fim_sep] + text((chunk.filename or "tmp") + "\n") if s.fim_sep >= 0 else text(SNIPPET)
        extra_tokens += text(chunk.text)
    if s.fim_sep >= 0:
        extra_tokens += [s.fim_sep] + text("filename\n")
    prompt_tokens = model.tokenize(prompt, add_special=False, parse_special=True)
    pre, suf = text(prefix), text(suffix)
    n_prefix = min(len(pre), 3 * (n_batch // 4))
    n_suffix = min(len(suf), max(0, n_batch // 4 - (2 + len(prompt_tokens))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    tokens = extra_tokens[len(extra_tokens) - n_extra:]
    if model.add_bos:
        tokens.append(s.bos)
    tokens += [s.fim_pre] + pre[len(pre) - n_prefix:] + prompt_tokens
    tokens += [s.fim_suf] + suf[:n_suffix] + [s.fim_mid]
    return tokens
