"""A controller process for end-to-end tests: started as users start it, read as it logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


class ControllerProcess:
    """`python -m <module> ...` as a subprocess; its log lines (stdout and stderr) as they come."""

    def __init__(self, args: list[str], module: str = "controllers.node_power") -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, "--log-format=text", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # This checkout's code, not whatever the shared venv's editable install points at.
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        self._reader = threading.Thread(target=self._read, name=f"{module}-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def log(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def matching(self, text: str) -> list[str]:
        return [line for line in self.log() if text in line]

    def wait_for(self, text: str, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.matching(text)
            if found:
                return found[0]
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no log line with {text!r}; log:\n" + "\n".join(self.log()))

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        self.process.send_signal(sig)
        code = self.process.wait(timeout_s)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path
