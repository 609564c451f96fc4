"""What the surface benchmarks share (scripts/chat_bench.py, bench_fim_server.py,
engine_overhead.py): their options, the command they are measured against, and starting a
server on a free loopback port. Run alone, it prints that command's figure: tokens/s of
`localspec generate --chat` for the shared prompt, `--rounds` times.

    .venv/bin/python scripts/measure.py -m qwen2.5-coder-1.5b-instruct --threads 2 --rounds 3
"""

import argparse
import re
import socket
import subprocess
import sys
import time

import httpx

PROMPT = "Write a Python function that parses a date in the format YYYY-MM-DD and explains each step."


def options(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    return ap


def generate_tokens_per_second(a: argparse.Namespace, prompt: str = PROMPT) -> float:
    """tokens/s of `localspec generate --chat` for the prompt, with the options' settings."""
    r = subprocess.run([sys.executable, "-m", "localspec.cli", "generate", "-m", a.model, "--threads",
                        str(a.threads), "--drafter", a.drafter, "--chat", "--max-tokens", str(a.max_tokens),
                        prompt], capture_output=True, text=True, check=True)
    return float(re.search(r"([\d.]+) tokens/s", r.stderr)[1])


def start_server(name: str, cmd: list[str]) -> tuple[subprocess.Popen, str]:
    """The server `cmd` on a free port (appended as --port), once /health answers 200."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited ({proc.returncode}): {' '.join(cmd)}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"{name} did not come up")


def main() -> None:
    a = options(__doc__).parse_args()
    for r in range(a.rounds):
        print(f"round {r + 1}: localspec generate --chat {generate_tokens_per_second(a):.2f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
