"""Prompt lookup: draft what followed earlier occurrences of the context's longest matching
suffix, as a tree where those occurrences continue differently."""

from __future__ import annotations

import numpy as np

from localspec import _native
from localspec.drafters.base import Budget, Drafter
from localspec.sampling import SamplingConfig
from localspec.verify import DraftTree, depths_of


class LookupDrafter(Drafter):
    name = "lookup"
    free = True
    learns = ("acceptance",)

    def __init__(self, n_min: int = 2, n_max: int = 32, max_depth: int = 63, max_occurrences: int = 32,
                 fim_suffix: int = -1):
        """`fim_suffix`: the target's token that opens the text after the cursor in a
        fill-in-the-middle prompt (-1: none)."""
        self.index = _native.NgramIndex(n_min, n_max)
        self.seen: list[int] = []
        self.max_depth = max_depth
        self.max_occurrences = max_occurrences
        self.acceptance = MatchAcceptance(n_min)
        self.fim_suffix = fim_suffix
        self.after_cursor = -1  # where the prompt's text after the cursor starts (-1: no such text)
        self.copy: tuple[int, int] | None = None  # a copy of that text going on (copies_after_cursor)

    def begin(self, prompt: list[int], sampling: SamplingConfig) -> None:
        self.sync(prompt, whole=True)
        # (-1 is in no prompt, but asking scans all of it: a long chat's every request)
        self.after_cursor = prompt.index(self.fim_suffix) + 1 if self.fim_suffix >= 0 and self.fim_suffix in prompt else -1
        self.copy = None

    def sync(self, context: list[int], whole: bool = False) -> None:
        """Index exactly `context`: extend when it continues what is indexed, rebuild when not.
        Within a request the context only grows, so there its first and last indexed tokens
        are checked (comparing all of it took a fifth of a millisecond an iteration); a new
        request's prompt (`whole`) is compared in full."""
        n = len(self.seen)
        if n > len(context) or (context[:n] != self.seen if whole else
                                n and (context[0] != self.seen[0] or context[n - 1] != self.seen[-1])):
            self.index.reset()
            self.seen = []
            n = 0
        self.index.extend(np.asarray(context[n:], np.int32))
        self.seen.extend(context[n:])

    def propose(self, context: list[int], budget: Budget) -> DraftTree:
        self.acceptance.start(context)
        self.sync(context)
        draft = self.index.draft(budget.max_nodes, self.max_depth, self.max_occurrences)
        return self.acceptance.tree(*draft, budget, into_suffix=self.copies_after_cursor(context, draft[3]))

    def copies_after_cursor(self, context: list[int], n_match: int) -> bool:
        """Is the text copying the code after a fill-in-the-middle cursor, from its start?
        Small models' middles run on into that code and rewrite it (three of four fim-warm
        answers copied 97-119 tokens of it), so a short match there is a copy's start, not
        the weak bet a short match elsewhere is, and the copy goes on as one until it breaks.
        Where the middle meets that code, a newline may be merged into the middle's last
        token (`,\n` against `\n`), so the match may begin up to two tokens in; it takes 3
        tokens (a newline and an indentation begin half the lines of any file)."""
        if self.after_cursor < 0 or n_match < 3:
            return False
        if self.copy is not None:  # (where the copy began in the context, where it copies from)
            began, source = self.copy
            if context[began:] == context[source:source + len(context) - began]:
                return True
            self.copy = None
        if n_match >= SHORT_MATCH:
            return False
        tail = context[-n_match:]
        for at in range(self.after_cursor, min(self.after_cursor + 3, len(context) - n_match)):
            if context[at:at + n_match] == tail:
                self.copy = (len(context) - n_match, at)
                return True
        return False


SHORT_MATCH = 16      # matches shorter than this many tokens draft at most short_match_depth()
SHORT_CHAIN_COST = 6  # ... deep: a chain verified in at most this many single tokens' time


