"""A generation session: the target, its cost curve, a drafter and the planner, wired
together once and used for many requests (CLI, bench, later the chat and the server)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

from localspec import store
from localspec.control.planner import FixedPlanner, Planner
from localspec.engine import Context, Model
from localspec.engine.context import ContextConfig
from localspec.engine.cost import CostCurve, cost_curve
from localspec.errors import LocalspecError
from localspec.generate import generate
from localspec.sampling import SamplingConfig
from localspec.speculative import SpecStats, speculative_generate

DEFAULT_DRAFT_MODEL = "qwen2.5-coder-0.5b-instruct"


@dataclass(frozen=True)
class EngineConfig:
    model: str = store.DEFAULT_MODEL
    n_ctx: int = 4096
    threads: int = 0
    n_gpu_layers: int = 0
    flash_attn: str = "auto"
    n_seq_max: int = 8     # root-to-leaf paths a draft tree may have
    # Greedy output bit-identical to plain decoding, not only up to ties: plain weight layouts
    # and a bf16 KV cache, under which llama.cpp's CPU batches of up to 6 tokens reproduce
    # single-token decoding exactly (the cost curve measures how far), and verification
    # batches kept within that size. Where no batch is exact, near-ties are settled instead.
    strict: bool = False
    # Plan as if every verification batch cost one single-token forward (a GPU's shape): the
    # drafters' tau, not this machine's trade-off, decides how much they draft.
    flat_cost: bool = False


class Session:
    """Owns the target model and context and, once asked for, drafters by spec."""

    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.model = Model(store.resolve(cfg.model), n_gpu_layers=cfg.n_gpu_layers, repack=not cfg.strict)
        self.ctx = Context(self.model, ContextConfig(
            n_ctx=cfg.n_ctx, n_threads=cfg.threads, flash_attn=cfg.flash_attn, n_seq_max=cfg.n_seq_max,
            kv_type="bf16" if cfg.strict else "f16"))
        self._curve: CostCurve | None = None
        self._drafters: dict[tuple, object] = {}

    @property
    def curve(self) -> CostCurve:
        if self._curve is None:
            self._curve = cost_curve(self.ctx)
            if self.cfg.flat_cost:
                c = self._curve
                self._curve = replace(c, seconds=[c.seconds[0]] * len(c.seconds))
        return self._curve

    def planner(self, max_nodes: int | None = None) -> Planner:
        return Planner(self.curve, self.cfg.n_seq_max, max_nodes)

    def planner_for(self, spec: str, max_nodes: int | None = None) -> Planner:
        """A drafter spec's planner: cost-aware, or static with `@K`."""
        k = split_budget(spec)[1]
        return FixedPlanner(self.curve, self.cfg.n_seq_max, k) if k else self.planner(max_nodes)

    def drafter(self, spec: str, sampling: SamplingConfig, max_nodes: int | None = None):
        """`lookup`, `draft[:MODEL][,head=FILE|on|off]` (a chain), `draft-tree[:MODEL][,head=...]`
        (a tree, 4 wide, 2 children per node; the acceptance head trained for the pair and the
        sampling, if there is one, unless off or a file is given), `jakiro[:FILE][,OPTION=VALUE...]` (a Jakiro drafter GGUF, by
        default the one that ships for the target; see jakiro_options) or `auto[:D+D...]`
        (Cascade over the given drafters, by default every one available); MODEL a registry
        name or GGUF path. Any but auto may end in `@K`: a static K, always up to K draft
        tokens, all verified, instead of the cost-aware size. None for `none`."""
        if spec == "none":
            return None
        key = (spec, sampling, max_nodes)
        if key not in self._drafters:
            base, k = split_budget(spec)
            kind, arg = split_spec(base)
            if kind == "auto" and k:
                raise LocalspecError("auto chooses K itself: no @K after auto")
            planner = self.planner_for(spec, max_nodes)
            if kind == "auto":
                from localspec.drafters.auto import AutoDrafter
                members = arg.split("+") if arg else self.available_drafters(sampling)
                d = AutoDrafter({m: self.drafter(m, sampling) for m in members}, planner)
            elif kind == "lookup":
                from localspec.drafters.lookup import LookupDrafter
                d = LookupDrafter()
            elif kind in ("draft", "draft-tree"):
                from localspec.drafters.draft_model import DraftModelDrafter
                name, head = draft_options(arg)
                dm = Model(store.resolve(name or DEFAULT_DRAFT_MODEL), n_gpu_layers=self.cfg.n_gpu_layers)
                d = DraftModelDrafter(dm, self.model, sampling, planner,
                                      width=4 if kind == "draft-tree" else 1, n_ctx=self.cfg.n_ctx,
                                      n_threads=self.cfg.threads,
                                      head=None if k else self.acceptance_head(head, dm, sampling))
            elif kind == "jakiro":
                from localspec.drafters.jakiro import JakiroDrafter, JakiroRuntime
                path, opts = jakiro_options(arg)
                if path is None:
                    path = store.shipped_drafter(self.model.path)
                    if path is None:
                        raise LocalspecError(f"no Jakiro drafter ships for {self.model.path.stem}: train "
                                             "one (localspec train jakiro) and pass --drafter jakiro:FILE")
                self.ctx.set_embeddings(True)
                rt = JakiroRuntime(path, self.model, self.cfg.n_ctx, self.cfg.threads,
                                   full_vocab=opts.pop("vocab") == "full")
                head = opts.pop("head")  # a static K drafts all K: nothing for a head to cut
                d = JakiroDrafter(rt, planner, **opts,
                                  head=None if k else self.acceptance_head(head, rt, sampling))
            else:
                raise LocalspecError(f"unknown drafter '{spec}' (none, auto[:D+D...], lookup, "
                                     "draft[:MODEL], draft-tree[:MODEL], jakiro[:FILE][,OPTION=VALUE...], "
                                     "each but auto optionally @K)")
            self._drafters[key] = d
        return self._drafters[key]

    def acceptance_head(self, choice: str, draft, sampling: SamplingConfig):
        """The head `choice` names for `draft` (a draft Model or a JakiroRuntime): a file,
        `off`, `on` (the one trained for this pair and sampling, which must exist) or `auto`
        (that one if it exists)."""
        if choice == "off":
            return None
        from localspec.control.acceptance import AcceptanceHead
        label = "greedy" if sampling.temperature <= 0 else "sampled"
        path = Path(choice) if choice not in ("on", "auto") else \
            store.acceptance_head(self.model.path, draft.path, label)
        if path is None and choice == "on":
            raise LocalspecError(f"no {label} acceptance head for {draft.path.stem} drafting for "
                                 f"{self.model.path.stem}: train one (localspec train acceptance-head)")
        return AcceptanceHead(path, draft, self.model) if path else None

    def available_drafters(self, sampling: SamplingConfig) -> list[str]:
        """What `auto` chooses among: prompt lookup; the default draft model when it is
        pulled, is not the target and shares its tokenizer; the Jakiro drafter that ships for
        the target, if one does."""
        found = ["lookup"]
        try:
            if store.resolve(DEFAULT_DRAFT_MODEL, pull_missing=False) != self.model.path:
                self.drafter("draft", sampling)
                found.append("draft")
        except LocalspecError:
            pass
        if store.shipped_drafter(self.model.path) is not None:
            found.append("jakiro")
        return found

    def generate(self, prompt: Sequence[int], max_tokens: int, sampling: SamplingConfig,
                 drafter: str = "none", stats: SpecStats | None = None,
                 max_nodes: int | None = None, stop_at_eog: bool = True) -> Iterator[int]:
        d = self.drafter(drafter, sampling, max_nodes)
        if d is None:
            return generate(self.ctx, prompt, max_tokens, sampling, stats, stop_at_eog)
        if hasattr(d, "new_request"):
            d.new_request()
        max_batch, tie_bound = None, 0.0
        if self.cfg.strict:
            if sampling.temperature > 0:
                raise LocalspecError("--strict applies to greedy decoding (temperature 0)")
            if self.curve.exact_batch >= 2:
                max_batch = self.curve.exact_batch
            else:
                tie_bound = self.curve.discrepancy * 2
        return speculative_generate(self.ctx, d, self.planner_for(drafter, max_nodes), prompt, max_tokens,
                                    sampling, stats, tie_bound, stop_at_eog, max_batch)

    def close(self) -> None:
        for d in self._drafters.values():
            if hasattr(d, "close"):
                d.close()
        self.ctx.close()
        self.model.close()


