"""Which of localspec's own Python files one warm request runs through: a warm /infill through
the real server app (Qwen2.5-Coder-0.5B, which has FIM tokens) and a warm chat turn through the
chat app driven by its pilot (SmolLM2). Each file is listed with the functions entered there.

    .venv/bin/python scripts/request_files.py [--drafter auto]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import threading
from pathlib import Path

from starlette.testclient import TestClient

from localspec import store
from localspec.drafters.spec import DrafterSpec
from localspec.engine import Engine, EngineConfig
from localspec.serve.app import create_app
from localspec.worker import Worker
from tui.app import ChatApp, ChatConfig
from tui.widgets import MessageView

ROOT = Path(__file__).resolve().parents[1]
seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
on = threading.Event()


def profile(frame, event, arg):
    if event == "call" and on.is_set():
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(ROOT) and not path.is_relative_to(ROOT / ".venv"):
            seen[str(path.relative_to(ROOT))][frame.f_code.co_name] += 1


def report(what: str) -> None:
    print(f"\n{what}: {len(seen)} files")
    for path, calls in sorted(seen.items()):
        print(f"  {path}: {', '.join(sorted(calls))}")
    seen.clear()


def infill(drafter: DrafterSpec, threads: int) -> None:
    cfg = EngineConfig(model="qwen2.5-coder-0.5b-instruct", threads=threads, n_ctx=2048, drafter=drafter, slots=2)

    def load() -> Engine:
        engine = Engine(cfg)
        engine.prepare()
        return engine
    worker = Worker(load)
    body = {"input_prefix": "def fib(n):\n    ", "input_suffix": "\n\nprint(fib(10))\n", "n_predict": 24}
    with TestClient(create_app(worker)) as client:
        while client.get("/health").status_code != 200:
            pass
        client.post("/infill", json=body)  # the cold one
        on.set()
        assert client.post("/infill", json=body).status_code == 200
        on.clear()
    worker.close()
    report("a warm /infill")


def chat(drafter: DrafterSpec, threads: int) -> None:
    async def drive():
        with tempfile.TemporaryDirectory() as tmp:
            cfg = EngineConfig(model=str(store.resolve("smollm2-135m-instruct")), threads=threads, n_ctx=2048,
                               drafter=drafter)
            app = ChatApp(ChatConfig(cfg, db=Path(tmp) / "chats.db", max_tokens=32))
            async with app.run_test() as pilot:
                while app.loading:
                    await asyncio.sleep(0.1)
                for turn in range(2):  # the second is warm
                    if turn:
                        on.set()
                    before = len(app.query(MessageView))
                    app.query_one("#prompt").insert("Name three colours.")
                    await pilot.press("enter")
                    while not (len(app.query(MessageView)) == before + 2 and app.answer is None):
                        await asyncio.sleep(0.05)
                        await pilot.pause()
                on.clear()
    asyncio.run(drive())
    report("a warm chat turn")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", type=DrafterSpec.parse, default=DrafterSpec("auto"))
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    threading.setprofile(profile)
    sys.setprofile(profile)
    infill(a.drafter, a.threads)
    chat(a.drafter, a.threads)
