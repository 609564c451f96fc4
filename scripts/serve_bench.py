"""Chat completions through `localspec serve` against `localspec generate --chat`, same prompt
and settings, interleaved: tokens/s by the server's own timings and by the client's clock
(first streamed text to the last), against the command's.

    .venv/bin/python scripts/serve_bench.py -m qwen2.5-coder-1.5b-instruct --threads 2 --rounds 5
"""

import json
import statistics
import sys
import time

import httpx
from measure import PROMPT, generate_tokens_per_second, options, start_server


def main() -> None:
    a = options(__doc__).parse_args()
    server, url = start_server("localspec serve", [sys.executable, "-m", "localspec.cli", "serve", "-m", a.model,
                                                   "--threads", str(a.threads), "--drafter", a.drafter])
    rows = []
    try:
        for r in range(a.rounds):
            cli = generate_tokens_per_second(a)
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
