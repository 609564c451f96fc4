"""What decoding prompts in chunks at fixed positions costs: prefill speed of a 1,024-token
prompt (code from the standard library) in chunks of 32 ... 512 tokens, interleaved, median of
`--rounds`.

    .venv/bin/python scripts/prefill_chunks.py -m qwen2.5-coder-1.5b-instruct --threads 2
"""

import argparse
import statistics
import time

from localspec import store
from localspec.datasets import edit_source_files
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunks", default="32,64,128,256,512")
    a = ap.parse_args()
    chunks = [int(c) for c in a.chunks.split(",")]
    with Model(store.resolve(a.model)) as model, \
            Context(model, ContextConfig(n_ctx=a.tokens + 64, n_threads=a.threads)) as ctx:
        text = "".join(p.read_text() for p in edit_source_files().values())
        prompt = model.tokenize(text)[:a.tokens]
        times: dict[int, list[float]] = {c: [] for c in chunks}
        for _ in range(a.rounds):
            for c in chunks:
                ctx.clear()
                ctx.chunk = c
                t0 = time.perf_counter()
                ctx.prefill(prompt)
                times[c].append(time.perf_counter() - t0)
    base = statistics.median(times[max(chunks)])
    print(f"{model.path.stem}, {a.threads} threads, a {len(prompt)}-token prompt:")
    print("| chunk | tokens/s | time × chunk of " + str(max(chunks)) + " |\n|---:|---:|---:|")
    for c in chunks:
        t = statistics.median(times[c])
        print(f"| {c} | {len(prompt) / t:.0f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
