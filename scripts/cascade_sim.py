"""Cascade on simulated requests: the share of the best arm's speed it reaches.

Each landscape gives every arm a utility (tests/test_cascade.py's simulator: an arm of K
costs 1 + K/4 plain iterations). Requests run one after the other on one controller, as a
server's do, prompt lookup watched while plain decoding runs, from a cold start (K 1); the
figure is tokens per second against the best arm's (or plain's, where no arm pays), over
all of them.

    python scripts/cascade_sim.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_cascade import T_BASE, peaked, simulate  # noqa: E402

from localspec.control.cascade import Cascade, CascadeConfig  # noqa: E402

LANDSCAPES = {  # (lookup, a draft model): utility by K
    "lookup 2.0 at K 6, draft 1.4 at 2": (peaked(6, 2.0), peaked(2, 1.4)),
    "lookup 1.1 at K 2, draft 0.7": (peaked(2, 1.1), peaked(1, 0.7)),
    "nothing pays (0.85, 0.7)": (peaked(1, 0.85), peaked(1, 0.7)),
}


def share(landscape, requests: int, iterations: int) -> float:
    lookup, draft = landscape
    cascade = Cascade(["lookup", "draft"], predict_k=lambda d: 1)  # a cold start: K 1
    tokens = seconds = 0.0
    for _ in range(requests):
        cascade.new_request()
        simulate(cascade, lambda arm, i: (lookup if arm[0] == "lookup" else draft)(arm[1]), iterations, ("lookup",))
        tokens += sum(r.tokens for r in cascade.trace)
        seconds += sum(r.seconds for r in cascade.trace)
    best = max([1.0] + [f(k) for f in landscape for k in CascadeConfig().ladder])
    return tokens / seconds * T_BASE / best


if __name__ == "__main__":
    print("| landscape | 1 request × 400 iterations | 8 × 100 |\n|---|---:|---:|")
    for name, landscape in LANDSCAPES.items():
        print(f"| {name} | {share(landscape, 1, 400):.1%} | {share(landscape, 8, 100):.1%} |")
