"""Text around tokens: streaming-safe detokenization and the GGUF's chat template."""

from __future__ import annotations

from bisect import bisect_right
from datetime import date
from typing import Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.llama.model import Model
from localspec.errors import LocalspecError


class TextStream:
    """Tokens in, text out: never half a UTF-8 character (its bytes wait for the token that
    completes it), never any part of a stop string (text that could begin one waits until it
    cannot), each run of text marked with where its tokens came from. The text ends before the
    first stop string to appear in full."""

    def __init__(self, model: Model, stops: Sequence[str] = ()):
        self.model = model
        self.stops = [s for s in stops if s]
        self.pending = b""  # an incomplete character
        self.held: list[list] = []  # [text, source] runs not yet given out
        self.text = ""  # everything given out
        self.stopped = False
        self.matched = ""  # the stop string found
        self._out: list[tuple[str, str | None]] = []
        # Per token fed, where its text ends (characters decoded so far); a token whose bytes
        # end inside a character ends with that character, once a later token completes it.
        self._ends: list[int] = []
        self._decoded = 0
        self._unended = 0

    def feed(self, token: int, source: str | None = None) -> None:
        self.pending += self.model.token_bytes(token)
        n = complete_utf8_prefix(self.pending)
        new, self.pending = self.pending[:n].decode("utf-8", "replace"), self.pending[n:]
        self._end_tokens(len(new), 1)
        if not new or self.stopped:
            return
        if self.stops:
            self._hold(new, source)
        else:  # nothing to hold back (most requests): out at once
            self._give(new, source)

    def take(self, final: bool = False) -> tuple[tuple[str, str | None], ...]:
        """The runs of text given out since the last call (at the end, all that is held)."""
        if final and not self.stopped:
            rest, self.pending = self.pending.decode("utf-8", "replace"), b""
            self._end_tokens(len(rest), 0)
            if rest:
                self.held.append([rest, None])
            self._release(sum(len(t) for t, _ in self.held))
        out, self._out = tuple(self._out), []
        return out

    def tokens_out(self) -> int:
        """How many of the tokens fed have their text out in full; after a stop string, every
        token that gave any text (one may end inside the stop string), none past it."""
        n = bisect_right(self._ends, len(self.text))
        if self.stopped and n < len(self._ends) and (self._ends[n - 1] if n else 0) < len(self.text):
            n += 1
        return n

    def _end_tokens(self, n_chars: int, n_fed: int) -> None:
        self._decoded += n_chars
        self._unended += n_fed
        if not self.pending:
            self._ends += [self._decoded] * self._unended
            self._unended = 0

    def _hold(self, new: str, source: str | None) -> None:
        if self.held and self.held[-1][1] == source:
            self.held[-1][0] += new
        else:
            self.held.append([new, source])
        held = "".join(t for t, _ in self.held)
        found = [(i, s) for i, s in ((held.find(s), s) for s in self.stops) if i >= 0]
        if found:
            at, self.matched = min(found)
            self._release(at)
            self.held, self.stopped = [], True
            return
        # Keep back the longest end of the text that begins a stop string.
        keep = max((k for s in self.stops for k in range(1, len(s)) if held.endswith(s[:k])), default=0)
        self._release(len(held) - keep)

    def _give(self, text: str, source: str | None) -> None:
        """Give `text` out: it joins the run before when its tokens came from the same place."""
        if self._out and self._out[-1][1] == source:
            self._out[-1] = (self._out[-1][0] + text, source)
        else:
            self._out.append((text, source))
        self.text += text

    def _release(self, n: int) -> None:
        while n > 0 and self.held:
            text, source = self.held[0]
            part = text[:n]
            self._give(part, source)
            n -= len(part)
            if len(part) == len(text):
                self.held.pop(0)
            else:
                self.held[0][0] = text[len(part):]


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
