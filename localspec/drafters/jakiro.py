"""The Jakiro drafter at inference: the native runtime (ggml, any backend llama.cpp runs on)
loaded beside its target, refused in one line when it was made for another target."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from localspec import _native
from localspec.drafters.base import Budget, DecayingRatio, Drafter, drafting_estimate, rerank
from localspec.drafters.files import check_target, read_config
from localspec.drafters.jakiro_config import JakiroConfig
from localspec.errors import LocalspecError
from localspec.llama import gguf
from localspec.llama.context import common_prefix, hidden_rows
from localspec.llama.curve import CostCurve
from localspec.llama.model import Model
from localspec.sampling import SamplingConfig
from localspec.verify import DraftTree, Verdict


class JakiroRuntime:
    """The drafter's layer and head, with its own KV cache (slots in decode order; the caller's
    masks say which slots each position sees), and the target's hidden states it has been
    given: one per target context position. Drafters with different tree options can share
    it."""

    def __init__(self, drafter: Path, target: Model, n_ctx: int = 4096, n_threads: int = 0,
                 full_vocab: bool = False):
        self.path = Path(drafter)
        gguf.check(self.path, model=False)
        self.cfg: JakiroConfig = read_config(drafter)
        check_target(self.cfg, target.n_vocab, target.n_embd, target.tokenizer_hash, target.name)
        try:
            self.native = _native.JakiroModel(str(drafter), str(target.path), n_ctx, n_threads,
                                              full_vocab)
        except RuntimeError as e:
            raise LocalspecError(f"cannot load drafter {Path(drafter).name}: {e}") from None
        self.draft_vocab = self.native.draft_vocab()
        self.target_share = target.head_share  # of a target forward, a step until one is timed
        d = self.cfg.d_model
        self.features = np.zeros((0, d), np.float32)  # target hidden state per position
        self.known = np.zeros(0, bool)
        self.context: list[int] = []  # the target context the features belong to
        self.start = 0          # context position of the drafter's KV slot 0
        self.slots: list[int] = []  # tokens whose (feature, next token) the cache has seen

    def layer(self, feats: np.ndarray, tokens, pos, mask: np.ndarray):
        """(u, experts (n, N, d), router logits (n, N)); the new K/V join the cache."""
        return self.native.step(np.ascontiguousarray(feats, np.float32),
                                np.ascontiguousarray(tokens, np.int32),
                                np.ascontiguousarray(pos, np.int32),
                                np.ascontiguousarray(mask, np.float32))

    def logits(self, feats: np.ndarray) -> np.ndarray:
        return self.native.logits(np.ascontiguousarray(feats, np.float32))

    def grow_tree(self, outs, root_pos: int, width: int, branch: int, max_nodes: int,
                  cepd: bool, min_reach: np.ndarray, head=None):
        """Algorithm 1's tree (native) from layer outputs whose last row is the root's
        predecessor's: (tokens, parents, reach, layer forwards). With an acceptance head,
        branch tokens' reach is built from its P(accepted) instead of their q."""
        u, experts, router = (np.ascontiguousarray(x[-1], np.float32).ravel() for x in outs)
        return self.native.grow_tree(u, experts, router, root_pos, width, branch, max_nodes,
                                     cepd, np.ascontiguousarray(min_reach, np.float32),
                                     head.native if head else None)

    def truncate(self, n: int) -> None:
        self.native.truncate(n)

    @property
    def n_cached(self) -> int:
        return self.native.n_cached

    # --- features from the target -----------------------------------------------------------

    def follow(self, prompt: list[int]) -> None:
        """A request starts from `prompt`: features of positions where it differs from the
        context they came from are stale."""
        same = common_prefix(self.context, prompt)
        self.known[same:] = False
        del self.context[same:]

    def commit(self, ctx, first_pos: int, rows: list[int]) -> None:
        """Record the target's hidden states of positions first_pos... (batch rows `rows` of
        its last decode); later positions are stale from now on."""
        need = first_pos + len(rows)
        if need > len(self.features):  # room to double: a prompt's length then one row at a time
            grow = 2 * max(need, len(self.features))
            # Uninitialised (untouched pages): only rows a commit writes are ever read.
            features = np.empty((grow, self.features.shape[1]), np.float32)
            features[:len(self.features)] = self.features
            self.features = features
            self.known = np.concatenate([self.known, np.zeros(grow - len(self.known), bool)])
        self.features[first_pos:need] = hidden_rows(ctx, rows)
        self.known[first_pos:need] = True
        self.known[need:] = False
        if first_pos > len(self.context):  # positions in between hold no known feature
            self.context.extend(ctx.tokens[len(self.context):first_pos])
        self.context[first_pos:] = ctx.tokens[first_pos:need]
        if first_pos < self.start + len(self.slots):  # re-decoded positions: redo from there
            self._rollback(first_pos)

    def _rollback(self, pos: int) -> None:
        keep = max(0, pos - self.start)
        del self.slots[keep:]
        self.truncate(keep)

    def behind(self, context: list[int], window: int) -> int:
        """The positions catch_up(context, window) would run through the layer now (0: the
        feature it drafts from is not there yet)."""
        last = len(context) - 2
        if last < 0 or last >= len(self.known) or not self.known[last]:
            return 0
        begin = self.start + len(self.slots)
        if self.slots and self.known[begin:last + 1].all():
            return max(1, last + 1 - begin)
        recent = self.known[max(0, last + 1 - window):last + 1]  # a fresh cache: the known run
        return len(recent) - int(np.flatnonzero(~recent)[-1]) - 1 if not recent.all() else len(recent)

    def catch_up(self, context: list[int], window: int) -> tuple[np.ndarray, ...] | None:
        """Run the layer over context positions not yet in the drafter's cache (each reads its
        feature and the next token); return the layer outputs, whose last row's next token is
        the root. None when the features it needs are missing. A fresh cache starts at most
        `window` positions back."""
        last = len(context) - 2  # the root's predecessor: its feature predicts the root
        # Where the context diverged from what the cache saw, roll back.
        ok = 0
        while ok < len(self.slots) and self.start + ok + 1 < len(context) and \
                context[self.start + ok + 1] == self.slots[ok]:
            ok += 1
        if ok < len(self.slots):
            self._rollback(self.start + ok)
        if last < 0 or last >= len(self.known) or not self.known[last]:
            return None
        if self.slots and not self.known[self.start + len(self.slots):last + 1].all():
            self._rollback(self.start)  # a gap since the cache's last slot: start afresh
        if not self.slots:  # a fresh cache starts at the first position with a known feature
            first = last
            while first > 0 and self.known[first - 1] and last - first + 1 < window:
                first -= 1
            self.start = first
        begin = self.start + len(self.slots)
        if begin > last:
            # Already processed: replay the last position (cheap) to get its outputs.
            self._rollback(last)
            begin = last
        pos = np.arange(begin, last + 1)
        n = len(pos)
        n_cached = len(self.slots)
        mask = np.zeros((n, n_cached + n), np.float32)
        mask[:, n_cached:] = np.triu(np.full((n, n), -np.inf, np.float32), 1)
        out = self.layer(self.features[begin:last + 1], [context[p + 1] for p in pos], pos, mask)
        self.slots.extend(context[p + 1] for p in pos)
        return out


