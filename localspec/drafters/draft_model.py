"""A small model with the target's tokenizer drafts in its own llama.cpp context: a chain,
token by token, or (width > 1) a tree grown EAGLE-2 style: each depth expands the `width`
best nodes so far by cumulative draft probability, each into its `branch` best children
(or `branch` draws, at T > 0), all of a depth in one batch.

How likely each drafted token is to be accepted (its reach, the product along its path) comes
from the draft's own probabilities, calibrated by what was accepted, or, with an acceptance
head, from the head (Sun et al.): drafting stops where the budget's marginal rule says one
more token no longer pays, which is the paper's early exit P_rej > h (see worth_drafting)."""

from __future__ import annotations

import time

import numpy as np

from localspec import _native
from localspec.drafters.acceptance_head import HEAD_SAMPLING, AcceptanceHead
from localspec.drafters.base import Budget, DecayingRatio, Drafter, drafting_estimate, rerank
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig, common_prefix
from localspec.llama.curve import CostCurve
from localspec.errors import LocalspecError
from localspec.sampling import SamplingConfig, TokenSampler
from localspec.verify import DraftTree, Verdict


def check_same_vocabulary(target: Model, draft: Model) -> None:
    """Refuse a draft model whose tokens mean something else than the target's."""
    if draft.n_vocab != target.n_vocab:
        raise LocalspecError(f"draft model {draft.path.name} has {draft.n_vocab} tokens, the "
                             f"target {target.path.name} {target.n_vocab}: not the same tokenizer")
    probe = range(0, target.n_vocab, max(1, target.n_vocab // 512))
    for t in probe:
        if target.token_bytes(t, special=True) != draft.token_bytes(t, special=True):
            raise LocalspecError(f"draft model {draft.path.name} and target {target.path.name} "
                                 f"disagree on token {t}: not the same tokenizer")


def draft_context(model: Model, n_ctx: int = 4096, n_threads: int = 0, flash_attn: str = "auto") -> Context:
    """The context a draft model drafts in: sequence 0 holds the context, 8 more the two banks
    of a 4-wide tree; hidden states for an acceptance head. `flash_attn`: the target's choice
    (engine.cpu_flash_attn), which pays the draft model more: after 3,000 tokens the 0.5B's
    single token cost 0.89x and a 4-row tree 0.73x without it on this CPU."""
    return Context(model, ContextConfig(n_ctx=n_ctx, n_threads=n_threads, n_seq_max=9, embeddings=True,
                                          context_in_every_sequence=False, flash_attn=flash_attn))


class DraftModelDrafter(Drafter):
    """Drafts with a small model in `ctx` (its own llama.cpp context, shared by the chain and
    the tree drafter of one model: each catches up with the context it is given)."""

    learns = ("calibration", "t_token", "t_prefill_token")

    def __init__(self, ctx: Context, target: Model, width: int = 1, branch: int = 2,
                 max_depth: int = 8, heads: dict[str, AcceptanceHead | None] | None = None,
                 head_required: bool = False):
        """`heads`: the acceptance head for greedy and for sampled drafting, if any (None: the
        draft's own probabilities, calibrated); `head_required`: refuse a request whose head
        is missing."""
        model = ctx.model
        check_same_vocabulary(target, model)
        if ctx.config.n_seq_max < 1 + 2 * width:
            raise ValueError("the draft context needs 1 + 2 * width sequences")
        self.name = f"draft:{model.path.stem}" + (f"/tree{width}x{branch}" if width > 1 else "")
        self.ctx = ctx  # sequence 0 holds the context; tree paths use two banks of `width`
        self.heads = heads or {"greedy": None, "sampled": None}
        self.head_required = head_required
        self.max_depth, self.width, self.branch = max_depth, width, branch
        self.calibration = DecayingRatio(prior=0.9)  # accepted / predicted tokens
        self.t_token = 0.0  # running seconds per draft forward
        # Until measured: decoding is bound by reading weights, so a draft forward costs about
        # its share of the target's bytes, and a prefill token a tenth of a forward.
        self.size_ratio = model.path.stat().st_size / target.path.stat().st_size
        self.t_prefill_token = 0.0
        self.head: AcceptanceHead | None = None
        self.sampled = False
        self.sampler = TokenSampler(SamplingConfig())
        self._raw = np.zeros(0)

    def begin(self, prompt: list[int], sampling: SamplingConfig) -> None:
        # Drafts at T = 0 are picked (deterministic); at T > 0 drawn from the draft's own
        # distribution under the same transform, so verification can use p/q.
        self.sampled = sampling.temperature > 0
        label = "sampled" if self.sampled else "greedy"
        self.head = self.heads[label]
        if self.head is None and self.head_required:
            raise LocalspecError(f"no {label} acceptance head for {self.name}: train one "
                                 "(localspec train acceptance-head) or drop head=on")
        # At T = 0 the draft's own probabilities (T = 1 over its top tokens) still rank the
        # children and estimate how likely each is to be accepted; a head reads them under
        # the transform it was trained with.
        ranking = HEAD_SAMPLING if self.head else SamplingConfig(
            temperature=1.0, top_k=max(16, self.branch), top_p=1.0, min_p=0.0)
        self.sampler = TokenSampler(sampling if self.sampled else ranking)

    def _scale(self, head: AcceptanceHead | None) -> float:
        """What reach estimates are multiplied by: the calibration; 1 for a head's (it is
        calibrated by training)."""
        return 1.0 if head else self.calibration.value

    def _acceptance(self, head, rows: list[int], tokens: list[int], ids: np.ndarray,
                    probs: np.ndarray) -> list[float]:
        """P(accepted) of `tokens`, drafted from the batch rows `rows` with the draft
        distribution (ids, probs) of those rows (a row's children share it): the head's, or the
        draft's own probability."""
        qs = [float(probs[ids == x][0]) for x in tokens]
        if not head:
            return qs
        uniq = sorted(set(rows))
        f = np.stack([self.ctx.hidden(r) for r in uniq])
        return head.probs(f, [uniq.index(r) for r in rows], qs).tolist()

    def propose(self, context: list[int], budget: Budget) -> DraftTree:
        self.calibration.tick()
        head = None if budget.static else self.head  # a static K drafts all K: nothing to cut
        scale = self._scale(head)
        # Even a first token the target surely accepts must pay for its draft forward and the
        # larger verification; when it cannot (a slow draft model on a CPU), do not draft.
        if not budget.worth_drafting(min(1.0, scale), self.t_token, 0):
            return DraftTree.empty()
        if self.sampler.window:
            self.sampler.history = np.asarray(context[-self.sampler.window:], np.int32)
        t0 = time.perf_counter()
        behind = len(context) - common_prefix(self.ctx.tokens, context)
        row = self.ctx.catch_up(context)  # what the target accepted since the last proposal
        decoded = max(1, behind)  # catch_up decodes the last token at least
        self.t_catch_up = self.clock.forward(decoded, len(context) - decoded, t0)
        if behind >= 16:
            self.t_prefill_token = self.t_catch_up / behind
        t0 = self.clock.now()
        grow = self._chain if self.width == 1 else self._tree
        tree, n_forwards = grow(row, head, scale, budget, min(self.max_depth, budget.max_nodes))
        if n_forwards:
            dt = (self.clock.now() - t0) / n_forwards
            self.t_token = dt if self.t_token == 0 else 0.8 * self.t_token + 0.2 * dt
        self._raw = tree.reach.copy()
        tree.reach = np.minimum(1.0, tree.reach * scale)
        return tree

    def drafting_seconds(self, context: list[int], curve: CostCurve) -> tuple[float, float]:
        """(seconds per drafted token, seconds to catch up with `context` first): see
        drafting_estimate; the share is its file's size against the target's."""
        behind = len(context) - common_prefix(self.ctx.tokens, context)
        return drafting_estimate(curve, self.t_token, self.size_ratio, self.t_prefill_token, behind)

    def _pick(self, logits: np.ndarray, k: int) -> tuple[list[int], np.ndarray, np.ndarray]:
        """k children: the k best (deterministic) or k draws (sampled); and the distribution."""
        ids, probs = self.sampler.distribution(logits)
        if self.sampled:
            return [_native.draw(ids, probs, self.sampler.rng) for _ in range(k)], ids, probs
        return [int(x) for x in ids[:k]], ids, probs

    def _chain(self, row: int, head, scale: float, budget: Budget, depth: int):
        tokens, reach, qs = [], [], []
        r = 1.0
        for d in range(depth):
            (x,), ids, probs = self._pick(self.ctx.logits(row), 1)
            r *= self._acceptance(head, [row], [x], ids, probs)[0]
            if not budget.worth_drafting(r * scale, self.t_token, d):
                break
            tokens.append(x)
            reach.append(r)
            qs.append((ids, probs))
            self.sampler.extend([x])
            if d + 1 < depth:
                t0 = time.perf_counter()
                self.ctx.append(x)
                self.clock.forward(1, len(self.ctx.tokens) - 1, t0)
                row = 0
        n = len(tokens)
        return self._make_tree(tokens, list(range(-1, n - 1)), reach, qs), max(0, n - 1)

    def _tree(self, row: int, head, scale: float, budget: Budget, depth: int):
        ctx = self.ctx
        n_past = len(ctx.tokens)
        tokens, parents, reach, qs, seq_of, drafted_at = [], [], [], [], {}, []
        children, ids, probs = self._pick(ctx.logits(row), self.branch)
        for x, a in zip(children, self._acceptance(head, [row] * len(children), children, ids, probs)):
            tokens.append(x), parents.append(-1), qs.append((ids, probs)), drafted_at.append(row)
            reach.append(a)
        frontier = list(range(len(tokens)))
        n_forwards = 0
        for d in range(1, depth):
            # Expand the `width` best nodes of the last depth, each in its own sequence.
            best = sorted(frontier, key=lambda i: -reach[i])[:self.width]
            if not best or not budget.worth_drafting(reach[best[0]] * scale, self.t_token, d):
                break
            bank = 1 + (d % 2) * self.width
            for j, node in enumerate(best):
                ctx.branch(seq_of.get(parents[node], 0), bank + j)  # the path so far
                seq_of[node] = bank + j
            t0 = time.perf_counter()
            self._decode_nodes([tokens[i] for i in best], [drafted_at[i] for i in best],
                               [n_past + d - 1] * len(best), [[seq_of[i]] for i in best])
            self.clock.forward(len(best), n_past + d - 1, t0)
            n_forwards += 1
            frontier = []
            for row, node in enumerate(best):
                children, ids, probs = self._pick(ctx.logits(row), self.branch)
                accept = self._acceptance(head, [row] * len(children), children, ids, probs)
                for x, a in zip(children, accept):
                    tokens.append(x), parents.append(node), qs.append((ids, probs)), drafted_at.append(row)
                    reach.append(reach[node] * a)
                    frontier.append(len(tokens) - 1)
        ctx.drop_branches(1 + 2 * self.width)  # the draft cache keeps only the context
        order, new_parents = rerank(parents, reach, budget.max_nodes)
        tree = self._make_tree([tokens[i] for i in order], new_parents,
                               [reach[i] for i in order], [qs[i] for i in order])
        return tree, n_forwards

    def _decode_nodes(self, tokens: list[int], drafted_at: list[int], pos: list[int],
                      seq_ids: list[list[int]]) -> None:
        """One forward of a tree's nodes, each in its own sequence, their logits kept;
        drafted_at: the rows of the last forward they were drafted from (which a drafter
        that reads its own hidden states decodes them with)."""
        self.ctx.decode(tokens, pos, seq_ids=seq_ids, outputs=[True] * len(tokens))

    def _make_tree(self, tokens, parents, reach, qs) -> DraftTree:
        tree = DraftTree(np.asarray(tokens, np.int32), np.asarray(parents, np.int32),
                         np.asarray(reach, np.float64))
        if self.sampled and tokens:
            tree.q_offsets = np.concatenate([[0], np.cumsum([len(i) for i, _ in qs])]).astype(np.int32)
            tree.q_ids = np.concatenate([i for i, _ in qs]).astype(np.int32)
            tree.q_probs = np.concatenate([p for _, p in qs]).astype(np.float32)
        return tree

    def observe(self, tree: DraftTree, verdict: Verdict) -> None:
        self.calibration.add(len(verdict.path), float(self._raw[:len(tree)].sum()))

