"""The chat screen's parts: the prompt, one view per message, and the statistics line."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message as TextualMessage
from textual.widgets import ContentSwitcher, Markdown, Static, TextArea
from textual.widgets.markdown import MarkdownFence

# Text from accepted drafts, by drafter kind (what precedes ':' in its name).
DRAFT_STYLES = {"lookup": "$text-success on $success-muted", "draft": "$text-warning on $warning-muted",
                "jakiro": "$text-accent on $accent-muted"}


def draft_style(drafter: str) -> str:
    return DRAFT_STYLES.get(drafter.split(":")[0], "$text-primary on $primary-muted")


class PromptArea(TextArea):
    """Enter sends; Shift+Enter and Ctrl+J insert a newline (many terminals send Shift+Enter as
    a plain Enter, so Ctrl+J always works)."""

    HELP = "Enter: send · Shift+Enter or Ctrl+J: new line · Esc: stop the answer"

    @dataclass
    class Submitted(TextualMessage):
        text: str

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Submitted(self.text))
            return
        if event.key in ("shift+enter", "ctrl+j"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)


class CodeBlock(MarkdownFence):
    """A code block coloured by the language it names, and left plain where it names none.
    Textual would have Pygments guess, running every lexer it has over the block, again on
    each update of a streamed block, in the app's event loop: 1.6 s in all for one 2,400-
    character block of a random model's answer, the cost depending on what the model wrote,
    and the guess often wrong (a Tera Term macro for a Python function)."""

    @classmethod
    def highlight(cls, code: str, language: str, ansi: bool = False, dark: bool = False) -> Content:
        return super().highlight(code, language or "text", ansi=ansi, dark=dark)


class AnswerMarkdown(Markdown):
    BLOCKS = {**Markdown.BLOCKS, "fence": CodeBlock, "code_block": CodeBlock}


class MessageView(Vertical):
    """One message: Markdown (streamed as it is written), or the same text with drafted runs
    coloured by drafter; its statistics below, on demand."""

    def __init__(self, role: str, text: str = "", pieces: list | None = None, stats: dict | None = None,
                 stopped: bool = False, highlight: bool = False):
        super().__init__(classes=role)
        self.role, self.text, self.pieces = role, text, list(pieces or [])
        self.stats, self.stopped, self.highlight = dict(stats or {}), stopped, highlight
        self._stream = None

    def compose(self) -> ComposeResult:
        if self.role == "user":
            yield Static(self.text, markup=False, classes="body")
            return
        with ContentSwitcher(initial="hl" if self.highlight else "md"):
            yield AnswerMarkdown(self.text, id="md", open_links=False)
            yield Static(self._coloured(), id="hl", markup=False)
        yield Static(self._footnote(), classes="footnote", markup=False)
        yield Static(format_stats(self.stats, full=True), classes="stats", markup=False)

    def _coloured(self) -> Content:
        return Content.assemble(*[(t, draft_style(d)) if d else t for t, d in self.pieces])

    def _footnote(self) -> str:
        return "⏹ stopped" if self.stopped else ""

    async def append(self, pieces: list[tuple[str, str | None]]) -> None:
        """Text the answer grew by: streamed into the Markdown without re-rendering the rest."""
        text = "".join(t for t, _ in pieces)
        if not text:
            return
        for t, d in pieces:
            if self.pieces and self.pieces[-1][1] == d:
                self.pieces[-1] = [self.pieces[-1][0] + t, d]
            else:
                self.pieces.append([t, d])
        self.text += text
        if self.highlight:
            self.query_one("#hl", Static).update(self._coloured())
        else:
            if self._stream is None:
                self._stream = Markdown.get_stream(self.query_one("#md", Markdown))
            await self._stream.write(text)

    async def finish(self, stats: dict, stopped: bool) -> None:
        """The answer ended: a last full render (a streamed code fence may need it)."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.stats, self.stopped = stats, stopped
        await self.query_one("#md", Markdown).update(self.text)
        self.query_one("#hl", Static).update(self._coloured())
        self.query_one(".footnote", Static).update(self._footnote())
        self.query_one(".stats", Static).update(format_stats(stats, full=True))

    async def set_highlight(self, on: bool) -> None:
        if self.role == "user" or on == self.highlight:
            return
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.highlight = on
        md = self.query_one("#md", Markdown)
        if md.source != self.text:
            await md.update(self.text)
        self.query_one("#hl", Static).update(self._coloured())
        self.query_one(ContentSwitcher).current = "hl" if on else "md"


def format_stats(s: dict, full: bool = False) -> str:
    """An answer's numbers in one line: speed, τ, drafts accepted, what ran, the cache."""
    if not s:
        return ""
    parts = [f"{s.get('predicted_per_second', 0):.1f} tok/s", f"τ {s.get('tau', 0):.2f}"]
    if s.get("draft_n"):
        parts.append(f"drafts {s['draft_n_accepted']}/{s['draft_n']} accepted")
    if s.get("arm"):
        parts.append(s["arm"])
    parts.append(f"{s.get('cache_n', 0)} cached")
    if full:
        parts.append(f"{s.get('predicted_n', 0)} tokens, prompt {s.get('prompt_n', 0) + s.get('cache_n', 0)}")
        ran = s.get("ran") or {}
        if ran:
            parts.append("ran " + ", ".join(f"{arm} ×{n}" for arm, n in sorted(ran.items(), key=lambda x: -x[1])))
    return " · ".join(parts)


class StatusLine(Static):
    """Live numbers of the answer being written (or the last one), and what the app is doing."""
