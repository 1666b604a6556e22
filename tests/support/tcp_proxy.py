"""A TCP proxy on loopback that a test can cut: the network between a client and a server.

    with TcpProxy(("127.0.0.1", apiserver_port)) as proxy:
        ...  # the client talks to proxy.port (kubeconfig_through points a kubeconfig there)
        proxy.cut()      # open connections reset, new ones refused
        proxy.restore()  # the same port accepts again

Bytes pass through untouched (TLS included), so the client meets the real server; only the
network fails, as when a controller loses its route to the API server, without stopping a
server that other clients of the test session share.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from pathlib import Path

import yaml


class TcpProxy:
    """Forwards every connection to `target`; listening from construction on."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self.restore()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.cut()

    def restore(self) -> None:
        """Listen again on the same port (nothing to do while listening)."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and reset the open ones."""
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._connections = self._connections, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                connection.close()  # linger 0: a reset, as a broken route gives

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._connections += [client, server]
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    def _pipe(self, client: socket.socket, server: socket.socket) -> None:
        sockets = [client, server]
        try:
            while True:
                readable, _, _ = select.select(sockets, [], [], 1.0)
                for source in readable:
                    data = source.recv(65536)
                    if not data:
                        return
                    (server if source is client else client).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.close()


def kubeconfig_through(kubeconfig: Path, port: int, path: Path) -> Path:
    """A copy of `kubeconfig` whose server is https://127.0.0.1:`port` (a `TcpProxy`)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
