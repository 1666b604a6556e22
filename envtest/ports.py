"""Loopback ports for processes that bind them later: outside the kernel's ephemeral range.

A port found by binding port 0 comes from the ephemeral range, the same range the kernel draws
from for every outgoing connection. Between the moment a test picks it and the moment the
process promised it binds it (or binds it again: the control plane's extender port is served by
a new extender in each test), any client connection on the machine may take it, and the bind
fails with "Address already in use". Ports below the ephemeral range are never handed out that
way, so one picked here stays free unless something binds it on purpose.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL_LOW = 32768
LOWEST_PORT = 10000  # above the registered ports services commonly use
MAX_TRIES = 200

_given: set[tuple[int, int]] = set()  # (kind, port) this process handed out: never twice
_lock = threading.Lock()


def ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default when unreadable)."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LINUX_DEFAULT_EPHEMERAL_LOW


def _free(kind: int, port: int) -> bool:
    with socket.socket(socket.AF_INET, kind) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 nobody has bound, that no outgoing connection will take meanwhile.

    Falls back to a port the OS picks when the ephemeral range leaves no room below it.
    """
    high = ephemeral_low() - 1
    with _lock:
        if high > LOWEST_PORT:
            for _ in range(MAX_TRIES):
                port = random.randint(LOWEST_PORT, high)
                if (kind, port) not in _given and _free(kind, port):
                    _given.add((kind, port))
                    return port
        with socket.socket(socket.AF_INET, kind) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        _given.add((kind, port))
        return port
