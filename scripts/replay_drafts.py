"""The suffix drafter's sizing replayed over the model's own plain answers, without timing
noise: `record` keeps a workload's prompts and greedy answers (per turn, sessions built on
plain decoding's answers, the store's warm documents); `replay` walks each answer as greedy
verification would, a proposal sized on a cost curve per iteration (the nodes the text
follows are accepted), and prices every verification on that curve, against plain decoding.
The drafter learns as it does in the engine (its store takes each answer after its turn).
Beside it, what the same proposals allow sized in hindsight (hindsight()), and with
`--breakdown` where the sized drafts win and lose, by rows drafted and accepted.
`--auto` runs the drafter inside Cascade as auto does (its test, set and plain phases priced
on the curve). `--graph-costs C,S` prices a GPU's change of batch shape and a shape's second
forward (C and S plain steps more; the engine's own LiveCurve then plans, learning them). `--own-long` / `--store-long` set the priors of 12-, 16- and 24-token matches (MatchAcceptance)
to compare settings on the same answers (with several recordings, their geometric mean per
curve: one recording's answers are few enough that a small change in sizing moves it by 1-2%
either way); `--set` changes a module's setting for the replay; `--choose-in-hindsight` has the drafter take whichever source's sized tree (the
request's own text or the store) the text follows further, where it would take the one it
predicts pays more (what that choice is worth at most). `live` runs a workload's turns in
the loop's own time, a drafter as localspec has it against with `--set` changes, alternated
per turn: whether a gain replayed on a curve holds where the forwards are real. `--ceiling M`:
beside each figure, the copy ceiling of a copier that must match M tokens to copy (1: the
bench's clairvoyant one; a lookup drafter matches at least 2). `--in-hindsight fresh|copy`:
the proposals made outside (or inside) a copy verified exactly as far as the text follows
them, the rest sized: which half of sizing leaves the gap to hindsight.

    .venv/bin/python scripts/replay_drafts.py record chat-session 4 /tmp/chat.json
    .venv/bin/python scripts/replay_drafts.py replay /tmp/chat.json /tmp/edit.json \\
        --curve ../shared/gpu/curves/h200-qwen3moe-30b-a3b-q4_k_m.json
    .venv/bin/python scripts/replay_drafts.py live edit-session 2 --set localspec.drafters.lookup.SHORT_CHAIN_COST=99
"""

import argparse
import bisect
import importlib
import importlib.util
import json
import statistics
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

from localspec.bench import workloads
from localspec.bench.ceiling import Corpus, copy_ceiling
from localspec.bench.runner import answers_cache, near_tie, run_ours, turns, warm_documents
from localspec.control.cascade import CascadeConfig
from localspec.control.controllers import CascadeController, controller_for
from localspec.drafters.base import Budget
from localspec.drafters.spec import NONE, DrafterSpec
from localspec.drafters.suffix import SuffixDrafter
from localspec.engine import Engine, EngineConfig
from localspec.llama.context import padded_shape
from localspec.llama.curve import POWERS_OF_TWO, read_curve, stable_shapes
from localspec.llama.live import LiveCurve
from localspec.sampling import SamplingConfig
from localspec.verify import DraftTree, depths_of

import numpy as np  # after localspec.llama (scripts/README.md)


def record(engine: Engine, workload: str, limit: int, out: Path) -> None:
    prompts, warm = workloads.load_warm(workload, limit)
    # The bench's cache of warm answers (humaneval-warm's are a hundred plain answers).
    data = {"warm": warm_documents(engine, warm, 128, answers_cache()), "turns": []}
    for p in prompts:
        steps = turns(engine, p)
        tokens = next(steps)
        while tokens is not None:
            answer, _ = run_ours(engine, tokens, DrafterSpec.parse("none"), 128, SamplingConfig())
            answer = [t for t in answer if not engine.model.is_eog(t)]
            data["turns"].append({"id": p.id, "prompt": tokens, "answer": answer})
            print(f"{p.id}: {len(tokens)} prompt tokens, {len(answer)} answered", flush=True)
            try:
                tokens = steps.send(engine.model.detokenize(answer)) if p.kind == "session" else None
            except StopIteration:
                tokens = None
    out.write_text(json.dumps(data))


