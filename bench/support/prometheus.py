"""A real Prometheus server for benches and tests, started on 127.0.0.1 with known data.

The collector and the live telemetry poller talk to Prometheus over HTTP; mocking its API would
only test our idea of it. These helpers run Debian's `prometheus` binary instead (a missing
binary raises `PrometheusMissingError`; tests turn that into a skip, see
`tests/support/prometheus.py`):

- `write_openmetrics(samples)` turns `(name, labels, timestamp_s, value)` samples into the
  OpenMetrics text that `promtool tsdb create-blocks-from openmetrics` backfills;
- `start_prometheus(tmp_path, openmetrics_text=..., scrape_targets=...)` backfills that text
  and/or scrapes exporters the caller serves on 127.0.0.1, starts the server on a free port and
  waits until it is ready (bounded; the error carries the server's log tail);
- `set_scrape_targets(server, targets)` points a running server (started with
  `extra_args=RELOADABLE`) at targets that exist only after it, such as a service reading it;
- for data too large to hold as text (a 1,000-node fleet), write the file series by series
  with `openmetrics_series`, load it with `backfill(file, tmp_path / "prometheus" / "data")`
  and start the server on it with `start_prometheus(tmp_path)`.

Typical use::

    text = write_openmetrics([("power_watts", {"instance": "a:1"}, 1767571200, 250.0)])
    with start_prometheus(tmp_path, openmetrics_text=text) as prom:
        requests.get(f"{prom.url}/api/v1/query", params={"query": "power_watts", ...})
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import yaml

from envtest.ports import free_port

PROMETHEUS_BIN = "prometheus"
PROMTOOL_BIN = "promtool"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
# Backfilled blocks are often far older than "now"; time-based retention is measured from the
# newest block, so a live scrape would make old test blocks expire unless retention is huge.
RETENTION = "100y"

Sample = tuple[str, Mapping[str, str], float, float]


def prometheus_available() -> bool:
    """True when both the server and promtool binaries are on PATH."""
    return shutil.which(PROMETHEUS_BIN) is not None and shutil.which(PROMTOOL_BIN) is not None


PROMETHEUS_MISSING = (
    "needs the 'prometheus' and 'promtool' binaries "
    "(Debian/Ubuntu: apt-get install prometheus, or run scripts/ensure-prometheus)"
)


class PrometheusMissingError(RuntimeError):
    """The `prometheus` or `promtool` binary is not on PATH."""


def ensure_prometheus() -> None:
    """Raise PrometheusMissingError unless both binaries are on PATH."""
    if not prometheus_available():
        raise PrometheusMissingError(PROMETHEUS_MISSING)


# --------------------------------------------------------------------------------------------
# OpenMetrics text for backfilling


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    # repr keeps every bit: counters like 1e6 + 0.25 must come back exactly.
    return repr(float(value))


def _family_of(name: str, types: Mapping[str, str]) -> tuple[str, str]:
    """(family name, type) of a sample name: `x_total` is a counter `x` unless told otherwise."""
    if name in types:
        return name, types[name]
    if name.endswith("_total"):
        family = name.removesuffix("_total")
        return family, types.get(family, "counter")
    return name, "gauge"


def write_openmetrics(samples: Iterable[Sample], *, types: Mapping[str, str] | None = None) -> str:
    """OpenMetrics text (with `# TYPE` lines and the closing `# EOF`) for promtool backfilling.

    Each sample is `(metric_name, labels, timestamp_s, value)`, timestamps in Unix seconds. A
    name ending in `_total` is written as a counter (family without the suffix); every other
    name as a gauge; `types` maps a family name to another type. Samples may come in any order:
    they are grouped by family and written per series in ascending time, as promtool requires.
    """
    types = types or {}
    families: dict[str, tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], list]]] = {}
    for name, labels, timestamp_s, value in samples:
        family, kind = _family_of(name, types)
        _, series = families.setdefault(family, (kind, {}))
        key = (name, tuple(sorted(labels.items())))
        series.setdefault(key, []).append((float(timestamp_s), float(value)))

    parts: list[str] = []
    for family, (kind, series) in families.items():
        parts.append(f"# TYPE {family} {kind}\n")
        for (name, labels), points in series.items():
            parts.append(openmetrics_series(name, dict(labels), sorted(points)))
    parts.append("# EOF\n")
    return "".join(parts)


def openmetrics_series(
    name: str, labels: Mapping[str, str], points: Iterable[tuple[float, float]]
) -> str:
    """The sample lines of one series, `(timestamp_s, value)` points in the order given
    (promtool wants ascending time). For writers that stream a file too large to build with
    `write_openmetrics`: write `# TYPE` once per family, all of its series, then `# EOF`."""
    label_text = ",".join(f'{k}="{_escape_label_value(str(v))}"' for k, v in sorted(labels.items()))
    head = f"{name}{{{label_text}}}" if label_text else name
    return "".join(
        f"{head} {_format_number(value)} {timestamp_s:.3f}\n" for timestamp_s, value in points
    )


# --------------------------------------------------------------------------------------------
# The server


class PrometheusServer:
    """A running Prometheus process; use as a context manager or call `stop()`."""

    def __init__(self, process: subprocess.Popen, url: str, data_dir: Path, log_path: Path):
        self.process = process
        self.url = url
        self.data_dir = data_dir
        self.log_path = log_path

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Terminate the server (kill it if it does not exit within a few seconds)."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_S)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the server wrote to stderr (for error messages)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def query(self, promql: str, *, at_s: float | None = None, timeout_s: float = 5.0) -> list:
        """Instant query through the HTTP API; returns `data.result` (for test set-up checks)."""
        params = {"query": promql}
        if at_s is not None:
            params["time"] = f"{at_s:.3f}"
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.load(response)["data"]["result"]

    def wait_for(self, promql: str, *, timeout_s: float = 20.0) -> list:
        """Poll an instant query until it returns at least one series (e.g. the first scrape).

        Raises TimeoutError with the server's log tail when nothing shows up in time.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no series for {promql!r} at {self.url} after {timeout_s:.0f} s; "
                    f"server log tail:\n{self.log_tail()}"
                )
            time.sleep(0.2)


