"""The engine every surface holds for as long as it runs: the target model and its context,
the cost curve, and the drafters loaded so far. It runs one request at a time; a request
goes in, events come out (text as it is written, then one final event), and closing the
stream, or setting its cancel flag, stops generation within one iteration."""

from __future__ import annotations

import collections
import contextlib
import enum
import functools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from localspec import store
from localspec.control.cascade import CascadeConfig
from localspec.control.controllers import controller_for
from localspec.drafters.base import DraftClock
from localspec.drafters.loaded import Drafters, loads_mtp, needs_features
from localspec.drafters.spec import AUTO, NONE, DrafterSpec
from localspec.drafters.suffix import StoreSetting
from localspec.errors import LocalspecError
from localspec.llama import Model
from localspec.llama.context import ContextConfig, default_threads, reserve_outputs
from localspec.llama.curve import POWERS_OF_TWO, CostModel, stable_shapes
from localspec.llama.live import LiveCurve
from localspec.llama.model import LogHandler, set_log_handler
from localspec.llama.placement import ALL_LAYERS, gpus, layers_that_fit, where
from localspec.llama.planning import Planning
from localspec.llama.slots import Slots
from localspec.llama.text import TextStream, chat_tokens
from localspec.loop import Controller, Iteration, RunOptions, Stats, run
from localspec.progress import Notice, Progress, notice_on_stderr
from localspec.sampling import SamplingConfig, TokenLogprob



@dataclass(frozen=True)
class EngineConfig:
    model: str = store.DEFAULT_MODEL
    n_ctx: int = 4096
    threads: int = 0
    n_gpu_layers: int | None = None  # None: every layer that fits on this machine's GPUs
    # "auto": off where the target runs on the CPU (cpu_flash_attn), else llama.cpp's choice.
    flash_attn: str = "auto"
    n_seq_max: int = 8     # root-to-leaf paths a draft tree may have
    # Tokens a recurrent target's state can be rolled back by (Model.recurrent; llama.cpp's
    # n_rs_seq, where the architecture has it), so its longest chain: each is one more copy of
    # the state in every decode (Qwen3.5-35B-A3B's: about 60 MB). 0: a batch that rejects a
    # node is undone from a checkpoint of the state instead (recurrent.py), which ran faster
    # on this CPU: docs/benchmarks.md#hybrid-targets-issue-47-2026-11-28.
    rollback: int = 0
    # Greedy output bit-identical to plain decoding, not only up to ties: plain weight layouts
    # and a bf16 KV cache, under which llama.cpp's CPU batches of up to 6 tokens reproduce
    # single-token decoding exactly (the cost curve measures how far), and every batch (prompt
    # chunks too) kept within that size. Where no batch is exact, no speculation (Engine).
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
    # The suffix store, which learns from every answer (StoreSetting.parse takes "" for the
    # target tokenizer's in the cache directory, a directory, ":memory:" or "off").
    store: StoreSetting = StoreSetting()
    # Requests take what acceptance needs of each row from a sampler inside the target's graph
    # (greedy its argmax, top-k its candidates; loop.device_sampling), not the row's full
    # logits (False: full rows on the host). None: where the output layer is offloaded, which
    # spares copying rows off the device; on the CPU the graph's sampler costs more than it
    # spares (it pads the logits, a slow copy: 0.9% of a 1.5B's step, docs/benchmarks.md).
    sample_on_device: bool | None = None
    # On the CPU, greedy requests read their rows' argmax from an exact head (native/head.h:
    # the output layer's argmax from a 4-bit copy of its matrix and the few rows that could
    # beat it computed exactly; the same tokens, 7% of a 1.5B's plain step spared). False:
    # llama.cpp's full output layer (--full-head). --strict keeps it.
    exact_head: bool = True
    # The sizes verification batches are padded up to (ContextConfig.shapes). None: where the
    # target's layers are offloaded (a GPU or RPC), powers of two, less those that cost about
    # what the next does on the cost curve; on the CPU none (a padded row costs as much there
    # as a real one). (): none.
    shapes: tuple[int, ...] | None = None
    # rpc-servers (HOST:PORT) that hold the target's offloaded layers (all of them unless
    # n_gpu_layers says how many); drafters stay on this machine.
    rpc: tuple[str, ...] = ()
    # A model's first start plans on a coarse cost curve measured in seconds; the whole curve
    # is measured between requests (a forward at a time, once none has run for REFINE_IDLE),
    # then cached. False: not in the background (LOCALSPEC_REFINE_CURVE=0; the test suite,
    # whose processes would slow each other). whole_curve: measured before the first request.
    refine_curve: bool = field(default_factory=lambda: os.environ.get("LOCALSPEC_REFINE_CURVE") != "0")
    whole_curve: bool = False

    def __post_init__(self):
        object.__setattr__(self, "store", StoreSetting.parse(self.store))  # callers may write it out


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
    iterations: int = 1  # of the loop this delta covers
    # Per token whose text this delta gives out (or, at a stop string, the last that gave
    # any), where the request asks: its log-probability. End-of-generation tokens have none.
    logprobs: tuple[TokenLogprob, ...] = ()

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.pieces)

    def then(self, later: Delta) -> Delta:
        """This delta and the one after it as one."""
        return Delta(self.pieces + later.pieces, self.n_tokens + later.n_tokens,
                     self.n_drafted + later.n_drafted, later.arm, self.iterations + later.iterations,
                     self.logprobs + later.logprobs)