class HindsightChoice(SuffixDrafter):
    """The suffix drafter taking, of its two sources' trees, the one the text (`future`, set
    before each proposal) follows further once sized; both sources are searched every time."""
    future: list[int] = []

    def propose(self, context: list[int], budget: Budget):
        self.acceptance.start(context)
        own, stored = self.lookup.propose(context, budget), self._from_store(context, budget)
        followed = [budget.size(t).walk(self.future)[0] if len(t) else -1 for t in (own, stored)]
        return stored if followed[1] > followed[0] else own


def drafter_for(engine: Engine, data: dict, own_long, store_long, hindsight_choice: bool = False) -> SuffixDrafter:
    """A suffix drafter over a store that holds the recording's warm documents."""
    store = engine.drafters.suffix_store()
    store.rollback(0)
    for doc in data["warm"]:
        store.add(doc)
    drafter = (HindsightChoice if hindsight_choice else SuffixDrafter)(store, fim_suffix=engine.model.special.fim_suf)
    # The three buckets before into_suffix_bucket are the long matches' (12, 16, 24+ tokens): only their priors change.
    for acceptance, long in ((drafter.lookup.acceptance, own_long), (drafter.acceptance, store_long)):
        if long:
            acceptance.prior[acceptance.into_suffix_bucket - len(long):acceptance.into_suffix_bucket] = np.asarray(long)[:, None]
    return drafter


def kind_of(n_drafted: int, n_accepted: int) -> str:
    """An iteration's kind for --breakdown: the rows it drafted, and how many were accepted."""
    rows = "1-2" if n_drafted <= 2 else "3-8" if n_drafted <= 8 else "9+"
    accepted = "none" if n_accepted == 0 else "part" if n_accepted < n_drafted else "all"
    return f"{rows} drafted, {accepted} accepted"


class Calibration:
    """Per depth and estimated reach, how often the text went through a proposal's nodes:
    every proposal, unsized, within the room its answer had left; apart for those made while
    the text was inside an earlier proposal's copy (IN_COPY tokens or more of it followed)."""

    DEPTHS = (1, 3, 9, 17, 33)  # each bin's first depth
    IN_COPY = 3

    def __init__(self):
        self.cells = defaultdict(lambda: [0, 0.0, 0])  # (in copy, depth bin, reach tenth): nodes, reach, followed

    def add(self, proposal: DraftTree, future: list[int], in_copy: bool, room: int) -> None:
        through = set(proposal.path(future)[0])  # the nodes the text went through
        for i, (depth, reach) in enumerate(zip(depths_of(proposal.parents.tolist()), proposal.reach.tolist())):
            if depth <= room:
                cell = self.cells[in_copy, bisect.bisect(self.DEPTHS, depth) - 1, min(int(reach * 10), 9)]
                cell[0], cell[1], cell[2] = cell[0] + 1, cell[1] + reach, cell[2] + (i in through)

    def print(self, min_nodes: int = 20) -> None:
        ends = (*self.DEPTHS[1:], 64)
        for in_copy in (False, True):
            print(f"    {'inside a copy' if in_copy else 'fresh'}: depth, then estimated -> followed (nodes) per tenth of reach")
            for b, (first, end) in enumerate(zip(self.DEPTHS, ends)):
                cells = [self.cells.get((in_copy, b, r)) for r in range(10)]
                print(f"      {first}-{end - 1}: " + "  ".join(f"{c[1] / c[0]:.2f}->{c[2] / c[0]:.2f} ({c[0]})"
                                                           for c in cells if c and c[0] >= min_nodes))


