"""The engine every surface holds for as long as it runs: the target model and its context,
the cost curve, and the drafters loaded so far. It runs one request at a time; a request
goes in, events come out (text as it is written, then one final event), and closing the
stream, or setting its cancel flag, stops generation within one iteration."""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

from localspec import store
from localspec.control.controllers import CascadeController, Fixed, Plain
from localspec.drafters.acceptance_head import AcceptanceHead
from localspec.drafters.base import Budget, Drafter
from localspec.drafters.draft_model import DraftModelDrafter, check_same_vocabulary, draft_context
from localspec.drafters.jakiro import JakiroDrafter, JakiroRuntime
from localspec.drafters.lookup import LookupDrafter
from localspec.drafters.spec import AUTO, DrafterSpec
from localspec.drafters.suffix import SuffixDrafter, SuffixStore, store_dir
from localspec.errors import LocalspecError
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig, common_prefix, default_threads
from localspec.llama.cost import (LONG_CONTEXT, MAX_BATCH, CostCurve, LiveCurve, cache_path, cost_curve, exactness,
                                  keep, measure, planning_curve, record_loop)
from localspec.llama.model import LogHandler, set_log_handler
from localspec.llama.placement import ALL_LAYERS, layers_that_fit, where
from localspec.llama.text import StreamDecoder, chat_tokens
from localspec.loop import Controller, Iteration, RunOptions, Stats, run
from localspec.progress import Progress
from localspec.sampling import SamplingConfig

DEFAULT_DRAFT_MODEL = "qwen2.5-coder-0.5b-instruct"
REFINE_IDLE = 1.0  # seconds without a request before the whole curve's measurement goes on


@dataclass(frozen=True)
class EngineConfig:
    model: str = store.DEFAULT_MODEL
    n_ctx: int = 4096
    threads: int = 0
    n_gpu_layers: int | None = None  # None: every layer that fits on this machine's GPUs
    flash_attn: str = "auto"
    n_seq_max: int = 8     # root-to-leaf paths a draft tree may have
    # Greedy output bit-identical to plain decoding, not only up to ties: plain weight layouts
    # and a bf16 KV cache, under which llama.cpp's CPU batches of up to 6 tokens reproduce
    # single-token decoding exactly (the cost curve measures how far), and every batch (prompt
    # chunks too) kept within that size. Where no batch is exact, near-ties are settled instead.
    strict: bool = False
    # Plan as if every verification batch cost one single-token forward (a GPU's shape): the
    # drafters' tau, not this machine's trade-off, decides how much they draft.
    flat_cost: bool = False
    # A cost curve file (the JSON `localspec cost` caches, another machine's say) to plan with
    # instead of this machine's; held as it is, not corrected by this machine's forwards.
    curve: str = ""
    drafter: DrafterSpec = AUTO  # what requests that name none run
    # The target's hidden states, for feature drafters (Jakiro); None: when `drafter` may
    # run one (auto does when a Jakiro drafter ships for the target).
    features: bool | None = None
    # Contexts (KV caches) kept for prompts that share nothing: a server's editor completions
    # and chats each keep theirs instead of evicting each other. Each costs its KV cache.
    slots: int = 1
    # The suffix store, which learns from every answer: "" the target tokenizer's in the cache
    # directory, a directory, ":memory:" (kept by nothing: benchmarks), or "off".
    store: str = ""
    # Greedy requests take each row's argmax inside the target's graph (a token id per row
    # comes back, not the row's logits), on every backend that can (False: on the host).
    argmax_on_device: bool = True
    # rpc-servers (HOST:PORT) that hold the target's offloaded layers (all of them unless
    # n_gpu_layers says how many); drafters stay on this machine.
    rpc: tuple[str, ...] = ()
    # A model's first start plans on a coarse cost curve measured in seconds; the whole curve
    # is measured between requests (a forward at a time, once none has run for REFINE_IDLE),
    # then cached. False: not in the background (LOCALSPEC_REFINE_CURVE=0; the test suite,
    # whose processes would slow each other). whole_curve: measured before the first request.
    refine_curve: bool = field(default_factory=lambda: os.environ.get("LOCALSPEC_REFINE_CURVE") != "0")
    whole_curve: bool = False


