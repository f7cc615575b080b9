"""`ridgefill-server`: the patched llama-server, plus a helper that runs it for tests and benchmarks.

    ridgefill-server -m MODEL.gguf --port 8080      # same flags as llama-server

    with Server(model) as srv:                    # 127.0.0.1, a free port, health-checked
        requests.post(srv.url + "/completion", json={...})
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from .errors import RidgefillError
from .modelfile import check_gguf


def server_binary() -> Path:
    path = Path(__file__).resolve().parent / "bin" / "llama-server"
    if not path.is_file():
        raise RidgefillError(f"the patched llama-server is missing at {path}; reinstall RidgeFill")
    return path


def _model_arg(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a in ("-m", "--model") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--model="):
            return a.split("=", 1)[1]
    return os.environ.get("LLAMA_ARG_MODEL")


def _rpc_arg(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--rpc" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--rpc="):
            return a.split("=", 1)[1]
    return os.environ.get("LLAMA_ARG_RPC")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        model = _model_arg(argv)
        if model:
            check_gguf(model)
        rpc = _rpc_arg(argv)
        if rpc:
            from .rpc import check_endpoints
            check_endpoints(rpc)  # upstream aborts on an endpoint that does not answer
        binary = server_binary()
    except RidgefillError as e:
        print(f"ridgefill-server: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    os.execv(binary, [str(binary), *argv])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A child process for the duration of a `with` block, its output kept for log(); stopped on exit."""
    proc: subprocess.Popen | None = None

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")


class Server(Process):
    """Runs ridgefill-server on 127.0.0.1 for the duration of a `with` block."""

    def __init__(self, model: str | Path, *args: str, ready_timeout: float = 180.0):
        self.model = str(check_gguf(model))
        self.args = list(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    def __enter__(self) -> "Server":
        cmd = [str(server_binary()), "-m", self.model, "--host", "127.0.0.1", "--port", str(self.port),
               *self.args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RidgefillError(f"ridgefill-server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RidgefillError(f"ridgefill-server did not become healthy in {self.ready_timeout:.0f}s")

    def get(self, path: str) -> dict:
        return http_get(self.url, path)

    def post(self, path: str, body: dict, timeout: float = 600) -> dict:
        return http_post(self.url, path, body, timeout)


def http_get(url: str, path: str, timeout: float = 60) -> dict:
    with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout) as r:
        return json.loads(r.read())


def http_post(url: str, path: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())
