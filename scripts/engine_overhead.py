"""Per-token overhead of localspec's Python engine against llama-bench's tg figure.

Runs llama-bench (tg, no prompt) and localspec's plain greedy loop (short prompt, EOG ignored)
alternately, `--rounds` times each, same model, threads and flash-attention setting, and
prints both rates and the overhead. Needs scripts/build-llama-tools.sh first.

    python scripts/engine_overhead.py -m qwen2.5-coder-1.5b-instruct -n 128 --rounds 5
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


def llama_bench_tps(bench: str, path: str, n: int, threads: int, fa: str) -> float:
    out = subprocess.run([bench, "-m", path, "-p", "0", "-n", str(n), "-t", str(threads),
                          "-fa", {"on": "1", "off": "0"}[fa], "-r", "1", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["avg_ts"]


def localspec_tps(ctx: Context, n: int) -> float:
    ctx.clear()
    stats = Stats()
    generate(ctx, ctx.model.tokenize("def"), n + 1, SamplingConfig(temperature=0), stop_at_eog=False,
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
    a = ap.parse_args()
    path = str(store.resolve(a.model))
    ours, theirs = [], []
    with Model(path) as model, Context(model, ContextConfig(
            n_ctx=1024, n_threads=a.threads, flash_attn=a.flash_attn)) as ctx:
        localspec_tps(ctx, 16)  # warm-up
        for r in range(a.rounds):
            theirs.append(llama_bench_tps(a.bench, path, a.n, a.threads, a.flash_attn))
            ours.append(localspec_tps(ctx, a.n))
            print(f"round {r + 1}: llama-bench {theirs[-1]:.2f} t/s, localspec {ours[-1]:.2f} t/s",
                  flush=True)
    b, o = statistics.median(theirs), statistics.median(ours)
    # Each round's pair ran back to back, so their ratio is the least noisy figure.
    overhead = statistics.median(t / s - 1 for t, s in zip(theirs, ours))
    print(f"\nmedian over {a.rounds} rounds, tg{a.n}, {a.threads} threads, flash-attn {a.flash_attn}:")
    print(f"llama-bench {b:.2f} t/s · localspec {o:.2f} t/s · "
          f"overhead (median of per-round ratios) {100 * overhead:+.1f}% per token")


if __name__ == "__main__":
    main()
