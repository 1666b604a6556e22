"""Ports for processes that bind later come from below the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from envtest import ports


def test_a_port_lies_below_the_ephemeral_range_and_is_free() -> None:
    low = ports.ephemeral_low()
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        port = ports.free_port(kind)
        assert ports.LOWEST_PORT <= port < low
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_is_never_handed_out_twice() -> None:
    given = [ports.free_port() for _ in range(300)]
    assert len(set(given)) == len(given)


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        picks = iter([taken, taken + 1 if taken < 65535 else taken - 1])
        monkeypatch.setattr(ports.random, "randint", lambda _low, _high: next(picks))
        monkeypatch.setattr(ports, "ephemeral_low", lambda: 65536)
        monkeypatch.setattr(ports, "_given", set())
        assert ports.free_port() != taken


def test_no_room_below_the_range_falls_back_to_the_os(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", range_file)
    assert ports.ephemeral_low() == 1024
    assert 1024 <= ports.free_port() <= 65535


def test_an_unreadable_range_is_linuxs_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ports.ephemeral_low() == ports.LINUX_DEFAULT_EPHEMERAL_LOW
