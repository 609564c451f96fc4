"""How llama.cpp's CPU settings move the cost of verification batches and whether a batch
reproduces single-token decoding: weight repacking on/off x flash attention on/off x KV type.
Each setting's cost curve and batch-vs-single discrepancy, measured as `localspec cost` does.

    .venv/bin/python scripts/kernel_settings.py [--model qwen2.5-coder-1.5b-instruct] [--threads 2]
"""
import argparse

from localspec import store
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig
from localspec.llama.cost import batch_discrepancy, measure

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--sizes", default="1,2,3,4,5,6,8,12")
ap.add_argument("--configs", default="repack=on fa=on kv=f16,repack=on fa=off kv=f16,"
                "repack=off fa=on kv=f16,repack=off fa=off kv=f16",
                help="comma-separated; each sets repack, fa (flash attention) and kv (cache type)")
args = ap.parse_args()
sizes = [int(s) for s in args.sizes.split(",")]

models = {}
for spec in args.configs.split(","):
    s = dict(kv.split("=") for kv in spec.split())
    repack = s.get("repack", "on") == "on"
    if repack not in models:
        models[repack] = Model(store.resolve(args.model), repack=repack)
    config = ContextConfig(n_ctx=1024, n_threads=args.threads, flash_attn=s.get("fa", "on"),
                           kv_type=s.get("kv", "f16"))
    with Context(models[repack], config) as ctx:
        curve = measure(ctx, max(sizes))
        d = {n_context: dict(zip(sizes[1:], batch_discrepancy(ctx, n_context, sizes[1:])))
             for n_context in (64, 320)}
    print(f"{spec}: single {curve.cost(1) * 1e3:.1f} ms; cost "
          + " ".join(f"{n}:{curve.ratio(n):.2f}" for n in sizes[1:]), flush=True)
    for n_context, dn in d.items():
        print(f"    max |batch - single| after {n_context}: "
              + " ".join(f"{n}:{dn[n]:.3g}" for n in sizes[1:]), flush=True)
