"""The bench's outputs: a markdown table, a JSON file and a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from localspec.bench.runner import Config, Run


def _speedup(cfg: Config, base: float) -> float:
    return cfg.tokens_per_s / base if base else 0.0


def speedup_interval(cfg: Config, plain: Config, n: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """A 95% bootstrap interval of cfg's speedup over plain, resampling turns (each
    configuration's median run of each); None with fewer than 3 turns both ran."""
    pairs = [(c, p) for c, p in zip(cfg.runs, plain.runs) if not c.failed and not p.failed and c.seconds and p.seconds]
    if len(pairs) < 3:
        return None
    a = np.array([[c.n_timed, c.seconds, p.n_timed, p.seconds] for c, p in pairs])
    idx = np.random.default_rng(seed).integers(0, len(a), (n, len(a)))
    s = a[idx].sum(axis=1)
    ratio = (s[:, 0] / s[:, 1]) / (s[:, 2] / s[:, 3])
    lo, hi = np.percentile(ratio, [2.5, 97.5])
    return float(lo), float(hi)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def projected_speedups(configs: list[Config], curve) -> list[float | None]:
    """Each configuration's speedup over plain decoding with every forward priced on `curve`
    (None for anchors, whose iterations are not ours to price)."""
    base = configs[0].projected_tokens_per_s(curve)
    return [c.projected_tokens_per_s(curve) / base if c.spec is not None and base else None
            for c in configs]


def table(configs: list[Config], projected_on=None) -> str:
    """The bench's table; with a curve (projected_on), a column of each configuration's speedup
    with its forwards priced on that curve."""
    base = configs[0].tokens_per_s
    server_plain = next((c.tokens_per_s for c in configs if c.name == "llama-server plain"), None)
    projected = projected_speedups(configs, projected_on) if projected_on is not None else [None] * len(configs)
    rows = ["| config | tokens/s | speedup vs plain [95% interval] | τ | acceptance | host ms/iter | "
            + ("projected speedup | " if projected_on is not None else "") + "identical to plain | failed |",
            "|---|---:|---:|---:|---:|---:|" + ("---:|" if projected_on is not None else "") + "---:|---:|"]
    for c, proj in zip(configs, projected):
        n = len(c.runs)
        ident = [r.identical for r in c.ok_runs if r.identical is not None]
        ties = sum(1 for r in c.ok_runs if r.tie)
        ident_s = "-" if not ident else f"{sum(ident)}/{len(ident)}" + (f" (+{ties} at ties)" if ties else "")
        sp = f"{_speedup(c, base):.2f}×"
        interval = speedup_interval(c, configs[0]) if c is not configs[0] else None
        if interval:
            sp += f" [{interval[0]:.2f}–{interval[1]:.2f}]"
        if c.name.startswith("llama-server") and server_plain and c.name != "llama-server plain":
            sp += f" ({c.tokens_per_s / server_plain:.2f}× its plain)"
        tau = "-" if c.tau is None else f"{c.tau:.2f}"
        failed = sum(1 for r in c.runs if r.failed)
        host = "-" if c.host_ms is None else f"{c.host_ms:.2f}"
        proj_s = "" if projected_on is None else ("- | " if proj is None else f"{proj:.2f}× | ")
        rows.append(f"| {c.name} | {c.tokens_per_s:.2f} | {sp} | {tau} | {_pct(c.acceptance)} | {host} | "
                    f"{proj_s}{ident_s} | {failed}/{n} |")
    return "\n".join(rows)


def copy_ceiling(configs: list[Config]) -> float | None:
    """The speedup over plain decoding that a clairvoyant copier would reach on the cost curve
    (bench/ceiling.py), over every turn; None when it was not computed (T > 0)."""
    pairs = [r.ceiling for r in configs[0].ok_runs if r.ceiling]
    spent = sum(c for _, c in pairs)
    return sum(p for p, _ in pairs) / spent if pairs and spent else None


def ceiling_line(configs: list[Config]) -> str:
    c = copy_ceiling(configs)
    return "" if c is None else (
        f"copy ceiling: {c:.2f}× plain (a clairvoyant drafter copying from the request and the store, "
        "free, on this cost curve: no lookup or suffix drafter can do better)")


def to_json(configs: list[Config], meta: dict, projected_on=None) -> dict:
    base = configs[0].tokens_per_s
    projected = projected_speedups(configs, projected_on) if projected_on is not None else [None] * len(configs)
    return {"meta": {**meta, "copy_ceiling": copy_ceiling(configs)}, "configs": [{
        "name": c.name, "drafter": c.drafter, "tokens_per_s": c.tokens_per_s,
        "speedup": _speedup(c, base), "speedup_95": speedup_interval(c, configs[0]) if i else None,
        "projected_speedup": projected[i],
        "projected_ms": projected_on and {k: 1e3 * v for k, v in c.projected_seconds(projected_on).items()},
        "tau": c.tau, "acceptance": c.acceptance, "drafted": c.total("drafted"),
        "accepted": c.total("accepted"), "forwards": c.total("forwards"), "host_ms": c.host_ms,
        "host_ms_by_batch": c.by_batch("host"), "iteration_ms_by_batch": c.by_batch("iteration"),
        "forward_ms_by_batch": c.by_batch("forward"), "forward_ms_by_streak": c.by_streak(),
        "forward_share": c.forward_share,
        "identical": sum(1 for r in c.ok_runs if r.identical),
        "ties": sum(1 for r in c.ok_runs if r.tie), "n": len(c.runs), "ran": c.ran,
        "failed": [r.failed for r in c.runs if r.failed],
        "runs": [_turn(r) for r in c.runs]} for i, c in enumerate(configs)]}


