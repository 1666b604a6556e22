"""The RTT matrix, kept in the background: Goldpinger through Prometheus and/or a static file.

The Delay plugin's background source (`Plugin.background`). Every refresh interval it

1. reads Goldpinger's histograms (live mode, `extender.sources.goldpinger`): one instant
   query, each caller-callee quantile over the window, mapped to nodes through the Node
   objects' addresses and the running pods (the Kubernetes watch's `PodIndex`). Each mapped
   link is remembered with the query's evaluation time and may be used for `max_age_s`; a
   link the next reads no longer return keeps its last value until then, so a Prometheus
   outage or a silent Goldpinger makes the matrix expire link by link instead of freezing;
2. reads the RTT file again if its modification time changed (`extender.sources.rtt_file`);
   a bad new file is logged and the previous one kept;
3. publishes an `extender.rtt.RttMatrix` (measured over static, symmetric, self at 0) under
   `RTT_SIGNAL` with `state.set_signal`.

A failed read is logged once per streak, counted, shown in `/status` and in
`power_aware_extender_delay_*` metrics; nothing raises out of the thread and nothing here is
on the request path. A bad RTT file at start-up raises `RttFileError` (the service refuses to
start on it, naming the file and entry).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extender.pods import EMPTY_POD_INDEX, PODS_SIGNAL, PodIndex
from extender.rtt import RTT_SIGNAL, RttLink, RttMatrix
from extender.sources.goldpinger import (
    DEFAULT_METRIC,
    DEFAULT_SELECTOR,
    DEFAULT_WINDOW,
    NodeResolver,
    bucket_rates_query,
    describe_unmapped,
    map_peers,
    peer_quantiles,
)
from extender.sources.rtt_file import RttFileError, read_rtt_file
from extender.state import ClusterState
from livedata.collect_config import CollectConfig, parse_duration_s
from livedata.prometheus import CollectError, PrometheusReader

log = logging.getLogger(__name__)

Clock = Callable[[], float]
METRIC_PREFIX = "power_aware_extender_delay"
UNMAPPED_EXAMPLES = 3
STARTUP_RETRY_S = 5.0


@dataclass(frozen=True)
class RttSourceSettings:
    """What to read and how long a value lasts (the Delay plugin's arguments)."""

    refresh_interval_s: float = 30.0
    max_age_s: float = 300.0
    rtt_file: Path | None = None
    goldpinger: bool = True  # read Goldpinger when a Prometheus URL is given (live mode)
    metric: str = DEFAULT_METRIC
    selector: str = DEFAULT_SELECTOR
    window: str = DEFAULT_WINDOW
    quantile: float = 0.5
    estimate: str = "upper"
    confidence: float = 0.95  # read an upper confidence bound of the quantile (0: the quantile)
    timeout_s: float = 10.0


class RttSource:
    """Background thread keeping the RTT matrix signal up to date; see the module docstring."""

    def __init__(
        self,
        settings: RttSourceSettings,
        state: ClusterState,
        *,
        prometheus_url: str | None = None,
        clock: Clock = time.time,
        registry: Any = None,
    ) -> None:
        self.settings = settings
        self._state = state
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.query = bucket_rates_query(settings.metric, settings.selector, settings.window)
        self._window_s = parse_duration_s(settings.window)  # rates x this = calls, for the bound
        self._prometheus: CollectConfig | None = None
        if settings.goldpinger and prometheus_url:
            self._prometheus = CollectConfig(
                url=prometheus_url, timeout_s=settings.timeout_s, retries=0
            )
        if self._prometheus is None and settings.rtt_file is None:
            raise ValueError(
                "Delay: no RTT source; give rttFile, or run in live mode (--prometheus-url) "
                "with goldpinger enabled"
            )
        # Directed links measured so far, (source, target) -> link; dropped once expired.
        self._measured: dict[tuple[str, str], RttLink] = {}
        self._static: list[RttLink] = []
        self._file_mtime_s: float | None = None
        self._refused_mtime_s: float | None = None
        self.matrix: RttMatrix | None = None
        # Counters and health, for /status and /metrics.
        self.polls_total = 0
        self.failures_total = 0
        self.consecutive_failures = 0
        self.last_success_at_s: float | None = None
        self.last_error: str | None = None
        self.last_links = 0
        self.unmapped_series = 0
        self.unmapped_examples: list[str] = []
        self.file_errors_total = 0
        self.last_file_error: str | None = None
        self._reads_counter: Any = None
        self._file_errors_counter: Any = None
        if settings.rtt_file is not None:
            self._static = read_rtt_file(settings.rtt_file)  # refuse to start on a bad file
            self._file_mtime_s = _mtime_s(settings.rtt_file)
            log.info(
                "RTT file read",
                extra={"rtt_file": str(settings.rtt_file), "links": len(self._static)},
            )
        if registry is not None:
            self._register_metrics(registry)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self.refresh()  # a first matrix before the first request, if the sources answer
        self._thread = threading.Thread(target=self._run, name="rtt-source", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=max(timeout_s, self.settings.timeout_s + 1.0))

    def _run(self) -> None:
        while not self._stop.wait(self._next_wait_s()):
            self.refresh()

    def _next_wait_s(self) -> float:
        # At start-up the Kubernetes watch may not have listed nodes and pods yet, so the first
        # reads map nothing: retry sooner until Goldpinger's links map to nodes.
        interval_s = self.settings.refresh_interval_s
        if self._prometheus is not None and self.last_links == 0:
            return min(interval_s, STARTUP_RETRY_S)
        return interval_s

    # ---- one refresh ----------------------------------------------------------------------

    def refresh(self) -> RttMatrix:
        """Read the sources once and publish the matrix; never raises."""
        with self._lock:
            now_s = self._clock()
            if self._prometheus is not None:
                self._read_goldpinger(now_s)
            if self.settings.rtt_file is not None:
                self._reload_file()
            try:
                matrix = self._publish(now_s)
            except Exception:  # a bug here must not kill the thread: keep the last matrix
                log.exception("building the RTT matrix failed; the previous one stays")
                matrix = self.matrix or RttMatrix.build(built_at_s=now_s)
            return matrix

    def _read_goldpinger(self, now_s: float) -> None:
        assert self._prometheus is not None
        self.polls_total += 1
        try:
            with PrometheusReader(self._prometheus) as reader:
                series = reader.instant(self.query, now_s)
        except CollectError as error:
            self._failed(str(error))
            return
        except Exception as error:  # never let the thread die
            log.exception("Goldpinger read failed unexpectedly")
            self._failed(f"{type(error).__name__}: {error}")
            return
        resolver = self._resolver()
        peers = peer_quantiles(
            series,
            self.settings.quantile,
            estimate=self.settings.estimate,
            confidence=self.settings.confidence,
            window_s=self._window_s,
        )
        mapped = map_peers(peers, resolver)
        expires_at_s = now_s + self.settings.max_age_s
        for (source, target), rtt_ms in mapped.rtt_ms.items():
            self._measured[(source, target)] = RttLink(source, target, rtt_ms, now_s, expires_at_s)
        self._note_unmapped(mapped.unmapped, resolver)
        self.last_links = len(mapped.rtt_ms)
        if self.consecutive_failures:
            log.info(
                "Goldpinger RTTs readable again after %d failed reads", self.consecutive_failures
            )
        elif not mapped.rtt_ms and self.last_success_at_s is None:
            log.warning(
                "Prometheus answered but no Goldpinger link maps to two nodes "
                "(is Goldpinger scraped? query: %s)",
                self.query,
            )
        self.consecutive_failures = 0
        self.last_error = None
        self.last_success_at_s = now_s
        if self._reads_counter is not None:
            self._reads_counter.labels("ok").inc()

    def _resolver(self) -> NodeResolver:
        pods = self._state.view(self._clock()).signal(PODS_SIGNAL)
        return NodeResolver.of(
            {node.name: node.addresses for node in self._state.node_infos()},
            pods if isinstance(pods, PodIndex) else EMPTY_POD_INDEX,
        )

    def _note_unmapped(self, unmapped: list, resolver: NodeResolver) -> None:
        # Examples from different callers first: one gone node explains many series.
        by_caller = {peer.instance: peer for peer in reversed(unmapped)}
        chosen = list(dict.fromkeys([*by_caller.values(), *unmapped]))[:UNMAPPED_EXAMPLES]
        examples = [describe_unmapped(peer, resolver) for peer in chosen]
        if len(unmapped) != self.unmapped_series and unmapped:
            log.warning(
                "%d Goldpinger series map to no node and are left out, e.g. %s",
                len(unmapped),
                "; ".join(examples),
            )
        self.unmapped_series = len(unmapped)
        self.unmapped_examples = examples

    def _failed(self, message: str) -> None:
        if self.consecutive_failures == 0:
            log.warning(
                "Goldpinger RTT read failed; known links age until %g s old: %s",
                self.settings.max_age_s,
                message,
            )
        self.consecutive_failures += 1
        self.failures_total += 1
        self.last_error = message
        if self._reads_counter is not None:
            self._reads_counter.labels("error").inc()

    def _reload_file(self) -> None:
        path = self.settings.rtt_file
        assert path is not None
        mtime_s = _mtime_s(path)
        if mtime_s in (self._file_mtime_s, self._refused_mtime_s):
            return  # unchanged, or the same bad file as last time
        try:
            links = read_rtt_file(path)
        except RttFileError as error:
            self._refused_mtime_s = mtime_s
            self.file_errors_total += 1
            if self._file_errors_counter is not None:
                self._file_errors_counter.inc()
            if str(error) != self.last_file_error:
                log.error("RTT file refused, the previous one stays: %s", error)
            self.last_file_error = str(error)
            return
        self._static = links
        self._file_mtime_s = mtime_s
        self.last_file_error = None
        log.info("RTT file read again", extra={"rtt_file": str(path), "links": len(links)})

    def _publish(self, now_s: float) -> RttMatrix:
        # Expired measurements go: a node that left the cluster must not linger forever.
        self._measured = {
            key: link for key, link in self._measured.items() if link.expires_at_s > now_s
        }
        sources = []
        if self._prometheus is not None:
            sources.append(f"goldpinger q{self.settings.quantile:g} over {self.settings.window}")
        if self.settings.rtt_file is not None:
            sources.append(f"file {self.settings.rtt_file}")
        matrix = RttMatrix.build(
            self._measured.values(), self._static, built_at_s=now_s, sources=sources
        )
        self.matrix = matrix
        self._state.set_signal(RTT_SIGNAL, matrix)
        return matrix

    # ---- status and metrics ---------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Health and matrix summary for /status (JSON-ready)."""
        matrix = self.matrix
        status: dict[str, Any] = {
            "refresh_interval_s": self.settings.refresh_interval_s,
            "max_age_s": self.settings.max_age_s,
            "matrix": matrix.summary(self._clock()) if matrix is not None else None,
        }
        if self._prometheus is not None:
            status["goldpinger"] = {
                "query": self.query,
                "quantile": self.settings.quantile,
                "estimate": self.settings.estimate,
                "confidence": self.settings.confidence,
                "reads_total": self.polls_total,
                "failures_total": self.failures_total,
                "consecutive_failures": self.consecutive_failures,
                "last_success_at_s": self.last_success_at_s,
                "last_error": self.last_error,
                "links_last_read": self.last_links,
                "unmapped_series": self.unmapped_series,
                "unmapped_examples": self.unmapped_examples,
            }
        if self.settings.rtt_file is not None:
            status["rtt_file"] = {
                "path": str(self.settings.rtt_file),
                "links": len(self._static),
                "modified_at_s": self._file_mtime_s,
                "errors_total": self.file_errors_total,
                "last_error": self.last_file_error,
            }
        return status

    def _register_metrics(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge

        def pairs(state: str) -> float:
            matrix = self.matrix
            if matrix is None:
                return 0.0
            return float(matrix.summary(self._clock())[f"pairs_{state}"])

        known = Gauge(
            f"{METRIC_PREFIX}_rtt_pairs",
            "Node pairs in the RTT matrix by state: known (usable) or expired (too old)",
            ["state"],
            registry=registry,
        )
        known.labels("known").set_function(lambda: pairs("known"))
        known.labels("expired").set_function(lambda: pairs("expired"))
        Gauge(
            f"{METRIC_PREFIX}_rtt_age_seconds",
            "Seconds since Goldpinger RTTs were last read successfully (NaN: never)",
            registry=registry,
        ).set_function(
            lambda: (
                math.nan
                if self.last_success_at_s is None
                else self._clock() - self.last_success_at_s
            )
        )
        Gauge(
            f"{METRIC_PREFIX}_unmapped_series",
            "Goldpinger caller-callee series of the last read that map to no node",
            registry=registry,
        ).set_function(lambda: float(self.unmapped_series))
        self._reads_counter = Counter(
            f"{METRIC_PREFIX}_rtt_reads",
            "Goldpinger reads from Prometheus by outcome (ok, error)",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("ok", "error"):
            self._reads_counter.labels(outcome)
        self._file_errors_counter = Counter(
            f"{METRIC_PREFIX}_rtt_file_errors",
            "Times a changed RTT file was refused (the previous one stays)",
            registry=registry,
        )


def _mtime_s(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
