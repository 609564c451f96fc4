"""Which drafter to run, as one typed value: parsed from the command line's `--drafter`, named
the same way in every table, footer and log."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from localspec.errors import LocalspecError

KINDS = ("auto", "none", "lookup", "suffix", "draft", "draft-tree", "jakiro", "mtp", "eagle3", "dflash")
HEADS = ("mtp", "eagle3", "dflash")  # the drafters llama.cpp runs on the target's hidden states

HELP = ("auto[:D+D...] (the default: Cascade picks the drafter and K per request and phase, or "
        "plain decoding, among every drafter available or those listed) | none | lookup | "
        "suffix[:DIR] (lookup plus a store of earlier answers and indexed files; DIR: the store, "
        "default: one per tokenizer in the cache directory) | "
        "draft[:MODEL][,head=FILE|on|off] | draft-tree[:MODEL][,head=...] | "
        "jakiro[:FILE][,width=N][,branch=N][,cepd=on|off][,vocab=draft|full][,head=FILE|on|off] | "
        "mtp[,width=N][,branch=N] (the target's own MTP layers) | eagle3:FILE[,width=N][,branch=N] "
        "(an EAGLE-3 GGUF made for the target); width 1: a chain | dflash:FILE[,branch=N] (a "
        "DFlash GGUF: a block a forward); "
        "any but auto and none may end in @K, a static K. MODEL: a registry name or a .gguf "
        "(default: qwen2.5-coder-0.5b-instruct); FILE: a Jakiro drafter (default: the one that "
        "ships for the target); head: the acceptance head (default: the one trained for the "
        "pair, if any)")


@dataclass(frozen=True)
class Head:
    """The acceptance head a draft model or Jakiro drafter runs with, parsed once from
    `head=`: auto (the one trained for the pair, if any), on (that one, which must exist),
    off (none), or a FILE."""
    choice: str = "auto"  # auto | on | off | file
    file: str = ""

    @classmethod
    def parse(cls, text: str | Head) -> Head:
        if isinstance(text, Head):
            return text
        return cls(text) if text in ("auto", "on", "off") else cls("file", text)

    @property
    def required(self) -> bool:
        return self.choice == "on"

    def render(self, short: bool) -> str:
        return self.choice if self.choice != "file" else Path(self.file).stem if short else self.file


@dataclass(frozen=True)
class DrafterSpec:
    kind: str                 # one of KINDS
    model: str = ""           # draft: MODEL, jakiro: FILE, suffix: DIR; "" for the default
    k: int | None = None      # a static K: always up to K draft tokens, all verified
    head: Head = Head()       # draft, jakiro: the acceptance head (Head.parse takes it written out)
    width: int = 4            # jakiro, mtp, eagle3: nodes expanded per depth (1: a chain)
    branch: int = 2           # jakiro, mtp, eagle3: tokens per branch
    cepd: bool = True         # jakiro: contrastive parallel decoding for the last two steps
    full_vocab: bool = False  # jakiro: score every target token, not its draft vocabulary
    members: tuple[DrafterSpec, ...] = ()  # auto: () for every drafter available

    def __post_init__(self):
        object.__setattr__(self, "head", Head.parse(self.head))

    @staticmethod
    def parse(text: str) -> DrafterSpec:
        """`KIND[:ARG][,OPTION=VALUE...][@K]`, as in HELP; one line saying what is wrong
        otherwise."""
        text = text.strip()
        k = None
        m = re.fullmatch(r"(.*)@(\d+)", text)
        if m:
            text, k = m.group(1), int(m.group(2))
            if k < 1:
                raise LocalspecError(f"bad drafter '{text}@{k}': K must be at least 1")
        kind = re.match(r"[^:,]*", text).group()
        if kind not in KINDS:
            raise LocalspecError(f"unknown drafter '{text}' (one of: {', '.join(KINDS)})")
        rest = text[len(kind):]
        if kind in ("none", "auto") and k is not None:
            raise LocalspecError(f"{kind} takes no @K" + (" (it chooses K itself)" if kind == "auto" else ""))
        if kind == "auto":
            if rest and not rest.startswith(":"):
                raise LocalspecError(f"bad drafter '{text}': auto[:D+D...]")
            members = tuple(DrafterSpec.parse(d) for d in rest[1:].split("+")) if rest else ()
            for d in members:
                if d.kind in ("auto", "none") or d.k is not None:
                    raise LocalspecError(f"auto's members are drafters without @K, not '{d.label}'")
            return DrafterSpec("auto", members=members)
        if kind == "suffix":
            if rest and not rest.startswith(":") or "," in rest:
                raise LocalspecError(f"bad drafter '{text}': suffix[:DIR]")
            return DrafterSpec(kind, model=rest[1:], k=k)
        if kind == "mtp" and rest and not rest.startswith(","):
            raise LocalspecError(f"bad drafter '{text}': mtp takes no file (its layers are in the target's)")
        if kind in ("none", "lookup"):
            if rest:
                raise LocalspecError(f"{kind} takes no options (got '{rest}')")
            return DrafterSpec(kind, k=k)
        arg, *pairs = rest.removeprefix(":").split(",")
        spec = DrafterSpec(kind, model=arg, k=k)
        for pair in pairs:
            spec = _option(spec, *pair.partition("=")[::2], pair)
        return spec

    @property
    def label(self) -> str:
        """The name tables and footers show: files by their stem, options that differ from
        the defaults, the static K."""
        return self._render(short=True)

    def __str__(self) -> str:
        """What parse() turns back into this spec."""
        return self._render(short=False)

    def _render(self, short: bool) -> str:
        if self.kind == "auto":
            members = "+".join(d._render(short) for d in self.members)
            return "auto" + (":" + members if members else "")
        name = lambda f: Path(f).stem if short and ("/" in f or f.endswith(".gguf")) else f  # noqa: E731
        default = DrafterSpec(self.kind)._options(short)
        options = [f"{key}={value}" for key, value in self._options(short).items() if value != default[key]]
        return (self.kind + (":" + name(self.model) if self.model else "")
                + "".join("," + o for o in options) + (f"@{self.k}" if self.k else ""))

    def _options(self, short: bool) -> dict[str, str]:
        if self.kind in HEADS:
            return {"width": str(self.width), "branch": str(self.branch)}
        options = {"head": self.head.render(short)}
        if self.kind == "jakiro":
            options |= {"width": str(self.width), "branch": str(self.branch),
                        "cepd": "on" if self.cepd else "off",
                        "vocab": "full" if self.full_vocab else "draft"}
        return options if self.kind in ("draft", "draft-tree", "jakiro") else {}

    @property
    def uses_features(self) -> bool:
        """Whether it names a drafter that reads the target's hidden states (Jakiro)."""
        return self.kind == "jakiro" or any(d.uses_features for d in self.members)

    @property
    def draft_models(self) -> list[str]:
        """The draft models it runs ("" for the default), which a surface pulls before it starts."""
        return [self.model] if self.kind in ("draft", "draft-tree") else [m for d in self.members for m in d.draft_models]

    def without_k(self) -> DrafterSpec:
        return replace(self, k=None)


AUTO = DrafterSpec("auto")
NONE = DrafterSpec("none")


def _option(spec: DrafterSpec, key: str, value: str, pair: str) -> DrafterSpec:
    jakiro, head = spec.kind == "jakiro", spec.kind in HEADS
    if key == "head" and value and not head:
        return replace(spec, head=Head.parse(value))
    if (jakiro or head) and key in ("width", "branch") and value.isdigit() and int(value) >= 1:
        return replace(spec, **{key: int(value)})
    if jakiro and key == "cepd" and value in ("on", "off"):
        return replace(spec, cepd=value == "on")
    if jakiro and key == "vocab" and value in ("draft", "full"):
        return replace(spec, full_vocab=value == "full")
    allowed = ("width=N, branch=N, cepd=on|off, vocab=draft|full, head=FILE|on|off" if jakiro
               else "width=N, branch=N" if head else "head=FILE|on|off")
    raise LocalspecError(f"bad {spec.kind} option '{pair}' ({allowed})")
