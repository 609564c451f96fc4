"""Anchors: other people's speculative decoding, measured in the same run.

- llama-cpp-python's LlamaPromptLookupDecoding, through its Llama class;
- llama.cpp's llama-server (built by scripts/build-llama-tools.sh from the llama.cpp that
  llama-cpp-python vendors), each configuration in its own server on loopback.

An anchor that fails is recorded as failed for that prompt; it never stops the bench."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

from localspec.bench.runner import Run
from localspec.bench.workloads import Prompt
from localspec.errors import LocalspecError
from localspec.sampling import SamplingConfig

LLAMA_TOOLS = Path(__file__).resolve().parents[2] / "build" / "llama-tools"


class PromptLookupAnchor:
    """llama-cpp-python's own prompt lookup (a single numpy chain)."""

    kind = "anchor"

    def __init__(self, model_path: Path, n_ctx: int, threads: int, num_pred_tokens: int = 10):
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.name = f"llama-cpp-python lookup ({num_pred_tokens})"
        self.llm = llama_cpp.Llama(str(model_path), n_ctx=n_ctx, n_threads=threads or None,
                                   flash_attn=True, verbose=False,
                                   draft_model=LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens))

    def run(self, p: Prompt, tokens: list[int], max_tokens: int, sampling: SamplingConfig, repeat: int = 0):
        try:
            self.llm.reset()
            text, n, t_first = "", 0, None
            for chunk in self.llm.create_completion(
                    tokens, max_tokens=max_tokens, temperature=sampling.temperature,
                    top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p,
                    repeat_penalty=sampling.repeat_penalty, seed=sampling.seed, stream=True):
                if t_first is None:
                    t_first = time.perf_counter()
                text += chunk["choices"][0]["text"]
                n += 1
            # Timed from the first streamed token, as localspec's own runs are.
            return Run(n_tokens=n, n_timed=n - 1, seconds=time.perf_counter() - (t_first or 0)), text
        except Exception as e:  # noqa: BLE001 -- an anchor's crash is a result, not our error
            return Run(failed=f"{type(e).__name__}: {e}"[:200]), ""

    def close(self) -> None:
        self.llm.close()


# This llama.cpp speculates only with a --spec-type: a draft model (-md) alone is loaded and
# never used (before 2026-12-01 the draft configurations here ran plain decoding so).
SERVER_CONFIGS = {
    "llama-server plain": [],
    "llama-server draft n-max 3": ["--spec-type", "draft-simple", "--spec-draft-n-max", "3"],
    "llama-server draft n-max 8": ["--spec-type", "draft-simple", "--spec-draft-n-max", "8"],
    "llama-server ngram-simple": ["--spec-type", "ngram-simple"],
    "llama-server ngram-mod": ["--spec-type", "ngram-mod"],
    "llama-server ngram-cache": ["--spec-type", "ngram-cache"],
}
# Its flash attention off, as localspec runs a target on the CPU (engine.cpu_flash_attn): a
# later -fa wins over the "-fa on" every server starts with. Not in the "llama-server" group.
FA_OFF = {f"{n}-fa-off": SERVER_CONFIGS[n] + ["-fa", "off"] for n in ("llama-server plain", "llama-server ngram-mod")}
# Its n-gram speculation only (no draft model): what the suffix drafter is measured against.
NGRAM_CONFIGS = ["llama-server plain", "llama-server ngram-simple", "llama-server ngram-mod",
                 "llama-server ngram-cache"]
SERVER_GROUPS = {"llama-server": list(SERVER_CONFIGS), "llama-server-ngram": NGRAM_CONFIGS}
SERVER_CONFIGS |= FA_OFF
# Its speculation that learns across requests: ngram-mod's hash pool and ngram-cache's context
# cache keep every prompt and answer a server saw (common/speculative.cpp). A server asked the
# same prompt again copies its own earlier answer (HumanEval/100 three times: 29, 38, 73
# tokens/s), so `--repeat` runs each repeat of these on a server of its own (Replicas).
LEARNS_ACROSS_REQUESTS = {"llama-server ngram-mod", "llama-server ngram-mod-fa-off", "llama-server ngram-cache"}


def one_config(anchor: str) -> str:
    """`llama-server-ngram-mod` names the configuration `llama-server ngram-mod`."""
    return anchor.replace("llama-server-", "llama-server ", 1)


def write_ngram_cache(docs: list[list[int]], path: Path, n_min: int = 1, n_max: int = 4) -> None:
    """llama.cpp's lookup cache file (common/ngram-cache.cpp's common_ngram_cache_save) of
    these documents, as common_ngram_cache_update counts them: for every n-gram of 1 to 4
    tokens, how often each token followed it. llama-server's ngram-cache reads it as its
    dynamic cache (-lcd), the warm-up our suffix store gets."""
    counts: dict[tuple[int, ...], dict[int, int]] = {}
    for doc in docs:
        for n in range(n_min, n_max + 1):
            for i in range(n, len(doc)):
                part = counts.setdefault(tuple(doc[i - n:i]) + (-1,) * (4 - n), {})
                part[doc[i]] = part.get(doc[i], 0) + 1
    out = bytearray()
    for ngram, part in counts.items():
        out += struct.pack("<4ii", *ngram, len(part))
        for token, count in part.items():
            out += struct.pack("<ii", token, count)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))


