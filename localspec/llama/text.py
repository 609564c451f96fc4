"""Text around tokens: streaming-safe detokenization and the GGUF's chat template."""

from __future__ import annotations

from datetime import date

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.llama.model import Model
from localspec.errors import LocalspecError


class StreamDecoder:
    """Turns tokens into text as they come, never emitting half a UTF-8 character:
    bytes of an incomplete character wait for the token that completes it."""

    def __init__(self, model: Model):
        self.model = model
        self.pending = b""

    def feed(self, token: int) -> str:
        self.pending += self.model.token_bytes(token)
        n = complete_utf8_prefix(self.pending)
        text, self.pending = self.pending[:n].decode("utf-8", "replace"), self.pending[n:]
        return text

    def flush(self) -> str:
        text, self.pending = self.pending.decode("utf-8", "replace"), b""
        return text


def complete_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    n = len(data)
    # A character is at most 4 bytes: look back at most 3 for the lead byte of the last one.
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else \
            4 if b >> 3 == 0b11110 else 1  # an invalid lead byte is emitted (as U+FFFD)
        return n if back >= need else n - back
    return n


def render_chat(model: Model, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Apply the chat template stored in the GGUF (jinja, as the model's authors wrote it)."""
    template = model.chat_template
    if not template:
        raise LocalspecError(f"{model.path.name} has no chat template; drop --chat")

    def raise_exception(message: str) -> None:
        raise LocalspecError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        loader=jinja2.BaseLoader())
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: date.today().strftime(fmt))
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=model.detokenize([model.special.bos], special=True) if model.special.bos >= 0 else "",
        eos_token=model.detokenize([model.special.eos], special=True) if model.special.eos >= 0 else "",
    )


def chat_tokens(model: Model, messages: list[dict]) -> list[int]:
    """Token ids of a chat prompt. The template writes any BOS itself, so none is added."""
    return model.tokenize(render_chat(model, messages), add_special=False, parse_special=True)