@dataclass
class HeldLogprobs:
    """A request's log-probabilities, each given out with its token's text: none for text
    that never is (a stop string's tokens: llama-server's answers, as OpenAI's, carry none)."""
    held: list[TokenLogprob] = field(default_factory=list)
    given: int = 0

    def add(self, logprobs: tuple[TokenLogprob, ...]) -> None:
        """An iteration's, every token's: those never fed to the text (an end of generation, a
        token past a stop string) end the answer, so they are never given out."""
        self.held += logprobs

    def out(self, text: TextStream) -> tuple[TokenLogprob, ...]:
        n = min(text.tokens_out(), len(self.held))
        out, self.given = tuple(self.held[self.given:n]), n
        return out


class Reason(str, enum.Enum):
    """Why an answer ended."""
    EOG = "eog"              # the model ended it (end of generation)
    STOP = "stop"            # a stop string
    LENGTH = "length"        # the request's max_tokens, or the context's end
    CANCELLED = "cancelled"  # the cancel flag, or the stream closed

    @property
    def finished(self) -> bool:
        """Did the answer end where it meant to (OpenAI's finish_reason "stop")?"""
        return self in (Reason.EOG, Reason.STOP)


@dataclass(frozen=True)
class Done:
    reason: Reason
    text: str           # the whole answer
    tokens: list[int]   # every token generated (past a stop string too)
    stats: Stats
    stop: str = ""      # the stop string that ended it
    cached: int = 0     # tokens the context's cache holds after it (prompt and answer)


def coalesce(events: Iterable[Delta | Done], every: float) -> Iterator[Delta | Done]:
    """The same events with Deltas merged, at most one every `every` seconds (the first at
    once), for a surface that redraws on each."""
    held, sent = None, float("-inf")
    for event in events:
        if isinstance(event, Done):
            if held is not None:
                yield held
            yield event
            return
        held = event if held is None else held.then(event)
        if time.monotonic() - sent >= every:
            yield held
            held, sent = None, time.monotonic()


def load_model(cfg: EngineConfig, progress: Progress, loads: collections.Counter[str], path: Path,
               repack: bool = True, rpc: tuple[str, ...] = (), mtp: bool = False) -> Model:
    """A model file loaded as the engine loads models (on the GPUs where its layers fit, over
    `rpc` when given; `mtp`: with its MTP layers), its progress to `progress`, counted in
    `loads`."""
    what = f"loading {path.stem}"
    n_gpu_layers = cfg.n_gpu_layers
    if rpc and not n_gpu_layers:
        n_gpu_layers = ALL_LAYERS
    elif n_gpu_layers is None:
        n_gpu_layers = layers_that_fit(path, cfg.n_ctx)
    model = Model(path, n_gpu_layers, repack, lambda share: progress(what, share, 1.0), rpc=rpc, mtp=mtp)
    loads[str(path)] += 1
    return model


