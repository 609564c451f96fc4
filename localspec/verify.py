"""Draft trees and their verification: one target forward over the whole tree, exact
acceptance in native code, and the KV cache left holding exactly the accepted path."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from localspec import _native
from localspec.errors import LocalspecError
from localspec.llama import recurrent
from localspec.llama.context import Context, check_status, off_device, padded_shape
from localspec.sampling import TokenLogprob, TokenSampler, token_logprob

_EMPTY_I = np.zeros(0, np.int32)
_EMPTY_F = np.zeros(0, np.float32)


def depths_of(parents: list[int]) -> list[int]:
    """Each node's depth (the root's children at 1), for parents listed before children."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


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
    _n_leaves: int = field(default=-1, init=False, repr=False, compare=False)

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
        return np.asarray(depths_of(self.parents.tolist()), np.int32)

    def has_child(self) -> np.ndarray:
        has = np.zeros(len(self), bool)
        has[self.parents[self.parents >= 0]] = True
        return has

    def walk(self, tokens) -> tuple[int, bool]:
        """How far `tokens` (what followed the root) run down the tree: the nodes matched, and
        whether that is final (a token left the tree, or a leaf was reached) rather than
        waiting on tokens still to come. Greedy verification accepts exactly those nodes."""
        nodes, final = self.path(tokens)
        return len(nodes), final

    def path(self, tokens) -> tuple[list[int], bool]:
        """walk()'s nodes themselves, root first, and whether that is final."""
        node, nodes = -1, []
        for token in tokens:
            children = np.flatnonzero((self.parents == node) & (self.tokens == token))
            if len(children) == 0:
                return nodes, True
            node = int(children[0])
            nodes.append(node)
        return nodes, not (self.parents == node).any()

    def n_leaves(self) -> int:
        """Nodes without children (root-to-leaf paths): counted once per tree (sizing asks
        again and again)."""
        if self._n_leaves < 0:
            self._n_leaves = len(self) - len(set(self.parents.tolist()) - {-1})
        return self._n_leaves

    def hybrid_forwards(self, n: int) -> list[list[int]]:
        """For each prefix of 0..n nodes, the rows of each forward a hybrid target decodes it in
        (native launch's layouts, the root the one pending token): a chain in one forward with
        the root; a tree flattened, each root-to-leaf path in rows of its own, which llama.cpp
        splits into the root alone, then equal runs from every path still holding tokens
        (`split_equal`): one forward per distinct path length."""
        out: list[list[int]] = [[1]]
        leaves: dict[int, int] = {}  # leaf -> its depth
        depths: list[int] = []
        for i, p in enumerate(self.parents[:n].tolist()):
            depths.append(1 if p < 0 else depths[p] + 1)
            leaves.pop(p, None)
            leaves[i] = depths[-1]
            if len(leaves) == 1:  # a chain: the root and its i + 1 nodes
                out.append([i + 2])
                continue
            lengths, rows, done = sorted(leaves.values()), [1], 0
            for k, length in enumerate(lengths):
                if length > done:
                    rows.append((len(lengths) - k) * (length - done))
                    done = length
            out.append(rows)
        return out


@dataclass
class Verdict:
    path: list[int]     # accepted node indices
    tokens: list[int]   # their tokens, then the next token (the bonus or the correction)
    n_cached: int       # how many of the accepted tokens the KV cache kept (see verify_tree)
    seconds: float = 0.0  # the target's forward: in llama_decode and waiting for its outputs
    # The batch's pending tokens, where the cache did not keep them either (a recurrent state
    # undone from its checkpoint): they lead the next batch, before the accepted tokens.
    requeued: list[int] = field(default_factory=list)
    # Per token, its log-probability, where the request asks (SamplingConfig.logprobs).
    logprobs: list[TokenLogprob] = field(default_factory=list)


class Launched(NamedTuple):
    """A batch verify.launch started and accept will finish (Context.inflight)."""
    batch: object          # the native batch (Context.abandon drops it)
    pending: np.ndarray
    tree: DraftTree
    all_pending_rows: bool
    speculating: bool
    flattened: bool  # a hybrid's tree, each path in a sequence of its own (layout)


def launch(ctx: Context, tree: DraftTree, pending: list[int], all_pending_rows: bool = False,
           speculating: bool = False) -> None:
    """Start the target's forward over `pending` (emitted tokens not yet in the KV cache; the
    last is the tree's root) and the tree, in one native call (native/step.h: the batch, one
    sequence per root-to-leaf path, and llama_decode), the GIL released. Rows: pending tokens
    first (outputs for the root only, or for all with all_pending_rows), then the tree's
    nodes, then padding up to the context's shape (padded). On a GPU it runs on after
    this returns, while the host does other work. `speculating`: a drafter proposed (the
    tree may be empty): the batch may keep the last forward's shape."""
    if ctx.inflight is not None:
        raise LocalspecError("a batch is already in flight on this context")
    n = len(pending) + len(tree)
    if n > ctx.config.n_batch:
        raise LocalspecError(f"batch of {n} tokens exceeds n_batch={ctx.config.n_batch}")
    ctx.check_room(n)
    layout = _layout(ctx, tree)
    if ctx.checkpoints and len(tree) and layout != FLAT:  # what accept undoes the batch to if it rejects a node
        recurrent.checkpoint(ctx)
    pending = np.asarray(pending, np.int32)
    shape = padded(ctx, n, speculating)
    batch, status = _native.launch(ctx.ptr, len(ctx.tokens), pending, tree.tokens, tree.parents, all_pending_rows,
                                   shape, ctx.pad_seq, layout)
    check_status(status, n)
    ctx.inflight = Launched(batch, pending, tree, all_pending_rows, speculating, layout == FLAT)
    ctx.shape = shape  # the batch's rows, padding included


