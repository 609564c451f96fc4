"""`localspec chat`: a person chats with a local model in a terminal, faster than plain
llama.cpp with output that is exactly the model's, and sees what speculation is doing.

One engine, loaded in a thread while the screen shows its progress; each answer is generated
in a thread worker that posts the engine's events to the app, which streams them into the
conversation and saves them as they come (at least every second)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, OptionList
from textual.widgets.option_list import Option

from localspec.drafters.spec import DrafterSpec
from localspec.engine import Delta, Done, Engine, EngineConfig, Reason, Request, coalesce
from localspec.errors import LocalspecError
from localspec.llama.text import chat_tokens
from localspec.paths import data_dir
from localspec.sampling import SamplingConfig
from localspec.worker import END, Job, Worker
from tui.commands import ChatCommands
from tui.loading import EngineLoading
from tui.screens import ProgressScreen
from tui.store import Conversation, Message, Store
from tui.widgets import MessageView, PromptArea, StatusLine, format_stats

SAVE_EVERY = 0.5  # seconds between saves of an answer as it streams
# Seconds between updates of the screen while an answer streams: each update re-renders the
# answer's last Markdown block, which costs the engine's threads CPU time on a small machine.
UPDATE_EVERY = 0.1
RESERVE = 512     # tokens of the context kept free for the answer


@dataclass(frozen=True)
class ChatConfig:
    engine: EngineConfig = EngineConfig()
    db: Path | None = None   # None: chats.db in localspec's data directory
    log: Path | None = None  # llama.cpp's log; None: chat.log beside the database
    max_tokens: int = 1024   # per answer


@dataclass
class Live:
    """The answer's numbers while it is written."""
    start: float = 0.0     # when its first token came
    tokens: int = 0
    from_drafts: int = 0
    iterations: int = 0    # after the first token
    arm: str = ""

    def add(self, d: Delta) -> None:
        if d.arm == "prompt":
            self.start = time.monotonic()
        self.tokens += d.n_tokens
        self.from_drafts += d.n_drafted
        self.iterations += d.iterations if d.arm != "prompt" else 0
        self.arm = d.arm

    def line(self) -> str:
        seconds = time.monotonic() - self.start
        speed = (self.tokens - 1) / seconds if seconds > 0 and self.tokens > 1 else 0.0
        return (f"{speed:.1f} tok/s · τ {self.tokens / (self.iterations + 1):.2f} · {self.from_drafts} "
                f"from drafts · {self.arm} · writing (Esc stops)")