def replay(engine: Engine, data: dict, curve, own_long, store_long,
           breakdown: dict[str, list[float]] | None = None, hindsight_choice: bool = False,
           trace: bool = False, price_on=None, auto: bool = False,
           timing_noise: float = 0.0, calibration: Calibration | None = None,
           graph_costs: tuple[float, float] = (0.0, 0.0), settle: int = 0,
           shapes: tuple[int, ...] | None = None, in_hindsight: str = "") -> tuple[float, float]:
    """(speedup over plain decoding on `curve`, tokens per iteration). `breakdown` (a
    defaultdict of [0, 0, 0]) sums per kind of iteration (rows verified, how many accepted):
    iterations, forwards' time beyond a plain step's, tokens accepted. `trace`: a line per
    iteration, the nodes sized in and accepted against how far the unsized proposal is followed.
    `price_on`: another curve the forwards are priced on (what they cost), each batch at the
    width `curve` pads it to, exactly that many rows (its unpadded seconds). `auto`: the
    drafter runs inside Cascade as auto runs it (its set phases, plain phases and watched
    shadows), each iteration timed at the curve's price (the drafter's host time left out),
    times a lognormal factor of sigma `timing_noise` in what Cascade hears (a real loop's
    iterations vary; the speedup is priced without it). `calibration`: every proposal's nodes
    counted there. `graph_costs`: what a GPU's forward costs beyond the curve, in plain steps,
    at a change of batch shape and at the second forward of a shape (a new graph; the capture
    of its CUDA graph: the H200's MoE 0.87 and 2.0, its 7B 0.28 and 0.97), plain decoding in a
    run of its own paying neither; `settle`: Cascade's (CascadeConfig.settle); `shapes`: the
    padded shapes (default: the engine's, stable_shapes). `in_hindsight` ("fresh" or "copy"):
    the proposals made outside (or inside) a copy the text follows (Calibration.IN_COPY)
    verified exactly as far as the text follows them, the rest as sized: where sizing's gap
    to hindsight() lies."""
    drafter = drafter_for(engine, data, own_long, store_long, hindsight_choice)
    noise = np.random.default_rng(0)
    # With a GPU's graph costs the engine's own curve plans: corrected by what each forward
    # cost, in the shape it ran in, after the last forward's (LiveCurve, as in the engine).
    static, shapes = curve, shapes or stable_shapes(curve, POWERS_OF_TWO)
    if any(graph_costs):
        curve = LiveCurve(static)
        curve.pad_with(shapes)
    controller = CascadeController({"suffix": drafter}, curve, 8, CascadeConfig(settle=settle)) if auto else None
    t_spec = t_plain = 0.0
    n_iterations = n_tokens = 0
    for turn in data["turns"]:
        prompt, answer = turn["prompt"], turn["answer"]
        drafter.begin(prompt, SamplingConfig())
        if controller:
            controller.begin()
        pos = 1  # the prompt's forward gave the first token
        last_shape, run = 1, 3  # as in plain decoding's run
        while pos < len(answer):
            context = prompt + answer[:pos]
            here = curve.at(len(context))
            drafter.future = answer[pos:]  # read by HindsightChoice only
            if controller:
                choice = controller.choose(context, len(answer) - pos - 1)
                proposal = choice[2] if choice else DraftTree.empty()
                tree = choice[1].size(proposal) if choice else proposal
            else:
                budget = Budget(here, 8).within(len(answer) - pos - 1)
                proposal = drafter.propose(context, budget)
                tree = budget.size(proposal)
            in_copy = max(drafter.lookup.acceptance.copied, drafter.acceptance.copied) >= Calibration.IN_COPY
            if in_hindsight and len(proposal) and in_copy == (in_hindsight == "copy"):
                tree = followed_path(proposal, answer[pos:])
            n = tree.walk(answer[pos:])[0] if len(tree) else 0
            if calibration is not None and len(proposal):
                calibration.add(proposal, answer[pos:], in_copy, len(answer) - pos - 1)
            if trace:
                followed = proposal.walk(answer[pos:])[0] if len(proposal) else 0
                print(f"    {turn['id']} at {pos}: sized {len(tree)}, accepted {n}; "
                      f"proposed {len(proposal)}, followed {followed}"
                      + (f"; {controller.arm} ({controller.phase})" if controller else ""))
            if price_on is None:
                took = here.cost(1 + len(tree))
                t_plain += static.at(len(context)).cost(1) * (n + 1)  # a plain run's step
            else:
                actual = price_on.unpadded_at(len(context))
                took = float(actual[curve.pad_to(1 + len(tree), len(context)) - 1])
                t_plain += float(actual[0]) * (n + 1)
            if any(graph_costs):  # in the shape the engine pads to (verify.padded), priced exactly
                speculating = choice is not None if controller else True
                shape = padded_shape(shapes, curve.pad_to(1 + len(tree), len(context)) if speculating else 1 + len(tree))
                run, last_shape = run + 1 if shape == last_shape else 1, shape
                exact = (static if price_on is None else price_on).unpadded_at(len(context))
                took = float(exact[shape - 1]) + float(exact[0]) * (
                    graph_costs[0] if run == 1 else graph_costs[1] if run == 2 else 0.0)
                curve.observe(shape, len(context), took)
            t_spec += took
            if controller:
                controller.record(n + 1, took * float(np.exp(timing_noise * noise.standard_normal())), len(tree), n)
            if breakdown is not None and len(tree):
                sums = breakdown[kind_of(len(tree), n)]
                sums[0] += 1
                sums[1] += here.cost(1 + len(tree)) / here.cost(1) - 1
                sums[2] += n
            n_iterations, n_tokens, pos = n_iterations + 1, n_tokens + n + 1, pos + n + 1
        drafter.store.add(answer)
    return t_plain / t_spec, n_tokens / max(n_iterations, 1)


