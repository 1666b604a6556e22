"""A Redfish BMC for benches and tests: sushy-tools' emulator, one system per node.

`RedfishEmulator` runs `sushy-emulator` with its fake driver (no libvirt) in a subprocess on
127.0.0.1 (`bench.support.redfish_bmc`, which sets the delay before a requested power state
shows), one ComputerSystem per node, optionally behind HTTP basic auth (bcrypt htpasswd, the
only kind it accepts), its state in a directory of its own. It stops with its context manager.
"""

from __future__ import annotations

import os
import pprint
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import requests

from envtest.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def stop_process(process: subprocess.Popen, timeout_s: float = 5.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class RedfishEmulator:
    """`sushy-emulator` (fake driver) serving one ComputerSystem per name."""

    def __init__(
        self,
        workdir: Path,
        systems: Iterable[str],
        *,
        power: str = "On",
        power_delay_s: tuple[int, int] = (0, 0),
        auth: tuple[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.systems = [
            {
                "uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
                "name": name,
                "power_state": power,
                "nics": [{"mac": f"52:54:00:00:00:{i + 1:02x}", "ip": f"127.0.0.{10 + i}"}],
            }
            for i, name in enumerate(systems)
        ]
        self.power_delay_s = power_delay_s
        self.auth = auth
        self._process: subprocess.Popen | None = None

    def system_path(self, name: str) -> str:
        uid = next(s["uuid"] for s in self.systems if s["name"] == name)
        return f"/redfish/v1/Systems/{uid}"

    def power_state(self, name: str) -> str:
        """The system's PowerState as the emulator reports it (On, Off)."""
        response = requests.get(self.url + self.system_path(name), auth=self.auth, timeout=5)
        response.raise_for_status()
        return response.json()["PowerState"]

    def _write_config(self) -> Path:
        lines = [
            "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'",
            f"SUSHY_EMULATOR_LISTEN_PORT = {self.port}",
            "SUSHY_EMULATOR_FAKE_DRIVER = True",
            f"SUSHY_EMULATOR_STATE_DIR = {str(self.workdir / 'state')!r}",
            "SUSHY_EMULATOR_FAKE_SYSTEMS = " + pprint.pformat(self.systems),
        ]
        if self.auth is not None:
            import bcrypt  # sushy-tools' own dependency; it accepts only bcrypt entries

            user, password = self.auth
            hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
            auth_file = self.workdir / "htpasswd"
            auth_file.write_text(f"{user}:{hashed}\n")
            lines.append(f"SUSHY_EMULATOR_AUTH_FILE = {str(auth_file)!r}")
        config = self.workdir / "emulator.conf"
        config.write_text("\n".join(lines) + "\n")
        return config

    def __enter__(self) -> RedfishEmulator:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        low, high = self.power_delay_s
        self._log = (self.workdir / "emulator.log").open("w")
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.support.redfish_bmc",
                "--power-delay",
                f"{low}:{high}",
                "--config",
                str(config),
            ],
            cwd=REPO,
            env=subprocess_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:  # the service root answers without auth once the app serves
            try:
                if requests.get(self.url + "/redfish/v1/", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if self._process.poll() is not None or time.monotonic() > deadline:
                stop_process(self._process)
                self._log.close()
                log = (self.workdir / "emulator.log").read_text()[-2000:]
                raise RuntimeError(f"sushy-emulator did not start:\n{log}")
            time.sleep(0.1)

    def __exit__(self, *exc_info: object) -> None:
        if self._process is not None:
            stop_process(self._process)
        self._log.close()
