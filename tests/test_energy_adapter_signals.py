"""`python -m controllers.energy_adapter` stops cleanly on SIGTERM (the kubelet) and Ctrl-C."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from envtest.ports import free_port
from tests.support.processes import ControllerProcess, write_kubeconfig


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_the_energy_adapter_exits_0_without_traceback_on_a_stop_signal(
    tmp_path: Path, stop_signal: int
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{free_port()}")
    adapter = ControllerProcess(
        [
            f"--kubeconfig={kubeconfig}",
            f"--prometheus=http://127.0.0.1:{free_port()}",
            "--interval=1s",
        ],
        module="controllers.energy_adapter",
    )
    try:
        adapter.wait_for("pass failed")  # running (and failing: nothing to reach), not importing
        code = adapter.stop(stop_signal)
    finally:
        adapter.kill()
    text = "\n".join(adapter.log())
    assert code == 0, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    name = signal.Signals(stop_signal).name
    assert adapter.log()[-1].endswith(f"energy adapter stopped on {name}"), text