SHARED, FLAT, EVERY_SEQUENCE = 0, 1, 2  # native/step.h's tree_layout


def _layout(ctx: Context, tree: DraftTree) -> int:
    """How the tree's rows sit in sequences: on a hybrid with sequences to spare (Context.flat)
    a tree flattened, each path in a sequence of its own (llama.cpp decodes it as two forwards
    at least), a chain in every sequence (one forward, a rejection undone from a checkpoint);
    elsewhere a node in the sequences of every path through it."""
    if not ctx.flat:
        return SHARED
    return FLAT if tree.n_leaves() > 1 else EVERY_SEQUENCE


def padded(ctx: Context, n: int, speculating: bool) -> int:
    """The rows a verification batch of n runs as: for a speculating step what ctx.pad_rule
    says (the last forward's shape, or a wider batch that costs less), else n, either up to the
    next of the context's shapes where it has any; never past n_batch or the context's end."""
    if ctx.pad_seq < 0:
        return n
    shape = padded_shape(ctx.shapes, ctx.pad_rule(n, len(ctx.tokens)) if speculating and ctx.pad_rule else n)
    return n if shape > ctx.config.n_batch or len(ctx.tokens) + shape > ctx.n_ctx else shape


def accept(ctx: Context, tree: DraftTree, sampler: TokenSampler) -> Verdict:
    """Wait for the launched forward and accept exactly from its outputs in one native call
    (greedy walk, sibling tests or SpecInfer residuals: native/verify.cpp; `tree`'s q_* are the
    distributions sampled nodes were drawn from), and leave sequence 0 holding the context,
    the pending tokens and the accepted path up to its first gap (the one place the KV cache
    is edited). An empty tree is a plain step: the next token drawn from the root's row.

    Why a gap matters: llama.cpp puts new tokens into the lowest free KV cells, and its CPU
    flash attention accumulates in cell order, so a token placed in the hole of a rejected
    node, before cells of earlier positions, would be computed slightly differently from
    plain decoding. Accepted nodes after the first hole are therefore dropped from the
    cache and come back as `pending` in the next decode; the cache stays in position order.

    A recurrent state that cannot be rolled back (Context.checkpoints) keeps the whole batch
    where every node is accepted; else the batch is undone to its checkpoint, and its pending
    tokens and accepted path come back as the next batch's pending ones (`requeued`), which
    costs rows in that batch rather than a forward of its own; where that batch rejects too,
    what it carried is decoded at once, in a forward of its own.

    A hybrid target's tree, verified flattened (Context.flat), keeps the pending tokens and,
    where the whole of the first path was accepted, that path; else the accepted nodes come
    back as the next batch's pending ones (n_cached 0). A chain there is undone as above."""
    launched, ctx.inflight = ctx.inflight, None
    keep_batch = ctx.checkpoints and not launched.flattened
    path, nxt, n_cached, seconds, device_failed = _native.finish(
        ctx.ptr, launched.batch, tree.q_offsets, tree.q_ids, tree.q_probs, sampler.sampler, sampler.history,
        sampler.rng, ctx.rows_from, keep_batch)
    # (a plain step accepts nothing: numpy's indexing would cost more than its Python)
    accepted = launched.tree.tokens[path].tolist() if len(path) and not device_failed else []
    emitted = accepted + ([nxt] if nxt >= 0 else [])
    logprobs = [] if device_failed else row_logprobs(ctx, launched, path, emitted, sampler.config.logprobs)
    rejected = keep_batch and (device_failed or len(path) < len(launched.tree))
    if rejected or device_failed and launched.flattened:
        recurrent.undo(ctx)
    if device_failed:  # nothing was kept: the same batch again, read on the host
        off_device(ctx, "a verification row")
        launch(ctx, launched.tree, launched.pending, launched.all_pending_rows, launched.speculating)
        again = accept(ctx, tree, sampler)
        return replace(again, seconds=seconds + again.seconds)
    if rejected:
        kept = launched.pending.tolist() + accepted
        if len(launched.pending) == 1:
            return Verdict(path, emitted, 0, seconds, launched.pending.tolist(), logprobs)
        # Requeued once already: decoded now, so that no batch carries them twice (a run of
        # rejections would otherwise grow every batch by what the last one kept).
        t0 = time.perf_counter()
        ctx.extend(kept, len(kept) if launched.all_pending_rows else 1)
        ctx.synchronize()
        return Verdict(path, emitted, len(path), seconds + time.perf_counter() - t0, logprobs=logprobs)
    ctx.tokens.extend(launched.pending.tolist())
    ctx.tokens.extend(accepted[:n_cached])
    return Verdict(path, emitted, n_cached, seconds, logprobs=logprobs)


def row_logprobs(ctx: Context, launched: Launched, path: list[int], emitted: list[int],
                 k: int | None) -> list[TokenLogprob]:
    """Each emitted token's log-probability (none where k is None), from the row verification
    drew it from: the root's, then each accepted node's, as launch laid the rows out."""
    if k is None:
        return []
    root = len(launched.pending) - 1
    rows = [root] + [launched.batch.node_rows[n] if launched.flattened else root + 1 + n for n in path]
    return [token_logprob(ctx.logits(row), token, k) for row, token in zip(rows, emitted)]


def verify_tree(ctx: Context, tree: DraftTree, pending: list[int], sampler: TokenSampler,
                all_pending_rows: bool = False) -> Verdict:
    """launch, then accept."""
    launch(ctx, tree, pending, all_pending_rows)
    return accept(ctx, tree, sampler)