def short_match_depth(budget: Budget) -> int:
    """How deep a draft from a match shorter than SHORT_MATCH may go: the deepest chain
    whose verification costs at most SHORT_CHAIN_COST single tokens on the budget's curve.
    Measured, not derived: replayed over recorded answers on this CPU's curve (7 rows at 4.8
    single tokens, 8 at 6.7), a short match's rows deeper than that earned less than their
    depth rates promised, and cutting them gained 7% on code edits and lost nothing on
    completion or chat (live: edits +3.5%, completion -2.6% over three turns); where rows
    are cheap (an H200's curves, 16 rows at 2-3 single tokens) no draft is that deep and
    nothing changes
    (docs/benchmarks.md#short-matches-drafted-shallower-issues-44-46-2026-12-03-session-37).
    A static K drafts what it drafts."""
    if budget.static:
        return budget.max_nodes
    seconds = budget.curve.seconds
    limit = SHORT_CHAIN_COST * seconds[0]
    return max((d for d in range(1, len(seconds)) if seconds[d] <= limit), default=0)


class MatchAcceptance:
    """How likely the text is to follow a draft of what followed earlier occurrences, by the
    length of the matched suffix (buckets 1..8, 12, 16, 24: longer matches are safer bets) and
    by depth (bins 1, 2, 3-4, 5-8, 9-16, 17-32, 33-63): per bin, the chance that the text goes
    on along the draft at that depth once it came that far. Copying is sticky: a text that
    followed a copy for 8 tokens is likelier to follow it for a 9th than one token after the
    match, and a single rate per bucket (a geometric chain) cut such drafts short (issue 44:
    on an MoE curve a fixed 16 tokens reached 2.02x where the sized drafts reached 1.64x).
    Depth counts from where the text began to follow a copy: a proposal made while the text
    is still inside an earlier proposal's copy counts on from there, so a copy verified two
    tokens an iteration is twenty deep after ten iterations, not at depth 1 each time.
    No bin starts sure of itself: drafts grow long only on evidence, so a wrong guess about
    what repeats stays cheap; but a long match starts as the copy it usually is (`long`: the
    priors of matches of 12, 16 and 24+ tokens). Replayed over the model's own answers (chat,
    edit and fim-warm sessions), such matches were followed at 0.95-1.0 at every depth; with
    the short matches' 0.9 (0.7 from the store) a chat answer copying an earlier one drafted
    2 tokens an iteration for ten iterations, where llama-server's ngram-mod drafted 48. They
    stay a little below what was seen, so a text whose copies all break at one length still
    unlearns them within a few judgements: 0.97-0.99 (0.93-0.95 for 12 and 16 had verified
    the first 20-40 tokens of each long copy a few at a time where 8 rows cost 6 single ones:
    edit-session replayed 1.7% faster there, no workload slower on three curves, session 30).
    (Priors that also rise with depth drafted deeper into edits, where the old code goes
    stale: edit sessions lost 5% on the MoE curve in the same replay.)

    Where the text leaves a copy also depends on the token drafted there: a counter (`Test
    case 1` where the model writes 2), a name an edit changes. Each token keeps the times the
    text followed it against the times the depth rates expected it to (`token_factor`), and a
    node's rate is its depth's times that factor, so drafts stop before the tokens copies break
    at and go on over the ones they keep. Replayed over the model's answers (session 34) it
    was worth 1-2% on average on three curves and 2.5-7% on HumanEval with a warm store; evidence
    that decayed as the depth rates' does was worse, as was one table for both sources.

    Every proposal is judged whole, as it was drafted before sizing, by the text that came
    after it (what greedy verification accepts): how deep the text followed it, and whether it
    then left it. A proposal sized to a few nodes, or not verified at all (another drafter
    ran, or plain decoding), so still tells how much deeper it would have been accepted;
    otherwise a bin whose prior is too low to draft would never learn it should. A judgement
    is counted as the text comes and closed after JUDGE_FOR proposals (what it followed so far
    counts as a censored run: no rejection)."""

    DEPTH_BINS = (1, 2, 3, 5, 9, 17, 33)  # each bin's first depth
    JUDGE_FOR = 8
    WEIGHT, DECAY = 8.0, 0.99  # the prior is worth WEIGHT judged tokens; evidence decays per proposal
    TOKEN_WEIGHT = 8.0  # token_factor's prior of 1 is worth this many expected follows
    TOKEN_CAP = 0.995   # a token's factor raises a node's rate at most to this (or its depth's rate)

    def __init__(self, n_min: int = 1, base: float = 0.5, cap: float = 0.9,
                 long: tuple[float, float, float] = (0.97, 0.98, 0.99), into_suffix: float = 0.95):
        """`into_suffix`: the prior of a short match where the code after a fill-in-the-middle
        cursor begins (LookupDrafter.copies_after_cursor), its own bucket after the others:
        replayed over 16 fim-warm answers on three curves, 0.9-0.98 gained alike."""
        self.match_lengths = (*range(n_min, 9), 12, 16, 24)
        short = np.asarray(self.match_lengths[:-len(long)], float)
        prior = np.concatenate([np.minimum(cap, base + 0.1 * short), long, [into_suffix]])
        self.into_suffix_bucket = len(prior) - 1
        self.prior = np.repeat(prior[:, None], len(self.DEPTH_BINS), axis=1)  # [bucket, depth bin]
        self.followed = np.zeros_like(self.prior)  # tokens the text followed, decayed
        self.reached = np.zeros_like(self.prior)   # tokens it followed or left there, decayed
        # Plain lists: they are read a few dozen times an iteration, where numpy's calls cost more.
        # depth - 1 -> bin, for depths counted from a copy's start: at most 63 on (the offset is
        # capped there, past the last bin's first depth) plus a proposal's 63, plus one left
        self.bin_of = (np.searchsorted(self.DEPTH_BINS, np.arange(1, 129), side="right") - 1).tolist()
        self.bucket_of = [max(i for i, m in enumerate(self.match_lengths) if m <= max(n, n_min))
                          for n in range(self.match_lengths[-1] + 1)]  # match length -> bucket
        self._context: tuple[int, tuple[int, ...]] = (0, ())  # its length and last tokens
        # Proposals the text has not yet judged: [start, tail before it, bucket, children by
        # (parent, token), the nodes' parents, tokens and depth rates, node reached, depth
        # reached, proposals waited, the copy's depth where it began].
        self._open: list[list] = []
        self._copied = 0  # tokens of an earlier proposal's copy the text has followed up to now
        # Per draft token: [the times the text followed it, the times the depth rates said it
        # would] (never decayed: a token's evidence comes slowly).
        self.token_counts: dict[int, list[float]] = {}

    @property
    def copied(self) -> int:
        """Tokens of an earlier proposal's copy the text had followed at the last start()."""
        return self._copied

    def rates(self, bucket: int | slice = slice(None)) -> np.ndarray:
        """[bucket, depth bin] (one bucket's row where given): the chance the text follows a
        draft at that depth once it came that far."""
        return (self.followed[bucket] + self.WEIGHT * self.prior[bucket]) / (self.reached[bucket] + self.WEIGHT)

    def rate(self, match_length: int, depth: int) -> float:
        return float(self.rates()[self.rate_bucket(match_length), self.bin_of[min(depth, 64) - 1]])

    def rate_bucket(self, n_match: int) -> int:
        """The bucket of a match of n_match tokens."""
        return self.bucket_of[min(n_match, len(self.bucket_of) - 1)]

    def start(self, context: list[int]) -> None:
        """A proposal for `context` begins: evidence decays, and the proposals still open are
        judged by the tokens that came since, as they came (a copy that goes on teaches at
        once, not when it ends). A text still inside a copy an earlier proposal drafted has
        followed it `_copied` tokens: the new proposal's depths count on from there."""
        self.followed *= self.DECAY
        self.reached *= self.DECAY
        still_open, self._copied = [], 0
        for judgement in self._open:
            at, tail, bucket, children, parents, tokens, rates, node, depth, waited, copied = judgement
            if len(context) < at or tuple(context[at - len(tail):at]) != tail:
                continue  # another text (a new request): nothing to judge
            before, left, done = depth, False, False
            for token in context[at + depth:]:
                child = children.get((node, token))
                if child is None:  # the text left the draft here, or ran past a leaf
                    left, done = node in parents, True
                    for k, parent in enumerate(parents):  # the draft's ways on from here, all left
                        if parent == node:
                            self._count_token(tokens[k], rates[k], 0.0)
                    break
                self._count_token(token, rates[child], 1.0)
                node, depth = child, depth + 1
            else:
                done = node not in parents or waited + 1 >= self.JUDGE_FOR  # a leaf, or long enough
            self._count(bucket, copied + before, copied + depth, left)
            if not left and at + depth >= len(context) - 1:  # followed up to now (and a token past a leaf)
                self._copied = min(63, max(self._copied, copied + depth))
            if not done:
                judgement[7:10] = node, depth, waited + 1
                still_open.append(judgement)
        self._open = still_open
        self._context = len(context), tuple(context[-8:])

    def _count(self, bucket: int, start: int, depth: int, left: bool) -> None:
        """The text followed a draft from depth `start` to `depth`, then left it (`left`)."""
        followed, reached = self.followed[bucket], self.reached[bucket]
        for b in self.bin_of[start:depth]:
            followed[b] += 1.0
            reached[b] += 1.0
        if left:
            reached[self.bin_of[depth]] += 1.0

    def _count_token(self, token: int, expected: float, followed: float) -> None:
        counts = self.token_counts.setdefault(token, [0.0, 0.0])
        counts[0] += followed
        counts[1] += expected

    def tree(self, tokens: np.ndarray, parents: np.ndarray, counts: np.ndarray, n_match: int,
             n_occurrences: int, budget: Budget | None = None, into_suffix: bool = False) -> DraftTree:
        """Reaching a node takes the text going the way that share of the earlier occurrences
        went, and the text following the draft at every node on the way there: at its depth's
        rate, times its token's factor (token_factor). A match shorter than SHORT_MATCH keeps
        the nodes at most short_match_depth(budget) deep (asked only then: most iterations
        inside a copy match long). `into_suffix`: the text copies the code after a
        fill-in-the-middle cursor (LookupDrafter.copies_after_cursor): a short match has a
        bucket of its own and no depth cap, and no token's factor applies (the tokens weak
        matches broke at before the copy began say nothing about the copy: they held its
        first drafts to 3-6 tokens)."""
        if n_occurrences == 0 or len(tokens) == 0:  # nothing matched, or no room to draft
            return DraftTree.empty()
        if n_match < SHORT_MATCH and budget is not None and not into_suffix:
            tokens, parents, counts = within_depth(tokens, parents, counts, short_match_depth(budget))
            if len(tokens) == 0:
                return DraftTree.empty()
        bucket = self.into_suffix_bucket if into_suffix and n_match < SHORT_MATCH else self.rate_bucket(n_match)
        rates, bin_of, copied = self.rates(bucket).tolist(), self.bin_of, self._copied
        parent_list, token_list = parents.tolist(), tokens.tolist()
        node_rates = [rates[bin_of[copied + d - 1]] for d in depths_of(parent_list)]  # before the tokens' factors
        factor, cap = (lambda t: 1.0) if into_suffix else self.token_factor, self.TOKEN_CAP
        along: list[float] = []  # the chance the text follows the draft to each node
        for p, t, rate in zip(parent_list, token_list, node_rates):
            r = rate * factor(t)
            if r > cap and r > rate:
                r = max(rate, cap)
            along.append(r if p < 0 else along[p] * r)
        reach = np.asarray(counts, float) * (1.0 / n_occurrences) * np.asarray(along)
        children = {(p, t): i for i, (p, t) in enumerate(zip(parent_list, token_list))}
        self._open.append([*self._context, bucket, children, parent_list, token_list, node_rates, -1, 0, 0, copied])
        return DraftTree(tokens, parents, reach)

    def token_factor(self, token: int) -> float:
        """How much likelier the text is to follow a draft at this token than its depth's rate
        says: the times it did against the times the rates expected, from 1 (TOKEN_WEIGHT
        expected follows' worth of prior)."""
        counts = self.token_counts.get(token)
        if counts is None:
            return 1.0
        w = self.TOKEN_WEIGHT
        return (counts[0] + w) / (counts[1] + w)


def within_depth(tokens: np.ndarray, parents: np.ndarray, counts: np.ndarray,
                 max_depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A drafted tree's nodes at most max_depth deep (parents before their children, as
    drafted), renumbered."""
    keep = np.asarray(depths_of(parents.tolist())) <= max_depth
    if keep.all():
        return tokens, parents, counts
    kept = np.flatnonzero(keep)
    new_index = np.cumsum(keep) - 1  # a kept node's place among the kept
    new_parents = np.where(parents[kept] >= 0, new_index[parents[kept]], -1).astype(parents.dtype)
    return tokens[kept], new_parents, counts[kept]
