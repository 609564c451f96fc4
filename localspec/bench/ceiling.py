"""How fast any drafter that copies could make an answer on this machine's cost curve.

The ceiling is a clairvoyant copier's: it knows the answer, and may draft any run of the
answer's next tokens that stands somewhere in what a copying drafter can see (the request's
own text so far, or a document in the suffix store) right after the token the answer has
just produced. It drafts free of cost and picks, over the whole answer, the verification
batches that cost least on the cost curve. No prompt-lookup or suffix drafter, nor any
policy over them, can beat it; so a workload whose ceiling is below a goal cannot reach that
goal by copying, whatever the drafter's scoring or Cascade's choices."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


class Corpus:
    """Token documents, searchable for where a token stands and what follows it."""

    def __init__(self, docs: Sequence[Sequence[int]] = ()):
        parts = [np.append(np.asarray(d, dtype=np.int64), -1) for d in docs if len(d)]
        self._index(np.concatenate(parts) if parts else np.zeros(0, np.int64))

    @classmethod
    def joined(cls, tokens: np.ndarray) -> Corpus:
        """Documents each ended by -1, as the suffix store keeps them (its corpus())."""
        corpus = cls.__new__(cls)
        corpus._index(np.asarray(tokens, dtype=np.int64))
        return corpus

    def _index(self, tokens: np.ndarray) -> None:
        self.tokens = tokens  # documents end in -1, so no continuation runs from one into the next
        self._order = np.argsort(tokens, kind="stable")
        self._sorted = tokens[self._order]

    def positions(self, token: int) -> np.ndarray:
        lo, hi = np.searchsorted(self._sorted, [token, token + 1])
        return self._order[lo:hi]


def longest_copy(text: np.ndarray, starts: np.ndarray, target: np.ndarray) -> int:
    """The longest prefix of `target` that stands in `text` at one of `starts`."""
    k = 0
    while k < len(target):
        starts = starts[starts < len(text)]
        starts = starts[text[starts] == target[k]]
        if not starts.size:
            break
        starts, k = starts + 1, k + 1
    return k


def after_match(text: np.ndarray, starts: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """Of `starts` (each right after an occurrence of tail[-1] in text), those the whole of
    `tail` stands right before."""
    starts = starts[starts >= len(tail)]
    for back in range(2, len(tail) + 1):
        starts = starts[text[starts - back] == tail[-back]]
    return starts


def copyable(answer: Sequence[int], prompt: Sequence[int], store: Corpus, max_draft: int,
             min_match: int = 1) -> list[int]:
    """Per position i of the answer (1..len-1), the longest run of answer[i:] that a copying
    drafter could have drafted having seen answer[:i]: it follows answer[i-1] in the request
    (prompt and answer so far, ending at the known text) or in a store document, there after
    the known text's last `min_match` tokens (1: the clairvoyant copier; a drafter that finds
    its copies by a match of at least n tokens can only take the copies of min_match n)."""
    seen = np.asarray([*prompt, *answer], dtype=np.int64)
    out = [0]
    for i in range(1, len(answer)):
        n_known = len(prompt) + i
        want = seen[n_known:n_known + min(max_draft, len(answer) - 1 - i)]
        tail = seen[max(0, n_known - min_match):n_known]
        own = after_match(seen, np.flatnonzero(seen[:n_known - 1] == tail[-1]) + 1, tail)
        best = longest_copy(seen[:n_known], own, want)
        if best < len(want) and len(store.tokens):
            stored = after_match(store.tokens, store.positions(tail[-1]) + 1, tail)
            best = max(best, longest_copy(store.tokens, stored, want))
        out.append(best)
    return out


def fastest_plan(runs: Sequence[int], seconds_at: Callable[[int], Sequence[float]], n_prompt: int) -> float:
    """Seconds to produce answer tokens 1..len(runs)-1 (token 0 comes with the prompt) when at
    position i a forward may verify up to runs[i] drafted tokens; seconds_at(n_context)[n-1]
    is one forward of a batch of n after n_context tokens. Dynamic programming from the end."""
    n = len(runs)
    best = np.zeros(n + 1)
    for i in range(n - 1, 0, -1):
        seconds = seconds_at(n_prompt + i)
        best[i] = min(seconds[k] + best[i + k + 1] for k in range(min(runs[i], n - 1 - i, len(seconds) - 1) + 1))
    return float(best[1]) if n > 1 else 0.0


def copy_ceiling(answer: Sequence[int], prompt: Sequence[int], store: Corpus, curve,
                 min_match: int = 1) -> tuple[float, float]:
    """(plain decoding's seconds, the clairvoyant copier's seconds) for this answer on `curve`
    (anything with at(n_context).seconds, as the engine's cost curves); `min_match`: copies
    after a match of at least that many tokens only (copyable)."""
    def seconds_at(n_context: int) -> Sequence[float]:
        return curve.at(n_context).seconds
    runs = copyable(answer, prompt, store, len(curve.seconds) - 1, min_match)
    plain = sum(seconds_at(len(prompt) + i)[0] for i in range(1, len(answer)))
    return plain, fastest_plan(runs, seconds_at, len(prompt))


def model_drafter_ceiling(ratio: Callable[[int], float], acceptance: float, draft_cost: float,
                          max_batch: int) -> tuple[float, int]:
    """A drafter whose every token is right with probability `acceptance` (each given the
    ones before) and costs `draft_cost` target forwards to draft, drafting chains of K: the best
    speedup over plain decoding and its K, where ratio(n) is a batch of n against one token."""
    best = (1.0, 0)
    for k in range(1, max_batch):
        expected = sum(acceptance ** d for d in range(k + 1))  # tokens per forward
        best = max(best, (expected / (ratio(k + 1) + k * draft_cost), k))
    return best
