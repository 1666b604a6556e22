"""`python -m extender` stops cleanly on SIGTERM (Kubernetes stopping its pod) and Ctrl-C.

uvicorn re-raises the signal that stopped it once it has shut down; left alone, that ends the
process right there (SIGTERM: status 143; SIGINT: a KeyboardInterrupt traceback), before the
extender stops its runtime: the watches and pollers, and the Reward plugin's last save of what
it learned. The extender must instead stop its runtime, log `stopped` and exit 0.
"""

from __future__ import annotations

import json
import signal

import pytest

from tests.support.server import run_extender


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_stops_the_runtime_and_exits_0(stop: signal.Signals) -> None:
    with run_extender() as service:
        service.process.send_signal(stop)
        status = service.process.wait(timeout=30)
    # The log reader thread has read everything once run_extender has joined it.
    messages = [json.loads(line).get("msg") for line in service.log_lines if line.startswith("{")]
    assert status == 0, "\n".join(service.log_lines[-10:])
    assert "stopped" in messages
    assert not any("Traceback" in line for line in service.log_lines)
