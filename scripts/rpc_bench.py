"""The target split between this machine and rpc-servers behind a link of 0, 1 and 5 ms round
trip: plain decoding against drafters, and llama-server --rpc with its n-gram speculation, on
the same split, in one `localspec bench` run per workload and delay; the cost curve per delay.

This kernel has no netem qdisc, so the delay comes from a relay in this script: it listens
where clients connect, holds every chunk for half the round trip in each direction, and
behind each client connection starts its own `localspec rpc-server` (an rpc-server serves one
client at a time, and the bench keeps ours and each llama-server configuration alive at once).

    .venv/bin/python scripts/rpc_bench.py --delays 0,1,5 --workloads edit-session:1,humaneval:4 \\
        --out docs/bench/rpc
    .venv/bin/python scripts/rpc_bench.py relay --port P --delay-ms D --threads T   (internal)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from localspec.bench.anchors import free_port

ROOT = Path(__file__).resolve().parents[1]
LOCALSPEC = [sys.executable, "-m", "localspec.cli"]


# --- the relay ---------------------------------------------------------------------------------

async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader to writer, each chunk leaving `delay` seconds after it arrived."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def read() -> None:
        while data := await reader.read(1 << 20):
            queue.put_nowait((loop.time() + delay, data))
        queue.put_nowait((0.0, b""))

    async def write() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    with contextlib.suppress(ConnectionError):
        await asyncio.gather(read(), write())
    with contextlib.suppress(ConnectionError, RuntimeError):
        writer.close()


def _no_delay(writer: asyncio.StreamWriter) -> None:
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _bridge(reader, writer, port: int, round_trip: float, tries: int = 1) -> None:
    """Join a client's connection to 127.0.0.1:port, `round_trip` seconds there and back
    (retrying the connection `tries` times, 0.1 s apart, while the server starts)."""
    _no_delay(writer)
    for attempt in range(tries):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            break
        except OSError:
            if attempt == tries - 1:
                writer.close()
                return
            await asyncio.sleep(0.1)
    _no_delay(up_writer)
    await asyncio.gather(_pipe(reader, up_writer, round_trip / 2), _pipe(up_reader, writer, round_trip / 2))


async def _serve_client(reader, writer, round_trip: float, threads: int) -> None:
    port = free_port()
    server = subprocess.Popen(LOCALSPEC + ["rpc-server", "--port", str(port), "--threads", str(threads),
                                           "--cache"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await _bridge(reader, writer, port, round_trip, tries=300)
    finally:
        server.terminate()
        server.wait()


def relay(port: int, delay_ms: float, threads: int) -> None:
    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: _serve_client(r, w, delay_ms / 1e3, threads), "127.0.0.1", port)
        async with server:
            await server.serve_forever()
    asyncio.run(main())


def round_trip_ms(delay_ms: float, n: int = 200) -> float:
    """The relay's measured round trip (median), against a bare echo server."""
    async def main() -> float:
        async def echo(r, w):
            _no_delay(w)
            while data := await r.read(1 << 16):
                w.write(data)
                await w.drain()
        backend = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = backend.sockets[0].getsockname()[1]

        front = await asyncio.start_server(lambda r, w: _bridge(r, w, port, delay_ms / 1e3), "127.0.0.1", 0)
        r, w = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
        _no_delay(w)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            w.write(b"x" * 64)
            await w.drain()
            await r.readexactly(64)
            times.append(time.perf_counter() - t)
        w.close()
        await asyncio.sleep(delay_ms / 1e3 + 0.05)  # the relay and the echo see the end and finish
        return 1e3 * statistics.median(times)
    return asyncio.run(main())


# --- the benchmark -----------------------------------------------------------------------------

@contextlib.contextmanager
def relays(n: int, delay_ms: float, threads: int):
    ports = [free_port() for _ in range(n)]
    procs = [subprocess.Popen([sys.executable, __file__, "relay", "--port", str(p), "--delay-ms",
                               str(delay_ms), "--threads", str(threads)]) for p in ports]
    try:
        for p in ports:  # listening?
            for _ in range(100):
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", p), 1):
                    break
                time.sleep(0.1)
        yield ",".join(f"127.0.0.1:{p}" for p in ports)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()


def run(cmd: list[str], out: Path | None) -> None:
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    with open(out, "w") if out else contextlib.nullcontext(None) as f:
        subprocess.run(cmd, check=True, stdout=f or None, cwd=ROOT)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")
    r = sub.add_parser("relay")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--delay-ms", type=float, required=True)
    r.add_argument("--threads", type=int, default=2)
    p.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--delays", default="0,1,5", help="round trips to inject, ms")
    p.add_argument("--servers", type=int, default=1, help="rpc-servers the offloaded layers spread over")
    p.add_argument("--gpu-layers", type=int, default=14, help="layers on the rpc-servers (of 28)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workloads", default="edit-session:1,humaneval:4", help="WORKLOAD:LIMIT,...")
    p.add_argument("--drafters", default="lookup,draft,auto")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--anchor", default="llama-server-ngram")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "rpc")
    a = p.parse_args()
    if a.command == "relay":
        relay(a.port, a.delay_ms, a.threads)
        return
    # Every process here shares two cores, as two machines would not: OpenMP's threads spin
    # for a while after each graph (libgomp's default) and would take the cores from the
    # process computing next (a 135M model's forward over RPC: 46 ms spinning, 9.5 ms not,
    # 8.3 ms all local). A short spin keeps each process's own speed.
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    a.out.mkdir(parents=True, exist_ok=True)
    common = ["-m", a.model, "--threads", str(a.threads), "--gpu-layers", str(a.gpu_layers)]
    for delay in (float(d) for d in a.delays.split(",")):
        tag = f"{delay:g}ms" + (f"-{a.servers}servers" if a.servers > 1 else "")
        print(f"relay round trip at {delay:g} ms injected: {round_trip_ms(delay):.2f} ms measured",
              file=sys.stderr, flush=True)
        with relays(a.servers, delay, a.threads) as endpoints:
            run(LOCALSPEC + ["cost", *common, "--rpc", endpoints, "--refresh"], a.out / f"cost-{tag}.md")
            for item in a.workloads.split(","):
                workload, _, limit = item.partition(":")
                drafters = [x for d in a.drafters.split(",") for x in ("--drafter", d)]
                anchors = ["--anchor", a.anchor] if a.anchor else []
                run(LOCALSPEC + ["bench", *common, "--rpc", endpoints, "--max-tokens", str(a.max_tokens),
                                 "--workload", workload, "--limit", limit or "4", *drafters, *anchors,
                                 "--json", str(a.out / f"{workload}-{tag}.json")],
                    a.out / f"{workload}-{tag}.md")


if __name__ == "__main__":
    main()
