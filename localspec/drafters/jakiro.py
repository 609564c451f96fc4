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

    def __init__(self, drafter: Path, target: Model, n_ctx: int = 4096, n_threads: int = 0):
        from localspec.convert import read_config
        self.path = Path(drafter)
        self.cfg: JakiroConfig = read_config(drafter)
        check_target(self.cfg, target.n_vocab, target.n_embd, tokenizer_hash(target), target.name)
        try:
            self.native = _native.JakiroModel(str(drafter), str(target.path), n_ctx, n_threads)
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

    def truncate(self, n: int) -> None:
        self.native.truncate(n)

    @property
    def n_cached(self) -> int:
        return self.native.n_cached


class JakiroDrafter:
    """Drafts a tree per the paper's Algorithm 1, grown EAGLE-2 style: from each expanded node
    the two activated experts' branches each offer their `branch` best tokens (steps
    1..gamma-2); at step gamma-1 one forward gives f_moe's tokens and, in parallel, f_ctr's
    tokens for step gamma (CEPD), placed under the best f_moe token. Each depth expands the
    `width` best nodes by cumulative draft probability; the result keeps the best nodes."""

    feature_window = 128  # prompt tokens whose target features seed the drafter's cache

    def __init__(self, runtime: JakiroRuntime, planner, width: int = 4, branch: int = 2):
        self.rt = runtime
        self.name = f"jakiro:{runtime.path.stem}"
        self.planner = planner
        self.width, self.branch = width, branch
        d = runtime.cfg.d_model
        self.features = np.zeros((0, d), np.float32)  # target hidden state per position
        self.known = np.zeros(0, bool)
        self.start = 0          # context position of the drafter's KV slot 0
        self.slots: list[int] = []  # tokens whose (feature, next token) the cache has seen
        self.calibration = DecayingRatio(prior=0.8)
        self.t_step = 0.0
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
        feature and the next token); return the outputs of the last, whose next token is the
        root. None when the features it needs are missing."""
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
        return tuple(x[-1:] for x in out)

    # --- drafting ---------------------------------------------------------------------------

    def _mix(self, u, experts, router):
        """Top-2 experts per row: left and right branch features, f_moe, f_ctr."""
        scores = np.exp(router - router.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        top = np.argsort(-scores, axis=-1, kind="stable")[:, :2]
        rows = np.arange(len(u))
        e_a, e_b = experts[rows, top[:, 0]], experts[rows, top[:, 1]]
        s = scores[rows[:, None], top]
        s = s / s.sum(-1, keepdims=True)
        cfg = self.rt.cfg
        f_moe = u + s[:, :1] * e_a + s[:, 1:] * e_b
        f_ctr = u + cfg.beta1 * e_a - cfg.beta2 * e_b
        return u + e_a, u + e_b, f_moe, f_ctr

    def _top(self, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k most likely draft-vocabulary tokens per row (target ids) and their
        probabilities under the drafter (softmax at T = 1)."""
        z = logits - logits.max(-1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(-1, keepdims=True)
        idx = np.argpartition(-p, k - 1, axis=-1)[:, :k]
        order = np.argsort(-np.take_along_axis(p, idx, -1), axis=-1, kind="stable")
        idx = np.take_along_axis(idx, order, -1)
        return self.rt.draft_vocab[idx], np.take_along_axis(p, idx, -1)

    def propose(self, context: list[int], max_nodes: int) -> DraftTree:
        self.calibration.tick()
        if max_nodes <= 0 or not self.planner.worth_drafting(min(1.0, self.calibration.value), self.t_step, 0):
            return DraftTree.empty()
        t0 = time.perf_counter()
        outs = self._catch_up(context)
        if outs is None:
            return DraftTree.empty()
        n_context = len(self.slots)
        gamma = self.rt.cfg.gamma
        tokens: list[int] = []
        parents: list[int] = []
        reach: list[float] = []
        feed: list[np.ndarray] = []     # per node: the feature its own expansion reads
        slot_of: dict[int, int] = {}    # expanded node -> its slot in the drafter's cache

        def add(x: int, parent: int, r: float, f: np.ndarray) -> int:
            tokens.append(x), parents.append(parent), reach.append(r), feed.append(f)
            return len(tokens) - 1

        nodes, outs_rows = [-1], outs  # nodes whose children the layer outputs predict
        n_steps = 0
        for depth in range(1, gamma):
            new: list[int] = []
            m = len(nodes)
            left, right, f_moe, f_ctr = self._mix(*outs_rows)
            cepd = depth == gamma - 1
            # One head product for the whole frontier: rows [branch 1 of each; branch 2 of each].
            ids, probs = self._top(self.rt.logits(np.concatenate(
                [f_moe, f_ctr] if cepd else [left, right])), self.branch)
            for r, node in enumerate(nodes):
                base = reach[node] if node >= 0 else 1.0
                if cepd:
                    # Step gamma - 1 from f_moe; step gamma from f_ctr in the same forward,
                    # under the likeliest step gamma - 1 token.
                    kids = [add(x, node, base * q, f_moe[r]) for x, q in zip(ids[r].tolist(), probs[r].tolist())]
                    for x, q in zip(ids[m + r].tolist(), probs[m + r].tolist()):
                        add(x, kids[0], reach[kids[0]] * q, f_moe[r])
                    continue
                seen: dict[int, int] = {}
                for x, q in zip(ids[[r, m + r]].ravel().tolist(), probs[[r, m + r]].ravel().tolist()):
                    if x in seen:  # both experts chose it: one node, at the likelier reading
                        reach[seen[x]] = max(reach[seen[x]], base * q)
                    else:
                        seen[x] = add(x, node, base * q, f_moe[r])
                        new.append(seen[x])
            if depth == gamma - 1 or len(tokens) >= max_nodes:
                break
            # Expand the `width` likeliest new nodes in one forward, each seeing its ancestors.
            best = sorted(new, key=lambda i: -reach[i])[:self.width]
            if not best or not self.planner.worth_drafting(
                    reach[best[0]] * self.calibration.value, self.t_step, depth):
                break
            n_cached = self.rt.n_cached
            mask = np.full((len(best), n_cached + len(best)), -np.inf, np.float32)
            mask[:, :n_context] = 0.0
            for r, node in enumerate(best):
                for a in _ancestors(parents, node):
                    mask[r, slot_of[a]] = 0.0
                mask[r, n_cached + r] = 0.0
                slot_of[node] = n_cached + r
            u, experts, router = self.rt.layer(np.stack([feed[i] for i in best]),
                                               [tokens[i] for i in best],
                                               # a node at depth k reads the feature of
                                               # the position before its own token
                                               [len(context) - 2 + depth] * len(best), mask)
            n_steps += 1
            nodes, outs_rows = best, (u, experts, router)
        self.rt.truncate(n_context)  # the cache keeps only the context
        dt = (time.perf_counter() - t0) / (n_steps + 1)
        self.t_step = dt if self.t_step == 0 else 0.8 * self.t_step + 0.2 * dt
        order, new_parents = rerank(parents, reach, max_nodes)
        tree = DraftTree(np.asarray([tokens[i] for i in order], np.int32),
                         np.asarray(new_parents, np.int32),
                         np.asarray([reach[i] for i in order], np.float64))
        self._raw = tree.reach.copy()
        tree.reach = np.minimum(1.0, tree.reach * self.calibration.value)
        return tree

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        self.calibration.add(len(verdict.path), float(self._raw[:len(tree)].sum()))


def _ancestors(parents: list[int], i: int) -> list[int]:
    out = []
    while parents[i] >= 0:
        i = parents[i]
        out.append(i)
    return out
