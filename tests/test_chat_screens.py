"""Snapshots of the chat app's main screens (pytest-textual-snapshot; `--snapshot-update`
rewrites them after a deliberate change). The conversations come from the database, so what
the screens show does not depend on this machine's speed."""

import asyncio
import time

import pytest
from textual.widgets import Input, TextArea

from localspec.drafters.spec import DrafterSpec
from localspec.engine import EngineConfig
from tui.app import ChatApp, ChatConfig
from tui.store import Store

from conftest import RECORDED_CURVE

STATS = {"predicted_per_second": 41.3, "tau": 1.62, "draft_n": 58, "draft_n_accepted": 37,
         "arm": "lookup@3", "cache_n": 128, "predicted_n": 96, "prompt_n": 41,
         "ran": {"lookup@3": 40, "plain": 12}}
ANSWER = [
    ["Here is a function that reverses a string:\n\n```python\ndef reverse(", None],
    ["text: str) -> str:\n", "lookup"],
    ["    return text[::-1]\n```\n\nIt uses a slice with a step of ", None],
    ["-1", "jakiro:smollm2-135m-instruct.q8_0"],
    [".", None],
]


@pytest.fixture(autouse=True)
def steady_cursors(monkeypatch):
    """Cursors blink every half second, so a snapshot would catch either phase, whichever the
    machine's speed gives: hold them on."""
    monkeypatch.setattr(TextArea, "_toggle_cursor_blink_visible", lambda self: None)
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


@pytest.fixture
def app(small_path, tmp_path):
    db = tmp_path / "chats.db"
    store = Store(db)
    old = store.new_conversation("smollm2-135m-instruct")
    old.title = "Haiku about the sea"
    store.update_conversation(old)
    store.add_message(old.id, "user", "Write a haiku about the sea.")
    c = store.new_conversation("smollm2-135m-instruct")
    c.title = "Reverse a string"
    store.update_conversation(c)
    store.add_message(c.id, "user", "Write a Python function that reverses a string.")
    answer = store.add_message(c.id, "assistant", "")
    answer.text, answer.pieces, answer.stats = "".join(t for t, _ in ANSWER), ANSWER, STATS
    store.save_message(answer)
    store.set_setting("last_conversation", str(c.id))
    store.close()
    engine = EngineConfig(model=str(small_path), n_ctx=1024, threads=1, drafter=DrafterSpec("lookup"),
                          curve=str(RECORDED_CURVE))
    return ChatApp(ChatConfig(engine, db=db))


async def loaded(pilot) -> None:
    end = time.monotonic() + 120
    while pilot.app.loading and time.monotonic() < end:
        await asyncio.sleep(0.05)
        await pilot.pause()
    await pilot.pause()


def test_main_screen(app, snap_compare):
    assert snap_compare(app, run_before=loaded, terminal_size=(110, 32))


def test_drafted_text_coloured(app, snap_compare):
    assert snap_compare(app, run_before=loaded, press=["ctrl+t"], terminal_size=(110, 32))


def test_answer_statistics(app, snap_compare):
    assert snap_compare(app, run_before=loaded, press=["f3"], terminal_size=(110, 32))


def test_keys_screen(app, snap_compare):
    assert snap_compare(app, run_before=loaded, press=["f1"], terminal_size=(110, 32))


def test_settings_screen(app, snap_compare):
    assert snap_compare(app, run_before=loaded, press=["f6"], terminal_size=(110, 32))


def test_delete_asks_first(app, snap_compare):
    assert snap_compare(app, run_before=loaded, press=["f8"], terminal_size=(110, 32))


def test_code_is_coloured_by_the_language_its_block_names_never_by_a_guess():
    """An answer streamed in small pieces, as the app shows one: the block that names Python is
    coloured; the fenced and the indented blocks that name nothing stay plain (Textual would
    have Pygments guess, a Tera Term macro for this Python function, on every update)."""
    from textual.app import App
    from textual.widgets.markdown import MarkdownFence
    from tui.widgets import MessageView

    code = "def add(a, b):\n    return a + b\n"
    answer = f"Named:\n\n```python\n{code}```\n\nUnnamed:\n\n```\n{code}```\n\nIndented:\n\n    " + \
        code.replace("\n", "\n    ")

    class OneAnswer(App):
        def compose(self):
            yield MessageView("assistant")

    async def go():
        app = OneAnswer()
        async with app.run_test() as pilot:
            view = app.query_one(MessageView)
            for i in range(0, len(answer), 5):
                await view.append([(answer[i:i + 5], None)])
                await pilot.pause()
            streamed = [len(b._highlighted_code.spans) for b in app.query(MarkdownFence)]
            await view.finish({}, stopped=False)
            await pilot.pause()
            return streamed, [len(b._highlighted_code.spans) for b in app.query(MarkdownFence)]

    streamed, finished = asyncio.run(go())
    for spans in (streamed, finished):
        assert len(spans) == 3 and spans[0] > 1 and spans[1:] == [1, 1], spans