@dataclass(frozen=True)
class Request:
    prompt: str | Sequence[int] = ""          # text (tokenized as the model wants) or tokens
    messages: Sequence[dict] | None = None    # or a chat, through the model's template
    sampling: SamplingConfig = SamplingConfig()
    max_tokens: int = 256
    stop: tuple[str, ...] = ()                # never part of the text; generation ends there
    drafter: DrafterSpec | None = None        # None: the engine's
    ignore_eog: bool = False                  # benchmarks: run on past end-of-generation
    cache: bool = True                        # reuse what the context holds (False: start cold)


@dataclass(frozen=True)
class Delta:
    """Text the answer grew by, as runs of (text, the drafter that drafted it or None for the
    target's own tokens)."""
    pieces: tuple[tuple[str, str | None], ...]
    n_tokens: int   # tokens generated since the last delta
    n_drafted: int  # of them, from accepted drafts
    arm: str        # what the controller ran ("plain", "lookup@3", ...)

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.pieces)


@dataclass(frozen=True)
class Done:
    reason: str         # "eog" (end of generation), "stop" (a stop string), "length", "cancelled"
    text: str           # the whole answer
    tokens: list[int]   # every token generated (past a stop string too)
    stats: Stats
    stop: str = ""      # the stop string that ended it


class Engine:
    def __init__(self, cfg: EngineConfig = EngineConfig(), progress: Progress | None = None,
                 log: LogHandler | None = None):
        """`progress` hears about loading and measuring; `log` receives llama.cpp's log
        (process-wide: the last engine made sets it)."""
        if log is not None:
            set_log_handler(log)
        self.cfg = cfg
        self.progress = progress or (lambda what, done, total: None)
        self.loads: collections.Counter[str] = collections.Counter()  # model files loaded
        path = store.resolve(cfg.model)
        self.model = self._load(path, repack=not cfg.strict, rpc=cfg.rpc)
        # Feature drafters read the target's hidden states: the context returns them whenever
        # one may run, decided once here. Over RPC, returning them costs every forward one more
        # round trip, drafting or not (at 6.5 ms: 21.5 -> 18.3 tokens/s plain), so auto leaves
        # Jakiro out there unless asked for by name.
        features = cfg.features if cfg.features is not None else cfg.drafter.uses_features or (
            cfg.drafter.kind == "auto" and not cfg.drafter.members and not cfg.rpc
            and store.shipped_drafter(path) is not None)
        config = ContextConfig(n_ctx=cfg.n_ctx, n_threads=cfg.threads, flash_attn=cfg.flash_attn,
                               n_seq_max=cfg.n_seq_max, kv_type="bf16" if cfg.strict else "f16",
                               embeddings=features, argmax_on_device=cfg.argmax_on_device)
        self.slots = [Context(self.model, config) for _ in range(max(1, cfg.slots))]
        self.ctx = self.slots[0]  # the slot the last request ran in
        self._used = [0.0] * len(self.slots)
        self._curve: CostCurve | LiveCurve | None = None
        self._drafters: dict[DrafterSpec, Drafter] = {}
        self._controllers: dict[DrafterSpec, Controller] = {}
        # What drafters share, loaded once: draft model contexts, Jakiro runtimes, heads.
        self._draft_ctxs: dict[Path, Context] = {}
        self._runtimes: dict[tuple, JakiroRuntime] = {}
        self._head_cache: dict[tuple, AcceptanceHead] = {}
        self._stores: dict[str, SuffixStore] = {}
        self._store_error = ""
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._idle_since = time.monotonic()
        self._closing = threading.Event()
        self._refiner: threading.Thread | None = None
        if cfg.strict:
            exact_batch = self.exactness[1]
            if exact_batch >= 2:  # prompts too in batches that reproduce single tokens
                for ctx in self.slots:
                    ctx.chunk, ctx.all_exact = exact_batch, True

    # --- what the engine holds ---------------------------------------------------------------

    @property
    def curve(self) -> CostCurve | LiveCurve:
        """The cost curve, measured once per model and machine, then corrected by what this
        engine's forwards cost (flat_cost: a curve held flat; cfg.curve: the one in that file)."""
        if self._curve is None and self.cfg.curve:
            self._curve = planning_curve(Path(self.cfg.curve), self.ctx)
        if self._curve is None:
            curve = cost_curve(self.ctx, progress=self.progress, quick=not self.cfg.whole_curve)
            if self.cfg.flat_cost:
                self._curve = replace(curve, seconds=[curve.seconds[0]] * len(curve.seconds), per_context=())
            else:
                self._curve = LiveCurve(curve)
                if curve.coarse and self.cfg.refine_curve:
                    self._refiner = threading.Thread(target=self._refine, name="localspec-curve", daemon=True)
                    self._refiner.start()
        return self._curve

    @property
    def exactness(self) -> tuple[float, int]:
        """How far batched forwards reproduce single tokens here: (the largest logit difference,
        the largest batch that was exact), as the whole cost curve measures it."""
        curve = self.curve
        coarse = getattr(curve, "base", curve).coarse
        return exactness(self.ctx) if coarse else (curve.discrepancy, curve.exact_batch)

    def _refine(self) -> None:
        """The whole cost curve, measured in a context of its own between requests, then
        cached and planned on in place of the coarse one."""
        try:
            with self._turn():
                config = replace(self.ctx.config, n_ctx=min(self.ctx.config.n_ctx, LONG_CONTEXT + MAX_BATCH))
                ctx = Context(self.model, config)
            try:
                curve = measure(ctx, turn=self._turn)
            finally:
                with self._turn(closing=True):
                    ctx.close()
            keep(self.ctx, curve)
            with self._lock:
                self._curve.rebase(curve)
        except _Closing:
            pass

    @contextlib.contextmanager
    def _turn(self, closing: bool = False) -> Iterator[None]:
        """The engine's lock for the curve's measurement, once no request has run for
        REFINE_IDLE seconds (at once with `closing`); _Closing when the engine closes first."""
        while True:
            if self._closing.is_set() and not closing:
                raise _Closing
            wait = 0.0 if closing else self._idle_since + REFINE_IDLE - time.monotonic()
            if wait > 0:
                self._closing.wait(wait)
            elif self._lock.acquire(timeout=0.1):
                if closing or time.monotonic() - self._idle_since >= REFINE_IDLE:
                    break
                self._lock.release()
        try:
            yield
        finally:
            self._lock.release()

    def _price(self) -> Callable[[int, int], float] | None:
        """With another machine's curve to plan on (cfg.curve): what a forward of n tokens
        after n_context costs there, so that Cascade measures utility as it would there."""
        if not self.cfg.curve:
            return None
        curve = self.curve
        return lambda n, n_context: float(curve.seconds_at(n_context)[min(n, len(curve.seconds)) - 1])

    @property
    def where(self) -> str:
        """One line on where the target runs."""
        return where(self.model, self.ctx.config.n_threads or default_threads())

    def _load(self, path: Path, repack: bool = True, rpc: tuple[str, ...] = ()) -> Model:
        what = f"loading {path.stem}"
        n_gpu_layers = self.cfg.n_gpu_layers
        if rpc and not n_gpu_layers:
            n_gpu_layers = ALL_LAYERS
        elif n_gpu_layers is None:
            n_gpu_layers = layers_that_fit(path, self.cfg.n_ctx)
        model = Model(path, n_gpu_layers, repack, lambda share: self.progress(what, share, 1.0), rpc=rpc)
        self.loads[str(path)] += 1
        return model

    def drafter(self, spec: DrafterSpec) -> Drafter:
        """The drafter a spec names, loaded on first use and kept (its K is the controller's)."""
        key = spec.without_k()
        if key not in self._drafters:
            if spec.kind == "lookup":
                d: Drafter = LookupDrafter()
            elif spec.kind == "suffix":
                d = SuffixDrafter(self.suffix_store(spec.model or self.cfg.store))
            elif spec.kind in ("draft", "draft-tree"):
                ctx = self._draft_context(store.resolve(spec.model or DEFAULT_DRAFT_MODEL))
                d = DraftModelDrafter(ctx, self.model, width=4 if spec.kind == "draft-tree" else 1,
                                      heads=self._heads(spec.head, ctx.model), head_required=spec.head == "on")
            elif spec.kind == "jakiro":
                rt = self._jakiro_runtime(spec)
                d = JakiroDrafter(rt, spec.width, spec.branch, spec.cepd, self._heads(spec.head, rt),
                                  head_required=spec.head == "on")
            else:
                raise LocalspecError(f"'{spec.label}' is not a drafter")
            self._drafters[key] = d
        return self._drafters[key]

    def suffix_store(self, where: str | None = None) -> SuffixStore:
        """The suffix store at `where` (as EngineConfig.store says), opened on first use."""
        where = self.cfg.store if where is None else where
        if where == "off":
            raise LocalspecError("the suffix store is off for this engine")
        if where not in self._stores:
            directory = None if where == ":memory:" else Path(where) if where else store_dir(
                self.model.tokenizer_hash)
            self._stores[where] = SuffixStore(directory, self.model.tokenizer_hash)
        return self._stores[where]

    def _learn(self, tokens: list[int]) -> None:
        """Every answer goes into the suffix store (the default one unless a drafter named
        another): what the user's work repeats, later requests draft from. Learning is a
        bonus: a store that cannot be opened or written is said once and left alone."""
        if self.cfg.store == "off" or not tokens or self._store_error:
            return
        try:
            for s in list(self._stores.values()) or [self.suffix_store()]:
                s.add(tokens)
        except (LocalspecError, OSError) as e:
            self._store_error = str(e)
            print(f"localspec: not learning answers: {e}", file=sys.stderr)

    def _draft_context(self, path: Path) -> Context:
        if path not in self._draft_ctxs:
            model = self._load(path)
            try:
                check_same_vocabulary(self.model, model)
            except LocalspecError:
                model.close()
                raise
            self._draft_ctxs[path] = draft_context(model, self.cfg.n_ctx, self.cfg.threads)
        return self._draft_ctxs[path]

    def _jakiro_runtime(self, spec: DrafterSpec) -> JakiroRuntime:
        path = Path(spec.model) if spec.model else store.shipped_drafter(self.model.path)
        if path is None:
            raise LocalspecError(f"no Jakiro drafter ships for {self.model.path.stem}: train one "
                                 "(localspec train jakiro) and pass --drafter jakiro:FILE")
        if not self.ctx.config.embeddings:
            raise LocalspecError("this engine was started without the target's hidden states, "
                                 "which Jakiro reads: start it with --drafter jakiro")
        key = ("jakiro", path, spec.full_vocab)
        if key not in self._runtimes:
            self._runtimes[key] = JakiroRuntime(path, self.model, self.cfg.n_ctx, self.cfg.threads,
                                                full_vocab=spec.full_vocab)
            self.loads[str(path)] += 1
        return self._runtimes[key]

    def _heads(self, choice: str, draft: Model | JakiroRuntime) -> dict[str, AcceptanceHead | None]:
        """The acceptance head for greedy and sampled drafting: a FILE for both, none when off,
        else the one trained for this pair and label, if any."""
        def head(path: Path | None) -> AcceptanceHead | None:
            if path is None:
                return None
            key = (path, draft.path)
            if key not in self._head_cache:
                self._head_cache[key] = AcceptanceHead(path, draft, self.model)
                self.loads[str(path)] += 1
            return self._head_cache[key]

        if choice == "off":
            return {"greedy": None, "sampled": None}
        if choice not in ("auto", "on"):
            return dict.fromkeys(("greedy", "sampled"), head(Path(choice)))
        return {label: head(store.acceptance_head(self.model.path, draft.path, label))
                for label in ("greedy", "sampled")}

    def prepare(self, spec: DrafterSpec | None = None) -> None:
        """Load, build and measure what requests with `spec` (the engine's drafter by default)
        need, now rather than inside the first of them."""
        spec = spec or self.cfg.drafter
        with self._running():
            self.controller(spec)
            if spec.kind != "none":
                self.curve

    def controller(self, spec: DrafterSpec) -> Controller:
        """What runs a request with this spec; auto's Cascade keeps what it learnt across
        requests."""
        if spec.kind == "none":
            return Plain()
        if spec.kind != "auto":
            drafter = self.drafter(spec)  # a drafter that cannot load says so before any measuring
            budget = Budget(self.curve, self.cfg.n_seq_max, spec.k, static=spec.k is not None)
            return Fixed(drafter, budget, spec.label)
        if spec not in self._controllers:
            members = spec.members or self.available()
            self._controllers[spec] = CascadeController(
                {d.label: self.drafter(d) for d in members}, self.curve, self.cfg.n_seq_max)
        return self._controllers[spec]

    def available(self) -> list[DrafterSpec]:
        """What auto chooses among: the suffix drafter (prompt lookup plus the store; lookup
        alone when the store is off); a draft model (_draft_model); the Jakiro drafter that ships for the
        target, if one does (and the context returns hidden states)."""
        found = [DrafterSpec("lookup")]
        if self.cfg.store != "off" and not self._store_error:
            try:
                self.drafter(DrafterSpec("suffix"))
                found = [DrafterSpec("suffix")]
            except (LocalspecError, OSError) as e:
                self._store_error = str(e)
                print(f"localspec: drafting without the suffix store: {e}", file=sys.stderr)
        draft = self._draft_model()
        if draft is not None:
            try:
                self.drafter(draft)
                found.append(draft)
            except LocalspecError:
                pass
        if store.shipped_drafter(self.model.path) is not None and self.ctx.config.embeddings:
            found.append(DrafterSpec("jakiro"))
        return found

    def _draft_model(self) -> DrafterSpec | None:
        """auto's draft model: the registry's default when it is pulled, else the smallest model
        this machine has (the store, other tools' folders) at most half the target's size
        that shares its tokenizer, said once."""
        try:
            default = store.resolve(DEFAULT_DRAFT_MODEL, pull_missing=False)
        except LocalspecError:
            default = None
        models = store.on_this_machine()
        small = sorted((p for p in models if p.stat().st_size <= self.model.path.stat().st_size / 2),
                       key=lambda p: p.stat().st_size)
        for path in [default] * (default is not None) + small:
            if path.resolve() == self.model.path.resolve():
                continue
            try:
                store.check_gguf(path)
                with Model(path, vocab_only=True) as vocab:  # seconds less than loading it
                    check_same_vocabulary(self.model, vocab)
            except LocalspecError:
                continue
            if path == default:
                return DrafterSpec("draft")
            print(f"localspec: auto drafts with {models[path]} ({path}), which shares the target's tokenizer",
                  file=sys.stderr)
            return DrafterSpec("draft", model=str(path))
        return None

    # --- requests ----------------------------------------------------------------------------

    def prompt_tokens(self, request: Request) -> list[int]:
        if request.messages is not None:
            return chat_tokens(self.model, list(request.messages))
        if isinstance(request.prompt, str):
            return self.model.tokenize(request.prompt)
        return list(request.prompt)

    def prefill(self, request: Request) -> Stats:
        """Only put the request's prompt in the cache (an editor's warm-up): what generate
        would reuse next, computed as it would compute it."""
        with self._running():
            tokens = self.prompt_tokens(request)
            stats = Stats()
            t0 = time.perf_counter()
            stats.cache_n, _ = self._slot(tokens).prefill(tokens, progress=self._reading)
            stats.prompt_n = len(tokens) - stats.cache_n
            stats.prompt_ms = (time.perf_counter() - t0) * 1e3
            return stats

    def _slot(self, tokens: list[int]) -> Context:
        """The context to run a prompt in: the one that shares most of it, else the one used
        longest ago. It becomes `ctx`."""
        shared = [common_prefix(c.tokens, tokens) for c in self.slots]
        best = max(range(len(self.slots)), key=lambda i: (shared[i], -self._used[i]))
        if shared[best] == 0:
            best = min(range(len(self.slots)), key=lambda i: self._used[i])
        self._used[best] = time.monotonic()
        self.ctx = self.slots[best]
        return self.ctx

    def _reading(self, done: int, total: int) -> None:
        self.progress("reading the prompt", done, total)

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """One request at a time; the thread that runs one may not start another."""
        me = threading.get_ident()
        if self._owner == me:
            raise LocalspecError("a request is still running on this engine: finish or close its stream first")
        with self._lock:
            self._owner = me
            try:
                yield
            finally:
                self._owner = None
                self._idle_since = time.monotonic()

    def generate(self, request: Request, cancel: threading.Event | None = None,
                 on_iteration: Callable[[Iteration], None] | None = None) -> Iterator[Delta | Done]:
        """Run `request`: Delta events as text is written (never part of a stop string, never
        half a character), then one Done. `cancel` set, or the stream closed, ends it after
        the iteration under way; the cache is left consistent either way."""
        with self._running():
            yield from self._generate(request, cancel, on_iteration)

    def _generate(self, request: Request, cancel, on_iteration) -> Iterator[Delta | Done]:
        tokens = self.prompt_tokens(request)
        if not tokens:
            raise LocalspecError("empty prompt")
        if request.max_tokens < 1:
            raise LocalspecError("max_tokens must be at least 1")
        spec = request.drafter or self.cfg.drafter
        controller = self.controller(spec)
        tie_bound, max_batch = 0.0, None
        if self.cfg.strict and spec.kind != "none":
            if request.sampling.temperature > 0:
                raise LocalspecError("--strict applies to greedy decoding (temperature 0)")
            discrepancy, exact_batch = self.exactness
            if exact_batch >= 2:
                max_batch = exact_batch
            else:
                tie_bound = discrepancy * 2
        stats = Stats()
        text = TextStream(self.model, request.stop)
        generated: list[int] = []
        reason = None
        ctx = self._slot(tokens)
        if not request.cache:
            ctx.clear()
        observe = getattr(self.curve, "observe", None) if spec.kind != "none" else None  # plain needs no curve
        options = RunOptions(not request.ignore_eog, tie_bound, max_batch, self._reading, observe, self._price())
        steps = run(ctx, controller, tokens, request.sampling, request.max_tokens, stats, options)
        try:
            while reason is None:
                if cancel is not None and cancel.is_set():  # seen before the next iteration
                    reason = "cancelled"
                    break
                it = next(steps, None)
                if it is None:
                    break
                if on_iteration:
                    on_iteration(it)
                generated += it.tokens
                for i, token in enumerate(it.tokens):
                    if self.model.is_eog(token) and not request.ignore_eog:
                        reason = "eog"
                        break
                    text.feed(token, it.drafter if i < it.n_accepted else None)
                    if text.stopped:
                        reason = "stop"
                        break
                yield Delta(text.take(final=reason is not None), len(it.tokens), it.n_accepted, it.arm)
        finally:
            steps.close()
        if reason in (None, "cancelled"):  # the request's max_tokens, the context's end, or cancelled
            reason = reason or "length"
            rest = text.take(final=True)
            if rest:
                yield Delta(rest, 0, 0, controller.arm)
        self._learn([t for t in generated if not self.model.is_eog(t)])
        if isinstance(self._curve, LiveCurve):  # how far the loop strays from it, kept beside it
            record_loop(cache_path(self.ctx), self._curve)
        yield Done(reason, text.text, generated, stats, text.matched)

    def close(self) -> None:
        self._closing.set()
        if self._refiner is not None:
            self._refiner.join()
        for d in self._drafters.values():
            d.close()
        for s in self._stores.values():
            s.close()
        for ctx in self._draft_ctxs.values():
            ctx.close()
            ctx.model.close()
        for ctx in self.slots:
            ctx.close()
        self.model.close()


