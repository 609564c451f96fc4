"""What the chat app costs and what its cache saves, measured in the app itself (headless,
driven by Textual's pilot, a real engine):

1. tokens/s of an answer written in the app against `localspec generate --chat` with the same
   prompt and settings, interleaved (the app idle while the command runs);
2. time to the first token of each turn of a six-turn conversation (turn n+1 reuses turn n's
   cache);
3. the process's memory after 50 turns.

    .venv/bin/python scripts/chat_bench.py -m qwen2.5-coder-1.5b-instruct --threads 2
"""

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from measure import PROMPT, generate_tokens_per_second, options

from localspec.drafters.spec import DrafterSpec
from localspec.engine import EngineConfig
from tui.app import ChatApp, ChatConfig

TURNS = ["Write a Python function that reverses a string.", "Now make it handle None.",
         "Add type hints.", "Add a docstring.", "Write a test for it.", "Explain the test."]


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


class Timed(ChatApp):
    """The app, noting when each answer's first text and its end reach the screen."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.first: float | None = None
        self.sent = 0.0
        self.ended = asyncio.Event()  # waited on, not polled: polling would cost the engine CPU

    async def end_answer(self, stopped, stats):
        await super().end_answer(stopped, stats)
        self.ended.set()

    async def take(self, m):
        if self.first is None and any(text for text, _ in m.pieces):
            self.first = time.perf_counter()
        await super().take(m)


def say(*args) -> None:
    """print() where a running Textual app, which captures sys.stdout, cannot swallow it."""
    print(*args, file=sys.__stdout__, flush=True)


async def until(pilot, predicate, timeout=900.0):
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)
        await pilot.pause()


async def ask(pilot, text: str) -> tuple[float, float, dict]:
    """(seconds to the first text on screen, answer tokens/s from its first token to its end on
    screen, the answer's stats)."""
    app = pilot.app
    app.first = None
    app.ended.clear()
    app.query_one("#prompt").insert(text)
    app.sent = time.perf_counter()
    await pilot.press("enter")
    await app.ended.wait()
    end = time.perf_counter()
    stats = app.store.messages(app.conversation.id)[-1].stats
    wall = (stats["predicted_n"] - 1) / (end - app.first) if app.first else 0.0
    return app.first - app.sent, wall, stats


async def run(a) -> None:
    home = Path(tempfile.mkdtemp())
    cfg = ChatConfig(EngineConfig(model=a.model, threads=a.threads, drafter=DrafterSpec.parse(a.drafter)),
                     db=home / "chats.db", max_tokens=a.max_tokens)
    app = Timed(cfg)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: not app.loading)
        rows = []
        for r in range(a.rounds):
            cli = generate_tokens_per_second(a)  # the app idle meanwhile
            await pilot.press("ctrl+n")
            app.engine.ctx.clear()  # cold, as the command starts
            _, app_wall, stats = await ask(pilot, PROMPT)
            rows.append((cli, stats["predicted_per_second"], app_wall))
            say(f"round {r + 1}: localspec generate {cli:.2f} tok/s, app {stats['predicted_per_second']:.2f} "
                f"({app_wall:.2f} by the clock, first text to last on screen)")
        ratio = statistics.median(app / cli for cli, app, _ in rows)
        ratio_wall = statistics.median(app / cli for cli, _, app in rows)
        say(f"\napp / localspec generate, median of {a.rounds} interleaved rounds: {ratio:.3f} "
            f"(the app's own count), {ratio_wall:.3f} (by the clock, on screen)")

        await pilot.press("ctrl+n")
        say("\n| turn | prompt tokens | from the cache | time to first text |\n|---:|---:|---:|---:|")
        for i, turn in enumerate(TURNS, 1):
            ttft, _, stats = await ask(pilot, turn)
            say(f"| {i} | {stats['prompt_n'] + stats['cache_n']} | {stats['cache_n']} | {ttft * 1e3:.0f} ms |")

        before = rss_mb()
        await pilot.press("ctrl+n")
        for i in range(a.turns):
            await ask(pilot, f"Turn {i}: say one short sentence about the number {i}.")
        say(f"\nmemory: {before:.0f} MB before, {rss_mb():.0f} MB after {a.turns} more turns "
            f"(one conversation; the context keeps its newest turns)")


def main() -> None:
    ap = options(__doc__)
    ap.add_argument("--turns", type=int, default=50)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
