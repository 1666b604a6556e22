"""Run the extender for benches (and tests): a real uvicorn server on 127.0.0.1.

Two ways, both on a port the OS picks (never a fixed one):

- ``serve_app(app)``: uvicorn in a thread of the calling process, so the caller can reach into
  the app's runtime (for example call ``ClusterState.pod_bound`` as the Pod watch would);
- ``run_extender(args)``: ``python -m extender --port 0 ...`` as a subprocess, the way an
  operator runs it; the URL is read from the service's own ``listening`` log line.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import uvicorn

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0


def bind_free_socket(host: str = "127.0.0.1") -> socket.socket:
    """A listening TCP socket on a port the OS chose."""
    # IPPROTO_TCP so that asyncio sets TCP_NODELAY (see extender.__main__.bind_socket).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


@contextlib.contextmanager
def serve_app(app: object) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a background thread; yield its base URL."""
    sock = bind_free_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start (see the log above)")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@dataclass
class ExtenderProcess:
    process: subprocess.Popen[str]
    url: str
    log_lines: list[str]


@contextlib.contextmanager
def run_extender(
    args: Sequence[str] = (), env: dict[str, str] | None = None, *, source: Path = REPO_ROOT
) -> Iterator[ExtenderProcess]:
    """Start ``python -m extender --port 0 <args>``; yield once it logged its URL.

    `source` is the checkout whose code runs (another revision's worktree, for a baseline).
    """
    command = [sys.executable, "-m", "extender", "--port", "0", "--log-format", "json", *args]
    environment = {**os.environ, **(env or {})}
    if source != REPO_ROOT:
        environment["PYTHONPATH"] = str(source)
    process = subprocess.Popen(
        command,
        cwd=source,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log_lines: list[str] = []
    url_found = threading.Event()
    found: dict[str, str] = {}

    def read_log() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            log_lines.append(line.rstrip("\n"))
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("msg") == "listening" and "url" in entry:
                    found["url"] = entry["url"]
                    url_found.set()

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not url_found.wait(0.05):
            if process.poll() is not None or time.monotonic() > deadline:
                reader.join(timeout=2)
                raise RuntimeError(
                    "python -m extender did not start:\n" + "\n".join(log_lines[-20:])
                )
        yield ExtenderProcess(process=process, url=found["url"], log_lines=log_lines)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(timeout=2)


def write_snapshot(path: Path, nodes: Sequence[Mapping[str, object]]) -> Path:
    """Write a contract-3 cluster snapshot file; returns its path."""
    path.write_text(json.dumps({"nodes": list(nodes)}, indent=1))
    return path
