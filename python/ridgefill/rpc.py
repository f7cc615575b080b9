"""Multi-machine RidgeFill on llama.cpp's RPC backend.

    ridgefill-rpc-server -H 0.0.0.0 -p 50052          # on each remote machine (= ggml-rpc-server)
    ridgefill-server -m MODEL.ridgefill.gguf --ridgefill --rpc HOST:50052 -ngl 99
    ridgefill.Llama("MODEL.ridgefill.gguf", rpc_servers="HOST:50052", n_gpu_layers=99)

Offloaded layers, their KV cells and their RidgeFill maps live on the remote device; each ubatch's graph
and the activations between devices cross the network (docs/runtime.md, "Several machines").
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .errors import RidgefillError
from .server import Process, free_port


def parse_endpoints(spec: str) -> list[tuple[str, int]]:
    """"host:port,host:port" as upstream's --rpc takes it; anything else is a RidgefillError naming the part."""
    out = []
    for part in str(spec).split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RidgefillError(f"RPC server {part.strip()!r} is not host:port (in {spec!r})")
        out.append((host.strip("[]"), int(port)))
    return out


def check_endpoints(spec: str, timeout: float = 5.0) -> list[tuple[str, int]]:
    """Each endpoint accepts a TCP connection (upstream aborts the process when one does not)."""
    endpoints = parse_endpoints(spec)
    for host, port in endpoints:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as e:
            raise RidgefillError(f"cannot reach RPC server {host}:{port} ({e}); start it with "
                                 f"`ridgefill-rpc-server -H HOST -p {port}` on that machine") from None
    return endpoints


def add_servers(spec: str) -> int:
    """Register the RPC servers of `spec` as devices of this process (before loading a model)."""
    from ._lib import lib
    endpoints = check_endpoints(spec)
    n = lib().llama_ridgefill_add_rpc_servers(",".join(f"{h}:{p}" for h, p in endpoints).encode())
    if n < 0:
        raise RidgefillError(lib().llama_ridgefill_last_error().decode())
    return n


def rpc_server_binary() -> Path:
    path = Path(__file__).resolve().parent / "bin" / "ggml-rpc-server"
    if not path.is_file():
        raise RidgefillError(f"ggml-rpc-server is missing at {path}; this build has no RPC backend "
                             "(reinstall RidgeFill without -DGGML_RPC=OFF)")
    return path


def main(argv: list[str] | None = None) -> None:
    """`ridgefill-rpc-server`: upstream's ggml-rpc-server built with the fork (same flags: -H, -p, -t, -c)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        binary = rpc_server_binary()
    except RidgefillError as e:
        print(f"ridgefill-rpc-server: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    os.execv(binary, [str(binary), *argv])


class RpcServer(Process):
    """Runs ridgefill-rpc-server on 127.0.0.1 (a free port) for the duration of a `with` block."""

    def __init__(self, *args: str, threads: int = 1, ready_timeout: float = 60.0):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.args = ["-H", "127.0.0.1", "-p", str(self.port), "-t", str(threads), *args]
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    def __enter__(self) -> "RpcServer":
        self.proc = subprocess.Popen([str(rpc_server_binary()), *self.args], stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RidgefillError(f"ridgefill-rpc-server exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
            try:  # a connection without the RPC hello is dropped by the server
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RidgefillError(f"ridgefill-rpc-server did not start in {self.ready_timeout:.0f}s:\n{self.log()[-2000:]}")