class JakiroDrafter(Drafter):
    """Drafts a tree per the paper's Algorithm 1 (grown natively, see native/jakiro_tree.h):
    dual expert branches for steps 1..gamma-2, CEPD for the last two, `width` nodes expanded
    per depth, `branch` tokens per branch, then EAGLE-2 reranking to the best nodes."""

    feature_window = 128  # prompt tokens whose target features seed the drafter's cache
    rests = True  # catch_up starts a fresh cache after a gap in the features
    learns = ("calibration", "t_token", "t_prefill_token")

    def __init__(self, runtime: JakiroRuntime, width: int = 4, branch: int = 2,
                 cepd: bool = True, heads: dict | None = None, head_required: bool = False):
        """`heads`: the acceptance head on branch features for greedy and for sampled drafting,
        if any (reach is then calibrated); `head_required`: refuse a request whose head is
        missing."""
        self.rt = runtime
        self.name = f"jakiro:{runtime.path.stem}"
        self.heads = heads or {"greedy": None, "sampled": None}
        self.head_required = head_required
        self.head = None
        self.width, self.branch, self.cepd = width, branch, cepd
        self.calibration = DecayingRatio(prior=0.8)
        self.t_token = 0.0  # running seconds per draft forward (one tree level)
        self.t_prefill_token = 0.0  # seconds per position of a long catch-up
        self._raw = np.zeros(0)

    def begin(self, prompt: list[int], sampling: SamplingConfig) -> None:
        label = "greedy" if sampling.temperature <= 0 else "sampled"
        self.head = self.heads[label]
        if self.head is None and self.head_required:
            raise LocalspecError(f"no {label} acceptance head for {self.name}: train one "
                                 "(localspec train acceptance-head --drafter ...) or drop head=on")
        self.rt.follow(prompt)

    def commit(self, ctx, first_pos: int, rows: list[int]) -> None:
        self.rt.commit(ctx, first_pos, rows)

    def drafting_seconds(self, context: list[int], curve: CostCurve) -> tuple[float, float]:
        """(seconds per draft forward, seconds to catch up with `context` first): see
        drafting_estimate; the share is a step's, a layer and the output head."""
        return drafting_estimate(curve, self.t_token, self.rt.target_share, self.t_prefill_token,
                                 self.rt.behind(context, self.feature_window))

    def propose(self, context: list[int], budget: Budget) -> DraftTree:
        self.calibration.tick()
        head = None if budget.static else self.head  # a static K drafts all K: nothing to cut
        # A head's reach is calibrated already; the drafter's own q gets the running ratio.
        cal = 1.0 if head else self.calibration.value
        if budget.max_nodes <= 0 or not budget.worth_drafting(min(1.0, cal), self.t_token, 0):
            return DraftTree.empty()
        self.t_catch_up = 0.0
        t0, n_cached = time.perf_counter(), self.rt.n_cached
        outs = self.rt.catch_up(context, self.feature_window)
        if outs is None:
            return DraftTree.empty()
        self.t_catch_up = self.clock.forward(len(outs[0]), n_cached, t0)
        if len(outs[0]) >= 16:
            self.t_prefill_token = self.t_catch_up / len(outs[0])
        min_reach = [budget.min_reach(self.t_token, d) / cal for d in range(1, self.rt.cfg.gamma)]
        t0 = time.perf_counter()
        tokens, parents, reach, n_forwards = self.rt.grow_tree(
            outs, len(context) - 1, self.width, self.branch, budget.max_nodes, self.cepd,
            np.asarray(min_reach), head)
        # The tree's levels, of up to `width` nodes each, timed as one span; with none, the
        # root's logits (the head over the whole vocabulary) still ran: a forward's worth.
        dt = self.clock.forward(self.width, len(context), t0, max(n_forwards, 1)) / max(n_forwards, 1)
        self.t_token = dt if self.t_token == 0 else 0.8 * self.t_token + 0.2 * dt
        order, new_parents = rerank(parents.tolist(), reach.tolist(), budget.max_nodes)
        tree = DraftTree(tokens[order].astype(np.int32), np.asarray(new_parents, np.int32),
                         reach[order].astype(np.float64))
        self._raw = tree.reach.copy()
        tree.reach = np.minimum(1.0, tree.reach * cal)
        return tree

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        self.calibration.add(len(verdict.path), float(self._raw[:len(tree)].sum()))