def followed_path(tree: DraftTree, future: list[int]) -> DraftTree:
    """The chain of `tree`'s nodes the text goes through: a proposal sized in hindsight."""
    nodes = tree.path(future)[0]
    return DraftTree(tree.tokens[nodes], np.arange(-1, len(nodes) - 1).astype(tree.parents.dtype), tree.reach[nodes])


def hindsight(engine: Engine, data: dict, curve, own_long, store_long) -> float:
    """The speedup the same proposals allow sized in hindsight: the drafter proposes at every
    position (unsized), and the cheapest way through each answer verifies at each step a
    prefix of the path the text follows (dynamic programming over positions). What sizing
    leaves on the table, next to replay()'s figure."""
    drafter = drafter_for(engine, data, own_long, store_long)
    t_best = t_plain = 0.0
    for turn in data["turns"]:
        prompt, answer = turn["prompt"], turn["answer"]
        drafter.begin(prompt, SamplingConfig())
        followed = []  # per position, how deep the text follows its proposal
        for pos in range(1, len(answer)):
            context = prompt + answer[:pos]
            budget = Budget(curve.at(len(context)), 8).within(len(answer) - pos - 1)
            tree = drafter.propose(context, budget)
            followed.append(tree.walk(answer[pos:])[0] if len(tree) else 0)
        best = [0.0] * (len(followed) + 1)  # best[i]: seconds from position i to the end
        for i in range(len(followed) - 1, -1, -1):
            here = curve.at(len(prompt) + 1 + i)
            best[i] = min(here.cost(1 + m) + best[min(len(followed), i + m + 1)] for m in range(followed[i] + 1))
            t_plain += here.cost(1)
        t_best += best[0]
        drafter.store.add(answer)
    return t_plain / t_best


def ceiling(data: dict, curve, min_match: int) -> float:
    """The copy ceiling over a recording's turns (the store as the drafter has it at each:
    the warm documents, then each answer after its turn), for a copier that must match
    min_match tokens (bench/ceiling.py: 1 is the clairvoyant one the bench reports)."""
    docs, t_plain, t_copy = list(data["warm"]), 0.0, 0.0
    for turn in data["turns"]:
        plain, copied = copy_ceiling(turn["answer"], turn["prompt"], Corpus(docs), curve, min_match)
        t_plain, t_copy = t_plain + plain, t_copy + copied
        docs.append(turn["answer"])
    return t_plain / t_copy


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a name inside a module
        return False


@contextmanager
def changed(settings: list[str]):
    """`module.NAME=value` or `module.Class.NAME=value` settings in force (value typed as the
    setting's own), then undone."""
    undo = []
    for setting in settings:
        path, value = setting.split("=", 1)
        owner_path, name = path.rsplit(".", 1)
        parts = owner_path.split(".")
        # the longest prefix that is a module, then attributes (a class's setting)
        i = next(i for i in range(len(parts), 0, -1) if is_module(".".join(parts[:i])))
        owner = importlib.import_module(".".join(parts[:i]))
        for attr in parts[i:]:
            owner = getattr(owner, attr)
        old = getattr(owner, name)
        undo.append((owner, name, old))
        setattr(owner, name, type(old)(float(value)) if isinstance(old, (int, float)) else value)
    try:
        yield
    finally:
        for module, name, old in reversed(undo):
            setattr(module, name, old)


