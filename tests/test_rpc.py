"""The target over llama.cpp's RPC backend: `localspec rpc-server` on loopback holds its layers.

Engines that use RPC run in child processes: the devices they register are process-wide, and
losing a server ends the process that used it (as it should; that is tested here too)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

from localspec.bench.anchors import free_port
from localspec.cli import main
from localspec.errors import LocalspecError
from localspec.llama import rpc

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
LOCALSPEC = [sys.executable, "-m", "localspec.cli"]

# Greedy answers to PROMPTS, printed as JSON: plain, lookup and Jakiro, over `rpc` if given;
# and the devices Jakiro ran on.
ANSWERS = """
import json, sys
from localspec.drafters.spec import DrafterSpec
from localspec.engine import Done, Engine, EngineConfig, Request
rpc = tuple(sys.argv[2:])
# flash attention asked for: off by default here, llama.cpp's choice over RPC (a remote GPU's)
engine = Engine(EngineConfig(model=sys.argv[1], threads=1, rpc=rpc, n_ctx=1024, store="off", features=True,
                             flash_attn="on"))
out = {}
for drafter in ("none", "lookup", "jakiro@2"):
    for p in %r:
        done = [e for e in engine.generate(Request(prompt=p, max_tokens=48, drafter=DrafterSpec.parse(drafter)))
                if isinstance(e, Done)][0]
        out[drafter + " " + p] = done.tokens
out["jakiro devices"] = [rt.native.device for rt in engine.drafters.runtimes]
print(json.dumps(out))
""" % (PROMPTS,)


def start_server(threads: int = 1) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(LOCALSPEC + ["rpc-server", "--port", str(port), "--threads", str(threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    endpoint = f"127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            rpc.probe(endpoint, timeout=2)
            return proc, endpoint
        except LocalspecError:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("rpc-server did not come up")


@pytest.fixture
def server():
    proc, endpoint = start_server()
    yield proc, endpoint
    proc.kill()
    proc.wait()


def answers(small_path, *rpc_endpoints: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ANSWERS, str(small_path), *rpc_endpoints],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_greedy_over_rpc_equals_local_plain(small_path, server):
    """Every layer on the rpc-server (same build, same CPU kernels): plain and speculative
    greedy output over RPC is local plain decoding's, token for token. The drafter runs here."""
    _, endpoint = server
    local = answers(small_path)
    remote = answers(small_path, endpoint)
    for p in PROMPTS:
        assert remote["none " + p] == local["none " + p], p
        assert remote["lookup " + p] == local["none " + p], p
        assert remote["jakiro@2 " + p] == local["none " + p], p
    assert remote["jakiro devices"] == ["CPU"]


def test_unreachable_server_is_one_line(small_path):
    port = free_port()  # nothing listens there
    t = time.time()
    with pytest.raises(LocalspecError, match=f"cannot reach an rpc-server at 127.0.0.1:{port}: connection refused"):
        rpc.connect((f"127.0.0.1:{port}",))
    assert time.time() - t < 5
    assert not rpc.connected()
    out = subprocess.run(LOCALSPEC + ["generate", "-m", str(small_path), "--rpc", f"127.0.0.1:{port}", "hi"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("localspec: error: cannot reach an rpc-server")


@pytest.mark.unit
def test_silent_or_foreign_servers_are_one_line():
    """A port that accepts and never answers times out; one that answers something else is
    not taken for an rpc-server."""
    with socket.socket() as silent, socket.socket() as foreign:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()

        def answer_http():
            conn, _ = foreign.accept()
            conn.recv(100)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()
        threading.Thread(target=answer_http, daemon=True).start()
        with pytest.raises(LocalspecError, match="did not answer within 1 s"):
            rpc.probe(f"127.0.0.1:{silent.getsockname()[1]}", timeout=1)
        with pytest.raises(LocalspecError, match="is not a llama.cpp rpc-server"):
            rpc.probe(f"127.0.0.1:{foreign.getsockname()[1]}", timeout=5)


def test_server_lost_mid_request_ends_with_one_line(small_path):
    proc, endpoint = start_server()
    gen = subprocess.Popen(LOCALSPEC + ["generate", "-m", str(small_path), "--rpc", endpoint, "--threads", "1",
                                        "--drafter", "none", "--max-tokens", "4000", "Count from 1 to 1000:"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert gen.stdout.read(20)  # generating over RPC
        proc.kill()
        _, err = gen.communicate(timeout=120)
    finally:
        gen.kill()
        proc.wait()
    assert gen.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("localspec: lost the connection to an rpc-server"), err[-1000:]


def test_rpc_server_refuses_other_hosts_without_the_flag(capsys):
    assert main(["rpc-server", "--host", "0.0.0.0"]) == 1
    assert "no authentication" in capsys.readouterr().err


def test_rpc_server_port_in_use_is_one_line(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["rpc-server", "--port", str(taken.getsockname()[1])]) == 1
    assert "cannot listen on 127.0.0.1:" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a usage error (it was bind()'s OverflowError and its trace)
        main(["rpc-server", "--port", "99999"])
    assert capsys.readouterr().err.strip().endswith("argument --port: a port is 0 to 65535, not 99999")


@pytest.mark.unit
def test_endpoints_parse():
    assert rpc.parse("10.0.0.2:50052, box") == ("10.0.0.2:50052", "box:50052")
    with pytest.raises(LocalspecError, match="not HOST:PORT"):
        rpc.parse("box:port")


def test_chat_losing_its_server_gives_back_the_terminal_with_one_line(small_path, tmp_path):
    """The real chat app in a pseudo-terminal: when its rpc-server goes, the terminal is left
    usable and the line reaches it, though the app sends native stderr to its log."""
    proc, endpoint = start_server()
    env = dict(os.environ, LOCALSPEC_HOME=str(tmp_path), TERM="xterm-256color")
    pid, tty = pty.fork()
    if pid == 0:
        os.execve(sys.executable, LOCALSPEC + ["chat", "-m", str(small_path), "--rpc", endpoint,
                                               "--threads", "1", "--drafter", "none"], env)
    fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    screen = b""

    def read_until(done, seconds: float) -> None:
        nonlocal screen
        deadline = time.time() + seconds
        while not done() and time.time() < deadline:
            if select.select([tty], [], [], 0.5)[0]:
                try:
                    screen += os.read(tty, 65536)
                except OSError:  # the child is gone
                    return
    try:
        read_until(lambda: b"Ctrl+P: commands" in screen, 180)  # loaded, cost curve measured
        os.write(tty, b"Hi\r")
        read_until(lambda: b"tok/s" in screen, 120)  # answered over RPC
        assert b"tok/s" in screen, screen[-2000:]
        proc.kill()
        proc.wait()
        os.write(tty, b"And then?\r")
        read_until(lambda: False, 60)  # until the child exits
        _, status = os.waitpid(pid, 0)
    finally:
        proc.kill()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert os.waitstatus_to_exitcode(status) == 1
    tail = screen[screen.rindex(b"\x1b[?1049l"):].decode(errors="replace")  # after the app's screen
    assert "localspec: lost the connection to an rpc-server" in tail, tail