class ChatApp(EngineLoading, ChatCommands, App):
    CSS_PATH = Path(__file__).with_name("chat.tcss")  # absolute: subclasses live elsewhere
    TITLE = "localspec chat"
    AUTO_FOCUS = "#prompt"
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_conversation", "New"),
        Binding("ctrl+b", "toggle_list", "Chats"),
        Binding("ctrl+t", "toggle_highlight", "Drafts"),
        Binding("f1", "keys", "Keys"),
        Binding("f2", "rename", "Rename", show=False),
        Binding("f3", "toggle_stats", "Stats", show=False),
        Binding("f4", "copy_code", "Copy code", show=False),
        Binding("f5", "regenerate", "Again", show=False),
        Binding("f6", "settings", "Settings", show=False, priority=True),  # the prompt binds F6, F7
        Binding("f7", "switch_model", "Model", show=False, priority=True),
        Binding("f8", "delete", "Delete", show=False),
        Binding("f9", "export", "Export", show=False),
    ]

    def __init__(self, cfg: ChatConfig = ChatConfig()):
        super().__init__()
        self.cfg = cfg
        self.db_path = cfg.db or data_dir() / "chats.db"
        self.log_path = cfg.log or self.db_path.with_name("chat.log")
        self.engine: Engine | None = None
        self.model_name = cfg.engine.model
        self._fallback: str | None = None  # the model to load again if a switch fails
        self.store: Store | None = None
        self.conversation: Conversation | None = None
        self.answer: Message | None = None  # the one being written
        self.answer_view: MessageView | None = None
        self.highlight = False
        self.worker: Worker | None = None  # the engine's thread
        self._job: Job | None = None  # the answer being written
        self._saved_at = 0.0
        self._unsaved = False  # the last write to the database was refused (saving)
        self._progress: ProgressScreen | None = None
        self._log = None  # llama.cpp's log file
        self.loading = True  # an engine is being loaded

    # --- screen ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield OptionList(id="conversations")
            with Vertical(id="main"):
                yield VerticalScroll(id="messages")
                yield PromptArea(id="prompt", soft_wrap=True, show_line_numbers=False, compact=True,
                                 placeholder="Message (Enter to send, Ctrl+J for a new line)",
                                 tab_behavior="focus")
                yield StatusLine("", id="status", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        # The terminal closed (SIGHUP) or a stop (SIGTERM): quit as Ctrl+Q does, the answer
        # being written saved and marked stopped (by default the process died mid-answer).
        for sig in (signal.SIGHUP, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, self.exit)
        self.store = Store(self.db_path)
        if self.store.moved_aside:
            self.notify(f"The conversations database could not be read: it was moved to "
                        f"{self.store.moved_aside} and a new one started.", severity="warning",
                        timeout=20, markup=False)
        self.query_one("#conversations").display = self.store.setting("list", "shown") == "shown"
        last = self.store.setting("last_conversation")
        chosen = self.store.conversation(int(last)) if last else None
        self.refresh_list()
        if chosen is not None:
            self.call_later(self.open_conversation, chosen)
        self._progress = ProgressScreen()
        self.push_screen(self._progress)
        self._load(self.model_name)

    def refresh_list(self) -> None:
        options = self.query_one("#conversations", OptionList)
        options.clear_options()
        options.add_options(Option(c.title or "(new conversation)", id=str(c.id))
                            for c in self.store.conversations())
        self.highlight_in_list()

    def highlight_in_list(self) -> None:
        options = self.query_one("#conversations", OptionList)
        ids = [o.id for o in options.options]
        options.highlighted = ids.index(str(self.conversation.id)) if self.conversation and \
            str(self.conversation.id) in ids else None

    def status(self, text: str) -> None:
        self.query_one("#status", StatusLine).update(text)

    def idle_status(self) -> None:
        """The model, and the last answer's numbers (or where to start)."""
        last = None
        if self.conversation is not None:
            last = next((x for x in reversed(self.store.messages(self.conversation.id))
                         if x.role == "assistant"), None)
        if self.engine is None:
            self.status("no model loaded · F7 chooses one")
        elif last and last.stats:
            self.status(format_stats(last.stats))
        else:
            self.status(f"{self.engine.model.path.stem} · Ctrl+P: commands · F1: keys")

    # --- conversations -------------------------------------------------------------------

    async def open_conversation(self, c: Conversation) -> None:
        self.conversation = c
        self.saving(lambda: self.store.set_setting("last_conversation", str(c.id)))
        box = self.query_one("#messages", VerticalScroll)
        await box.remove_children()
        messages = self.store.messages(c.id)
        await box.mount_all([MessageView(m.role, m.text, m.pieces, m.stats, m.stopped, self.highlight)
                             for m in messages])
        box.scroll_end(animate=False)
        self.idle_status()
        self.sub_title = c.title
        self.highlight_in_list()

    def current_conversation(self) -> Conversation:
        if self.conversation is None:
            self.conversation = self.store.new_conversation(self.model_name,
                                                            drafter=str(self.cfg.engine.drafter))
            self.store.set_setting("last_conversation", str(self.conversation.id))
            self.refresh_list()
        return self.conversation

    @on(OptionList.OptionSelected, "#conversations")
    async def chosen(self, event: OptionList.OptionSelected) -> None:
        if self.answer is not None:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        c = self.store.conversation(int(event.option.id))
        if c is not None:
            await self.open_conversation(c)
            self.query_one("#prompt").focus()

    # --- asking ------------------------------------------------------------------------------

    @on(PromptArea.Submitted)
    async def submitted(self, event: PromptArea.Submitted) -> None:
        if self.answer is not None:
            self.notify("An answer is still being written: Esc stops it.", severity="warning")
            return
        if self.engine is None:
            self.notify("No model is loaded: F7 chooses one.", severity="error")
            return
        text = event.text.rstrip()
        c = self.saving(self.current_conversation)
        m = c and self.saving(lambda: self.store.add_message(c.id, "user", text))
        if not m:  # not saved: what was typed stays in the box, to send again
            return
        self.query_one("#prompt", PromptArea).clear()
        if not c.title:  # the first message titles a conversation
            c.title = text.strip().splitlines()[0][:48]
            self.saving(lambda: self.store.update_conversation(c))
            self.refresh_list()
            self.sub_title = c.title
        await self.query_one("#messages").mount(MessageView("user", m.text))
        await self.ask()

    async def ask(self) -> None:
        """Answer the conversation as it stands."""
        c = self.conversation
        messages = ([{"role": "system", "content": c.system_prompt}] if c.system_prompt else []) + \
            [{"role": m.role, "content": m.text} for m in self.store.messages(c.id)]
        messages, dropped = fit(self.engine, messages)
        if dropped:
            self.notify(f"The conversation is longer than the context: its {dropped} oldest "
                        "messages are left out of this answer.", severity="warning")
        try:
            drafter = DrafterSpec.parse(c.drafter)
        except LocalspecError as e:
            self.notify(str(e), severity="error", markup=False)
            return
        sampling = SamplingConfig(temperature=c.sampling.get("temperature", 0.0), seed=c.sampling.get("seed"))
        request = Request(messages=messages, sampling=sampling, max_tokens=self.cfg.max_tokens, drafter=drafter)
        self.answer = self.saving(lambda: self.store.add_message(c.id, "assistant", ""))
        if self.answer is None:
            return
        self.answer_view = MessageView("assistant", highlight=self.highlight)
        box = self.query_one("#messages", VerticalScroll)
        await box.mount(self.answer_view)
        box.anchor()
        self._saved_at = time.monotonic()
        self.status(f"{self.engine.model.path.stem}: reading the conversation …")
        self._answer(request)

    @work(exclusive=True, group="answer")
    async def _answer(self, request: Request) -> None:
        """Run the request on the engine's thread; its events come back here, in order, the
        text at most every UPDATE_EVERY seconds (the first at once)."""
        job = self.worker.submit(lambda engine, cancel: coalesce(engine.generate(request, cancel), UPDATE_EVERY))
        self._job, live = job, Live()
        while (event := await job.out.get()) is not END:
            await self.take(event, live)

    async def take(self, event: Delta | Done | Exception, live: Live) -> None:
        """Show one event of the answer being written; save it now and then; end it."""
        answer, view = self.answer, self.answer_view
        if answer is None:
            return
        if isinstance(event, Exception):
            self.notify(str(event), severity="error", markup=False)
            await self.end_answer(stopped=True, stats=answer.stats)
        elif isinstance(event, Done):
            if event.reason is Reason.LENGTH and event.stats.predicted_n < self.cfg.max_tokens:
                self.notify("The context is full: the answer stops here. Start a new conversation "
                            "(Ctrl+N), or drop old messages by deleting them.", severity="warning")
            await self.end_answer(stopped=not event.reason.finished,
                                  stats=event.stats.as_dict() | {"arm": live.arm})
        else:
            live.add(event)
            if event.pieces:
                await view.append(list(event.pieces))
                answer.text, answer.pieces = view.text, view.pieces
            self.status(live.line())
            if time.monotonic() - self._saved_at >= SAVE_EVERY:
                self.saving(lambda: self.store.save_message(answer))
                self._saved_at = time.monotonic()

    async def end_answer(self, stopped: bool, stats: dict) -> None:
        """An answer ended (stopped: by Esc, the length or the context): saved and shown."""
        answer, view = self.answer, self.answer_view
        answer.stopped, answer.stats = stopped, stats
        self.saving(lambda: self.store.save_message(answer))
        await view.finish(stats, stopped)
        self.answer = self.answer_view = None
        self.idle_status()

    def saving(self, write):
        """A write to the conversations' database, and what it returns (True for a write that
        returns nothing); where the database refuses it (a full disk), that is said once (until
        a write goes through again) and None returned: the screen keeps what it shows, and the
        app goes on."""
        try:
            result = write()
        except sqlite3.Error as e:
            if not self._unsaved:
                self.notify(f"Not saved: {e} ({self.store.path}). What the screen shows stays; "
                            "free some space and go on.", severity="error", markup=False)
            self._unsaved = True
            return None
        self._unsaved = False
        return True if result is None else result

    # --- commands ------------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.answer is not None and self._job is not None:
            self._job.cancel.set()

    async def action_new_conversation(self) -> None:
        if self.answer is not None:
            return
        self.conversation = None
        await self.query_one("#messages").remove_children()
        self.sub_title = ""
        self.idle_status()
        self.query_one("#prompt").focus()

    async def action_regenerate(self) -> None:
        if self.answer is not None or self.engine is None or self.conversation is None:
            return
        messages = self.store.messages(self.conversation.id)
        if not messages or messages[-1].role != "assistant":
            return
        if not self.saving(lambda: self.store.delete_message(messages[-1].id)):
            return
        await list(self.query(MessageView))[-1].remove()
        await self.ask()

    def on_unmount(self) -> None:
        if self._job is not None:
            self._job.cancel.set()
        if self.worker is not None:
            self.worker.close()
        if self.store is not None:
            if self.answer is not None:
                self.answer.stopped = True
                self.saving(lambda: self.store.save_message(self.answer))
            self.store.close()


def fit(engine: Engine, messages: list[dict]) -> tuple[list[dict], int]:
    """The messages whose prompt fits the engine's context with room for an answer: the oldest
    turns go first, the system prompt stays. Returns them and how many were left out."""
    system = [m for m in messages if m["role"] == "system"]
    turns = [m for m in messages if m["role"] != "system"]
    dropped = 0
    limit = engine.ctx.n_ctx - min(RESERVE, engine.ctx.n_ctx // 4)
    while len(turns) > 1 and len(chat_tokens(engine.model, system + turns)) > limit:
        turns = turns[1:]
        dropped += 1
        while len(turns) > 1 and turns[0]["role"] != "user":  # a chat starts with the user
            turns = turns[1:]
            dropped += 1
    return system + turns, dropped


def run(cfg: ChatConfig) -> None:
    """Run the app in this terminal; native code's stderr goes to the log, not the screen
    (Textual draws through the real terminal, kept on a duplicate of it)."""
    app = ChatApp(cfg)
    app.log_path.parent.mkdir(parents=True, exist_ok=True)
    tty = os.dup(2)
    log = os.open(app.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved_stderr = sys.__stderr__
    os.dup2(log, 2)
    os.close(log)
    sys.__stderr__ = sys.stderr = os.fdopen(tty, "w", buffering=1)
    try:
        app.run()
    finally:
        os.dup2(tty, 2)
        sys.__stderr__ = sys.stderr = saved_stderr