def free_port() -> int:
    """A TCP port on loopback nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerAnchor:
    kind = "anchor"

    def __init__(self, name: str, model_path: Path, draft_path: Path | None, n_ctx: int,
                 threads: int, extra: list[str], rpc: tuple[str, ...] = (), n_gpu_layers: int = 0):
        binary = LLAMA_TOOLS / "llama-server"
        if not binary.exists():
            raise LocalspecError(f"{binary} is missing: run scripts/build-llama-tools.sh first")
        self.name = name
        self.port = free_port()
        cmd = [str(binary), "-m", str(model_path), "--host", "127.0.0.1", "--port", str(self.port),
               "-c", str(n_ctx), "-np", "1", "-fa", "on", "--no-webui"]
        if threads:
            cmd += ["-t", str(threads)]
        cmd += ["-ngl", str(n_gpu_layers)]  # the target's layers where ours are (its default fits its own)
        if rpc:  # a draft model stays here, as ours does
            cmd += ["--rpc", ",".join(rpc), "-devd", "none"]
        if "--spec-draft-n-max" in extra:
            cmd += ["-md", str(draft_path)]
        self.proc = subprocess.Popen(cmd + extra, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()
        if "--spec-type" in extra and not self._speculating():
            self.close()
            raise LocalspecError(f"{name}: llama-server started without speculative decoding "
                                 f"({' '.join(extra)})")

    def _wait_ready(self, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise LocalspecError(f"{self.name}: llama-server exited ({self.proc.returncode})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise LocalspecError(f"{self.name}: llama-server not ready after {timeout:.0f}s")

    def _speculating(self) -> bool:
        """Does its slot speculate (llama-server's /slots says so per slot)?"""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/slots", timeout=10) as r:
            return all(slot.get("speculative") for slot in json.loads(r.read()))

    def run(self, p: Prompt, tokens: list[int], max_tokens: int, sampling: SamplingConfig,
            ignore_eos: bool = False):
        body = {"prompt": tokens, "n_predict": max_tokens, "temperature": sampling.temperature,
                "ignore_eos": ignore_eos,
                "top_k": sampling.top_k, "top_p": sampling.top_p, "min_p": sampling.min_p,
                "repeat_penalty": sampling.repeat_penalty, "cache_prompt": False,
                "seed": sampling.seed if sampling.seed is not None else -1}
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion",
                                         json.dumps(body).encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=1800) as r:
                out = json.loads(r.read())
            t = out["timings"]
            # predicted_ms runs from the first token (the prompt's batch gave it) to the last:
            # the tokens after the first, as localspec's own runs count them; so are its
            # forwards, the prompt's included (each after it emits 1 + what it accepted)
            accepted = t.get("draft_n_accepted", 0)
            run = Run(n_tokens=t["predicted_n"], n_timed=max(0, t["predicted_n"] - 1),
                      seconds=t["predicted_ms"] / 1e3, drafted=t.get("draft_n", 0),
                      accepted=accepted, forwards=max(0, t["predicted_n"] - accepted))
            return run, out["content"]
        except Exception as e:  # noqa: BLE001
            return Run(failed=f"{type(e).__name__}: {e}"[:200]), ""

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Replicas:
    """One server configuration on a server per repeat where it learns across requests (else
    on one): every repeat then runs as its first did (each server saw the earlier prompts
    once, not this one), as every repeat of ours does (the bench rolls its suffix store back),
    and the bench's median compares like with like."""

    kind = "anchor"

    def __init__(self, name: str):
        self.name = name
        self.servers: list[ServerAnchor] = []

    def run(self, p: Prompt, tokens: list[int], max_tokens: int, sampling: SamplingConfig, repeat: int = 0):
        return self.servers[repeat % len(self.servers)].run(p, tokens, max_tokens, sampling)

    def close(self) -> None:
        for server in self.servers:
            server.close()


def make_anchors(names: list[str], model_path: Path, draft_path: Path | None, n_ctx: int,
                 threads: int, lookup_cache: Path | None = None, rpc: tuple[str, ...] = (),
                 n_gpu_layers: int = 0, repeat: int = 1) -> list:
    """`lookup_cache`: llama-server ngram-cache's dynamic cache (write_ngram_cache); `rpc`:
    the rpc-servers that hold `n_gpu_layers` of the target's layers; `repeat`: the bench's
    repeats, each of a configuration that learns across requests on its own server."""
    anchors: list = []
    try:
        for name in names:
            if name == "llama-cpp-python":
                anchors.append(PromptLookupAnchor(model_path, n_ctx, threads))
            elif name in SERVER_GROUPS or one_config(name) in SERVER_CONFIGS:
                for n in SERVER_GROUPS.get(name, [one_config(name)]):
                    extra = SERVER_CONFIGS[n]
                    if n == "llama-server ngram-cache" and lookup_cache is not None:
                        extra = extra + ["-lcd", str(lookup_cache)]
                    replicas = Replicas(n)
                    anchors.append(replicas)  # listed before its servers start: closed if one fails
                    for _ in range(repeat if n in LEARNS_ACROSS_REQUESTS else 1):
                        replicas.servers.append(ServerAnchor(n, model_path, draft_path, n_ctx, threads, extra,
                                                             rpc, n_gpu_layers))
            else:
                raise LocalspecError(f"unknown anchor '{name}' (llama-cpp-python, llama-server, llama-server-ngram, "
                                     "or one configuration: llama-server-plain, llama-server-ngram-mod, ...)")
    except BaseException:  # the servers started so far do not outlive the bench that failed
        for anchor in anchors:
            anchor.close()
        raise
    return anchors
