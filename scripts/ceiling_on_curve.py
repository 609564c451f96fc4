"""The copy ceiling (localspec/bench/ceiling.py) of a workload's plain greedy answers on a
cost curve measured elsewhere: a table that `localspec cost` printed (docs/bench/rpc/cost-5ms.md,
say), held at any context. Greedy answers over RPC equal local ones (tests/test_rpc.py), so the
answers are decoded here and only the curve is the other set-up's.

    .venv/bin/python scripts/ceiling_on_curve.py humaneval 3 docs/bench/rpc/cost-0ms.md docs/bench/rpc/cost-5ms.md
"""

import re
import sys
from dataclasses import replace

from localspec import paths
from localspec.bench import runner, workloads
from localspec.bench.ceiling import Corpus, copy_ceiling
from localspec.drafters.spec import NONE
from localspec.engine import Engine, EngineConfig
from localspec.llama.cost import CostCurve
from localspec.sampling import SamplingConfig

workload, limit, tables = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
max_tokens = 128
curves = {}
for path in tables:
    rows = [line.split("|") for line in open(path) if re.match(r"\| \d+ \|", line)]
    curves[path] = CostCurve(seconds=[float(r[2]) / 1e3 for r in rows], n_context=256)

engine = Engine(replace(EngineConfig(model="qwen2.5-coder-1.5b-instruct", threads=2), store=":memory:"))
prompts, warm = workloads.load_warm(workload, limit)
learnt = runner.warm_documents(engine, warm, max_tokens, paths.cache_dir() / "bench" / "answers.json")
spent = {path: [0.0, 0.0] for path in tables}
for p in prompts:
    steps = runner.turns(engine, p)
    tokens = next(steps)
    while tokens is not None:
        answer, _ = runner.run_ours(engine, tokens, NONE, max_tokens, SamplingConfig())
        for path, curve in curves.items():
            plain, copier = copy_ceiling(answer, tokens, Corpus(learnt), curve)
            spent[path][0] += plain
            spent[path][1] += copier
        learnt.append([t for t in answer if not engine.model.is_eog(t)])
        text = engine.model.detokenize(learnt[-1])
        try:
            tokens = steps.send(text) if p.kind == "session" else None
        except StopIteration:
            tokens = None
for path, (plain, copier) in spent.items():
    print(f"{workload} × {len(prompts)} on {path}: copy ceiling {plain / copier:.2f}× plain")
