"""Token Diversity Index of a tree drafter's candidates (Jakiro paper, eq. 18): at every node
with k >= 2 children, the entropy of the children's drafter probabilities renormalised over
the k, divided by log k; averaged over the nodes of the trees drafted while decoding a
workload greedily (the trees verified, from the engine's iteration hook). 1 = the siblings are
equally likely, 0 = one sibling takes all. Plans with a flat cost curve (as `--flat-cost`), so
the drafter grows full trees even on a CPU.

    .venv/bin/python scripts/jakiro_tdi.py --drafter jakiro
"""

import argparse

import numpy as np

from localspec.bench.runner import prompt_tokens, run_ours
from localspec.bench.workloads import load
from localspec.drafters.spec import DrafterSpec
from localspec.engine import Engine, EngineConfig
from localspec.sampling import SamplingConfig


def tree_tdi(parents: np.ndarray, reach: np.ndarray) -> list[float]:
    out = []
    for node in np.unique(parents):
        kids = np.flatnonzero(parents == node)
        if len(kids) < 2:
            continue
        p = reach[kids] / reach[kids].sum()
        p = p[p > 0]
        out.append(float(-(p * np.log(p)).sum() / np.log(len(kids))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--workload", default="humaneval")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    spec = DrafterSpec.parse(args.drafter)
    engine = Engine(EngineConfig(model=args.model, threads=args.threads, flat_cost=True, drafter=spec))
    values: list[float] = []

    def record(it) -> None:
        if len(it.tree):
            values.extend(tree_tdi(it.tree.parents, it.tree.reach))

    for prompt in load(args.workload, args.limit):
        run_ours(engine, prompt_tokens(engine, prompt), spec, args.max_tokens,
                 SamplingConfig(temperature=0.0), on_iteration=record)
    print(f"{spec.label}: TDI {np.mean(values):.3f} over {len(values)} branching nodes")


if __name__ == "__main__":
    main()