class _Closing(Exception):
    """The engine closed while its curve was being measured."""


class TextStream:
    """Tokens in, text out: never half a UTF-8 character, never any part of a stop string
    (text that could begin one waits until it cannot), each run of text marked with where its
    tokens came from. The text ends before the first stop string to appear in full."""

    def __init__(self, model: Model, stops: Sequence[str] = ()):
        self.model = model
        self.stops = [s for s in stops if s]
        self.decoder = StreamDecoder(model)  # holds an incomplete character
        self.held: list[list] = []  # [text, source] runs not yet given out
        self.text = ""  # everything given out
        self.stopped = False
        self.matched = ""  # the stop string found
        self._out: list[tuple[str, str | None]] = []

    def feed(self, token: int, source: str | None) -> None:
        new = self.decoder.feed(token)
        if not new or self.stopped:
            return
        if not self.stops:  # nothing to hold back: out at once, in runs by source
            if self._out and self._out[-1][1] == source:
                self._out[-1] = (self._out[-1][0] + new, source)
            else:
                self._out.append((new, source))
            self.text += new
            return
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

    def take(self, final: bool = False) -> tuple[tuple[str, str | None], ...]:
        """The runs of text given out since the last call (at the end, all that is held)."""
        if final and not self.stopped:
            rest = self.decoder.flush()
            if rest:
                self.held.append([rest, None])
            self._release(sum(len(t) for t, _ in self.held))
        out, self._out = tuple(self._out), []
        return out

    def _release(self, n: int) -> None:
        while n > 0 and self.held:
            text, source = self.held[0]
            part = text[:n]
            self._out.append((part, source))
            self.text += part
            n -= len(part)
            if len(part) == len(text):
                self.held.pop(0)
            else:
                self.held[0][0] = text[len(part):]
