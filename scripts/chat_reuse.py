"""What reusing an earlier answer's cache can change: turn 2 of held-out ShareGPT chats (the
model's own turn-1 answer in the history), answered warm (turn 1's cache reused, its answer
decoded as generation) and cold (the whole history prefilled), greedy, plain decoding. Counts
identical answers, and for the others whether the first difference is a near-tie within the
measured batch-vs-single bound. With --strict both must be identical.

    .venv/bin/python scripts/chat_reuse.py -m qwen2.5-coder-1.5b-instruct --chats 20 [--strict]
"""

import argparse
import itertools

import numpy as np

from localspec.datasets import N_SHAREGPT_TRAIN, sharegpt_conversations
from localspec.drafters.spec import NONE
from localspec.engine import Engine, EngineConfig, Request
from localspec.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0)


def two_turn_chats(n: int, max_chars: int = 600):
    """(first user message, second user message) of held-out conversations."""
    for conv in itertools.islice(sharegpt_conversations(), N_SHAREGPT_TRAIN, None):
        turns = [t.get("value", "") for t in conv.get("conversations") or [] if t.get("from") == "human"]
        if len(turns) >= 2 and all(0 < len(t) <= max_chars for t in turns[:2]):
            yield turns[0], turns[1]
            n -= 1
            if n == 0:
                return


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--chats", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--strict", action="store_true")
    a = ap.parse_args()
    engine = Engine(EngineConfig(model=a.model, threads=a.threads, strict=a.strict, drafter=NONE))
    bound = engine.exactness[0]
    same = ties = other = reused = 0
    for first, second in two_turn_chats(a.chats):
        one = [{"role": "user", "content": first}]
        *_, turn1 = engine.generate(Request(messages=one, sampling=GREEDY, max_tokens=a.max_tokens))
        two = one + [{"role": "assistant", "content": turn1.text}, {"role": "user", "content": second}]
        request = Request(messages=two, sampling=GREEDY, max_tokens=a.max_tokens)
        *_, warm = engine.generate(request)
        reused += warm.stats.cache_n
        engine.ctx.clear()
        *_, cold = engine.generate(request)
        if warm.tokens == cold.tokens:
            same += 1
            continue
        # Plain decoding's own computation of the first differing position, cold.
        k = next(i for i, (x, y) in enumerate(zip(warm.tokens, cold.tokens)) if x != y)
        engine.ctx.clear()
        _, logits = engine.ctx.prefill(engine.prompt_tokens(request))
        for t in cold.tokens[:k]:
            engine.ctx.append(t)
            logits = engine.ctx.logits(0)
        top2 = np.partition(logits, -2)[-2:]
        gap = float(abs(top2[1] - top2[0]))
        ties, other = ties + (gap <= bound), other + (gap > bound)
        print(f"differs at token {k}: top-two gap {gap:.3f} (bound {bound:.3f})", flush=True)
    n = same + ties + other
    print(f"{engine.model.path.stem}{' --strict' if a.strict else ''}: {n} two-turn chats, turn 2 "
          f"reused {reused / n:.0f} cached tokens on average; identical warm and cold: {same}/{n}; "
          f"differing at a near-tie: {ties}; differing otherwise: {other}")


if __name__ == "__main__":
    main()
