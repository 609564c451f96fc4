"""Does a Mixture-of-Experts batch cost what its size says, whatever its tokens? Each row of
a batch wakes its own experts, so n copies of one token wake the experts of one, and n
different tokens up to n times as many. Times a forward of n tokens after 256 of context,
all rows output as verification has them, in a run of its own, for three kinds of rows: one
token repeated, n different tokens of text, and the n tokens the context just ended with
(what a copying drafter proposes). On a dense model the three should agree.

    .venv/bin/python scripts/moe_tokens.py -m moe-15b.gguf --threads 2 --sizes 1,2,4,8,16
    python scripts/moe_tokens.py -m rand-moe.gguf --gpu-layers 99 --sizes 1,4,8,16,32   # on a GPU
"""

import argparse
import statistics

from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig
from localspec.llama.timing import filler_tokens

N_CONTEXT = 256


def time_rows(ctx: Context, rows: list[int], repeats: int) -> float:
    """Median milliseconds of a forward of `rows` after the context (which holds it again after)."""
    import time
    n_past, times = len(ctx.tokens), []
    for _ in range(repeats + 1):  # the first builds the graph: dropped
        t0 = time.perf_counter()
        ctx.extend(rows, n_outputs=len(rows))
        ctx.synchronize()
        times.append(time.perf_counter() - t0)
        ctx.truncate(n_past)
    return statistics.median(times[1:]) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True, help="a GGUF path")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sizes", default="1,2,4,8,16")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--gpu-layers", type=int, default=0, help="layers offloaded to the GPU (99: all)")
    a = p.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    model = Model(a.model, n_gpu_layers=a.gpu_layers)
    with Context(model, ContextConfig(n_ctx=N_CONTEXT + 2 * max(sizes) + 8, n_threads=a.threads)) as ctx:
        filler = filler_tokens(ctx, N_CONTEXT + max(sizes))
        ctx.extend(filler[:N_CONTEXT])
        print(f"{model.path.name} ({model.architecture}), {a.threads} threads: ms for a forward of n rows "
              f"after {N_CONTEXT} tokens, median of {a.repeats}")
        print("| n | one token repeated | different tokens | the context's last n again | different / repeated |")
        print("|---:|---:|---:|---:|---:|")
        for n in sizes:
            repeated = time_rows(ctx, [filler[N_CONTEXT]] * n, a.repeats)
            different = time_rows(ctx, filler[N_CONTEXT:N_CONTEXT + n], a.repeats)
            copied = time_rows(ctx, filler[N_CONTEXT - n:N_CONTEXT], a.repeats)
            print(f"| {n} | {repeated:.1f} | {different:.1f} | {copied:.1f} | {different / repeated:.2f} |")


if __name__ == "__main__":
    main()
