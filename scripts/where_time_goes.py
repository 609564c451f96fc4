"""Where a speculative request spends its time: llama_decode by batch size against everything
else (drafting, sizing, the native acceptance walk, KV bookkeeping), plain and lookup, on the
first N code-edit prompts.

    .venv/bin/python scripts/where_time_goes.py 3
"""

import collections
import sys
import time

import localspec.control.planner as planner
import localspec.drafters.lookup as lookup
import localspec.llama.context as context
import localspec.verify as verify
from localspec.bench import workloads
from localspec.bench.runner import prompt_tokens
from localspec.sampling import SamplingConfig
from localspec.session import EngineConfig, Session
from localspec.speculative import SpecStats

seconds: dict[str, float] = collections.defaultdict(float)
by_batch: dict[int, list[float]] = collections.defaultdict(list)


def timed(owner, name: str, key: str, record_batch: bool = False) -> None:
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        result = inner(*args, **kwargs)
        dt = time.perf_counter() - t0
        seconds[key] += dt
        if record_batch:
            by_batch[len(args[1])].append(dt)
        return result
    setattr(owner, name, wrapper)


timed(context.Context, "_decode", "decode", record_batch=True)
timed(lookup.LookupDrafter, "propose", "propose")
timed(lookup.LookupDrafter, "observe", "observe")
timed(planner.Planner, "size", "size")
timed(verify._native, "verify", "accept")
timed(verify, "keep_path", "keep_path")

session = Session(EngineConfig(model="qwen2.5-coder-1.5b-instruct", threads=2))
curve = session.curve
print("cost curve (× one token):", " ".join(f"{curve.ratio(n):.2f}" for n in range(1, 13)),
      f"(one token {curve.seconds[0] * 1000:.1f} ms)")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for prompt in workloads.load("code-edit", n):
    tokens = prompt_tokens(session, prompt)
    for drafter in ("none", "lookup"):
        session.ctx.clear()
        seconds.clear()
        by_batch.clear()
        stats = SpecStats()
        list(session.generate(tokens, 256, SamplingConfig(), drafter, stats))
        rest = sum(v for k, v in seconds.items() if k != "decode")
        print(f"{prompt.id} {drafter}: {stats.n_generated / stats.t_generate:.2f} tokens/s, "
              f"τ {stats.tau:.2f}, outside llama_decode {rest:.3f} s of {stats.t_generate:.2f} s")
        print("   ms per decode by batch size:", " ".join(
            f"{b}:{1000 * sum(v) / len(v):.0f}×{len(v)}" for b, v in sorted(by_batch.items())))
