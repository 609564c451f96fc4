"""What a target forward of a batch of n costs after c tokens of context, side by side in one
context: for each c, fill c tokens, then rounds of batches of 1, 2, 4, ..., 64 (interleaved;
the first round dropped, the median kept), as the cost curve times them.

    .venv/bin/python scripts/cost_by_context.py [MODEL] [ROUNDS]
"""

import statistics
import sys

from localspec import store
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig
from localspec.llama.cost import filler_tokens, time_batch

model_name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-instruct"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
sizes = (1, 2, 4, 8, 16, 32, 64)
contexts = (256, 1024, 2048, 4096)
with Model(store.resolve(model_name)) as model, \
        Context(model, ContextConfig(n_ctx=8192, n_threads=2, n_seq_max=8)) as ctx:
    filler = filler_tokens(ctx, max(contexts) + max(sizes))
    print(f"{model.path.stem}, 2 threads; ms for one token, then × one token")
    print("| context | 1 token | " + " | ".join(f"×{n}" for n in sizes[1:]) + " |")
    print("|---:|---:|" + "---:|" * (len(sizes) - 1))
    for c in contexts:
        ctx.extend(filler[len(ctx.tokens):c])
        times = [[time_batch(ctx, filler, c, n) for n in sizes] for _ in range(rounds)]
        ms = [1e3 * statistics.median(t) for t in zip(*times[1:])]
        print(f"| {c:,} | {ms[0]:.1f} ms | " + " | ".join(f"{m / ms[0]:.2f}" for m in ms[1:]) + " |")