def _turn(r: Run) -> dict:
    """One turn's run (a prompt's median one; a session's turns in order), so that a table's
    ratio can be traced to the turns that make it; and every repeat's seconds and tokens (the
    spread)."""
    return {"tokens": r.n_timed, "seconds": r.seconds, "forwards": r.forwards, "drafted": r.drafted,
            "accepted": r.accepted, "identical": r.identical, "failed": r.failed,
            "repeat_seconds": [seconds for seconds, _ in r.repeats],
            "repeat_tokens": [tokens for _, tokens in r.repeats]}


def write_json(configs: list[Config], meta: dict, path: Path, projected_on=None) -> None:
    path.write_text(json.dumps(to_json(configs, meta, projected_on), indent=2))


def chart(configs: list[Config], title: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = configs[0].tokens_per_s
    names = [c.name for c in configs]
    speed = [_speedup(c, base) for c in configs]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.2))
    colors = ["#888" if n == "plain" else "#c55" if n.startswith(("llama-", "llama-cpp")) else "#37a"
              for n in names]
    ax.barh(names[::-1], speed[::-1], color=colors[::-1])
    ax.axvline(1.0, color="black", lw=0.8)
    for y, v in enumerate(speed[::-1]):
        ax.text(v, y, f" {v:.2f}×", va="center", fontsize=8)
    ax.set_xlabel("speedup vs localspec plain decoding (same run)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def phase_utilities(requests: list[list]) -> list[float]:
    """Per iteration (loop.Iteration) of these requests in turn, the utility of the phase it
    belonged to, as Cascade measures it: the phase's tokens per second against plain
    decoding's (its latest plain phase before, in this request or an earlier one, as Cascade
    carries it; NaN until there is one)."""
    out, t_base = [], float("nan")
    for iterations in requests:
        i = 0
        while i < len(iterations):
            j = i
            while j < len(iterations) and iterations[j].phase == iterations[i].phase:
                j += 1
            tokens = sum(len(it.tokens) for it in iterations[i:j])
            seconds = sum(it.seconds for it in iterations[i:j])
            if iterations[i].arm == "plain" and tokens:
                t_base = seconds / tokens
            out += [tokens / seconds * t_base if seconds > 0 else float("nan")] * (j - i)
            i = j
    return out


def _arm_and_k(it) -> tuple[str, int]:
    """An iteration's drafter and K as the chart plots them: "lookup@8" -> ("lookup", 8);
    plain at K 0; a free drafter run outside Cascade because it was sure ("suffix", no K) by
    what it drafted."""
    if it.arm == "plain":
        return "", 0
    name, _, k = it.arm.partition("@")
    return (name, int(k)) if k else (f"{name} (sure)", it.batch - 1)


def write_trace(requests: list[list], title: str, path: Path) -> None:
    """The trace `--trace` asks for: a PNG chart, or with a .json name the iterations
    themselves (per request, each iteration's arm, phase, times, what it drafted, the reach
    predicted per node and what verification accepted), for a study of its own."""
    if path.suffix.lower() == ".json":
        trace_json(requests, title, path)
    else:
        trace_chart(requests, title, path)


def trace_json(requests: list[list], title: str, path: Path) -> None:
    def record(it) -> dict:
        return {"arm": it.arm, "phase": it.phase, "drafter": it.drafter, "batch": it.batch,
                "n_past": it.n_past, "n_drafted": it.n_drafted, "n_accepted": it.n_accepted,
                "n_emitted": len(it.tokens), "seconds": it.seconds, "forward_seconds": it.forward_seconds,
                "draft_seconds": it.draft_seconds, "host_seconds": it.host_seconds,
                "tree_parents": [int(p) for p in it.tree.parents],
                "tree_reach": [round(float(r), 4) for r in it.tree.reach],
                "accepted_nodes": it.tree.path(it.tokens[:it.n_accepted])[0]}  # the path they walk
    data = {"title": title, "requests": [[record(it) for it in its] for its in requests]}
    path.write_text(json.dumps(data))


def trace_chart(requests: list[list], title: str, path: Path) -> None:
    """Cascade at work (as the paper's figures): per iteration, the utility of the trial or
    set phase it belonged to, and the arm it ran (K by drafter; plain at 0); requests side by
    side, separated by dotted lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    requests = [[it for it in its if it.arm != "prompt"] for its in requests]  # Cascade's iterations
    rows = [it for its in requests for it in its]
    utility = phase_utilities(requests)
    arms = [_arm_and_k(it) for it in rows]
    x = range(len(rows))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    top.step(x, utility, where="post", color="#37a", lw=1)
    top.axhline(1.0, color="black", lw=0.8)
    top.set_ylabel("utility (× plain speed)")
    top.set_title(title, fontsize=10)
    names = sorted({name for name, _ in arms})
    colors = dict(zip(names, ["#888", "#37a", "#c55", "#3a5", "#a7c"]))
    for name in names:
        pts = [(i, k) for i, (n, k) in enumerate(arms) if n == name]
        bottom.scatter(*zip(*pts), s=4, color=colors.get(name, "#000"), label=name or "plain")
    bottom.set_ylabel("K (draft tokens)")
    bottom.set_xlabel("iteration")
    bottom.legend(loc="upper right", fontsize=8, markerscale=3)
    start = 0
    for its in requests[:-1]:
        start += len(its)
        for ax in (top, bottom):
            ax.axvline(start, color="#bbb", lw=0.6, ls=":")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
