"""Contexts (KV caches) kept for prompts that share nothing: a server's editor completions and
chats each keep theirs instead of evicting each other. Each costs its KV cache."""

from __future__ import annotations

import time

from localspec.llama.context import Context, ContextConfig, common_prefix
from localspec.llama.model import Model


class Slots:
    def __init__(self, model: Model, config: ContextConfig, n: int):
        self.contexts = [Context(model, config) for _ in range(max(1, n))]
        self._used = [0.0] * len(self.contexts)

    def pick(self, tokens: list[int]) -> Context:
        """The context to run a prompt in: the one that shares most of it, else the one used
        longest ago."""
        shared = [common_prefix(c.tokens, tokens) for c in self.contexts]
        best = max(range(len(self.contexts)), key=lambda i: (shared[i], -self._used[i]))
        if shared[best] == 0:
            best = min(range(len(self.contexts)), key=lambda i: self._used[i])
        self._used[best] = time.monotonic()
        return self.contexts[best]

    def close(self) -> None:
        for ctx in self.contexts:
            ctx.close()
