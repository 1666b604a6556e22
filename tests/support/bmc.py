"""BMCs for tests, real and broken: a Redfish emulator, an IPMI endpoint, and misbehaving ones.

- `RedfishEmulator`: sushy-tools' `sushy-emulator` (`bench.support.bmc`, which benches share);
- `IpmiBmc`: pyghmi's BMC server in a subprocess on a loopback UDP port
  (`tests.support.ipmi_bmc`);
- `SilentTcpServer` (accepts connections, never answers: a hung Redfish BMC),
  `GarbageHttpServer` (answers every GET with a body of the test's choosing) and
  `SilentUdpServer` (swallows IPMI packets): the BMCs a controller must survive.

Every server binds loopback only and stops with its context manager.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.support.bmc import (
    REPO,
    RedfishEmulator,
    free_port,
    stop_process,
    subprocess_env,
)

__all__ = [
    "GarbageHttpServer",
    "IpmiBmc",
    "RedfishEmulator",
    "SilentTcpServer",
    "SilentUdpServer",
    "free_port",
]


class IpmiBmc:
    """pyghmi's BMC server (`tests.support.ipmi_bmc`) in a subprocess on a loopback UDP port."""

    def __init__(
        self,
        workdir: Path,
        *,
        user: str = "admin",
        password: str = "ipmi-test-password",
        power: str = "on",
        delay_s: float = 0.0,
        ignore_soft_off: bool = False,
    ) -> None:
        self.workdir = workdir
        self.user, self.password = user, password
        self.power, self.delay_s = power, delay_s
        self.ignore_soft_off = ignore_soft_off
        self.port = free_port(socket.SOCK_DGRAM)
        self.address = f"127.0.0.1:{self.port}"
        self.requests: list[str] = []  # power requests the BMC received, in order
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> IpmiBmc:
        self.workdir.mkdir(parents=True, exist_ok=True)
        password_file = self.workdir / f"ipmi-{self.port}.password"
        password_file.write_text(self.password)
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.ipmi_bmc",
                "--port",
                str(self.port),
                "--user",
                self.user,
                "--password-file",
                str(password_file),
                "--power",
                self.power,
                "--delay",
                str(self.delay_s),
                *(["--ignore-soft-off"] if self.ignore_soft_off else []),
            ],
            cwd=REPO,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self._process.stdout is not None
        first = self._process.stdout.readline()
        if "listening" not in first:
            stop_process(self._process)
            raise RuntimeError(f"IPMI BMC did not start: {first}{self._process.stdout.read()}")
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        return self

    def power_state(self) -> str:
        """ "on"/"off" as the chassis has it once the requests received so far are carried out
        (what a node's kubelet lives by; with `delay_s` it runs ahead of the chassis)."""
        power = self.power
        for request in list(self.requests):
            if request == "on":
                power = "on"
            elif request in ("off", "soft-off"):
                power = "off"
        return power

    def _read_log(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith("request "):
                self.requests.append(line.split(" ", 1)[1].strip())

    def __exit__(self, *exc_info: object) -> None:
        if self._process is not None:
            stop_process(self._process)
        if self._reader is not None:
            self._reader.join(5)


class SilentTcpServer:
    """Accepts TCP connections on loopback and never answers (a hung BMC)."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(16)
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        self._stop = threading.Event()

    def _accept(self) -> None:
        self._socket.settimeout(0.2)
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except OSError:
                continue
            self.connections.append(connection)

    def __enter__(self) -> SilentTcpServer:
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for connection in self.connections:
            connection.close()
        self._socket.close()


class GarbageHttpServer:
    """Answers every request with `answer(path) -> (status, content type, body)`."""

    def __init__(self, answer: Callable[[str], tuple[int, str, bytes]]) -> None:
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                server.paths.append(self.path)
                status, content_type, body = answer(self.path)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = _answer

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> GarbageHttpServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class SilentUdpServer:
    """Receives UDP datagrams on loopback and answers none (an IPMI BMC that is gone)."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._socket.getsockname()[1]}"
        self.datagrams = 0
        self._stop = threading.Event()

    def _receive(self) -> None:
        self._socket.settimeout(0.2)
        while not self._stop.is_set():
            try:
                self._socket.recvfrom(65536)
            except OSError:
                continue
            self.datagrams += 1

    def __enter__(self) -> SilentUdpServer:
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close()
