"""What a model's first start waits for before it can plan: the coarse cost curve it starts on
against the whole curve (what every first start waited for before), each measured in a fresh
LOCALSPEC_HOME, with how far the coarse one is from the whole one by batch size.

    .venv/bin/python scripts/startup_curve.py -m smollm2-135m-instruct --threads 2
"""

import argparse
import os
import tempfile
import time

os.environ["LOCALSPEC_HOME"] = tempfile.mkdtemp(prefix="startup-curve-")  # nothing cached

from localspec import store  # noqa: E402
from localspec.llama import Context, Model  # noqa: E402
from localspec.llama.context import ContextConfig  # noqa: E402
from localspec.llama.cost import cost_curve  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default="smollm2-135m-instruct")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=4096)
    a = p.parse_args()
    with Model(store.resolve(a.model)) as model, Context(model, ContextConfig(n_ctx=a.ctx, n_seq_max=8,
                                                                               n_threads=a.threads)) as ctx:
        t = time.perf_counter()
        quick = cost_curve(ctx, quick=True)
        t_quick = time.perf_counter() - t
        t = time.perf_counter()
        whole = cost_curve(ctx, refresh=True)
        t_whole = time.perf_counter() - t
    print(f"{model.path.stem}, {a.threads} threads: coarse curve {t_quick:.1f} s, whole curve {t_whole:.1f} s\n")
    print("| batch | coarse ms | whole ms | coarse / whole |\n|---:|---:|---:|---:|")
    for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
        print(f"| {n} | {quick.cost(n) * 1e3:.1f} | {whole.cost(n) * 1e3:.1f} | {quick.cost(n) / whole.cost(n):.2f} |")


if __name__ == "__main__":
    main()
