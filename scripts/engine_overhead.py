"""Per-token overhead of localspec's Python engine against llama-bench's tg figure.

Runs llama-bench (tg after `--depth` tokens of context) and localspec's plain greedy loop (a
prompt of that many tokens, EOG ignored) alternately, `--rounds` times each, same model,
threads and flash-attention setting, and prints both rates and the overhead. `--seqs N`: the
context holds N sequences, every token in all of them, as the engine's does for draft trees.
Needs scripts/build-llama-tools.sh first.

    python scripts/engine_overhead.py -m qwen2.5-coder-1.5b-instruct -n 128 --rounds 5 [--depth 200 --seqs 8]
"""

import argparse
import json
import statistics
import subprocess

from localspec import store
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig
from localspec.loop import Stats, generate
from localspec.sampling import SamplingConfig


def llama_bench_tps(bench: str, path: str, n: int, threads: int, fa: str, depth: int) -> float:
    out = subprocess.run([bench, "-m", path, "-p", "0", "-n", str(n), "-d", str(depth), "-t", str(threads),
                          "-fa", {"on": "1", "off": "0"}[fa], "-r", "1", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["avg_ts"]


def localspec_tps(ctx: Context, n: int, depth: int) -> float:
    ctx.clear()
    stats = Stats()
    text = ctx.model.tokenize("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * (depth // 8 + 1))
    generate(ctx, text[:max(1, depth)], n + 1, SamplingConfig(temperature=0), stop_at_eog=False,
             stats=stats)
    return stats.predicted_per_second


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=store.DEFAULT_MODEL)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", choices=["on", "off"], default="on")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bench", default="build/llama-tools/llama-bench")
    ap.add_argument("--depth", type=int, default=0, help="context tokens before the timed ones")
    ap.add_argument("--seqs", type=int, default=1, help="sequences the context holds every token in")
    a = ap.parse_args()
    path = str(store.resolve(a.model))
    ours, theirs = [], []
    with Model(path) as model, Context(model, ContextConfig(
            n_ctx=1024, n_threads=a.threads, flash_attn=a.flash_attn, n_seq_max=a.seqs)) as ctx:
        localspec_tps(ctx, 16, a.depth)  # warm-up
        for r in range(a.rounds):
            theirs.append(llama_bench_tps(a.bench, path, a.n, a.threads, a.flash_attn, a.depth))
            ours.append(localspec_tps(ctx, a.n, a.depth))
            print(f"round {r + 1}: llama-bench {theirs[-1]:.2f} t/s, localspec {ours[-1]:.2f} t/s",
                  flush=True)
    b, o = statistics.median(theirs), statistics.median(ours)
    # Each round's pair ran back to back, so their ratio is the least noisy figure.
    overhead = statistics.median(t / s - 1 for t, s in zip(theirs, ours))
    print(f"\nmedian over {a.rounds} rounds, tg{a.n} after {a.depth}, {a.threads} threads, "
          f"flash-attn {a.flash_attn}, {a.seqs} sequence(s):")
    print(f"llama-bench {b:.2f} t/s · localspec {o:.2f} t/s · "
          f"overhead (median of per-round ratios) {100 * overhead:+.1f}% per token")


if __name__ == "__main__":
    main()
