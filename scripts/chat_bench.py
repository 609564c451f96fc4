"""What the chat app costs and what its cache saves, measured in the app itself (headless,
driven by Textual's pilot, a real engine):

1. tokens/s of an answer written in the app against the same request run straight on the
   app's engine (what `localspec generate` does), interleaved, same prompt and settings;
2. time to the first token of each turn of a six-turn conversation (turn n+1 reuses turn n's
   cache);
3. the process's memory after 50 turns.

    .venv/bin/python scripts/chat_bench.py -m qwen2.5-coder-1.5b-instruct --threads 2
"""

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from localspec.drafters.spec import DrafterSpec
from localspec.engine import Delta, EngineConfig, Request
from localspec.sampling import SamplingConfig
from tui.app import ChatApp, ChatConfig

PROMPT = "Write a Python function that parses a date in the format YYYY-MM-DD and explains each step."
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

    def on_streamed(self, m):  # Textual then calls ChatApp's handler too
        if self.first is None and any(text for text, _ in m.pieces):
            self.first = time.perf_counter()


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
    before = len(app.query("MessageView"))
    app.query_one("#prompt").insert(text)
    app.sent = time.perf_counter()
    await pilot.press("enter")
    await until(pilot, lambda: len(app.query("MessageView")) == before + 2 and app.answer is None)
    end = time.perf_counter()
    stats = app.store.messages(app.conversation.id)[-1].stats
    wall = (stats["predicted_n"] - 1) / (end - app.first) if app.first else 0.0
    return app.first - app.sent, wall, stats


def direct(engine, messages, max_tokens) -> tuple[float, float]:
    """The same request straight on the engine, in a thread as the app runs it: (tokens/s by the
    engine's stats, tokens/s by the clock from the first text to the end)."""
    out = {}

    def go():
        first = None
        for event in engine.generate(Request(messages=messages, sampling=SamplingConfig(temperature=0),
                                             max_tokens=max_tokens, drafter=DrafterSpec(a.drafter))):
            if first is None and isinstance(event, Delta) and event.text:
                first = time.perf_counter()
        out["stats"] = event.stats.predicted_per_second
        out["wall"] = (event.stats.predicted_n - 1) / (time.perf_counter() - first)
    t = threading.Thread(target=go)
    t.start()
    t.join()
    return out["stats"], out["wall"]


async def main() -> None:
    home = Path(tempfile.mkdtemp())
    cfg = ChatConfig(EngineConfig(model=a.model, threads=a.threads, drafter=DrafterSpec.parse(a.drafter)),
                     db=home / "chats.db", max_tokens=a.max_tokens)
    app = Timed(cfg)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: not app.loading)
        rows = []
        for r in range(a.rounds):
            app.engine.ctx.clear()
            d_stats, d_wall = direct(app.engine, [{"role": "user", "content": PROMPT}], a.max_tokens)
            await pilot.press("ctrl+n")
            app.engine.ctx.clear()
            _, app_wall, stats = await ask(pilot, PROMPT)
            rows.append((d_stats, d_wall, stats["predicted_per_second"], app_wall))
            print(f"round {r + 1}: engine {d_stats:.2f} tok/s ({d_wall:.2f} by the clock), "
                  f"app {stats['predicted_per_second']:.2f} ({app_wall:.2f} by the clock)", flush=True)
        ratio = statistics.median(app / eng for eng, _, app, _ in rows)
        ratio_wall = statistics.median(app / eng for _, eng, _, app in rows)
        print(f"\napp / engine, median of {a.rounds} interleaved rounds: {ratio:.3f} by the engine's "
              f"stats, {ratio_wall:.3f} by the clock (first text to last on screen)")

        await pilot.press("ctrl+n")
        print("\n| turn | prompt tokens | from the cache | time to first text |\n|---:|---:|---:|---:|")
        for i, turn in enumerate(TURNS, 1):
            ttft, _, stats = await ask(pilot, turn)
            print(f"| {i} | {stats['prompt_n'] + stats['cache_n']} | {stats['cache_n']} | {ttft * 1e3:.0f} ms |",
                  flush=True)

        before = rss_mb()
        await pilot.press("ctrl+n")
        for i in range(a.turns):
            await ask(pilot, f"Turn {i}: say one short sentence about the number {i}.")
        print(f"\nmemory: {before:.0f} MB before, {rss_mb():.0f} MB after {a.turns} more turns "
              f"(one conversation; the context keeps its newest turns)")


ap = argparse.ArgumentParser()
ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--drafter", default="auto")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--turns", type=int, default=50)
a = ap.parse_args()
asyncio.run(main())
