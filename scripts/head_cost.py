"""What a drafting step of a model drafter llama.cpp runs (an EAGLE-3 GGUF, a target's MTP
layer, a DFlash GGUF) costs against the target's forward, timed here on random weights of real
shapes (issue 48's goal: at most 0.15x the forward of a 7B-class target).

Each figure is the median of --reps, alternating: the target's forward of one token after
--depth tokens of context, and each drafter's step (one drafted token decoded with a hidden
state, after as many pairs; DFlash: its block, the root and block_size - 1 masks, in one
forward); also what a drafter pays once an iteration to take in the target's states of what
was accepted, 3 tokens (EAGLE-3's fc layer and the pairs' decode; DFlash's injection).

    python scripts/head_cost.py TARGET.gguf [eagle3:FILE] [mtp:FILE] [dflash:FILE] [--threads 2] [--gpu-layers 99]
        [--depth 256] [--flash-attn auto|on|off]
"""

import argparse
import statistics
import time
from pathlib import Path

from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig
from localspec.llama.heads import HeadContext, target_layers
# numpy after localspec.llama (scripts/README.md: numpy first made model loads crash)
import numpy as np  # noqa: E402


def timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target")
    p.add_argument("drafters", nargs="*", help="eagle3:FILE or mtp:FILE (a model with MTP layers)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--depth", type=int, default=256)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--gpu-layers", type=int, default=0, help="the target's and drafters' layers on the GPU")
    p.add_argument("--flash-attn", choices=["auto", "on", "off"],
                   help="the target's and drafters' (default: as the engine runs them, off on the CPU, "
                        "llama.cpp's choice with layers on a GPU)")
    a = p.parse_args()
    a.flash_attn = a.flash_attn or ("off" if a.gpu_layers == 0 else "auto")
    target = Model(a.target, a.gpu_layers)
    ctx = Context(target, ContextConfig(n_ctx=a.depth + 64, n_threads=a.threads, flash_attn=a.flash_attn))
    rng = np.random.default_rng(0)
    context = [int(t) for t in rng.integers(100, 1000, a.depth)]
    ctx.prefill(context)

    heads = {}
    for spec in a.drafters:
        kind, path = spec.split(":", 1)
        model = Model(path, a.gpu_layers, mtp=kind == "mtp")
        config = ContextConfig(n_ctx=a.depth + 64, n_threads=a.threads, mtp=kind == "mtp", flash_attn=a.flash_attn)
        head = HeadContext(model, config, ctx, encode=kind == "eagle3", causal=kind != "dflash")
        width = {"eagle3": 3 * target.n_embd, "mtp": head.width,
                 "dflash": len(target_layers(model)) * target.n_embd}[kind]
        for p_ in range(a.depth - 1):  # the context's states, drawn at random
            head.states[p_] = rng.normal(0, 1, width).astype(np.float32)
        (head.inject if kind == "dflash" else head.catch_up)(context)
        heads[f"{kind}:{Path(path).name} ({_mb(path)} MB)"] = (kind, head, width)

    def target_step():
        ctx.append(7)
        ctx.truncate(a.depth)

    def draft_step(kind, head, width):
        if kind == "dflash":  # a block: the root and its masks
            k = int(head.model.meta("dflash.block_size") or 16)
            block = [7] + [head.model.special.mask] * (k - 1)
            return lambda: (head.decode(block, range(a.depth - 1, a.depth - 1 + k), seq_ids=[[0]] * k,
                                        outputs=[True] * k), head.drop_branches(1))
        state = rng.normal(0, 1, (1, head.width)).astype(np.float32)
        return lambda: (head.decode_pairs([7], state, [a.depth], [[0]]), head._seq_rm(-1, a.depth, -1))

    def take_in(kind, head, width):  # 3 accepted tokens' states, then their pairs (or KV)
        def run():
            for i in range(3):
                head.states[a.depth - 1 + i] = rng.normal(0, 1, width).astype(np.float32)
            if kind == "dflash":
                head.inject(context + [7, 8, 9, 10])
                head.truncate(a.depth - 1)
            else:
                head.catch_up(context + [7, 8, 9])
                head.truncate(a.depth)
        return run

    for f in [target_step] + [draft_step(*h) for h in heads.values()]:
        f()  # warm up: graphs planned, weights paged in
    times: dict[str, list[float]] = {"target forward": []}
    for _ in range(a.reps):
        times["target forward"].append(timed(target_step))
        for name, h in heads.items():
            times.setdefault(name + " step", []).append(timed(draft_step(*h)))
            times.setdefault(name + " take-in of 3", []).append(timed(take_in(*h)))
    base = statistics.median(times["target forward"])
    print(f"{Path(a.target).name} ({_mb(a.target)} MB), {a.threads} threads, after {a.depth} tokens, "
          f"flash attention {a.flash_attn}, median of {a.reps}:")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:60} {m * 1e3:8.2f} ms  {m / base:5.3f}x the target's forward")


def _mb(path) -> int:
    return round(Path(path).stat().st_size / 2**20)


if __name__ == "__main__":
    main()
