"""llama.cpp's RPC backend: a target model spread over other machines running `rpc-server`.

Each endpoint is first asked for llama.cpp's RPC handshake here, with a timeout: ggml itself
aborts the process on a server it cannot reach or that speaks another protocol version. Then
its devices are registered in ggml's backend registry and a model that names the endpoint
loads its layers there (`Model(rpc=...)`); drafters' models stay on this machine. Once a
connection is up, ggml cannot recover from losing it: the process then says so in one line
and exits (`_native.rpc_exit_cleanly_on_abort`), and TCP keepalive bounds how long a vanished
server can keep a request waiting."""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
import threading

from localspec import _native
from localspec.errors import LocalspecError

DEFAULT_PORT = 50052  # llama.cpp's rpc-server's
PROTOCOL = _native.rpc_protocol  # (major, minor, patch) this build speaks
HELLO, CAPS = 14, 24  # ggml-rpc.cpp: RPC_CMD_HELLO and the size of its capabilities field
TIMEOUT = 10.0  # seconds to connect and to answer the handshake
# A server that stops answering is given up after KEEPALIVE[0] + KEEPALIVE[1] * KEEPALIVE[2]
# seconds of silence; its computing for longer is fine (its kernel answers keepalives).
KEEPALIVE = (10, 5, 4)

_devices: dict[str, list[int]] = {}  # endpoint -> its registered devices
_lock = threading.Lock()


def parse(endpoints: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """'HOST:PORT[,HOST:PORT...]' (or a list of them) as a tuple of endpoints; a bare HOST
    gets llama.cpp's default port."""
    parts = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        host, _, port = part.rpartition(":") if ":" in part else (part, ":", str(DEFAULT_PORT))
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise LocalspecError(f"'{part}' is not HOST:PORT")
        out.append(f"{host}:{int(port)}")
    return tuple(dict.fromkeys(out))


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed the connection")
        data += chunk
    return data


def probe(endpoint: str, timeout: float = TIMEOUT) -> tuple[int, int, int]:
    """The protocol version the rpc-server at `endpoint` speaks, or a one-line error."""
    host, port = _split(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(bytes([HELLO]) + struct.pack("<Q", CAPS) + bytes(CAPS))
            size, = struct.unpack("<Q", _recv_exact(s, 8))
            if size != 4 + CAPS:
                raise LocalspecError(f"{endpoint} is not a llama.cpp rpc-server (it answered the "
                                     "handshake with something else)")
            major, minor, patch = _recv_exact(s, size)[:3]
    except socket.timeout:
        raise LocalspecError(
            f"the rpc-server at {endpoint} did not answer within {timeout:.0f} s (it serves one "
            "client at a time: is another process using it?)") from None
    except ConnectionRefusedError:
        raise LocalspecError(f"cannot reach an rpc-server at {endpoint}: connection refused "
                             "(start one there: localspec rpc-server)") from None
    except OSError as e:  # ConnectionError from _recv_exact too
        raise LocalspecError(f"cannot reach an rpc-server at {endpoint}: {e.strerror or e}") from None
    if major != PROTOCOL[0] or minor > PROTOCOL[1]:
        raise LocalspecError(
            f"the rpc-server at {endpoint} speaks RPC protocol {major}.{minor}.{patch}, this "
            f"llama.cpp build {'.'.join(map(str, PROTOCOL))}: run the same llama.cpp version on both")
    return major, minor, patch


def connect(endpoints: tuple[str, ...]) -> list[int]:
    """The devices of these rpc-servers (addresses), registered on first use."""
    with _lock:
        for endpoint in endpoints:
            if endpoint not in _devices:
                probe(endpoint)
                _native.rpc_exit_cleanly_on_abort()
                try:
                    _devices[endpoint] = _native.rpc_add_server(endpoint)
                except RuntimeError as e:
                    raise LocalspecError(str(e)) from None
        return [d for e in endpoints for d in _devices[e]]


def connected() -> bool:
    return bool(_devices)


def keepalive(endpoints: tuple[str, ...]) -> None:
    """Keepalive on every connection to these servers (ggml opens them as it needs them:
    call after loading a model and after creating a context)."""
    if endpoints:
        _native.rpc_keepalive(list(endpoints), *KEEPALIVE)


def device_list(devices: list[int]) -> ctypes.Array:
    """A NULL-terminated ggml_backend_dev_t array for llama_model_params.devices."""
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


def serve(host: str, port: int, threads: int, cache_dir: str = "") -> None:
    """Serve this machine's devices until interrupted; a port that cannot be bound is one line."""
    try:
        host = socket.gethostbyname(host)  # ggml's server takes an IPv4 address
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise LocalspecError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    result: list[BaseException] = []

    def run() -> None:
        try:
            _native.rpc_serve(f"{host}:{port}", cache_dir, threads)
        except RuntimeError as e:
            result.append(LocalspecError(str(e)))

    server = threading.Thread(target=run, daemon=True)  # native code: the main thread keeps signals
    server.start()
    try:
        while server.is_alive():
            server.join(0.5)
    except KeyboardInterrupt:
        sys.stdout.flush()
        os._exit(0)  # the serving thread is in a blocking accept(): nothing to unwind
    if result:
        raise result[0]
    raise LocalspecError(f"the rpc-server at {host}:{port} stopped (llama.cpp said why above)")