def _duration(seconds: float) -> str:
    """Prometheus duration text for a number of seconds (millisecond resolution)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _write_config(path: Path, scrape_targets: Sequence[str], scrape_interval_s: float) -> None:
    interval = _duration(scrape_interval_s)
    config: dict = {"global": {"scrape_interval": interval, "evaluation_interval": interval}}
    if scrape_targets:
        config["scrape_configs"] = [
            {
                "job_name": "test",
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "static_configs": [{"targets": list(scrape_targets)}],
            }
        ]
    path.write_text(yaml.safe_dump(config, sort_keys=False))


RELOADABLE = ("--web.enable-lifecycle",)  # start_prometheus extra_args for `set_scrape_targets`


def set_scrape_targets(
    server: PrometheusServer, scrape_targets: Sequence[str], scrape_interval_s: float = 1.0
) -> None:
    """Make a running server scrape `scrape_targets` from now on (for targets that exist only
    after the server started, such as a service that reads this Prometheus). The server must
    have been started with `extra_args=RELOADABLE`."""
    _write_config(server.data_dir.parent / "prometheus.yml", scrape_targets, scrape_interval_s)
    request = urllib.request.Request(f"{server.url}/-/reload", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        if response.status != 200:
            raise RuntimeError(f"Prometheus at {server.url} refused the reload: {response.status}")


def backfill(
    source: Path, data_dir: Path, *, extra_args: Sequence[str] = (), timeout_s: float = 300.0
) -> None:
    """Load an OpenMetrics file into a Prometheus data directory with promtool (for data too
    large for `start_prometheus(openmetrics_text=...)`; start the server on it afterwards
    with `start_prometheus(tmp_path)`, whose data directory is `tmp_path/prometheus/data`)."""
    ensure_prometheus()
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            PROMTOOL_BIN, "tsdb", "create-blocks-from", "openmetrics",
            *extra_args, str(source), str(data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(
            f"promtool backfill of {source} failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[-2000:]}"
        )


def _wait_ready(server: PrometheusServer, timeout_s: float) -> bool:
    """True once /-/ready answers 200; False if the process died (e.g. port taken)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=1.0) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(
        f"Prometheus at {server.url} was not ready within {timeout_s:.0f} s; "
        f"log tail:\n{server.log_tail()}"
    )


def start_prometheus(
    tmp_path: Path,
    *,
    openmetrics_text: str | None = None,
    scrape_targets: Sequence[str] = (),
    scrape_interval_s: float = 1.0,
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> PrometheusServer:
    """Start Prometheus on a free 127.0.0.1 port, backfilled and/or scraping, and wait till ready.

    `openmetrics_text` (see `write_openmetrics`) is loaded with promtool before start;
    `scrape_targets` are `host:port` exporters (serve them on 127.0.0.1) scraped every
    `scrape_interval_s`. Everything lives under `tmp_path / "prometheus"`.
    """
    ensure_prometheus()
    workdir = Path(tmp_path) / "prometheus"
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir = workdir / "data"
    data_dir.mkdir(exist_ok=True)
    if openmetrics_text is not None:
        source = workdir / "backfill.om"
        source.write_text(openmetrics_text)
        backfill(source, data_dir)
    config_path = workdir / "prometheus.yml"
    _write_config(config_path, scrape_targets, scrape_interval_s)
    log_path = workdir / "prometheus.log"

    # The free port can be taken between our probe and the server's bind: retry a few times.
    for _attempt in range(3):
        port = free_port()
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [
                    PROMETHEUS_BIN,
                    f"--web.listen-address=127.0.0.1:{port}",
                    f"--storage.tsdb.path={data_dir}",
                    f"--config.file={config_path}",
                    f"--storage.tsdb.retention.time={RETENTION}",
                    *extra_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=workdir,
            )
        server = PrometheusServer(process, f"http://127.0.0.1:{port}", data_dir, log_path)
        if _wait_ready(server, ready_timeout_s):
            return server
        if "address already in use" not in server.log_tail(50):
            break
    raise RuntimeError(
        f"Prometheus exited during start-up (exit {server.process.returncode}); "
        f"log tail:\n{server.log_tail()}"
    )
