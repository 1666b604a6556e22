"""Timing extender requests as kube-scheduler sends them: the clients and the measurement.

`OneWriteClient` sends each request in one write, as Go's transport does; `measure` times a
block of requests and reads the server's own figure from `Server-Timing: app;dur=<ms>`.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np

SERVER_TIMING = re.compile(r"app;dur=([0-9.]+)")


@dataclass
class Result:
    name: str
    requests: int
    body_bytes: int
    server_ms: np.ndarray  # empty for endpoints without Server-Timing
    client_ms: np.ndarray
    wall_s: float

    def row(self) -> str:
        server = (
            f"{np.percentile(self.server_ms, 50):7.3f} {np.percentile(self.server_ms, 99):7.3f}"
            if self.server_ms.size
            else f"{'-':>7} {'-':>7}"
        )
        client = (
            f"{np.percentile(self.client_ms, 50):7.3f} {np.percentile(self.client_ms, 99):7.3f}"
        )
        return (
            f"{self.name:<31} {self.body_bytes / 1024:9.1f} {server}  {client} "
            f"{self.requests / self.wall_s:8.0f}"
        )


@dataclass
class RawResponse:
    """The parts of an ``httpx.Response`` that ``measure`` reads."""

    status_code: int
    headers: dict[str, str]
    text: str


class OneWriteClient:
    """An HTTP/1.1 keep-alive client that sends each request in one write, as Go does.

    kube-scheduler's transport buffers the request and writes headers and body back to back;
    httpx writes them in two calls with Python in between, and on a busy 2-core machine the
    server (whose clock starts before it reads the body) then waits for the second write.
    Answers must carry Content-Length (the service's always do).
    """

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        self.host = host
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, path: str, body: bytes) -> RawResponse:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + body)
        received = b""
        while b"\r\n\r\n" not in received:
            received += self._recv()
        raw_head, content = received.split(b"\r\n\r\n", 1)
        status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        while len(content) < length:
            content += self._recv()
        return RawResponse(int(status_line.split()[1]), headers, content.decode())

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


def measure(
    client: object,
    name: str,
    send: Callable[[], httpx.Response | RawResponse],
    body_bytes: int,
    count: int,
) -> Result:
    for _ in range(min(20, count)):  # warm-up: first-touch allocations, caches
        send()
    server_ms, client_ms = [], []
    wall_start = time.perf_counter()
    for _ in range(count):
        start = time.perf_counter()
        response = send()
        client_ms.append((time.perf_counter() - start) * 1e3)
        if response.status_code != 200:
            raise RuntimeError(f"{name}: HTTP {response.status_code}: {response.text[:200]}")
        timing = SERVER_TIMING.search(response.headers.get("server-timing", ""))
        if timing:
            server_ms.append(float(timing.group(1)))
    wall_s = time.perf_counter() - wall_start
    return Result(name, count, body_bytes, np.array(server_ms), np.array(client_ms), wall_s)
