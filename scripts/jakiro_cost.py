"""What a Jakiro draft step costs next to a target forward, on this machine: the native
drafter layer for 1..4 rows, its head over a reduced and the full vocabulary, and whole
draft trees (Algorithm 1, its layer passes, mixing and head picks on the drafter's device),
against one single-token forward of the target (from its cost curve). Untrained weights:
cost does not depend on what the drafter learnt.

    .venv/bin/python scripts/jakiro_cost.py -m qwen2.5-coder-1.5b-instruct --threads 2 [--only tree]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from localspec import store
from localspec.convert import write_gguf
from localspec.drafters.jakiro import JakiroRuntime
from localspec.drafters.jakiro_config import JakiroConfig
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig
from localspec.llama.measure import cost_curve
from localspec.llama.placement import layers_that_fit
from localspec.train.target_weights import TargetWeights
# numpy after localspec.llama (scripts/README.md: numpy first made model loads crash)
import numpy as np  # noqa: E402


def random_drafter(model: Model, weights: TargetWeights, vocab: int, path: Path) -> None:
    """A drafter of the real shapes for this target, random as JakiroNet's initialisation (in
    numpy: the GPU machine has no torch)."""
    cfg = JakiroConfig(target_name=model.name, target_vocab=model.n_vocab,
                       target_tokenizer=model.tokenizer_hash, d_model=model.n_embd,
                       n_heads=int(weights.arch_meta("attention.head_count")),
                       rope_theta=float(weights.arch_meta("rope.freq_base", 10000.0)),
                       draft_vocab=list(range(vocab)) if vocab < model.n_vocab else [])
    d, de, rng = cfg.d_model, cfg.d_expert, np.random.default_rng(0)
    shapes = {"fc.weight": (d, 2 * d), "q.weight": (d, d), "k.weight": (d, d), "v.weight": (d, d),
              "o.weight": (d, d), "router.weight": (cfg.n_experts, d)}
    for j in range(cfg.n_experts):
        shapes |= {f"experts.{j}.gate.weight": (de, d), f"experts.{j}.up.weight": (de, d),
                   f"experts.{j}.down.weight": (d, de)}
    state = {name: rng.normal(0.0, 0.5 / np.sqrt(shape[1]), shape).astype(np.float32) for name, shape in shapes.items()}
    state["fc.weight"][:, d:] += np.eye(d, dtype=np.float32)
    state |= {"fc.bias": np.zeros(d, np.float32), "norm.weight": np.ones(d, np.float32)}
    write_gguf(cfg, state, path, "q8_0")


def timed(fn, repeats: int = 15) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["layer", "head", "tree"], help="one part only")
    a = ap.parse_args()
    want = lambda part: a.only in (None, part)  # noqa: E731
    path = store.resolve(a.model)
    # On the GPUs where it fits, as the engine loads it: Jakiro's step runs on the target's device.
    model = Model(path, layers_that_fit(path, 1024))
    weights = TargetWeights(path)
    with Context(model, ContextConfig(n_ctx=1024, n_threads=a.threads)) as ctx:
        t_target = cost_curve(ctx).seconds[0]
    print(f"target single-token forward: {t_target * 1000:.1f} ms")
    print("| drafter part | ms | × target token |\n|---|---:|---:|")
    tmp = Path(tempfile.mkdtemp())
    for vocab in (32_000, model.n_vocab) if want("head") else (32_000,):
        gguf = tmp / f"d{vocab}.gguf"
        random_drafter(model, weights, vocab, gguf)
        rt = JakiroRuntime(gguf, model, n_ctx=512, n_threads=a.threads)
        d = model.n_embd
        if vocab != model.n_vocab and (want("layer") or want("tree")):
            ctx_feats = np.random.default_rng(1).normal(size=(256, d)).astype(np.float32)
            mask = np.triu(np.full((256, 256), -np.inf, np.float32), 1)
            rt.layer(ctx_feats, np.arange(256) + 100, np.arange(256), mask)  # a context of 256
            for rows in (1, 4) if want("layer") else ():
                def step():
                    m = np.zeros((rows, 256 + rows), np.float32)
                    rt.layer(ctx_feats[:rows], np.arange(rows) + 100, np.full(rows, 256), m)
                    rt.truncate(256)
                t = timed(step)
                print(f"| layer, {rows} row(s), after 256 positions | {t * 1000:.2f} | {t / t_target:.3f} |")
            last = rt.layer(ctx_feats[-1:], [7], [255], np.zeros((1, 257), np.float32))
            rt.truncate(256)
            for width, max_nodes in ((1, 8), (4, 16), (4, 32)) if want("tree") else ():
                forwards = []

                def grow():
                    forwards.append(rt.grow_tree(last, 257, width, 2, max_nodes, True, np.zeros(0))[3])
                t = timed(grow)
                per = t / (forwards[-1] + 1)  # the root's head pick, then each layer pass
                print(f"| tree: width {width}, {max_nodes} nodes, {forwards[-1]} layer passes | {t * 1000:.2f} | "
                      f"{t / t_target:.3f} ({per / t_target:.3f} a step) |")
        for rows in (1, 2, 8) if want("head") else ():
            feats = np.random.default_rng(2).normal(size=(rows, d)).astype(np.float32)
            t = timed(lambda: rt.logits(feats))
            print(f"| head over {vocab} tokens, {rows} row(s) | {t * 1000:.2f} | {t / t_target:.3f} |")


if __name__ == "__main__":
    main()