def split_budget(spec: str) -> tuple[str, int | None]:
    """`SPEC@K` -> (SPEC, K); a spec without a static K -> (SPEC, None)."""
    m = re.fullmatch(r"(.*)@(\d+)", spec)
    if m and int(m.group(2)) >= 1:
        return m.group(1), int(m.group(2))
    return spec, None


def split_spec(spec: str) -> tuple[str, str]:
    """A drafter spec's kind (up to the first ':' or ',') and the rest after a ':': `jakiro`
    options may follow the kind directly (`jakiro,cepd=off`) or a file (`jakiro:F,cepd=off`)."""
    kind = re.match(r"[^:,]*", spec).group()
    return kind, spec[len(kind):].removeprefix(":")


def draft_options(arg: str) -> tuple[str, str]:
    """`[MODEL][,head=FILE|on|off]` -> (MODEL, head choice; `auto` when not given: the
    trained head if there is one)."""
    name, *pairs = arg.split(",")
    head = "auto"
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key != "head" or not value:
            raise LocalspecError(f"bad draft option '{pair}' (head=FILE|on|off)")
        head = value
    return name, head


# Per option: int (a count >= 1), str (any non-empty value) or the values allowed.
JAKIRO_OPTIONS = {"width": int, "branch": int, "cepd": ("on", "off"), "vocab": ("draft", "full"),
                  "head": str}


def jakiro_options(arg: str) -> tuple[Path | None, dict]:
    """`[FILE][,width=N][,branch=N][,cepd=on|off][,vocab=draft|full][,head=FILE|on|off]`: the
    drafter (None: the one that ships for the target), the tree's expanded nodes per depth and
    tokens per branch, CEPD for the last two steps, the LM head's rows (the drafter's own
    reduced vocabulary, or every target token) and the acceptance head on branch features
    (default: the one trained for this drafter and sampling, if any)."""
    path, *pairs = arg.split(",")
    opts: dict = {"vocab": "draft", "cepd": "on", "head": "auto"}
    for pair in pairs:
        key, _, value = pair.partition("=")
        allowed = JAKIRO_OPTIONS.get(key, ())
        ok = (value.isdigit() and int(value) >= 1 if allowed is int else
              bool(value) if allowed is str else value in allowed)
        if not ok:
            raise LocalspecError(f"bad Jakiro option '{pair}' (width=N, branch=N, cepd=on|off, "
                                 "vocab=draft|full, head=FILE|on|off)")
        opts[key] = int(value) if allowed is int else value
    opts["cepd"] = opts["cepd"] == "on"
    return Path(path) if path else None, opts
