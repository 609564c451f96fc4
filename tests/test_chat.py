"""`localspec chat` driven by Textual's pilot on SmolLM2-135M: answers stream exactly as the
engine writes them, Esc stops one, nothing is lost across restarts or a kill, and bad input
(a missing model, a full context, a corrupt database) is a notice, never a crash."""

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path


from textual import events

from localspec.drafters.spec import DrafterSpec
from localspec.engine import Engine, EngineConfig, Request
from localspec.sampling import SamplingConfig
from tui.app import ChatApp, ChatConfig
from tui.store import Store
from tui.widgets import MessageView

from conftest import RECORDED_CURVE

GREEDY = SamplingConfig(temperature=0)


class Recording(ChatApp):
    """The app, keeping the notices it shows."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.notices: list[str] = []

    def notify(self, message, **kw):
        self.notices.append(str(message))
        super().notify(message, **kw)


def config(small_path, tmp_path, **kw) -> ChatConfig:
    # Strict: batches (prompts too) of at most the size that reproduces single tokens (16 for
    # SmolLM2 on one thread), so speculation's answer is plain decoding's byte for byte, even
    # where the app's history was decoded and the cold reference prefills it at once.
    engine = EngineConfig(model=str(small_path), n_ctx=kw.pop("n_ctx", 2048), threads=1, strict=True,
                          drafter=kw.pop("drafter", DrafterSpec("auto")), curve=str(RECORDED_CURVE))
    return ChatConfig(engine, db=tmp_path / "chats.db", max_tokens=kw.pop("max_tokens", 64), **kw)


async def until(pilot, predicate, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)
        await pilot.pause()


async def ready(pilot) -> None:
    await until(pilot, lambda: not pilot.app.loading)


async def say(pilot, text: str) -> None:
    """Type a message, send it, and wait for the answer to end."""
    app = pilot.app
    before = len(app.query(MessageView))
    app.query_one("#prompt").insert(text)
    await pilot.press("enter")
    await until(pilot, lambda: len(app.query(MessageView)) == before + 2 and app.answer is None)


def send_now(pilot) -> None:
    """Enter, sent as the pilot sends a key but without its wait for the process to go idle:
    while an answer is written the engine's thread keeps the process busy, so `pilot.press`
    waits out its two idle checks (up to a second each), and on a fast machine a random
    model's whole answer is written by then (the hybrid chat test timed out so on an AVX-512
    EPYC, 2026-12-07). For a test that must act while the answer is still being written."""
    key = events.Key("enter", None)
    key.set_sender(pilot.app)
    pilot.app._driver.send_message(key)


async def long_answer_under_way(pilot) -> None:
    """Once the model is ready, ask for a long story and wait until some of it is written."""
    app = pilot.app
    await ready(pilot)
    app.query_one("#prompt").insert("Tell me a very long story about a dragon.")
    send_now(pilot)
    await until(pilot, lambda: app.answer is not None and len(app.answer.text) > 40)


def plain(small_path, messages, max_tokens) -> str:
    """The answer of a cold engine configured as the app's (auto: with Jakiro, whose target
    features make the prompt's last rows outputs, which llama.cpp computes as a batch)."""
    engine = Engine(config(small_path, Path("/nonexistent")).engine)
    *_, done = engine.generate(Request(messages=messages, sampling=GREEDY, max_tokens=max_tokens))
    engine.close()
    return done.text


def run(coro):
    return asyncio.run(coro)


def test_what_is_typed_while_a_model_loads_is_kept(small_path, tmp_path):
    from tui.screens import ProgressScreen

    async def go():
        app = ChatApp(config(small_path, tmp_path))
        async with app.run_test() as pilot:
            await ready(pilot)
            app.push_screen(ProgressScreen())  # as loading another model (F7) shows it
            await pilot.pause()
            await pilot.press(*"def f(", "backspace", "x", "ctrl+j", "#", "enter")
            app.pop_screen()
            await pilot.pause()
            assert app.query_one("#prompt").text == "def fx\n#"
            assert app.conversation is None  # Enter sent nothing while the model loaded
    run(go())


def test_an_answer_streams_exactly_what_the_engine_writes_and_is_kept(small_path, tmp_path):
    async def go():
        app = Recording(config(small_path, tmp_path))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await say(pilot, "Write a haiku about the moon.")
            await say(pilot, "Now one about mountains.")
            views = list(app.query(MessageView))
            return [v.text for v in views], app.store.messages(app.conversation.id)
    texts, saved = run(go())
    first = [{"role": "user", "content": "Write a haiku about the moon."}]
    assert texts[1] == plain(small_path, first, 64)
    second = first + [{"role": "assistant", "content": texts[1]},
                      {"role": "user", "content": "Now one about mountains."}]
    assert texts[3] == plain(small_path, second, 64)
    assert [m.text for m in saved] == texts and [m.role for m in saved] == ["user", "assistant"] * 2
    assert saved[1].stats["predicted_n"] > 0 and not saved[1].stopped


