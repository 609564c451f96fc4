"""How flash attention and the output rows move the cost of batches of 4 and 8 (1.5B).

    .venv/bin/python scripts/cost_settings.py
"""
import time, statistics
from localspec import store
from localspec.engine import Model, Context
from localspec.engine.context import ContextConfig
m = Model(store.resolve("qwen2.5-coder-1.5b-instruct"))
for fa in ["on", "off"]:
    with Context(m, ContextConfig(n_ctx=1024, n_threads=2, flash_attn=fa)) as ctx:
        filler = [100 + (i * 7919) % 150000 for i in range(300)]
        ctx.prefill(filler[:256])
        for all_out in [True, False]:
            res = {}
            for n in [1, 4, 8]:
                ts = []
                for r in range(6):
                    t0 = time.perf_counter()
                    ctx.decode(filler[256:256+n], range(256, 256+n), outputs=[all_out]*(n-1)+[True])
                    ts.append(time.perf_counter() - t0)
                    ctx.seq_rm(0, 256, -1)
                res[n] = statistics.median(ts[1:])
            print(f"fa={fa} all_outputs={all_out}: " + ", ".join(f"{n}: {res[n]*1e3:.0f}ms ({res[n]/res[1]:.2f}x)" for n in res), flush=True)