def live(engine: Engine, workload: str, limit: int, settings: list[str], drafter: str,
         repeat: int, max_turns: int, max_tokens: int) -> None:
    """Per turn of a workload: plain decoding, then `drafter` as localspec has it (A) and with
    `settings` changed (B), `repeat` times in alternating order, the store rolled back before
    each run and each arm learning from its own runs only (as the bench keeps configurations
    apart); seconds per turn, and whether each differs from plain (at a measured tie or not)."""
    spec, sampling = DrafterSpec.parse(drafter), SamplingConfig()
    prompts, warm = workloads.load_warm(workload, limit)
    store = engine.drafters.suffix_store()
    for doc in warm_documents(engine, warm, max_tokens, answers_cache()):
        store.add(doc)
    drafters = engine.controller(spec).drafters
    learnt = {arm: {id(d): d.learned() for d in drafters} for arm in "AB"}
    # auto's Cascade keeps what it measured from request to request (its baseline, each arm's
    # utility, back-offs): each arm has its own, or a Cascade setting changed in B would
    # judge A's trials too. Both over the same drafters, whose learning is kept apart above.
    cascades = {"A": engine.controller(spec), "B": controller_for(
        spec, engine.drafters, engine.planning.prepare, engine.ctx.n_paths, engine.ctx.flat)}
    seconds = {"plain": [], "A": [], "B": []}  # per turn, summed over its runs
    n_turn = 0
    for prompt in prompts:
        steps = turns(engine, prompt)
        tokens = next(steps)
        while tokens is not None and (not max_turns or n_turn < max_turns):
            mark = store.checkpoint()
            plain, run = run_ours(engine, tokens, NONE, max_tokens, sampling)
            took, after = {"plain": run.seconds * repeat, "A": 0.0, "B": 0.0}, {}
            for r in range(repeat):
                for arm in "AB" if r % 2 == 0 else "BA":
                    store.rollback(mark)
                    for d in drafters:
                        d.relearn(learnt[arm][id(d)])
                    if spec.kind == "auto":
                        engine._cascades[spec] = cascades[arm]
                    with changed(settings if arm == "B" else []):
                        out, run = run_ours(engine, tokens, spec, max_tokens, sampling)
                    after[arm] = {id(d): d.learned() for d in drafters}  # the last repeat's
                    if out != plain:
                        at = next(i for i, (x, y) in enumerate(zip(out + [-1], plain + [-1])) if x != y)
                        tie = "a measured near-tie" if near_tie(engine, tokens, plain, out) else "NOT A TIE"
                        print(f"  {arm} differs from plain at token {at}: {tie}")
                    took[arm] += run.seconds
            learnt.update(after)  # each repeat ran from what its arm had learnt by the turn's start
            for arm, s in took.items():
                seconds[arm].append(s)
            n_turn += 1
            print(f"{prompt.id} turn {n_turn}: {len(tokens)} prompt tokens; seconds plain {took['plain']:.2f}, "
                  f"A {took['A']:.2f}, B {took['B']:.2f}", flush=True)
            store.rollback(mark)
            answer = [t for t in plain if not engine.model.is_eog(t)]
            store.add(answer)
            try:
                tokens = steps.send(engine.model.detokenize(answer)) if prompt.kind == "session" else None
            except StopIteration:
                tokens = None
    total = {arm: sum(s) for arm, s in seconds.items()}
    faster = sum(b < a_ for a_, b in zip(seconds["A"], seconds["B"]))
    print(f"{n_turn} turns: A {total['plain'] / total['A']:.3f}x plain, B {total['plain'] / total['B']:.3f}x plain; "
          f"B's speed / A's {total['A'] / total['B']:.3f} (B faster on {faster} of {n_turn} turns; "
          f"median turn {statistics.median(x / y for x, y in zip(seconds['A'], seconds['B'])):.3f})")



