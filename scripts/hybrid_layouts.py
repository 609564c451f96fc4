"""A hybrid target's default verification (trees flattened, chains in every sequence of a
context with a sequence per path, undone from checkpoints: native/step.h's tree_layout)
against one-sequence chains (`--rollback N`: rolled back where the family can, else undone from
checkpoints), in one process: plain and lookup, code-edit prompts, 128 tokens, greedy, the two
engines' runs interleaved and alternating in order each round. Prints tokens/s, tokens per
forward, the per-pair ratios (median [range]) and whether every output was the same.

    python tests/random_gguf.py qwen35 1b q35.gguf --repeats --quiet 0.1   # granitehybrid: 0.05
    python scripts/hybrid_layouts.py q35-q4.gguf --rollback 8 --rounds 2
"""
from __future__ import annotations

import argparse
import statistics

from localspec.engine import Engine, EngineConfig, Request  # llama.cpp before numpy (scripts/README.md)
from localspec.bench import workloads  # noqa: I001
from localspec.drafters.spec import DrafterSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rollback", type=int, default=8, help="the one-sequence engine's --rollback")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=3)
    a = ap.parse_args()
    engines = {"default": Engine(EngineConfig(model=a.model, threads=2)),
               "one sequence": Engine(EngineConfig(model=a.model, threads=2, rollback=a.rollback))}
    try:
        for name, e in engines.items():
            print(f"{name}: {e.ctx.config.n_seq_max} sequences, flattened trees {e.ctx.flat}, "
                  f"rollback {e.ctx.rollback}, checkpoints {e.ctx.checkpoints}")
        speed: dict[tuple[str, str], list[float]] = {}
        tau: dict[tuple[str, str], list[float]] = {}
        outputs: dict[int, set[tuple[int, ...]]] = {}
        prompts = workloads.load("code-edit", a.prompts)
        for r in range(a.rounds):
            for i, p in enumerate(prompts):
                for name in list(engines) if (r + i) % 2 == 0 else list(engines)[::-1]:
                    for d in ("none", "lookup"):
                        *_, done = engines[name].generate(Request(
                            messages=[{"role": "user", "content": p.prompt}], max_tokens=128,
                            ignore_eog=True, cache=False, drafter=DrafterSpec.parse(d)))
                        s = done.stats
                        speed.setdefault((name, d), []).append((s.predicted_n - 1) / s.predicted_ms * 1e3)
                        tau.setdefault((name, d), []).append(s.predicted_n / max(1, s.forwards + 1))
                        outputs.setdefault(i, set()).add(tuple(done.tokens))
        for (name, d), v in speed.items():
            print(f"{name}, {d}: {statistics.median(v):.2f} tok/s, {statistics.median(tau[(name, d)]):.2f} tokens a forward")

        def ratios(a_key, b_key) -> str:
            r = [x / y for x, y in zip(speed[a_key], speed[b_key])]
            return f"{statistics.median(r):.3f} [{min(r):.2f}-{max(r):.2f}]"
        for d in ("none", "lookup"):
            print(f"{d}: default / one sequence {ratios(('default', d), ('one sequence', d))}")
        for name in engines:
            print(f"{name}: lookup / plain {ratios((name, 'lookup'), (name, 'none'))}")
        print("every output the same across engines and drafters:", all(len(o) == 1 for o in outputs.values()))
    finally:
        for e in engines.values():
            e.close()


if __name__ == "__main__":
    main()
