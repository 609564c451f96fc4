"""Draft trees and their verification: one target forward over the whole tree, exact
acceptance in native code, and the KV cache left holding exactly the accepted path."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from localspec import _native
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
        d = np.zeros(len(self), np.int32)
        for i, p in enumerate(self.parents):
            d[i] = 1 if p < 0 else d[p] + 1
        return d

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

    def path_seqs(self) -> list[list[int]]:
        """Sequence ids of every node: one sequence per root-to-leaf path, so that a node
        belongs to the paths of all the leaves below it (the tree-attention mask)."""
        n = len(self)
        has_child = self.has_child()
        seqs: list[list[int]] = [[] for _ in range(n)]
        leaf = 0
        for i in range(n):
            if not has_child[i]:
                seqs[i].append(leaf)
                leaf += 1
        for i in range(n - 1, -1, -1):  # children come after parents: push sets upwards
            p = self.parents[i]
            if p >= 0:
                seqs[p].extend(s for s in seqs[i] if s not in seqs[p])
        return seqs


@dataclass
class Verdict:
    path: list[int]     # accepted node indices
    tokens: list[int]   # their tokens, then the next token (the bonus or the correction)
    unsettled: bool     # strict mode: the next token is still to be drawn
    n_cached: int       # how many of the accepted tokens the KV cache kept (see verify_tree)


def verify_tree(ctx: Context, tree: DraftTree, pending: list[int], sampler: TokenSampler,
                tie_bound: float = 0.0, all_pending_rows: bool = False) -> Verdict:
    """Decode `pending` (emitted tokens not yet in the KV cache; the last is the tree's root)
    and the tree in one llama_decode, accept exactly, and leave sequence 0 holding the
    context, `pending` and the accepted path up to its first gap. Rows: pending tokens first
    (outputs for the root only, or for all with all_pending_rows), then the tree's nodes. An
    empty tree is a plain step: the next token drawn from the root's row.

    Why a gap matters: llama.cpp puts new tokens into the lowest free KV cells, and its CPU
    flash attention accumulates in cell order, so a token placed in the hole of a rejected
    node, before cells of earlier positions, would be computed slightly differently from
    plain decoding. Accepted nodes after the first hole are therefore dropped from the
    cache and come back as `pending` in the next decode; the cache stays in position order."""
    n_past = len(ctx.tokens)  # positions: pending tokens from here, then the tree by depth
    root_row = len(pending) - 1
    seqs = tree.path_seqs()
    n_seqs = max(1, tree.n_leaves())
    ctx.share(n_seqs)
    pos = [*range(n_past, n_past + len(pending)), *(n_past + root_row + tree.depths()).tolist()]
    ctx.decode([*pending, *tree.tokens.tolist()], pos,
               seq_ids=[list(range(n_seqs))] * len(pending) + seqs,
               outputs=[all_pending_rows] * root_row + [True] * (len(tree) + 1))
    path, nxt, unsettled = _native.verify(
        ctx.ptr, ctx.model.n_vocab, root_row, tree.tokens, tree.parents, tree.q_offsets,
        tree.q_ids, tree.q_probs, sampler.sampler, sampler.history, sampler.rng, tie_bound)
    n_cached = 0
    while n_cached < len(path) and path[n_cached] == n_cached:
        n_cached += 1  # node i sits in the i-th cell after the root: no hole so far
    ctx.keep_path(seqs[path[n_cached - 1]][0] if n_cached else 0,
                  [*pending, *(int(tree.tokens[i]) for i in path[:n_cached])], n_seqs)
    return Verdict(path, [int(tree.tokens[i]) for i in path] + ([nxt] if nxt >= 0 else []),
                   unsettled, n_cached)
