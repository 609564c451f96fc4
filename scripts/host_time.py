"""Host milliseconds per iteration outside the target's forward, measured alike on this commit
and on commits before the loop reported it (run it from a checkout of either): an
iteration's wall time, the caller's own work on the last one included, less the time in the
target's forward (llama_decode and the wait for its outputs). Where the loop reports it
(Iteration.host_seconds) that is its own account; before, the time between consecutive
iterations handed out less the time in the native decode.

    .venv/bin/python scripts/host_time.py -m qwen2.5-coder-1.5b-instruct --threads 2 \\
        --limit 3 --max-tokens 256 lookup suffix

`--cold`: what the forward leaves the host's Python (on a CPU backend the forward streams the
weights through every cache): the live curve's `observe`, which the loop calls right after
each verification forward, timed there and again at once (the same work on a warm cache),
and how many iterations replanned the curve.
"""

import argparse
import statistics
import time

from localspec import _native
from localspec.bench import workloads
from localspec.bench.runner import prompt_tokens
from localspec.drafters.spec import DrafterSpec
from localspec.engine import Engine, EngineConfig, Request
from localspec.llama import live
from localspec.sampling import SamplingConfig

in_decode = [0.0]
decode = _native.decode


def timed_decode(*args):
    t0 = time.perf_counter()
    try:
        return decode(*args)
    finally:
        in_decode[0] += time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workload", default="code-edit")
    p.add_argument("--limit", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--argmax", choices=["host", "device"], default=None, help="where greedy rows' argmax runs")
    p.add_argument("--cold", action="store_true", help="time the live curve's observe as the loop pays it and warm")
    p.add_argument("drafters", nargs="*", default=["none", "lookup", "suffix"])
    a = p.parse_args()

    _native.decode = timed_decode
    probe = cold_probe() if a.cold else None
    extra = {} if a.argmax is None else {"sample_on_device": a.argmax == "device"}
    # the whole cost curve, measured before any run is timed (not beside them, between requests)
    engine = Engine(EngineConfig(model=a.model, threads=a.threads, store=":memory:", whole_curve=True, **extra))
    engine.planning.prepare()
    prompts = [prompt_tokens(engine, p) for p in workloads.load(a.workload, a.limit)]
    for label in a.drafters:
        spec = DrafterSpec.parse(label)
        host: dict[int, list[float]] = {}
        for tokens in prompts:
            engine.ctx.clear()
            last = None
            request = Request(prompt=tokens, max_tokens=a.max_tokens, drafter=spec, sampling=SamplingConfig())

            def seen(it) -> None:
                nonlocal last
                now = time.perf_counter()
                if it.arm != "prompt" and last is not None:
                    if hasattr(it, "host_seconds"):  # the loop's own account (its iterations run end to end)
                        host.setdefault(1 + it.n_drafted, []).append(it.host_seconds)
                    else:
                        host.setdefault(1 + it.n_drafted, []).append(now - last - in_decode[0])
                in_decode[0] = 0.0
                last = now
            for _ in engine.generate(request, on_iteration=seen):
                pass
        every = [x for v in host.values() for x in v]
        print(f"{label}: host ms per iteration, median {1e3 * statistics.median(every):.3f} over {len(every)}; "
              f"by batch: " + " ".join(f"{b}:{1e3 * statistics.median(v):.2f}" for b, v in sorted(host.items())[:10]))
        if probe and probe["cold"]:
            print(f"  observe after the forward {1e6 * statistics.median(probe['cold']):.1f} us, at once again "
                  f"{1e6 * statistics.median(probe['warm']):.1f} us; replans {probe['replans']} in "
                  f"{len(probe['cold'])} forwards")
            probe.update(cold=[], warm=[], replans=0)


def cold_probe() -> dict:
    """Wrap LiveCurve.observe to run twice, each timed: on the curve, then on a twin made at
    its first forward that hears the same forwards (the same work, each curve learning each
    forward once); and count the replans (LiveCurve._choices)."""
    import copy

    probe = {"cold": [], "warm": [], "replans": 0}
    observe, choices = live.LiveCurve.observe, live.LiveCurve._choices
    twins: dict[int, live.LiveCurve] = {}

    def timed_observe(self, n, n_context, seconds):
        if id(self) not in twins:
            twins[id(self)] = copy.deepcopy(self)
        twin = twins[id(self)]
        for key, curve in (("cold", self), ("warm", twin)):
            t0 = time.perf_counter()
            observe(curve, n, n_context, seconds)
            probe[key].append(time.perf_counter() - t0)

    def counted_choices(self, base):
        probe["replans"] += 1
        return choices(self, base)
    live.LiveCurve.observe, live.LiveCurve._choices = timed_observe, counted_choices
    return probe


if __name__ == "__main__":
    main()
