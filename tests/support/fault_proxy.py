"""A TCP proxy on loopback in front of a real server, that can stall, reset, refuse or delay.

Connection faults a real server does not make on demand: a stream cut mid-flight, a server
that stops answering, connections refused for a while, answers slower than a client's timeout.
Bytes pass through untouched (TLS goes end to end, so the client still verifies the API
server's certificate)::

    with FaultProxy("127.0.0.1", api_port) as proxy:
        kubeconfig_through(kubeconfig, proxy.port, path)  # or configuration.host = proxy.url
        proxy.reset_connections()        # every open connection gets a TCP RST
        proxy.refuse()                   # new connections are reset at once...
        proxy.resume()                   # ... until this
        proxy.cut()                      # both: the route to the server is gone
        proxy.stall()                    # open and new connections stop moving bytes

`answer_delay_s` holds every chunk of the server's answers back that long (an extender slower
than kube-scheduler's `httpTimeout`); `listen_port` puts the proxy where clients already look.
One thread accepts, two threads per connection pump bytes; `stop()` closes everything.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from pathlib import Path

import yaml

_FORWARD, _STALL, _REFUSE = "forward", "stall", "refuse"
_POLL_S = 0.05


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a crashed peer or a middlebox does."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    """Forward loopback TCP connections to (host, port); see the module docstring."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        scheme: str = "https",
        *,
        listen_port: int = 0,
        answer_delay_s: float = 0.0,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.scheme = scheme
        self.answer_delay_s = answer_delay_s
        self.posts_forwarded = 0  # HTTP POST requests seen going upstream
        self._mode = _FORWARD
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._connections: list[tuple[socket.socket, socket.socket]] = []
        self._stopping = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", listen_port))
        self._listener.listen(64)
        self._listener.settimeout(_POLL_S)
        self.port = self._listener.getsockname()[1]
        self.accepted_total = 0
        self._thread = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    # ---- faults ---------------------------------------------------------------------------

    def stall(self) -> None:
        """Stop moving bytes on every connection, open or new, until `resume()`."""
        with self._lock:
            self._mode = _STALL
            self._flowing.clear()

    def refuse(self) -> None:
        """Reset every new connection at once until `resume()` (open ones are left alone)."""
        with self._lock:
            self._mode = _REFUSE

    def resume(self) -> None:
        with self._lock:
            self._mode = _FORWARD
            self._flowing.set()

    def cut(self) -> None:
        """The route to the server is gone: new connections refused, open ones reset."""
        self.refuse()
        self.reset_connections()

    def reset_connections(self) -> int:
        """RST every open connection on the client's side (and close upstream); how many."""
        with self._lock:
            connections, self._connections = self._connections, []
        for client, upstream in connections:
            _reset(client)
            _reset(upstream)
        return len(connections)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._flowing.set()
        self._thread.join(timeout=5)
        self._listener.close()
        self.reset_connections()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # ---- plumbing -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted_total += 1
            with self._lock:
                mode = self._mode
            if mode == _REFUSE:
                _reset(client)
                continue
            threading.Thread(
                target=self._connect, args=(client,), name="fault-proxy-conn", daemon=True
            ).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _reset(client)  # upstream down: the client sees its connection reset
            return
        upstream.settimeout(None)
        with self._lock:
            self._connections.append((client, upstream))
        for source, sink, answers in ((client, upstream, False), (upstream, client, True)):
            threading.Thread(
                target=self._pump,
                args=(source, sink, answers),
                name="fault-proxy-pump",
                daemon=True,
            ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while not self._stopping.is_set():
                self._flowing.wait()
                readable, _, _ = select.select([source], [], [], _POLL_S)
                if not readable:
                    continue
                if not self._flowing.is_set():
                    continue  # stalled after select: hold the bytes in the kernel's buffers
                data = source.recv(65536)
                if not data:
                    break
                if not answers:
                    with self._lock:
                        self.posts_forwarded += data.count(b"POST /")
                elif self.answer_delay_s and self._stopping.wait(self.answer_delay_s):
                    break
                sink.sendall(data)
        except (OSError, ValueError):
            pass  # reset or closed by the other pump, a fault, or stop()
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        self._forget(source)

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            for pair in self._connections:
                if sock in pair:
                    self._connections.remove(pair)
                    for end in pair:
                        with contextlib.suppress(OSError):
                            end.close()
                    break


def kubeconfig_through(kubeconfig: Path, port: int, path: Path) -> Path:
    """A copy of `kubeconfig` whose server is https://127.0.0.1:`port` (a `FaultProxy`)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