def cpu_flash_attn(cfg: EngineConfig, offloaded: bool = False) -> str:
    """Flash attention for the target: "auto" is off where it runs on the CPU (not `offloaded`
    to a GPU or over RPC, where llama.cpp chooses). ggml's CPU flash attention walks the whole
    cache once per row of a batch, where attention without it reads the cache once for all rows
    as a matrix product: after 1,500 tokens a verification batch of 4-48 rows cost 13-24% less
    without it, after 3,000 20-34%, a single token the same or less, prefill the same (docs/benchmarks.md#flash-attention-off-on-the-cpu-issue-44-2026-12-04-session-47).
    Its price is memory: the attention scores of a prompt chunk against the whole cache (at a
    32k context, 0.5 GiB more for the 1.5B). --strict keeps llama.cpp's choice (flash attention
    on), under which its batches up to the size the cost curve measures reproduce single ones."""
    return "off" if cfg.flash_attn == "auto" and not cfg.strict and not offloaded else cfg.flash_attn


class RequestLock:
    """One request at a time on an engine, which the cost curve's measurement takes turns with
    between requests (Planning gets the lock and idle()). An object of its own: what the
    engine's parts hold is no reference back to the engine (see Engine.__init__)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.owner: int | None = None  # the thread whose request holds it
        self.idle_since = time.monotonic()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """A request's turn; the thread that runs one may not start another."""
        me = threading.get_ident()
        if self.owner == me:
            raise LocalspecError("a request is still running on this engine: finish or close its stream first")
        with self.lock:
            self.owner = me
            try:
                yield
            finally:
                self.owner = None
                self.idle_since = time.monotonic()

    def idle(self) -> float:
        """Seconds since the last request ended."""
        return time.monotonic() - self.idle_since


