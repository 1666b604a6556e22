"""``python -m extender`` stops cleanly on Ctrl-C (SIGINT) and SIGTERM: exit 0, no traceback.

The service runs as a subprocess the way ``make run`` starts it, with SIGINT at its default
disposition as in a terminal (a test runner started in the background inherits SIGINT ignored,
which would hide what Ctrl-C does).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from envtest.ports import free_port
from tests.support.server import REPO_ROOT

STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


def restore_default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_extender(port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "extender", "--port", str(port), "--log-format", "json"],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=restore_default_sigint,
    )


def wait_healthy(process: subprocess.Popen[str], url: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("the extender did not answer /healthz in time")


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_extender_cleanly(stop_signal: signal.Signals) -> None:
    port = free_port()
    process = start_extender(port)
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}")
        process.send_signal(stop_signal)
        _, stderr = process.communicate(timeout=STOP_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "KeyboardInterrupt" not in stderr
    entries = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    listening = next(i for i, entry in enumerate(entries) if entry["msg"] == "listening")
    # After the service said it listens, one line says that it stopped and why: uvicorn's
    # lifecycle lines (startup complete, shutting down, ...) would only repeat ours.
    (stopped,) = entries[listening + 1 :]
    assert stopped["msg"] == "stopped"
    assert stopped["signal"] == stop_signal.name
