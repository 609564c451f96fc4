"""Code completion as an editor drives it, against llama-server built from the same llama.cpp
(scripts/build-llama-tools.sh): every server gets the same requests, session by session in
turn. A session is llama.vim's pattern on the fim workload: the ring-buffer warm-up (n_predict
0 with the extra chunks), the completion, and the follow-up asked as if the suggestion had been
accepted. Reports median and p95 latency of completions and follow-ups per server, and whether
each server's completions are localspec plain decoding's.

    .venv/bin/python scripts/bench_fim_server.py -m qwen2.5-coder-1.5b-instruct --sessions 12
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from measure import start_server

from localspec import store
from localspec.bench.workloads import fim
from localspec.serve.app import ServeConfig

TOOLS = Path(__file__).resolve().parents[1] / "build" / "llama-tools"


def session_requests(p, n_predict: int) -> tuple[dict, dict, callable]:
    extra = [{"text": t, "filename": f, "time": 0} for f, t in p.extra]
    warm = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "",
            "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
            "response_fields": [""]}
    common = {"id_slot": 0, "input_extra": extra, "n_predict": n_predict, "temperature": 0.0,
              "top_k": 40, "top_p": 0.9, "stream": False, "cache_prompt": True}
    completion = common | {"input_prefix": p.prefix, "input_suffix": p.suffix, "prompt": p.prompt,
                           "n_indent": p.n_indent}

    def follow_up(content: str) -> dict:
        """As llama.vim asks once the suggestion is shown: the context as if it were accepted."""
        lines = (p.prompt + content).split("\n")
        last = lines[-1]
        prefix = p.prefix + "".join(line + "\n" for line in lines[:-1])
        indent = len(last) - len(last.lstrip())
        return common | {"input_prefix": prefix, "input_suffix": p.suffix, "prompt": last, "n_indent": indent}
    return warm, completion, follow_up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--json")
    ap.add_argument("--llama-server", default=str(TOOLS / "llama-server"),
                    help="llama-server binary (scripts/build-llama-tools.sh builds it)")
    a = ap.parse_args()
    model = str(store.resolve(a.model))
    ours = [sys.executable, "-m", "localspec.cli", "serve", "-m", model, "--threads", str(a.threads),
            "--ctx", str(a.ctx)]
    theirs = [a.llama_server, "-m", model, "-t", str(a.threads), "-c", str(a.ctx), "-np", "1",
              "-fa", "on", "--no-webui", "--host", "127.0.0.1",
              # its infill prompt keeps room for 2 × -n tokens of answer, as localspec serve's
              # does for 128 (ServeConfig.infill_predict): the same tokens for both
              "-n", str(ServeConfig.infill_predict)]
    configs = [("localspec plain", ours + ["--drafter", "none"]), ("localspec auto", ours),
               ("localspec lookup", ours + ["--drafter", "lookup"]),
               ("llama-server plain", theirs),
               ("llama-server ngram-simple", theirs + ["--spec-type", "ngram-simple"]),
               ("llama-server ngram-mod", theirs + ["--spec-type", "ngram-mod"])]
    servers = [(name, *start_server(name, cmd)) for name, cmd in configs]
    results = {name: {"completion": [], "follow-up": [], "texts": []} for name, _, _ in servers}
    try:
        for i, p in enumerate(fim(a.sessions)):
            warm, completion, follow_up = session_requests(p, a.n_predict)
            for name, _, url in servers:
                with httpx.Client(base_url=url, timeout=600) as c:
                    c.post("/infill", json=warm)
                    t0 = time.perf_counter()
                    first = c.post("/infill", json=completion).json()
                    t1 = time.perf_counter()
                    c.post("/infill", json=follow_up(first["content"])).json()
                    t2 = time.perf_counter()
                r = results[name]
                r["completion"].append(t1 - t0)
                r["follow-up"].append(t2 - t1)
                r["texts"].append(first["content"])
            print(f"session {i + 1}/{a.sessions}: " + ", ".join(
                f"{n} {results[n]['completion'][-1]:.2f}s" for n, _, _ in servers), flush=True)
    finally:
        for _, proc, _ in servers:
            proc.terminate()
            proc.wait(30)
    plain = results["localspec plain"]["texts"]
    print(f"\n{Path(model).stem}, {a.threads} threads, fim × {a.sessions}, n_predict {a.n_predict}, greedy\n")
    print("| server | completion median | p95 | follow-up median | p95 | same text as localspec plain |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        def q(xs, k):
            return statistics.quantiles(xs, n=20)[18] if k == 95 and len(xs) > 1 else statistics.median(xs)
        same = sum(x == y for x, y in zip(r["texts"], plain))
        print(f"| {name} | {q(r['completion'], 50):.2f} s | {q(r['completion'], 95):.2f} s | "
              f"{q(r['follow-up'], 50):.2f} s | {q(r['follow-up'], 95):.2f} s | {same}/{len(plain)} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": sys.argv[1:], "results": results}, indent=1))


if __name__ == "__main__":
    main()
