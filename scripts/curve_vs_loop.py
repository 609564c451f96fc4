"""What verification forwards cost in the decoding loop against the cost curve: plain decoding
and the suffix drafter on HumanEval or another warmed workload, per batch size the median iteration
seconds, the cached curve's prediction and the live curve's after the run.

    .venv/bin/python scripts/curve_vs_loop.py [PROMPTS] [WORKLOAD]
"""

import collections
import statistics
import sys
from dataclasses import replace

from localspec import paths
from localspec.bench import runner, workloads
from localspec.drafters.spec import NONE, DrafterSpec
from localspec.engine import Engine, EngineConfig
from localspec.sampling import SamplingConfig

prompts, warm = workloads.load_warm(sys.argv[2] if len(sys.argv) > 2 else "humaneval-warm",
                                    int(sys.argv[1]) if len(sys.argv) > 1 else 6)
engine = Engine(replace(EngineConfig(model="qwen2.5-coder-1.5b-instruct", threads=2), store=":memory:"))
docs = runner.warm_documents(engine, warm, 128, paths.cache_dir() / "bench" / "answers.json")
runner.run_bench(engine, prompts[:1], [DrafterSpec("suffix")], 128, SamplingConfig(), warm=docs)  # the store
seconds = collections.defaultdict(list)  # (drafter, batch size) -> iteration seconds
contexts = []
for spec in (NONE, DrafterSpec("suffix")) * 2:
    for p in prompts:
        tokens = runner.prompt_tokens(engine, p)
        contexts.append(len(tokens))
        its = []
        runner.run_ours(engine, tokens, spec, 128, SamplingConfig(), its.append)
        for it in its[1:]:  # after the prompt's
            seconds[(spec.kind, 1 + len(it.tree))].append(it.seconds)
n_context = int(statistics.median(contexts)) + 64
cached, live = engine.curve.base.at(n_context), engine.curve.at(n_context)
print(f"after about {n_context} tokens; ms per iteration (median) against the curves' forward")
print("| drafter | 1 + drafted | iterations | median | cached curve | live curve |")
print("|---|---:|---:|---:|---:|---:|")
for (kind, n), v in sorted(seconds.items()):
    if len(v) >= 5:
        print(f"| {kind} | {n} | {len(v)} | {1e3 * statistics.median(v):.1f} | "
              f"{1e3 * cached.cost(n):.1f} | {1e3 * live.cost(n):.1f} |")
