"""The drafters an engine has made, and what they share, each loaded once: draft models and
their contexts, Jakiro runtimes, acceptance heads, suffix stores. Building and loading
happen here, when the engine prepares a drafter (Engine.prepare), not in the loop: each kind
of drafter registers the factory that builds it from its spec (at the end of this file)."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Callable

from localspec import store
from localspec.drafters.acceptance_head import AcceptanceHead
from localspec.drafters.base import DraftClock, Drafter
from localspec.drafters.draft_model import DraftModelDrafter, check_same_vocabulary
from localspec.drafters.draft_model import draft_context as open_draft_context
from localspec.drafters.heads import DFlashDrafter, HeadDrafter, drafter_path, head_context
from localspec.drafters.jakiro import JakiroDrafter, JakiroRuntime
from localspec.drafters.lookup import LookupDrafter
from localspec.drafters.spec import HEADS, DrafterSpec, Head
from localspec.drafters.suffix import StoreSetting, SuffixDrafter, SuffixStore
from localspec.errors import LocalspecError
from localspec.llama import Context, Model, gguf
from localspec.progress import Notice, notice_on_stderr

def needs_features(spec: DrafterSpec, asked: bool | None, over_rpc: bool, target: Path) -> bool:
    """Whether the target's context must return its hidden states, which feature drafters
    (Jakiro) read: as `asked`, else when `spec` may run one. Over RPC, returning them costs
    every forward one more round trip, drafting or not (at 6.5 ms: 21.5 -> 18.3 tokens/s
    plain), so auto leaves Jakiro out there unless it is asked for by name."""
    if asked is not None:
        return asked
    return spec.uses_features or (spec.kind == "auto" and not spec.members and not over_rpc
                                  and store.shipped_drafter(target) is not None)


def loads_mtp(spec: DrafterSpec, target: Path) -> bool:
    """Whether the target is loaded with its MTP layers: when its GGUF has them and `spec` may
    draft with them (auto with every drafter, or named)."""
    named = spec.kind == "mtp" or any(d.kind == "mtp" for d in spec.members)
    return (named or (spec.kind == "auto" and not spec.members)) and gguf.mtp_layers(target) > 0


class Drafters:
    def __init__(self, target: Model, features: bool, n_ctx: int, threads: int, store_setting: StoreSetting,
                 load: Callable[[Path], Model], loads: collections.Counter[str], clock: DraftClock,
                 targets: list[Context], notice: Notice = notice_on_stderr):
        """`features`: the target's context returns hidden states (Jakiro reads them);
        `store_setting`: EngineConfig.store; `load` loads a draft model as the engine loads
        models, and `loads` counts every file loaded; `clock`: what times the drafters'
        own forwards; `targets`: the target's contexts (MTP and EAGLE-3 drafters have them
        keep hidden states); `notice` hears what the user should know."""
        self.model = target
        self.notice = notice
        self.clock = clock
        self.features, self.n_ctx, self.threads = features, n_ctx, threads
        self.store_setting = store_setting
        self.load, self.loads = load, loads
        self.targets = targets
        self._drafters: dict[DrafterSpec, Drafter] = {}
        self._draft_ctxs: dict[Path, Context] = {}
        self._runtimes: dict[tuple, JakiroRuntime] = {}
        self._head_cache: dict[tuple, AcceptanceHead] = {}
        self._stores: dict[StoreSetting, SuffixStore] = {}
        self._store_error = ""

    @property
    def runtimes(self) -> list[JakiroRuntime]:
        return list(self._runtimes.values())

    def get(self, spec: DrafterSpec) -> Drafter:
        """The drafter a spec names, loaded on first use and kept (its K is the controller's)."""
        key = spec.without_k()
        if key not in self._drafters:
            if spec.kind not in FACTORIES:
                raise LocalspecError(f"'{spec.label}' is not a drafter")
            d = FACTORIES[spec.kind](self, spec)
            d.clock = self.clock
            self._drafters[key] = d
        return self._drafters[key]

    def loaded(self, spec: DrafterSpec) -> bool:
        """Whether the drafters `spec` runs are built (lookup needs nothing), so a request can run
        it as is (plain decoding is the engine's to judge)."""
        if spec.kind == "auto":
            return bool(spec.members) and all(self.loaded(d) for d in spec.members)
        return spec.kind == "lookup" or spec.without_k() in self._drafters

    def suffix_store(self, where: StoreSetting | str | None = None) -> SuffixStore:
        """The suffix store `where` says (None: the engine's), opened on first use."""
        where = self.store_setting if where is None else StoreSetting.parse(where)
        if where not in self._stores:
            tokenizer = self.model.tokenizer_hash
            self._stores[where] = SuffixStore(where.folder(tokenizer), tokenizer, notice=self.notice)
        return self._stores[where]

    def learn(self, tokens: list[int]) -> None:
        """Every answer goes into the suffix store (the default one unless a drafter named
        another): what the user's work repeats, later requests draft from. Learning is a
        bonus: a store that cannot be opened or written is said once and left alone."""
        if self.store_setting.off or not tokens or self._store_error:
            return
        try:
            for s in list(self._stores.values()) or [self.suffix_store()]:
                s.add(tokens)
        except (LocalspecError, OSError) as e:
            self._store_error = str(e)
            self.notice(f"not learning answers: {e}")

    def draft_context(self, path: Path) -> Context:
        """A draft model's context, the model loaded once (and checked against the target)."""
        if path not in self._draft_ctxs:
            model = self.load(path)
            try:
                check_same_vocabulary(self.model, model)
            except LocalspecError:
                model.close()
                raise
            # flash attention as the target has it (off on the CPU, where it walks the cache per row)
            self._draft_ctxs[path] = open_draft_context(model, self.n_ctx, self.threads,
                                                        self.targets[0].config.flash_attn)
        return self._draft_ctxs[path]

    def jakiro_runtime(self, spec: DrafterSpec) -> JakiroRuntime:
        path = Path(spec.model) if spec.model else store.shipped_drafter(self.model.path)
        if path is None:
            raise LocalspecError(f"no Jakiro drafter ships for {self.model.path.stem}: train one "
                                 "(localspec train jakiro) and pass --drafter jakiro:FILE")
        if not self.features:
            raise LocalspecError("this engine was started without the target's hidden states, "
                                 "which Jakiro reads: start it with --drafter jakiro")
        key = ("jakiro", path, spec.full_vocab)
        if key not in self._runtimes:
            self._runtimes[key] = JakiroRuntime(path, self.model, self.n_ctx, self.threads,
                                                full_vocab=spec.full_vocab)
            self.loads[str(path)] += 1
        return self._runtimes[key]

    def heads(self, choice: Head, draft: Model | JakiroRuntime) -> dict[str, AcceptanceHead | None]:
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

        if choice.choice == "off":
            return {"greedy": None, "sampled": None}
        if choice.file:
            return dict.fromkeys(("greedy", "sampled"), head(Path(choice.file)))
        return {label: head(store.acceptance_head(self.model.path, draft.path, label))
                for label in ("greedy", "sampled")}

    def available(self) -> list[DrafterSpec]:
        """What auto chooses among: the suffix drafter (prompt lookup plus the store; lookup
        alone when the store is off); a draft model (draft_model); the Jakiro drafter that ships for the
        target, if one does (and the context returns hidden states)."""
        found = [DrafterSpec("lookup")]
        if not self.store_setting.off and not self._store_error:
            try:
                self.get(DrafterSpec("suffix"))
                found = [DrafterSpec("suffix")]
            except (LocalspecError, OSError) as e:
                self._store_error = str(e)
                self.notice(f"drafting without the suffix store: {e}")
        draft = self.draft_model()
        if draft is not None:
            try:
                self.get(draft)
                found.append(draft)
            except LocalspecError:
                pass
        if store.shipped_drafter(self.model.path) is not None and self.features:
            found.append(DrafterSpec("jakiro"))
        if self.model.mtp:
            found.append(DrafterSpec("mtp"))
        return found

    def draft_model(self) -> DrafterSpec | None:
        """auto's draft model: the registry's default when it is pulled, else the smallest model
        this machine has (the store, other tools' folders) at most half the target's size
        that shares its tokenizer, said once."""
        try:
            default = store.resolve(store.DEFAULT_DRAFT_MODEL)
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
            self.notice(f"auto drafts with {models[path]} ({path}), which shares the target's tokenizer")
            return DrafterSpec("draft", model=str(path))
        return None

    def close(self) -> None:
        for d in self._drafters.values():
            d.close()
        for s in self._stores.values():
            s.close()
        for ctx in self._draft_ctxs.values():
            ctx.close()
            ctx.model.close()


# --- how each kind of drafter is built from its spec (spec.py parses its options) ---------------

Factory = Callable[[Drafters, DrafterSpec], Drafter]
FACTORIES: dict[str, Factory] = {}


def factory(*kinds: str) -> Callable[[Factory], Factory]:
    """Register what builds the drafters of `kinds` from their spec, with what they share."""
    def register(make: Factory) -> Factory:
        FACTORIES.update(dict.fromkeys(kinds, make))
        return make
    return register


@factory("lookup")
def _lookup(drafters: Drafters, spec: DrafterSpec) -> Drafter:
    return LookupDrafter(fim_suffix=drafters.model.special.fim_suf)


@factory("suffix")
def _suffix(drafters: Drafters, spec: DrafterSpec) -> Drafter:
    return SuffixDrafter(drafters.suffix_store(spec.model or None), fim_suffix=drafters.model.special.fim_suf)


@factory("draft", "draft-tree")
def _draft_model(drafters: Drafters, spec: DrafterSpec) -> Drafter:
    ctx = drafters.draft_context(store.resolve(spec.model or store.DEFAULT_DRAFT_MODEL))
    return DraftModelDrafter(ctx, drafters.model, width=4 if spec.kind == "draft-tree" else 1,
                             heads=drafters.heads(spec.head, ctx.model), head_required=spec.head.required)


@factory(*HEADS)
def _head(drafters: Drafters, spec: DrafterSpec) -> Drafter:
    target = drafters.model
    model = target if spec.kind == "mtp" else drafters.load(drafter_path(spec.kind, spec.model))
    try:
        ctx, states = head_context(spec.kind, target, model, drafters.targets, drafters.n_ctx, drafters.threads)
    except LocalspecError:
        if model is not target:
            model.close()
        raise
    # One path a target context (a recurrent-only state's): chains.
    trees = drafters.targets[0].n_paths > 1
    if spec.kind == "dflash":
        return DFlashDrafter(spec.without_k().label, ctx, states, target, spec.branch if trees else 1)
    return HeadDrafter(spec.without_k().label, ctx, states, target, spec.width if trees else 1, spec.branch)


@factory("jakiro")
def _jakiro(drafters: Drafters, spec: DrafterSpec) -> Drafter:
    rt = drafters.jakiro_runtime(spec)
    return JakiroDrafter(rt, spec.width, spec.branch, spec.cepd, drafters.heads(spec.head, rt),
                         head_required=spec.head.required)

