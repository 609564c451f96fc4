"""The Jakiro drafter at inference: the native runtime (ggml, any backend llama.cpp runs on)
loaded beside its target, refused in one line when it was made for another target."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from localspec import _native
from localspec.convert import check_target
from localspec.drafters import DecayingRatio, rerank
from localspec.drafters.jakiro_config import JakiroConfig
from localspec.engine.model import Model
from localspec.errors import LocalspecError
from localspec.train.features import tokenizer_hash
from localspec.verify import DraftTree, Verdict


class JakiroRuntime:
    """The drafter's layer and head, with its own KV cache (slots in decode order; the caller's
    masks say which slots each position sees)."""

    def __init__(self, drafter: Path, target: Model, n_ctx: int = 4096, n_threads: int = 0,
                 full_vocab: bool = False):
        from localspec.convert import read_config
        self.path = Path(drafter)
        self.cfg: JakiroConfig = read_config(drafter)
        check_target(self.cfg, target.n_vocab, target.n_embd, tokenizer_hash(target), target.name)
        try:
            self.native = _native.JakiroModel(str(drafter), str(target.path), n_ctx, n_threads,
                                              full_vocab)
        except RuntimeError as e:
            raise LocalspecError(f"cannot load drafter {Path(drafter).name}: {e}") from None
        self.draft_vocab = self.native.draft_vocab()

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


class JakiroDrafter:
    """Drafts a tree per the paper's Algorithm 1 (grown natively, see native/jakiro_tree.h):
    dual expert branches for steps 1..gamma-2, CEPD for the last two, `width` nodes expanded
    per depth, `branch` tokens per branch, then EAGLE-2 reranking to the best nodes."""

    feature_window = 128  # prompt tokens whose target features seed the drafter's cache

    def __init__(self, runtime: JakiroRuntime, planner, width: int = 4, branch: int = 2,
                 cepd: bool = True, head=None):
        self.rt = runtime
        self.name = f"jakiro:{runtime.path.stem}" + ("+head" if head else "")
        self.head = head  # an AcceptanceHead on branch features (reach is then calibrated)
        self.planner = planner
        self.width, self.branch, self.cepd = width, branch, cepd
        d = runtime.cfg.d_model
        self.features = np.zeros((0, d), np.float32)  # target hidden state per position
        self.known = np.zeros(0, bool)
        self.start = 0          # context position of the drafter's KV slot 0
        self.slots: list[int] = []  # tokens whose (feature, next token) the cache has seen
        self.calibration = DecayingRatio(prior=0.8)
        self.t_token = 0.0  # running seconds per draft forward (one tree level)
        self._raw = np.zeros(0)

    # --- features from the target -----------------------------------------------------------

    def committed(self, ctx, first_pos: int, rows: list[int], fresh: bool = False) -> None:
        """Record the target's hidden states of positions first_pos... (batch rows `rows`).
        Later positions are stale from now on; with `fresh` (a new prompt) earlier ones too."""
        need = first_pos + len(rows)
        if need > len(self.features):
            grow = max(need, 2 * len(self.features))
            self.features = np.resize(self.features, (grow, self.features.shape[1]))
            self.known = np.concatenate([self.known, np.zeros(grow - len(self.known), bool)])
        for i, row in enumerate(rows):
            self.features[first_pos + i] = ctx.hidden(row)
        self.known[first_pos:need] = True
        self.known[need:] = False
        if fresh:
            self.known[:first_pos] = False
        if first_pos < self.start + len(self.slots):  # re-decoded positions: redo from there
            self._rollback(first_pos)

    def _rollback(self, pos: int) -> None:
        keep = max(0, pos - self.start)
        del self.slots[keep:]
        self.rt.truncate(keep)

    def _catch_up(self, context: list[int]) -> tuple[np.ndarray, ...] | None:
        """Run the layer over context positions not yet in the drafter's cache (each reads its
        feature and the next token); return the layer outputs, whose last row's next token is
        the root. None when the features it needs are missing."""
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
        if not self.slots:  # a fresh cache starts at the first position with a known feature
            first = last
            while first > 0 and self.known[first - 1] and last - first + 1 < self.feature_window:
                first -= 1
            self.start = first
        begin = self.start + len(self.slots)
        if begin > last:
            # Already processed: replay the last position (cheap) to get its outputs.
            self._rollback(last)
            begin = last
        if not self.known[begin:last + 1].all():
            self._rollback(self.start)
            self.start = last
            begin = last
        pos = np.arange(begin, last + 1)
        n = len(pos)
        n_cached = len(self.slots)
        mask = np.zeros((n, n_cached + n), np.float32)
        mask[:, n_cached:] = np.triu(np.full((n, n), -np.inf, np.float32), 1)
        out = self.rt.layer(self.features[begin:last + 1], [context[p + 1] for p in pos], pos, mask)
        self.slots.extend(context[p + 1] for p in pos)
        return out

    # --- drafting ---------------------------------------------------------------------------

    def drafting_seconds(self, context: list[int], t_target: float) -> tuple[float, float]:
        """(seconds per draft forward, catch-up seconds): it follows every committed token,
        so it never has to catch up."""
        return self.t_token, 0.0

    def propose(self, context: list[int], max_nodes: int) -> DraftTree:
        self.calibration.tick()
        # A head's reach is calibrated already; the drafter's own q gets the running ratio.
        cal = 1.0 if self.head else self.calibration.value
        if max_nodes <= 0 or not self.planner.worth_drafting(min(1.0, cal), self.t_token, 0):
            return DraftTree.empty()
        t0 = time.perf_counter()
        outs = self._catch_up(context)
        if outs is None:
            return DraftTree.empty()
        min_reach = [self.planner.min_reach(self.t_token, d) / cal for d in range(1, self.rt.cfg.gamma)]
        tokens, parents, reach, n_forwards = self.rt.grow_tree(
            outs, len(context) - 1, self.width, self.branch, max_nodes, self.cepd, np.asarray(min_reach),
            self.head)
        dt = (time.perf_counter() - t0) / (n_forwards + 1)
        self.t_token = dt if self.t_token == 0 else 0.8 * self.t_token + 0.2 * dt
        order, new_parents = rerank(parents.tolist(), reach.tolist(), max_nodes)
        tree = DraftTree(tokens[order].astype(np.int32), np.asarray(new_parents, np.int32),
                         reach[order].astype(np.float64))
        self._raw = tree.reach.copy()
        tree.reach = np.minimum(1.0, tree.reach * cal)
        return tree

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        self.calibration.add(len(verdict.path), float(self._raw[:len(tree)].sum()))