def measured_curve(engine: Engine):
    curve = engine.planning.prepare()
    return getattr(curve, "base", curve)  # a LiveCurve's measured curve, its corrections aside


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--threads", type=int, default=2)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="a workload's prompts and plain greedy answers, to a JSON file")
    r.add_argument("workload")
    r.add_argument("limit", type=int)
    r.add_argument("out", type=Path)
    s = sub.add_parser("replay", help="the suffix drafter sized per curve over recorded answers")
    s.add_argument("files", nargs="+", type=Path)
    s.add_argument("--curve", action="append", default=[], help="a cost curve file (default: this machine's)")
    floats = lambda text: tuple(float(x) for x in text.split(","))  # noqa: E731
    s.add_argument("--own-long", type=floats, help="priors of 12-, 16-, 24-token matches in the request's own text")
    s.add_argument("--store-long", type=floats, help="... and in the store")
    s.add_argument("--choose-in-hindsight", action="store_true",
                   help="take the source whose sized tree the text follows further")
    s.add_argument("--breakdown", action="store_true",
                   help="per kind of iteration (rows drafted, accepted): time spent against tokens won")
    s.add_argument("--set", action="append", default=[], dest="settings", metavar="MODULE.NAME=VALUE",
                   help="a setting changed for the replay, e.g. localspec.drafters.lookup.SHORT_CHAIN_COST=99")
    s.add_argument("--price-on", type=Path, help="a curve the forwards cost (each batch at the width --curve pads it to)")
    s.add_argument("--auto", action="store_true", help="the drafter inside Cascade, as auto runs it")
    s.add_argument("--timing-noise", type=float, default=0.0, metavar="SIGMA",
                   help="with --auto: each iteration's time as Cascade hears it varies by a lognormal factor")
    s.add_argument("--graph-costs", type=floats, default=(0.0, 0.0), metavar="CHANGE,SECOND",
                   help="a GPU's extra cost, in plain steps, at a change of batch shape and at a shape's second forward")
    s.add_argument("--shapes", type=lambda text: tuple(int(x) for x in text.split(",")),
                   help="with --graph-costs: the batch shapes padded to (default: the engine's)")
    s.add_argument("--settle", type=int, default=0, help="with --auto: Cascade's settle (plain steps left out of its baseline)")
    s.add_argument("--calibration", action="store_true",
                   help="per depth and estimated reach, how often the text went through the proposals' nodes")
    s.add_argument("--ceiling", action="append", type=int, default=[], metavar="M",
                   help="the copy ceiling beside each figure, for a copier that must match M tokens (1: the bench's)")
    s.add_argument("--in-hindsight", choices=("fresh", "copy"), default="",
                   help="proposals made outside (fresh) or inside a copy verified as far as the text follows them")
    s.add_argument("--trace", action="store_true",
                   help="per iteration: nodes sized in and accepted, against how far the unsized proposal is followed")
    v = sub.add_parser("live", help="a workload's turns run live: a drafter as it is against with --set changes")
    v.add_argument("workload")
    v.add_argument("limit", type=int, help="prompts (sessions) of the workload")
    v.add_argument("--set", action="append", default=[], dest="settings", metavar="MODULE.NAME=VALUE")
    v.add_argument("--drafter", default="auto")
    v.add_argument("--repeat", type=int, default=2, help="runs of each arm per turn, in alternating order")
    v.add_argument("--turns", type=int, default=0, help="stop after this many turns (0: all)")
    v.add_argument("--max-tokens", type=int, default=128)
    a = p.parse_args()
    # whole_curve: this machine's curve measured before a replay, not in the background beside it
    engine = Engine(EngineConfig(model=a.model, threads=a.threads, store=":memory:", whole_curve=True))
    if a.command == "record":
        record(engine, a.workload, a.limit, a.out)
        return
    if a.command == "live":
        live(engine, a.workload, a.limit, a.settings, a.drafter, a.repeat, a.turns, a.max_tokens)
        return
    # This machine's curve as measured: the engine plans on it corrected by what its loop's
    # forwards cost, saved after each run, which moved a replay by 11% between two invocations.
    curves = {Path(c).stem: read_curve(Path(c)) for c in a.curve} or {"this machine": measured_curve(engine)}
    speedups = defaultdict(list)  # per curve: (sized, in hindsight) per recording
    with changed(a.settings):  # for the whole replay
        for path in a.files:
            data = json.loads(path.read_text())
            for name, curve in curves.items():
                kinds = defaultdict(lambda: [0, 0.0, 0]) if a.breakdown else None
                calibration = Calibration() if a.calibration else None
                speedup, tau = replay(engine, data, curve, a.own_long, a.store_long, kinds, a.choose_in_hindsight,
                                      a.trace, read_curve(a.price_on) if a.price_on else None, a.auto,
                                      a.timing_noise, calibration, a.graph_costs, a.settle, a.shapes,
                                      a.in_hindsight)
                best = hindsight(engine, data, curve, a.own_long, a.store_long)
                ceilings = "".join(f"; copy ceiling after {m}-token matches {ceiling(data, curve, m):.3f}x"
                                   for m in a.ceiling)
                print(f"{path.stem}  {name}: {speedup:.3f}x plain, {tau:.2f} tokens an iteration; "
                      f"sized in hindsight {best:.3f}x{ceilings}", flush=True)
                speedups[name].append((speedup, best))
                if calibration:
                    calibration.print()
                for kind, (iterations, extra, tokens) in sorted((kinds or {}).items()):
                    print(f"    {kind}: {iterations} iterations, {extra:.1f} forwards' time more than "
                          f"plain steps, {tokens} tokens accepted, net {tokens - extra:+.1f}")
        if len(a.files) > 1:  # one figure per curve: a change that helps one recording and costs another shows
            for name, pairs in speedups.items():
                sized, best = (statistics.geometric_mean(column) for column in zip(*pairs))
                print(f"geometric mean of {len(pairs)}  {name}: {sized:.3f}x plain; sized in hindsight {best:.3f}x")


if __name__ == "__main__":
    main()
