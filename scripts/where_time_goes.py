"""Where a speculative request spends its time: per arm, an iteration's seconds against what
its target forward costs by the cost curve (a batch of the pending token and the drafted
nodes); the rest is everything else (drafting, sizing, the native acceptance walk, KV
bookkeeping). Plain and lookup on the first N code-edit prompts, from the iteration hook.

    .venv/bin/python scripts/where_time_goes.py 3
"""

import collections
import sys

from localspec.bench import workloads
from localspec.bench.runner import prompt_tokens, run_ours
from localspec.drafters.spec import NONE, DrafterSpec
from localspec.engine import Engine, EngineConfig
from localspec.sampling import SamplingConfig

engine = Engine(EngineConfig(model="qwen2.5-coder-1.5b-instruct", threads=2))
curve = engine.curve
print("cost curve (× one token):", " ".join(f"{curve.ratio(n):.2f}" for n in range(1, 13)),
      f"(one token {curve.seconds[0] * 1000:.1f} ms)")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for prompt in workloads.load("code-edit", n):
    tokens = prompt_tokens(engine, prompt)
    for spec in (NONE, DrafterSpec("lookup")):
        by_size: dict[int, list[float]] = collections.defaultdict(list)

        def record(it) -> None:
            if it.arm != "prompt":
                by_size[1 + it.n_drafted].append(it.seconds)

        out, run = run_ours(engine, tokens, spec, 256, SamplingConfig(), on_iteration=record)
        total = sum(sum(v) for v in by_size.values())
        forward = sum(curve.cost(b) * len(v) for b, v in by_size.items())
        print(f"{prompt.id} {spec.label}: {run.n_timed / run.seconds:.2f} tokens/s, τ "
              f"{run.n_tokens / max(run.forwards, 1):.2f}, outside the target forward about "
              f"{total - forward:.3f} s of {total:.2f} s")
        print("   ms per iteration by batch size (measured / cost curve):", " ".join(
            f"{b}:{1000 * sum(v) / len(v):.0f}/{1000 * curve.cost(b):.0f}×{len(v)}"
            for b, v in sorted(by_size.items())))
