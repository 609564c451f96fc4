"""The one thread that owns an engine, for surfaces that run on an event loop (the server, the
chat app): the engine is made there and every job runs there, one at a time, in the order
they arrive; their items go back to the event loop that waits for them. A cancelled job is
skipped if it has not started, and told through its flag if it has.

Why one thread for good: llama.cpp's CPU backend (OpenMP builds) keeps a team of threads per
calling thread, spinning between forwards; decoding from a new thread each request starts
another team while the old one still spins, and on two cores that costs a quarter of the speed
(docs/benchmarks-history.md#localspec-chat-what-the-app-costs-what-its-cache-saves-2026-11-24)."""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable

from localspec.engine import Engine
from localspec.errors import LocalspecError

END = object()  # the last item a job puts on its queue
SWITCH_INTERVAL = 0.0005


@dataclass
class Job:
    run: Callable[[Engine, threading.Event], Iterable]  # the items for the client, in order
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)

    def put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class Worker:
    def __init__(self, load: Callable[[], Engine], on_error: Callable[[str], None] = lambda why: None):
        """`load` makes the engine, in the worker's thread: until it has, `ready` is False (and
        `error` says why it could not; `on_error` hears it too)."""
        # When a forward ends, the engine's thread needs the GIL back from the event loop
        # (rendering, HTTP): Python hands it over after this many seconds (default 5 ms,
        # a sixth of a token here).
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.engine: Engine | None = None
        self.error: str | None = None
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, args=(load, on_error), name="localspec-engine",
                                        daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def submit(self, run: Callable[[Engine, threading.Event], Iterable]) -> Job:
        job = Job(run, asyncio.get_running_loop())
        self._jobs.put(job)
        return job

    def _serve(self, load: Callable[[], Engine], on_error: Callable[[str], None]) -> None:
        try:
            self.engine = load()
        except Exception as e:  # noqa: BLE001 -- any failure: every job hears why, none waits for good
            self.error = str(e) if isinstance(e, LocalspecError) else f"cannot load the model: {type(e).__name__}: {e}"
            on_error(self.error)
        while (job := self._jobs.get()) is not None:
            if job.cancel.is_set():
                job.put(END)
                continue
            try:
                if self.engine is None:
                    raise LocalspecError(self.error or "the model is still loading")
                for item in job.run(self.engine, job.cancel):
                    job.put(item)
            except Exception as e:  # noqa: BLE001 -- the client gets it; the worker goes on
                job.put(e)
            job.put(END)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)
        if self.engine is not None:
            self.engine.close()
