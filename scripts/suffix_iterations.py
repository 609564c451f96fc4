"""Where an edit session's time goes under the suffix drafter: its iterations grouped by what
drafted (the request's own text, "lookup", or the store, "store") and the matched length's
bucket, with tokens per iteration and per second. Prompt iterations (prefill) count as plain.

    .venv/bin/python scripts/suffix_iterations.py --model qwen2.5-coder-1.5b-instruct --session 1
"""

from __future__ import annotations

import argparse
import collections

from localspec.bench import workloads
from localspec.bench.runner import turns
from localspec.drafters.spec import DrafterSpec
from localspec.engine import Engine, EngineConfig, Request


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--session", type=int, default=1, help="which edit session (0-based)")
    p.add_argument("--max-tokens", type=int, default=128)
    a = p.parse_args()
    engine = Engine(EngineConfig(model=a.model, threads=2, store=":memory:"))
    spec = DrafterSpec("suffix")
    drafter = engine.drafters.get(spec)
    groups: dict[tuple, list[float]] = collections.defaultdict(lambda: [0, 0, 0, 0.0])

    def hook(it) -> None:
        source = drafter.source
        n_match = (drafter.acceptance if source == "store" else drafter.lookup.acceptance).last
        g = groups[("plain", 0) if not len(it.tree) else (source, n_match)]
        g[0] += 1
        g[1] += len(it.tree)
        g[2] += len(it.tokens)
        g[3] += it.seconds

    session = workloads.edit_sessions(a.session + 1)[a.session]
    steps = turns(engine, session)
    tokens = next(steps)
    while tokens is not None:
        engine.ctx.clear()
        *_, done = engine.generate(Request(prompt=tokens, max_tokens=a.max_tokens, drafter=spec), on_iteration=hook)
        try:
            tokens = steps.send(done.text)
        except StopIteration:
            tokens = None
    print("| drafted from | match bucket | iterations | drafted per iteration | tokens per iteration | ms per iteration | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (source, bucket), (n, drafted, emitted, seconds) in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        print(f"| {source} | {bucket} | {n} | {drafted / n:.1f} | {emitted / n:.2f} | {1e3 * seconds / n:.0f} | "
              f"{emitted / seconds:.1f} |")
    engine.close()


if __name__ == "__main__":
    main()
