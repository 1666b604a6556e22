"""Live node telemetry: poll Prometheus in the background and write it into `ClusterState`.

The power curves the extender answers from are tabulated at each node's current utilisation
and temperatures, so those must be read continuously, and never on the request path. Every
refresh interval this poller asks Prometheus for all nodes at once, one instant query per
metric, through `livedata.instant.read_instant`: the same queries, BMC sensor mapping and
instance-to-node mapping that produced the training data, so a node's features mean the same
thing at training and at serving time.

Each node with at least one value gets its `(values, observed_at_s)` written, one
`state.set_telemetry_many` per round, where `observed_at_s` is the time Prometheus evaluated the
queries. A poll is bounded in time: the per-request timeout is the poll budget split over its
queries (whole seconds, at least one), with no retries (the next poll is the retry). When
Prometheus cannot be read, the last values stay in the state untouched, so they age and count
as "no telemetry" once older than the TTL the state's readers apply; the failure is logged once
per streak and counted, and `last_success_at_s` / `consecutive_failures` feed `/readyz` and
`/metrics`. Nothing raises out of the polling thread.

A limit to know: an instant query still answers a gauge for Prometheus's lookback (5 minutes by
default) after its exporter stopped, stamped with the evaluation time. A dead node_exporter
shows sooner (its CPU rate vanishes after the rate window, and a node without `cpu_util` has no
usable telemetry); a dead ipmi_exporter's temperatures linger up to the lookback.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable

from extender.state import ClusterState
from livedata.collect_config import CollectConfig
from livedata.instant import read_instant
from livedata.metrics_table import VALUE_COLUMNS
from livedata.prometheus import CollectError

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 15.0
DEFAULT_POLL_TIMEOUT_S = 10.0
# Values copied from a node's reading into its telemetry: every measured contract-1 column.
TELEMETRY_COLUMNS: tuple[str, ...] = VALUE_COLUMNS

Clock = Callable[[], float]


def _queries_per_poll(config: CollectConfig) -> int:
    # CPU, temperature and power; plus node_uname_info when nodes are found through it.
    return 4 if config.node_from == "uname" else 3


class TelemetryPoller:
    """Background Prometheus poller feeding `ClusterState.set_telemetry`."""

    def __init__(
        self,
        config: CollectConfig | str,
        state: ClusterState,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float | None = None,
        clock: Clock = time.time,
    ) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        budget_s = min(DEFAULT_POLL_TIMEOUT_S, interval_s) if timeout_s is None else timeout_s
        if not (budget_s > 0 and math.isfinite(budget_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if isinstance(config, str):  # a bare Prometheus URL: the default queries and mapping
            config = CollectConfig(url=config)
        self.interval_s = float(interval_s)
        self.timeout_s = float(budget_s)
        # The poll's budget is shared by its queries, which run one after another.
        request_timeout_s = budget_s / _queries_per_poll(config)
        self._config = dataclasses.replace(config, timeout_s=request_timeout_s, retries=0)
        self._state = state
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.polls_total = 0
        self.failures_total = 0
        self.consecutive_failures = 0
        self.last_success_at_s: float | None = None
        self.last_error: str | None = None
        self.last_duration_s: float | None = None
        self.nodes_last_poll = 0

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="telemetry-poller", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop polling; waits for a poll in flight (bounded by the poll timeout)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=timeout_s if timeout_s is not None else self.timeout_s + 5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_once()
            # Keep the cadence: a slow poll shortens the wait, it does not add to the period.
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    # ---- one poll -------------------------------------------------------------------------

    def poll_once(self) -> bool:
        """Read every node's telemetry once; True when Prometheus answered. Never raises."""
        with self._lock:  # start() and a direct caller must not interleave their counters
            started = time.monotonic()
            try:
                readings = []
                for reading in read_instant(self._config, at_s=self._clock()):
                    values = {
                        column: reading.values[column]
                        for column in TELEMETRY_COLUMNS
                        if math.isfinite(reading.values[column])
                    }
                    if values:
                        readings.append((reading.node, values, reading.observed_at_s))
                # One state update per round: the curves are re-tabulated once, not per node.
                self._state.set_telemetry_many(readings)
                nodes = len(readings)
            except CollectError as error:
                self._failed(str(error))
                return False
            except Exception as error:  # a bug here must not kill the thread or the service
                log.exception("telemetry poll failed unexpectedly")
                self._failed(f"{type(error).__name__}: {error}")
                return False
            finally:
                self.polls_total += 1
                self.last_duration_s = time.monotonic() - started
            self._succeeded(nodes)
            return True

    def _succeeded(self, nodes: int) -> None:
        if self.consecutive_failures:
            log.info(
                "Prometheus telemetry recovered after %d failed polls", self.consecutive_failures
            )
        elif nodes == 0 and (self.nodes_last_poll != 0 or self.last_success_at_s is None):
            log.warning("Prometheus answered but no node has telemetry (exporters down?)")
        self.consecutive_failures = 0
        self.last_error = None
        self.nodes_last_poll = nodes
        self.last_success_at_s = self._clock()

    def _failed(self, message: str) -> None:
        if self.consecutive_failures == 0:
            log.warning("telemetry poll failed, keeping the last values: %s", message)
        else:
            log.debug("telemetry poll failed again: %s", message)
        self.consecutive_failures += 1
        self.failures_total += 1
        self.last_error = message

    def status(self) -> dict[str, object]:
        """Counters and health for /status, /readyz and /metrics (JSON-ready)."""
        return {
            "polls_total": self.polls_total,
            "failures_total": self.failures_total,
            "consecutive_failures": self.consecutive_failures,
            "last_success_at_s": self.last_success_at_s,
            "last_error": self.last_error,
            "last_duration_s": self.last_duration_s,
            "nodes_last_poll": self.nodes_last_poll,
        }
