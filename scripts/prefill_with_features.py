"""What a feature drafter's context costs prefill: the same 2,000-token prompt (code from the fim
workload) decoded cold by an engine whose drafter is `none` (no features) and by one whose
drafter is `auto` (Jakiro among its members: the context computes every row's features),
alternating.

    .venv/bin/python scripts/prefill_with_features.py -m qwen2.5-coder-1.5b-instruct --rounds 2
"""

import argparse

from localspec.bench.workloads import fim
from localspec.drafters.spec import DrafterSpec
from localspec.engine import Done, Engine, EngineConfig, Request

ap = argparse.ArgumentParser()
ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--tokens", type=int, default=2000)
ap.add_argument("--rounds", type=int, default=2)
a = ap.parse_args()
p = fim(1)[0]
for _ in range(a.rounds):
    for spec in ("none", "auto"):
        e = Engine(EngineConfig(model=a.model, threads=a.threads, drafter=DrafterSpec.parse(spec)))
        tokens = e.model.tokenize(p.prefix + p.suffix, add_special=False, parse_special=False)[:a.tokens]
        done = next(x for x in e.generate(Request(prompt=tokens, max_tokens=1, cache=False)) if isinstance(x, Done))
        print(f"{spec}: {len(tokens)} prompt tokens in {done.stats.prompt_ms / 1e3:.1f} s "
              f"(features {'on' if e.ctx.config.embeddings else 'off'})", flush=True)
        e.close()