def test_escape_stops_the_answer_keeps_it_and_the_next_one_is_a_cold_starts(small_path, tmp_path):
    async def go():
        app = Recording(config(small_path, tmp_path, max_tokens=300))
        async with app.run_test(size=(100, 30)) as pilot:
            await long_answer_under_way(pilot)
            await pilot.press("escape")
            await until(pilot, lambda: app.answer is None)
            stopped = app.store.messages(app.conversation.id)[-1]
            await say(pilot, "Give it a title.")
            return stopped, app.store.messages(app.conversation.id)
    stopped, saved = run(go())
    assert stopped.stopped and stopped.stats["predicted_n"] < 300 and saved[1].text == stopped.text
    assert saved[1].stopped
    history = [{"role": m.role, "content": m.text} for m in saved[:3]]
    assert saved[3].text == plain(small_path, history, 300)


def test_quit_and_reopen_rename_delete_export(small_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    async def first():
        app = Recording(config(small_path, tmp_path, max_tokens=8))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await say(pilot, "Hello there")
            await pilot.press("ctrl+n")
            await say(pilot, "Second conversation")
            await pilot.press("f2")
            await pilot.pause()
            app.screen.query_one("#value").value = "Renamed"
            await pilot.press("enter")
            await pilot.pause()
            await pilot.press("f9")
            await pilot.pause()

    run(first())
    assert (tmp_path / "renamed.md").read_text().startswith("# Renamed")

    async def second():
        app = Recording(config(small_path, tmp_path, max_tokens=8))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            reopened = app.conversation.title, [v.text for v in app.query(MessageView)]
            titles = [c.title for c in app.store.conversations()]
            await pilot.press("f8")
            await pilot.pause()
            await pilot.click("#yes")
            await pilot.pause()
            return reopened, titles, [c.title for c in app.store.conversations()]
    reopened, titles, after = run(second())
    assert reopened[0] == "Renamed" and reopened[1][0] == "Second conversation"
    assert titles == ["Renamed", "Hello there"] and after == ["Hello there"]


def test_a_closed_terminal_quits_as_ctrl_q_does(small_path, tmp_path):
    """SIGHUP (the terminal window closed) in the middle of an answer: the app quits, the
    answer so far is saved and marked stopped, as Ctrl+Q leaves it."""
    async def go():
        app = Recording(config(small_path, tmp_path, max_tokens=300))
        async with app.run_test(size=(100, 30)) as pilot:
            await long_answer_under_way(pilot)
            os.kill(os.getpid(), signal.SIGHUP)
            for _ in range(200):
                await asyncio.sleep(0.05)
                if app.return_code is not None:
                    break
        return app.return_code
    assert run(go()) == 0
    store = Store(tmp_path / "chats.db")
    user, answer = store.messages(1)
    assert answer.role == "assistant" and len(answer.text) > 40 and answer.stopped


def test_a_killed_process_loses_at_most_the_last_second(small_path, tmp_path):
    """The real app in a real process (headless, driven by its pilot), killed while it
    writes: what the database holds at the kill is a prefix of the answer, saved less than a
    second before."""
    script = tmp_path / "chat_child.py"
    script.write_text(f"""
import asyncio, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_chat import Recording, config, ready, send_now
from pathlib import Path

async def main():
    app = Recording(config(Path({str(small_path)!r}), Path({str(tmp_path)!r}), max_tokens=2000))
    async with app.run_test() as pilot:
        await ready(pilot)
        app.query_one("#prompt").insert("Tell me a very long story about a dragon and a knight.")
        send_now(pilot)
        print("sent", flush=True)
        await asyncio.sleep(600)
asyncio.run(main())
""")
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "sent"
    db = tmp_path / "chats.db"
    seen: list[tuple[float, str]] = []  # (when this process saw it, the answer saved)
    deadline = time.monotonic() + 120
    kill_at = None
    while time.monotonic() < (kill_at or deadline):
        with sqlite3.connect(db) as c:
            row = c.execute("SELECT text FROM message WHERE role = 'assistant' ORDER BY id DESC").fetchone()
        if row and row[0] and (not seen or row[0] != seen[-1][1]):
            seen.append((time.monotonic(), row[0]))
        if kill_at is None and len(seen) >= 2 and seen[-1][0] - seen[0][0] > 3:
            kill_at = time.monotonic() + 0.77  # a moment unrelated to the saves
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    killed = time.monotonic()
    child.wait()
    gaps = [b[0] - a[0] for a, b in zip(seen, seen[1:])]
    assert len(seen) >= 4 and max(gaps) < 1.0, gaps  # saved at least every second
    assert killed - seen[-1][0] < 1.0
    store = Store(db)
    assert store.moved_aside is None
    (answer,) = [m for m in store.messages(1) if m.role == "assistant"]
    assert answer.text == seen[-1][1] and all(answer.text.startswith(t) for _, t in seen)


def test_a_missing_model_is_a_notice_and_the_app_keeps_running(small_path, tmp_path):
    async def go():
        cfg = config(small_path, tmp_path)
        app = Recording(ChatConfig(EngineConfig(model=str(tmp_path / "nope.gguf")), db=cfg.db))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: not app.loading)
            app.query_one("#prompt").insert("hello")
            await pilot.press("enter")
            await pilot.pause()
            return app.notices, app.is_running
    notices, running = run(go())
    assert running and any("model file not found" in n for n in notices)
    assert any("No model is loaded" in n for n in notices)


