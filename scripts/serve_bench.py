"""Chat completions through `localspec serve` against `localspec generate --chat`, same prompt
and settings, interleaved: tokens/s by the server's own timings and by the client's clock
(first streamed text to the last), against the command's.

    .venv/bin/python scripts/serve_bench.py -m qwen2.5-coder-1.5b-instruct --threads 2 --rounds 5
"""

import argparse
import json
import re
import socket
import statistics
import subprocess
import sys
import time

import httpx

PROMPT = "Write a Python function that parses a date in the format YYYY-MM-DD and explains each step."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "localspec.cli", "serve", "-m", a.model, "--threads",
                               str(a.threads), "--drafter", a.drafter, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    rows = []
    try:
        for r in range(a.rounds):
            out = subprocess.run([sys.executable, "-m", "localspec.cli", "generate", "-m", a.model, "--threads",
                                  str(a.threads), "--drafter", a.drafter, "--chat", "--max-tokens",
                                  str(a.max_tokens), PROMPT], capture_output=True, text=True, check=True)
            cli = float(re.search(r"([\d.]+) tokens/s", out.stderr)[1])
            body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": a.max_tokens,
                    "temperature": 0, "stream": True, "cache_prompt": False}
            first = last = None
            timings = {}
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as resp:
                for line in resp.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        first = first or time.perf_counter()
                        last = time.perf_counter()
                    timings = chunk.get("timings", timings)
            clock = (timings["predicted_n"] - 1) / (last - first)
            rows.append((cli, timings["predicted_per_second"], clock))
            print(f"round {r + 1}: localspec generate {cli:.2f} tok/s; server {timings['predicted_per_second']:.2f} "
                  f"(timings), {clock:.2f} (client's clock)", flush=True)
    finally:
        server.terminate()
        server.wait(30)
    print(f"\nserver / localspec generate, median of {a.rounds} interleaved rounds: "
          f"{statistics.median(s / c for c, s, _ in rows):.3f} (server timings), "
          f"{statistics.median(k / c for c, _, k in rows):.3f} (client's clock)")


if __name__ == "__main__":
    main()
