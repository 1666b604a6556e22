"""The node power controller as it ships, in a subprocess, for benches and tests.

`ControllerProcess` runs `python -m controllers.node_power --apply` as its ServiceAccount
power-aware-scheduler/power-node-controller (the manifests' RBAC) against an `envtest`
control plane, its log (stdout and stderr) in a file named after it; `secret_dir` writes the
BMC Secret as kubelet mounts it; `wait_until` and `wait_for` poll a condition (the latter
failing at once, with the log, if the controller died).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envtest import ControlPlane

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "power-aware-scheduler"
SCHEDULER = "power-aware-scheduler"
CONTROLLER_ACCOUNT = (NAMESPACE, "power-node-controller")
PASSWORD = "bmc-password-for-e2e"


def wait_until(check: Callable[[], Any], timeout_s: float = 20.0, what: str = "") -> Any:
    """Poll `check` until it returns something true; that value (AssertionError on timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.02)


class ControllerProcess:
    """`python -m controllers.node_power --apply <flags>` in a subprocess, its log in a file.

    Later flags win over earlier ones (argparse keeps the last value of a flag)."""

    def __init__(
        self,
        plane: ControlPlane,
        tmp_path: Path,
        secret_dir: Path,
        *flags: str,
        name: str = "e2e-controller",
    ) -> None:
        self.name = name
        self.log = tmp_path / f"{name}.log"
        kubeconfig = plane.service_account_kubeconfig(
            *CONTROLLER_ACCOUNT, tmp_path / f"{name}.kubeconfig"
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.argv = [
            sys.executable,
            "-m",
            "controllers.node_power",
            "--apply",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--scheduler-name={SCHEDULER}",
            f"--bmc-secret-dir={secret_dir}",
            f"--identity={name}",
            *flags,
        ]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                self.argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.lines()[-lines:])

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.process.returncode}:\n{self.tail()}"
            )

    def leading(self) -> bool:
        """Whether its log says it leads now (it started leading and has not stopped since)."""
        state = False
        for line in self.lines():
            if f"{self.name} started leading" in line:
                state = True
            elif "stopped leading" in line:
                state = False
        return state

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, the Lease is left to expire."""
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_for(
    controller: ControllerProcess, check: Callable[[], object], timeout_s: float, what: str
) -> object:
    """`wait_until`, failing at once with the controller's log if it died."""

    def checked() -> object:
        controller.check_alive()
        return check()

    return wait_until(checked, timeout_s, what)


def secret_dir(tmp_path: Path, addresses: dict[str, str], **extra: str) -> Path:
    """The BMC Secret as kubelet mounts it: one key per node, and `_defaults`."""
    directory = tmp_path / "bmc-secret"
    directory.mkdir()
    for node, address in addresses.items():
        lines = [f"address: {address}"] + [f"{k}: {v}" for k, v in extra.items()]
        (directory / node).write_text("\n".join(lines) + "\n")
    (directory / "_defaults").write_text(f"username: admin\npassword: {PASSWORD}\n")
    return directory