def test_a_conversation_longer_than_the_context_drops_its_oldest_turns(small_path, tmp_path):
    async def go():
        app = Recording(config(small_path, tmp_path, n_ctx=512, max_tokens=16))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            for i in range(5):
                await say(pilot, f"Message {i}: " + "please remember this sentence well. " * 12)
            return app.notices, app.store.messages(app.conversation.id)
    notices, saved = run(go())
    assert any("oldest" in n for n in notices)
    assert len(saved) == 10 and all(m.text for m in saved if m.role == "assistant")


def test_a_corrupt_database_is_moved_aside_with_a_notice(small_path, tmp_path):
    db = tmp_path / "chats.db"
    db.write_bytes(b"this is not a database" * 100)

    async def go():
        app = Recording(config(small_path, tmp_path, max_tokens=4))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await say(pilot, "hello")
            return app.notices
    notices = run(go())
    aside = list(tmp_path.glob("chats.db.unreadable-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == b"this is not a database" * 100
    assert any("moved to" in n for n in notices)
    assert len(Store(db).conversations()) == 1


def test_a_drafter_that_cannot_be_had_is_said_when_it_is_chosen(small_path, tmp_path):
    """Settings name the drafter; the engine builds it then, not inside the next message, and a
    drafter that cannot be had is one line at once."""
    async def go():
        app = Recording(config(small_path, tmp_path))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            app.action_settings()
            await pilot.pause()
            app.screen.query_one("#drafter").value = "draft:nonesuch.gguf"
            await pilot.click("#save")
            await until(pilot, lambda: any(n.startswith("drafter draft:nonesuch.gguf:") for n in app.notices), 60)
            return app.notices, app.is_running
    notices, running = run(go())
    assert running and any("not found" in n for n in notices if n.startswith("drafter ")), notices


def test_a_database_that_takes_no_more_keeps_what_was_typed_and_the_app(small_path, tmp_path):
    """The database refuses to grow (SQLite's own limit on its pages, as a full disk refuses
    it): the message is not sent, stays in the box and the app says why; once it may grow
    again, the same Enter sends it and the answer is kept."""
    async def go():
        app = Recording(config(small_path, tmp_path, max_tokens=8))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await say(pilot, "Hi.")
            pages = app.store.db.execute("PRAGMA page_count").fetchone()[0]
            app.store.db.execute(f"PRAGMA max_page_count = {pages}")
            text = "Say yes. " + "The long part of a message. " * 300  # pages more than there are
            app.query_one("#prompt").insert(text)
            await pilot.press("enter")
            await pilot.pause()
            kept, running = app.query_one("#prompt").text, app.is_running
            app.store.db.execute("PRAGMA max_page_count = 1073741823")
            await pilot.press("enter")
            await until(pilot, lambda: len(app.query(MessageView)) == 4 and app.answer is None)
            return app.notices, kept, running, text, app.store.messages(app.conversation.id)
    notices, kept, running, text, saved = run(go())
    assert running and kept == text  # as typed
    assert sum("Not saved" in n and "full" in n for n in notices) == 1, notices
    assert [m.role for m in saved] == ["user", "assistant"] * 2 and saved[2].text == text.rstrip()


def test_settings_refuse_a_seed_no_answer_could_use(small_path, tmp_path):
    """A negative seed is said in the settings dialog, which stays open; the conversation keeps
    its settings (saved, it would have failed every answer after)."""
    from textual.widgets import Input, Label

    from tui.screens import SettingsScreen

    async def go():
        app = Recording(config(small_path, tmp_path))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            await say(pilot, "Hi")
            await pilot.press("f6")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
            app.screen.query_one("#seed", Input).value = "-5"
            app.screen.save()
            await pilot.pause()
            problem = str(app.screen.query_one("#problem", Label).render())
            return problem, isinstance(app.screen, SettingsScreen), app.conversation.sampling
    problem, still_open, sampling = run(go())
    assert problem.startswith("seed must be 0 to 2^64 - 1") and still_open and sampling.get("seed") is None
