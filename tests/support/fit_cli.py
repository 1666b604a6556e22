"""`python -m training.fit` as a user runs it, for the tests of the fitting CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_fit(*args: str, tmpdir: Path | None = None) -> subprocess.CompletedProcess:
    """Run the CLI quietly from the repository root, output captured; `tmpdir` becomes its
    TMPDIR (where a Prometheus collection spills its node-group files)."""
    env = {**os.environ, "TMPDIR": str(tmpdir)} if tmpdir is not None else None
    return subprocess.run(
        [sys.executable, "-m", "training.fit", *args, "--quiet"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def iso(seconds: float) -> str:
    """Unix seconds as the RFC 3339 time the CLI's --start/--end take."""
    return datetime.fromtimestamp(seconds, UTC).isoformat()
