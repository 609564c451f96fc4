"""What a change of batch size costs a forward, part by part, with each row's argmax in the graph
(the loop's default on a GPU) and without it. All times are taken after 256 tokens of context,
with every row output, as verification outputs them.

- growth: the first batch of 8, 16, 32 and 64 rows in a fresh context, against the second
  batch of each size. llama.cpp's output buffer only grows. With a sampler in the graph it takes
  about 4 x n_vocab floats a row, in pinned host memory on a GPU.
- place in a run: 1 and 16 rows alternating in runs of 1, 2, 3 and 5 forwards. The first
  forward of a size after the other size, the second, and the third and later are kept apart:
  llama.cpp rebuilds its graph at a change, and ggml-cuda captures a CUDA graph at the second
  forward and replays it from the third.

    python scripts/shape_costs.py -m MODEL.gguf --gpu-layers 99
"""

import argparse
import statistics

from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig
from localspec.llama.timing import filler_tokens, time_batch

N_CONTEXT = 256
SIZES = (8, 16, 32, 64)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True, help="a GGUF path")
    p.add_argument("--gpu-layers", type=int, default=0, help="layers offloaded to the GPU (99: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=6, help="runs of each length in the place-in-a-run part")
    a = p.parse_args()
    model = Model(a.model, n_gpu_layers=a.gpu_layers)
    print(f"{model.path.name}: ms for a forward of n rows after {N_CONTEXT} tokens, every row output")
    print("| rows in the graph | the first 8 / 16 / 32 / 64 rows, then the second of each "
          "| 1 row: at a change / 2nd / 3rd+ | 16 rows: at a change / 2nd / 3rd+ |")
    print("|---|---|---|---|")
    for argmax in (False, True):
        with Context(model, ContextConfig(n_ctx=N_CONTEXT + 2 * max(SIZES) + 8, n_threads=a.threads)) as ctx:
            filler = filler_tokens(ctx, N_CONTEXT + max(SIZES))
            ctx.extend(filler[:N_CONTEXT])
            if argmax:
                ctx.sample_on_device(0)

            def forward(n: int) -> float:
                return time_batch(ctx, filler, N_CONTEXT, n) * 1e3

            growth = [(forward(n), forward(n)) for n in SIZES]
            placed: dict[tuple[int, str], list[float]] = {}
            for run in (1, 2, 3, 5):
                for _ in range(a.repeats):
                    for n in (1, 16):
                        for i in range(run):
                            placed.setdefault((n, "3+" if i >= 2 else str(i + 1)), []).append(forward(n))

            def places(n: int) -> str:
                return " / ".join(f"{statistics.median(placed[n, k]):.2f}" for k in ("1", "2", "3+"))

            print(f"| {'argmax' if argmax else 'none (logits)'} | "
                  f"{' / '.join(f'{g[0]:.1f}' for g in growth)}, then {' / '.join(f'{g[1]:.1f}' for g in growth)} "
                  f"| {places(1)} | {places(16)} |")


if __name__ == "__main__":
    main()
