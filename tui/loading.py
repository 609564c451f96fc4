"""The chat's engine: made on a thread of its own (the engine's Worker) while the screen shows
its progress, made again for another model (F7), the one before loaded again where that
fails. A part of ChatApp (tui/app.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from textual import work
from textual.message import Message as TextualMessage

from localspec import pull as model_pull
from localspec.engine import Engine
from localspec.worker import Worker


class Progress(TextualMessage):
    def __init__(self, what: str, done: float, total: float):
        super().__init__()
        self.what, self.done, self.total = what, done, total


class Notice(TextualMessage):
    """A line the engine says that nothing waits on (a store left alone, a drafter found)."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text


class Loaded(TextualMessage):
    def __init__(self, engine: Engine | None, error: str | None = None):
        super().__init__()
        self.engine, self.error = engine, error


class EngineLoading:
    def _load(self, model: str, pull: bool = False) -> None:
        """Close the engine there is, and make one for `model` on a new engine thread (pulling
        the model first if asked), its progress shown; Loaded comes when it is ready."""
        if self.worker is not None:
            self.worker.close()
        self.engine = None
        if self._log is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "a", buffering=1)

        def load() -> Engine:
            progress = lambda *a: self.post_message(Progress(*a))  # noqa: E731
            if pull:
                model_pull.resolve(model, progress=progress)
            engine = Engine(replace(self.cfg.engine, model=model), progress=progress,
                            log=lambda level, text: self._log.write(text),
                            notice=lambda text: self.post_message(Notice(text)))
            engine.prepare()  # drafters and the cost curve, with their progress shown
            return engine
        self.worker = Worker(load)
        self._wait_loaded(self.worker)

    @work(exclusive=True, group="load")
    async def _wait_loaded(self, worker: Worker) -> None:
        job = worker.submit(lambda engine, cancel: [engine])  # runs once the engine is made
        item = await job.out.get()
        self.post_message(Loaded(None, str(item)) if isinstance(item, Exception) else Loaded(item))

    def on_progress(self, m: Progress) -> None:
        if self._progress is not None:
            self._progress.report(m.what, m.done, m.total)
        elif m.total:
            self.status(f"{m.what} {m.done / m.total:.0%}")

    def on_notice(self, m: Notice) -> None:
        self.notify(m.text, severity="warning", timeout=10, markup=False)

    def on_loaded(self, m: Loaded) -> None:
        self.loading = False
        self.sub_title = m.engine.model.path.stem if m.engine else ""
        if self._progress is not None:
            self._progress.dismiss()
            self._progress = None
        fallback, self._fallback = self._fallback, None
        if m.engine is None and fallback:
            self.notify(f"{m.error} — back to {Path(fallback).stem}.", severity="error", timeout=20, markup=False)
            self.loading = True
            self._load(fallback)
            return
        if m.engine is None:
            self.notify(f"{m.error} — F7 chooses another model.", severity="error", timeout=20, markup=False)
            self.status("no model loaded")
            return
        self.engine = m.engine
        self.model_name = m.engine.cfg.model
        self.status(f"{m.engine.where} · Ctrl+P: commands · F1: keys")  # until an answer's numbers
