"""Where `auto` gains and loses against plain decoding, by what chose each iteration: Cascade's
baseline, its trials (by drafter), its set phases (by drafter, or plain) and the free drafter's
"sure" iterations. Each iteration's cost is its seconds less what plain decoding spent on as
many tokens of the same prompt (plain runs beside it, in the same process); a negative sum
is time saved.

    .venv/bin/python scripts/auto_phases.py humaneval-warm 8 [auto-spec ...]
"""

import collections
import sys
from dataclasses import replace

from localspec import paths
from localspec.bench import workloads
from localspec.bench.runner import run_bench, warm_documents
from localspec.drafters.spec import NONE, DrafterSpec
from localspec.engine import Engine, EngineConfig
from localspec.sampling import SamplingConfig

workload, limit = sys.argv[1], int(sys.argv[2])
specs = [DrafterSpec.parse(s) for s in sys.argv[3:]] or [DrafterSpec("auto")]
prompts, warm = workloads.load_warm(workload, limit)
engine = Engine(replace(EngineConfig(model="qwen2.5-coder-1.5b-instruct", threads=2), store=":memory:"))
for spec in specs:
    engine.controller(spec)
docs = warm_documents(engine, warm, 256, paths.cache_dir() / "bench" / "answers.json") if warm.prompts or warm.texts else []
for spec in specs:
    trace: list = []
    configs = run_bench(engine, prompts, [NONE, spec], 256, SamplingConfig(), traced=spec, trace=trace, warm=docs)
    plain, auto = configs[0], configs[1]
    loss: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])  # iterations, tokens, s
    for run, its in zip(plain.runs, trace):
        per_token = run.seconds / max(run.n_timed, 1)
        for it in its:
            if it.arm == "prompt":
                continue
            kind = it.phase.split()[0] if it.phase else "?"
            key = f"{kind:5s} {it.arm.split('@')[0]}"
            row = loss[key]
            row[0] += 1
            row[1] += len(it.tokens)
            row[2] += it.seconds - len(it.tokens) * per_token
    print(f"\n{spec.label} on {workload} × {len(prompts)}: {auto.tokens_per_s / plain.tokens_per_s:.3f}× plain "
          f"({plain.tokens_per_s:.2f} tok/s plain, {plain.total('seconds'):.1f} s)")
    print(f"{'phase arm':20s} {'iters':>6s} {'tokens':>7s} {'s lost':>7s}")
    for key, (n, t, s) in sorted(loss.items(), key=lambda kv: -kv[1][2]):
        print(f"{key:20s} {n:6d} {t:7d} {s:7.2f}")
    print(f"{'total':20s} {sum(r[0] for r in loss.values()):6d} {sum(r[1] for r in loss.values()):7d} "
          f"{sum(r[2] for r in loss.values()):7.2f}")