class Engine:
    def __init__(self, cfg: EngineConfig = EngineConfig(), progress: Progress | None = None,
                 log: LogHandler | None = None, notice: Notice = notice_on_stderr,
                 draft_clock: DraftClock | None = None, heard: Callable[[Iteration], float] | None = None):
        """`progress` hears about loading and measuring; `log` receives llama.cpp's log
        (process-wide: the last engine made sets it); `notice` what the user should know
        that nothing waits on (a store left alone, the draft model auto found). `draft_clock`
        times the drafters' own forwards and `heard` says what Cascade hears an iteration
        took (RunOptions.heard): a bench's projection onto another machine sets both."""
        if log is not None:
            set_log_handler(log)
        self.cfg = cfg
        self.progress = progress or (lambda what, done, total: None)
        self.loads: collections.Counter[str] = collections.Counter()  # model files loaded
        self.heard = heard
        path = store.resolve(cfg.model)
        # What the engine's parts hold of it is no reference back to it (load is no bound
        # method): an engine a script never closes is freed with its script's globals, before
        # the interpreter's last collection, where a native runtime's teardown crashed.
        load = functools.partial(load_model, cfg, self.progress, self.loads)
        self.model = load(path, repack=not cfg.strict, rpc=cfg.rpc, mtp=loads_mtp(cfg.drafter, path))
        features = needs_features(cfg.drafter, cfg.features, bool(cfg.rpc), path)  # decided once
        self.offloaded = offloaded = self.model.n_gpu_layers > 0 and (bool(cfg.rpc) or bool(gpus()))
        shapes = cfg.shapes
        if shapes is None:
            shapes = POWERS_OF_TWO if offloaded and not cfg.strict else ()
        on_device = cfg.sample_on_device
        if on_device is None:  # llama.cpp counts the output layer as layer n_layer
            on_device = offloaded and self.model.n_gpu_layers > self.model.n_layer
        # A recurrent state (Model.recurrent) is kept per sequence (and per rollback step): a
        # hybrid target verifies trees flattened, each path in a sequence of its own (native/
        # step.h); a recurrent-only one, --rollback and --strict chains, in one sequence, a
        # rejecting batch undone from a checkpoint (recurrent.py) or, with --rollback N where
        # the architecture can, rolled back.
        recurrent = self.model.recurrent
        flat = recurrent and self.model.hybrid and not cfg.rollback and not cfg.strict and cfg.drafter.kind != "none"
        config = ContextConfig(n_ctx=cfg.n_ctx, n_threads=cfg.threads,
                               flash_attn=cpu_flash_attn(cfg, offloaded),
                               n_seq_max=cfg.n_seq_max + 1 if flat else 1 if recurrent else cfg.n_seq_max,
                               flat_trees=flat, kv_type="bf16" if cfg.strict else "f16",
                               embeddings=features, sample_on_device=on_device,
                               exact_head=cfg.exact_head and not cfg.strict and not offloaded,
                               shapes=() if recurrent else shapes,
                               # a recurrent padding row would need a state of its own; strict
                               # keeps its batches' shapes
                               padding=not recurrent and not cfg.strict,
                               # what rollback costs plain decoding: docs/benchmarks.md#hybrid-targets
                               rollback=cfg.rollback if recurrent and cfg.drafter.kind != "none" else 0)
        self.slots = Slots(self.model, config, cfg.slots)
        self.ctx = self.slots.contexts[0]  # the slot the last request ran in
        self.drafters = Drafters(self.model, features, cfg.n_ctx, cfg.threads, cfg.store, load, self.loads,
                                 draft_clock or DraftClock(), self.slots.contexts, notice)
        self._requests = RequestLock()
        self.planning = Planning(self.ctx, self.progress, self._requests.lock, self._requests.idle, cfg.curve,
                                 cfg.flat_cost, cfg.whole_curve, cfg.refine_curve, cfg.strict)
        self._cascades: dict[DrafterSpec, Controller] = {}  # auto's keep what they learnt
        # --strict keeps every batch, prompt chunks too, within the size that reproduces single
        # tokens here; where none does (batches of 2 already differ), within one token, and
        # nothing is verified in batches: whatever a batch writes into the cache would differ
        # from plain decoding's for the rest of the answer.
        self.speculates = True
        if cfg.strict:
            exact_batch = self.exactness()[1]
            self.speculates = exact_batch >= 2
            if not self.speculates:
                notice("--strict: batches of 2 tokens already differ from single ones on this target; "
                       "it decodes one token at a time, prompts too, without speculation")
            for ctx in self.slots.contexts:
                ctx.chunk, ctx.all_exact = exact_batch, True

    @property
    def curve(self) -> CostModel:
        """The cost curve requests plan on, once measured (prepare(), or the first request
        that speculates)."""
        return self.planning.curve

    def exactness(self) -> tuple[float, int]:
        """How far batched forwards reproduce single tokens here (Planning.exactness: the cost
        curve is measured first if it was not)."""
        return self.planning.exactness()

    @property
    def where(self) -> str:
        """One line on where the target runs."""
        return where(self.model, self.ctx.config.n_threads or default_threads())

    def turn(self) -> contextlib.AbstractContextManager:
        """A request's turn on the engine for a caller that drives its context itself (the
        synthetic bench): the cost curve's measurement in the background waits for its end."""
        return self._requests.turn()

    def prepare(self, spec: DrafterSpec | None = None) -> None:
        """Load, build and measure what requests with `spec` (the engine's drafter by default)
        need, now rather than inside the first of them."""
        spec = spec or self.cfg.drafter
        if not self.speculates:
            return
        with self._requests.turn():
            self.controller(spec)
            if spec.kind != "none":
                curve = self.planning.prepare()
                for ctx in self.slots.contexts:
                    if self.cfg.shapes is None:  # auto: the sizes worth their own shape on this curve
                        ctx.shapes = stable_shapes(curve, ctx.shapes)
                    if self.offloaded:  # (a growth costs a CPU little, a forward of 65 rows a second)
                        reserve_outputs(ctx, len(curve.seconds) + 1)  # before the first request's longest drafts

    def ready(self, spec: DrafterSpec) -> bool:
        """Whether a request with `spec` runs on what is loaded and measured (prepare(spec)
        does the rest): a server refuses one that is not, rather than load inside it."""
        return spec.kind == "none" or not self.speculates or self.planning.measured and (spec in self._cascades or self.drafters.loaded(spec))

    def controller(self, spec: DrafterSpec) -> Controller:
        """What runs a request with this spec."""
        if spec in self._cascades:
            return self._cascades[spec]
        controller = controller_for(spec, self.drafters, self.planning.prepare, self.ctx.n_paths, self.ctx.flat,
                                    CascadeConfig(settle=2 if self.offloaded else 0))
        if spec.kind == "auto":
            self._cascades[spec] = controller
        return controller

    def prompt_tokens(self, request: Request) -> list[int]:
        if request.messages is not None:
            return chat_tokens(self.model, list(request.messages))
        return self.model.tokenize(request.prompt) if isinstance(request.prompt, str) else list(request.prompt)

    def prefill(self, request: Request) -> Done:
        """Only put the request's prompt in the cache (an editor's warm-up): what generate
        would reuse next, computed as it would compute it."""
        with self._requests.turn():
            tokens, stats, t0 = self.prompt_tokens(request), Stats(), time.perf_counter()
            self.ctx = self.slots.pick(tokens)
            stats.cache_n, _ = self.ctx.prefill(tokens, progress=self._reading)
            stats.prompt_n = len(tokens) - stats.cache_n
            stats.prompt_ms = (time.perf_counter() - t0) * 1e3
            return Done(Reason.LENGTH, "", [], stats, cached=len(self.ctx.tokens))

    def generate(self, request: Request, cancel: threading.Event | None = None,
                 on_iteration: Callable[[Iteration], None] | None = None) -> Iterator[Delta | Done]:
        """Run `request`: Delta events as text is written (never part of a stop string, never
        half a character), then one Done. `cancel` set, or the stream closed, ends it after
        the iteration under way; the cache is left consistent either way."""
        with self._requests.turn():
            yield from self._generate(request, cancel or threading.Event(), on_iteration)

    def _generate(self, request: Request, cancel: threading.Event, on_iteration) -> Iterator[Delta | Done]:
        tokens = self.prompt_tokens(request)
        if not tokens or request.max_tokens < 1:
            raise LocalspecError("empty prompt" if not tokens else "max_tokens must be at least 1")
        spec = request.drafter or self.cfg.drafter
        if spec.kind != "none":
            self.planning.check_strict(request.sampling.temperature)
        if not self.speculates:
            spec = NONE
        controller = self.controller(spec)
        plain = spec.kind == "none"  # needs no curve
        max_batch = None if plain else self.planning.strict_batch()
        if self.ctx.rollback:  # a chain rejects at most all but its root: what the state rolls back
            max_batch = min(max_batch or self.ctx.n_ctx, self.ctx.rollback + 1)
        stats, text, generated, reason = Stats(), TextStream(self.model, request.stop), [], None
        logprobs = HeldLogprobs()
        ctx = self.ctx = self.slots.pick(tokens)
        if not request.cache:
            ctx.clear()
        curve = None if plain else self.planning.prepare()
        # The curve prices each size as the cheapest width that holds it (in padded shapes:
        # after the last forward's), and the context pads as it prices (plain requests keep to
        # their shape; a batch limit keeps to its own).
        if ctx.shapes and isinstance(curve, LiveCurve):
            curve.pad_with(tuple(ctx.shapes))
        ctx.pad_rule = curve.pad_to if curve is not None and max_batch is None else None
        options = RunOptions(stop_at_eog=not request.ignore_eog, max_batch=max_batch,
                             progress=self._reading, on_forward=None if plain else curve.observe,
                             draft_clock=self.drafters.clock, heard=self.heard)
        steps = run(ctx, controller, tokens, request.sampling, request.max_tokens, stats, options)
        with contextlib.closing(steps):
            while reason is None and (it := None if cancel.is_set() else next(steps, None)) is not None:
                if on_iteration:
                    on_iteration(it)
                generated += it.tokens
                for i, token in enumerate(it.tokens):
                    if self.model.is_eog(token) and not request.ignore_eog:
                        reason = Reason.EOG
                        break
                    text.feed(token, it.drafter if i < it.n_accepted else None)
                    if text.stopped:
                        reason = Reason.STOP
                        break
                logprobs.add(it.logprobs)
                pieces = text.take(final=reason is not None)
                yield Delta(pieces, len(it.tokens), it.n_accepted, it.arm, logprobs=logprobs.out(text))
        if reason is None:  # the request's max_tokens, the context's end, or cancelled
            reason = Reason.CANCELLED if cancel.is_set() else Reason.LENGTH
            rest = text.take(final=True)
            if (lps := logprobs.out(text)) or rest:
                yield Delta(rest, 0, 0, controller.arm, iterations=0, logprobs=lps)
        self.drafters.learn([t for t in generated if not self.model.is_eog(t)])
        yield Done(reason, text.text, generated, stats, text.matched, len(ctx.tokens))

    def _reading(self, done: int, total: int) -> None:
        self.progress("reading the prompt", done, total)

    def close(self) -> None:
        self.planning.close()
        self.drafters.close()
        self.slots.close()
        self.model.close()
