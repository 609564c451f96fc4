"""Draft trees and their verification: one target forward over the whole tree, exact
acceptance in native code, and the KV cache left holding exactly the accepted path."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from localspec.llama.context import Context
from localspec.sampling import TokenSampler

_EMPTY_I = np.zeros(0, np.int32)
_EMPTY_F = np.zeros(0, np.float32)


@dataclass
class DraftTree:
    """Nodes in topological order (parents[i] < i; -1 = the root, the last accepted token),
    so any prefix of the nodes is a tree too. `reach` is the drafter's estimate that the
    walk reaches (accepts) each node. Sampled drafts carry the distribution each node was
    drawn from in q_offsets/q_ids/q_probs; deterministic drafts leave them empty."""

    tokens: np.ndarray
    parents: np.ndarray
    reach: np.ndarray
    q_offsets: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    q_ids: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    q_probs: np.ndarray = field(default_factory=lambda: _EMPTY_F)

    @staticmethod
    def empty() -> DraftTree:
        return DraftTree(_EMPTY_I, _EMPTY_I, np.zeros(0))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def sampled(self) -> bool:
        return len(self.q_offsets) > 0

    def prefix(self, n: int) -> DraftTree:
        if n >= len(self):
            return self
        if not self.sampled:
            return DraftTree(self.tokens[:n], self.parents[:n], self.reach[:n])
        end = self.q_offsets[n]
        return DraftTree(self.tokens[:n], self.parents[:n], self.reach[:n], self.q_offsets[:n + 1],
                         self.q_ids[:end], self.q_probs[:end])

    def depths(self) -> np.ndarray:
        d: list[int] = []
        for p in self.parents.tolist():
            d.append(1 if p < 0 else d[p] + 1)
        return np.asarray(d, np.int32)

    def has_child(self) -> np.ndarray:
        has = np.zeros(len(self), bool)
        has[self.parents[self.parents >= 0]] = True
        return has

    def walk(self, tokens) -> tuple[int, bool]:
        """How far `tokens` (what followed the root) run down the tree: the nodes matched, and
        whether that is final (a token left the tree, or a leaf was reached) rather than
        waiting on tokens still to come. Greedy verification accepts exactly those nodes."""
        node, n = -1, 0
        for token in tokens:
            children = np.flatnonzero((self.parents == node) & (self.tokens == token))
            if len(children) == 0:
                return n, True
            node, n = int(children[0]), n + 1
        return n, not (self.parents == node).any()

    def n_leaves(self) -> int:
        return int((~self.has_child()).sum())


@dataclass
class Verdict:
    path: list[int]     # accepted node indices
    tokens: list[int]   # their tokens, then the next token (the bonus or the correction)
    unsettled: bool     # strict mode: the next token is still to be drawn
    n_cached: int       # how many of the accepted tokens the KV cache kept (see verify_tree)
    seconds: float = 0.0  # the target's forward: in llama_decode and waiting for its outputs


def launch(ctx: Context, tree: DraftTree, pending: list[int], all_pending_rows: bool = False,
           speculating: bool = False) -> None:
    """Start the target's forward over `pending` (emitted tokens not yet in the KV cache; the
    last is the tree's root) and the tree, in one llama_decode. Rows: pending tokens first
    (outputs for the root only, or for all with all_pending_rows), then the tree's nodes. On a
    GPU it runs on after this returns, while the host does other work. `speculating`: a
    drafter proposed (the tree may be empty): the batch may keep the last forward's shape."""
    ctx.launch(pending, tree.tokens, tree.parents, all_pending_rows, stay=speculating)


def accept(ctx: Context, tree: DraftTree, sampler: TokenSampler, tie_bound: float = 0.0) -> Verdict:
    """Accept exactly from the launched forward's outputs, and leave sequence 0 holding the
    context, the pending tokens and the accepted path up to its first gap. An empty tree is a
    plain step: the next token drawn from the root's row.

    Why a gap matters: llama.cpp puts new tokens into the lowest free KV cells, and its CPU
    flash attention accumulates in cell order, so a token placed in the hole of a rejected
    node, before cells of earlier positions, would be computed slightly differently from
    plain decoding. Accepted nodes after the first hole are therefore dropped from the
    cache and come back as `pending` in the next decode; the cache stays in position order."""
    path, accepted, nxt, unsettled, n_cached, seconds = ctx.finish(tree.q_offsets, tree.q_ids, tree.q_probs,
                                                                   sampler, tie_bound)
    return Verdict(path, accepted + ([nxt] if nxt >= 0 else []), unsettled, n_cached, seconds)


def verify_tree(ctx: Context, tree: DraftTree, pending: list[int], sampler: TokenSampler,
                tie_bound: float = 0.0, all_pending_rows: bool = False) -> Verdict:
    """launch, then accept."""
    launch(ctx, tree, pending, all_pending_rows)
    return accept(ctx, tree, sampler, tie_bound)
