"""Where `auto` gains and loses against plain decoding, by what chose each iteration: Cascade's
baseline, its trials (by drafter), its set phases (by drafter, or plain) and the free drafter's
"sure" iterations. Each iteration's cost is its seconds less what plain decoding spent on as
many tokens of the same prompt (plain runs beside it, every configuration on each prompt in
turn, as the bench runs them); a negative sum is time saved.

    .venv/bin/python scripts/auto_phases.py humaneval-warm 8 auto 'auto:suffix+draft+jakiro|explore_share=inf'
    .venv/bin/python scripts/auto_phases.py --max-tokens 128 humaneval-warm 8 suffix auto

A spec may end in |FIELD=VALUE,... : CascadeConfig fields for that controller (two `auto`
controllers side by side need different specs: name the members in one).
"""

import collections
import sys
from dataclasses import replace

from localspec import paths
from localspec.bench import runner, workloads
from localspec.drafters.spec import DrafterSpec
from localspec.engine import Engine, EngineConfig
from localspec.sampling import SamplingConfig

args = sys.argv[1:]
max_tokens = 256  # per answer, warm answers included
if args[:1] == ["--max-tokens"]:
    max_tokens, args = int(args[1]), args[2:]
workload, limit = args[0], int(args[1])
prompts, warm = workloads.load_warm(workload, limit)
engine = Engine(replace(EngineConfig(model="qwen2.5-coder-1.5b-instruct", threads=2), store=":memory:"))
specs = []
for arg in args[2:] or ["auto"]:
    text, _, overrides = arg.partition("|")
    spec = DrafterSpec.parse(text)
    controller = engine.controller(spec)
    for pair in filter(None, overrides.split(",")):
        key, value = pair.split("=")
        controller.cascade.cfg = replace(controller.cascade.cfg, **{key: type(getattr(controller.cascade.cfg, key))(value)})
    specs.append((arg, spec))
docs = runner.warm_documents(engine, warm, max_tokens, paths.cache_dir() / "bench" / "answers.json") \
    if warm.prompts or warm.texts else []

runs: dict = collections.defaultdict(list)  # spec -> [(iterations, Run)] per turn
run_ours = runner.run_ours


def traced(engine, tokens, spec, max_tokens, sampling, on_iteration=None):
    its: list = []
    out = run_ours(engine, tokens, spec, max_tokens, sampling, its.append)
    runs[spec].append((its, out[1]))
    return out


runner.run_ours = traced
configs = runner.run_bench(engine, prompts, [s for _, s in specs], max_tokens, SamplingConfig(), warm=docs)
plain = configs[0]
for (arg, spec), config in zip(specs, configs[1:]):
    loss: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])  # iterations, tokens, s
    for (_, plain_run), (its, _) in zip(runs[configs[0].spec], runs[spec]):
        per_token = plain_run.seconds / max(plain_run.n_timed, 1)
        for it in its:
            if it.arm == "prompt":
                continue
            row = loss[f"{it.phase.split()[0] if it.phase else '?':5s} {it.arm.split('@')[0]}"]
            row[0] += 1
            row[1] += len(it.tokens)
            row[2] += it.seconds - len(it.tokens) * per_token
    print(f"\n{arg} on {workload} × {len(prompts)}: {config.tokens_per_s / plain.tokens_per_s:.3f}× plain "
          f"({plain.tokens_per_s:.2f} tok/s plain, {plain.total('seconds'):.1f} s)")
    print(f"{'phase arm':20s} {'iters':>6s} {'tokens':>7s} {'s lost':>7s}")
    for key, (n, t, s) in sorted(loss.items(), key=lambda kv: -kv[1][2]):
        print(f"{key:20s} {n:6d} {t:7d} {s:7.2f}")
    print(f"{'total':20s} {sum(r[0] for r in loss.values()):6d} {sum(r[1] for r in loss.values()):7d} "
          f"{sum(r[2] for r in loss.values()):7.2f}")
