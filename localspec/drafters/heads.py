"""The drafters models ship with, run by llama.cpp's own model code: the target's MTP layers
(`mtp`), EAGLE-3 GGUFs (`eagle3:FILE`) and DFlash GGUFs (`dflash:FILE`). Each reads the target's hidden states
(llama/heads.py) and drafts as a draft model does (DraftModelDrafter): a chain, or a tree whose
every step expands the best nodes into their top-k children, sized by the cost curve and, at
T > 0, drawn from its own distribution, which verification's rejection sampling is handed."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from localspec.drafters.base import Budget, rerank
from localspec.drafters.draft_model import DraftModelDrafter, check_same_vocabulary
from localspec.errors import LocalspecError
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig
from localspec.llama.heads import WINDOW, HeadContext, TargetStates, target_layers
from localspec.sampling import SamplingConfig
from localspec.verify import DraftTree

# Targets whose llama.cpp graph hands out its layers' inputs, which EAGLE-3 reads (elsewhere
# llama.cpp aborts building the graph): src/models/*.cpp that set t_layer_inp.
LAYER_INPUTS = frozenset({"llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "qwen4exp",
                          "gemma4", "gpt-oss", "minimax-01", "minimax-m2", "mimo2", "nemotron_h",
                          "deepseek4", "bailingmoe3", "hunyuan_vl", "lfm2", "nanbeige", "muse-glimmer"})


NAMES = {"eagle3": "an EAGLE-3", "dflash": "a DFlash"}


def check_drafter(kind: str, target: Model, drafter: Model) -> list[int]:
    """Refuse, in one line, an EAGLE-3 or DFlash drafter (`kind`) made for another target, or
    for one llama.cpp cannot hand the hidden states it reads; its target layers."""
    name, what = drafter.path.name, NAMES[kind]
    if drafter.architecture != kind:
        raise LocalspecError(f"{name} is a {drafter.architecture} model, not {what} drafter")
    if target.architecture not in LAYER_INPUTS:
        raise LocalspecError(f"llama.cpp cannot hand {what} drafter the hidden states of a "
                             f"{target.architecture} target ({target.path.name})")
    # EAGLE-3 says the width it reads; a DFlash drafter reads states of its own width.
    width = int(drafter.meta("eagle3.target_hidden_size") or 0) if kind == "eagle3" else drafter.n_embd
    if width != target.n_embd:
        raise LocalspecError(f"{name} was made for a target of width {width}; "
                             f"{target.path.name} has {target.n_embd}: not made for it")
    layers = target_layers(drafter)
    if not layers or (kind == "eagle3" and len(layers) != 3) or max(layers) >= target.n_layer or min(layers) < 0:
        raise LocalspecError(f"{name} reads target layers {layers}; {target.path.name} has "
                             f"{target.n_layer}: not made for it")
    if kind == "dflash" and drafter.special.mask < 0:
        raise LocalspecError(f"{name} names no mask token (tokenizer.ggml.mask_token_id)")
    check_same_vocabulary(target, drafter)
    return layers


def head_context(kind: str, target: Model, drafter: Model, targets: list[Context],
                 n_ctx: int, threads: int) -> tuple[HeadContext, TargetStates]:
    """The drafter's context beside the target's (`targets`, whose forwards from now on keep
    the hidden states it reads) and what it reads of them."""
    if kind == "mtp":
        if not target.mtp:
            raise LocalspecError(f"{target.path.name} has no MTP layers" if not target.mtp_layers else
                                 f"{target.path.name} was loaded without its MTP layers: start with --drafter mtp")
        states = TargetStates()
    else:
        states = TargetStates(check_drafter(kind, target, drafter))
    for ctx in targets:
        states.stage(ctx)
    # flash attention as the target (and a draft model) has it, so --flash-attn reaches every
    # context of the engine; on this CPU a head's step costs the same either way after 3,000
    # tokens (its output layer is most of it: docs/benchmarks.md, session 50)
    config = ContextConfig(n_ctx=n_ctx, n_threads=threads, n_seq_max=9, context_in_every_sequence=False,
                           mtp=kind == "mtp", flash_attn=targets[0].config.flash_attn)
    return HeadContext(drafter, config, targets[0], encode=kind == "eagle3", causal=kind != "dflash"), states


class HeadDrafter(DraftModelDrafter):
    """Drafts with a drafter llama.cpp runs on the target's hidden states; each drafted token
    is decoded with the state of the row it was drafted from."""

    feature_window = WINDOW  # prompt positions whose states seed the drafter's cache

    def __init__(self, name: str, ctx: HeadContext, states: TargetStates, target: Model, width: int = 1,
                 branch: int = 2):
        super().__init__(ctx, target, width=width, branch=branch)
        self.name = name
        self.ctx: HeadContext = ctx
        self.states = states
        self.target = target
        self.size_ratio = target.head_share  # until a step is timed

    def begin(self, prompt: list[int], sampling: SamplingConfig) -> None:
        super().begin(prompt, sampling)
        self.ctx.follow(prompt)

    def commit(self, ctx: Context, first_pos: int, rows: list[int]) -> None:
        self.ctx.commit(first_pos, ctx.tokens, self.states.rows(ctx, rows))

    def close(self) -> None:
        model = self.ctx.model
        self.ctx.close()
        if model is not self.target:  # an EAGLE-3 drafter's own
            model.close()

    def propose(self, context: list[int], budget: Budget) -> DraftTree:
        if len(context) - 2 not in self.ctx.states:  # the root's predecessor: not seen (yet)
            return DraftTree.empty()
        tree = super().propose(context, budget)
        # A chain's drafted pairs carry the drafter's own states: what the target accepts of
        # them is decoded again with the target's (catch_up), as llama.cpp's MTP does.
        self.ctx.truncate(len(context))
        return tree

    def _decode_nodes(self, tokens: list[int], drafted_at: list[int], pos: list[int],
                      seq_ids: list[list[int]]) -> None:
        self.ctx.decode_pairs(tokens, self.ctx.row_states(drafted_at), pos, seq_ids)


class DFlashDrafter(HeadDrafter):
    """DFlash: the target's states are its KV (HeadContext.inject); one forward of the root and
    block_size - 1 mask tokens, attending both ways, drafts a block at once. The tree: a chain
    of each position's best token (at T > 0, a draw), with the `branch` - 1 next best (draws)
    beside each as leaves, each from its position's distribution, sized by the cost curve."""

    def __init__(self, name: str, ctx: HeadContext, states: TargetStates, target: Model, branch: int = 2):
        super().__init__(name, ctx, states, target, width=1, branch=branch)
        self.block_size = int(ctx.model.meta("dflash.block_size") or 16)
        self.mask = ctx.model.special.mask

    def propose(self, context: list[int], budget: Budget) -> DraftTree:
        n = len(context)
        if n - 2 not in self.ctx.states:
            return DraftTree.empty()
        self.calibration.tick()
        scale = self.calibration.value
        if budget.max_nodes <= 0 or not budget.worth_drafting(min(1.0, scale), self.t_token, 0):
            return DraftTree.empty()
        if self.sampler.window:
            self.sampler.history = np.asarray(context[-self.sampler.window:], np.int32)
        t0 = time.perf_counter()
        self.ctx.inject(context)
        k = min(self.block_size - 1, budget.max_nodes)
        self.ctx.decode([context[-1]] + [self.mask] * k, range(n - 1, n + k), seq_ids=[[0]] * (k + 1),
                        outputs=[True] * (k + 1))
        dt = self.clock.forward(k + 1, n - 1, t0) / k  # a forward drafts k tokens
        self.t_token = dt if self.t_token == 0 else 0.8 * self.t_token + 0.2 * dt
        tokens, parents, reach, qs = [], [], [], []
        parent, r = -1, 1.0
        for d in range(1, k + 1):
            picks, ids, probs = self._pick(self.ctx.logits(d), self.branch)
            q = [float(probs[ids == x][0]) for x in picks]
            for x, qx in zip(picks, q):  # the first continues the chain; the others are leaves
                tokens.append(x), parents.append(parent), reach.append(r * qx), qs.append((ids, probs))
            parent = len(tokens) - len(picks)
            r *= q[0]
            self.sampler.extend(picks[:1])
            if not budget.worth_drafting(r * scale, 0.0, d):  # drafted already: only verifying costs
                break
        self.ctx.drop_branches(1)  # the block's KV goes
        order, new_parents = rerank(parents, reach, budget.max_nodes)
        tree = self._make_tree([tokens[i] for i in order], new_parents, [reach[i] for i in order],
                               [qs[i] for i in order])
        self._raw = tree.reach.copy()
        tree.reach = np.minimum(1.0, tree.reach * scale)
        return tree


def drafter_path(kind: str, spec_model: str) -> Path:
    if not spec_model:
        raise LocalspecError(f"{kind} needs its file: --drafter {kind}:FILE.gguf")
    return Path(spec_model)
