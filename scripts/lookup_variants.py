"""Compare prompt-lookup settings on a workload, interleaved with plain decoding.

    .venv/bin/python scripts/lookup_variants.py --workload humaneval --limit 8 --max-tokens 128
"""

import argparse
import time

from localspec.bench import workloads
from localspec.bench.runner import prompt_tokens
from localspec.drafters.lookup import LookupDrafter
from localspec.generate import generate
from localspec.sampling import SamplingConfig
from localspec.session import EngineConfig, Session
from localspec.speculative import SpecStats, speculative_generate

VARIANTS = {
    "lookup n=2..8 (default)": dict(n_min=2, n_max=8),
    "lookup n=3..8": dict(n_min=3, n_max=8),
    "lookup n=1..8": dict(n_min=1, n_max=8),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="humaneval")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    s = Session(EngineConfig(threads=2))
    greedy = SamplingConfig(temperature=0)
    totals = {"plain": [0, 0.0], **{k: [0, 0.0] for k in VARIANTS}}
    for p in workloads.load(a.workload, a.limit):
        tokens = prompt_tokens(s, p)
        s.ctx.clear()
        st = SpecStats()
        list(generate(s.ctx, tokens, a.max_tokens, greedy, st))
        totals["plain"][0] += st.n_generated - 1
        totals["plain"][1] += st.t_generate
        for name, kw in VARIANTS.items():
            s.ctx.clear()
            st = SpecStats()
            list(speculative_generate(s.ctx, LookupDrafter(**kw), s.planner(), tokens, a.max_tokens,
                                      greedy, st))
            totals[name][0] += st.n_generated - 1
            totals[name][1] += st.t_generate
    base = totals["plain"][0] / totals["plain"][1]
    for name, (n, t) in totals.items():
        print(f"{name:28} {n / t:6.2f} tok/s  {n / t / base:.2f}×")


if __name__ == "__main__":
    main()
