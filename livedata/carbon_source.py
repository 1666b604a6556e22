"""Carbon intensity in the background: poll the configured sources, publish one snapshot.

Two readers use it. The extender's Carbon plugin (`extender.plugins.carbon`) scores and defers
pods from each zone's current carbon intensity and forecast; the node power controller
(`controllers.node_power`, with `--rank-by grams`) chooses which nodes to power off and wake by
the grams their watts emit. Reading intensities means HTTP calls to services that answer in
hundreds of milliseconds and sometimes not at all, so it happens here, in a thread, never on
a request or decision path. Every `interval_s` the `CarbonSource` asks each provider
(`livedata.carbon_providers`) for the readings of the cluster's zones (the `zones` callable:
the zone names on the nodes), merges them into an immutable `CarbonSnapshot` and hands it to
`publish` (the extender puts it in its cluster state; the controller keeps the latest), and
the readers look a node up with `node_g_per_kwh`.

When a provider fails, its previous readings stay in the snapshot and age: each entry carries
the time it stops being usable (`valid_until_s`: the reading's own time plus the max age, the
source's `maxAgeSeconds` or the plugin's), and a forecast likewise (`forecast_valid_until_s`,
from when it was generated). Past that the plugin treats the zone as having no data: it scores
it neutral and never holds a pod on its forecast. The failure is logged once per streak and
counted (`power_aware_extender_carbon_source_polls_total{source, outcome}`). When two sources
report the same zone and signal, the newer reading wins.

Scrape-time gauges describe the snapshot:
`<prefix>_intensity_g_per_kwh{zone, signal, source}` and
`<prefix>_intensity_age_seconds{zone, signal, source}` (node-local readings:
`<prefix>_node_intensity_*{node, signal, source}`), `<prefix>_forecast_horizon_seconds{zone,
signal, source}` (how far ahead the forecast reaches) and
`<prefix>_source_last_success_timestamp_seconds{source}`, where the prefix is the reader's
(`power_aware_extender_carbon`, `power_aware_node_power_carbon`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from livedata.carbon import IntensityReading, annotated_at_s, annotated_intensity, value_at
from livedata.carbon_providers import CarbonSourceError, Provider, Readings

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class Entry:
    """One zone's (or node's) reading and until when its value and its forecast may be used."""

    reading: IntensityReading
    valid_until_s: float  # observed_at + max age; -inf when the reading has no current value
    forecast_valid_until_s: float  # generated_at + forecast max age; -inf without a forecast

    def current_g_per_kwh(self, now_s: float) -> float:
        """The value for now: the reading's if still valid, else a fresh forecast's for now."""
        if now_s <= self.valid_until_s:
            return self.reading.g_per_kwh
        if now_s <= self.forecast_valid_until_s:
            return value_at(self.reading.forecast, now_s)
        return math.nan

    def outlook_g_per_kwh(self, now_s: float, horizon_s: float) -> float:
        """The time-weighted mean intensity over [now_s, now_s + horizon_s): the forecast
        where it covers that window, the current value (`current_g_per_kwh`) where it does not
        (past its end, before its first point, across a gap; all of it when the forecast is
        stale or absent). `horizon_s` 0: the current value. NaN when there is no current value.

        The window's mean, not its worst or best hour: a node that will run (or stay off) for
        the next hours emits over all of them, and the mean is what its grams per watt come to.
        """
        current = self.current_g_per_kwh(now_s)
        if not (horizon_s > 0 and math.isfinite(current)) or now_s > self.forecast_valid_until_s:
            return current
        end_s = now_s + horizon_s
        covered_s = weighted = 0.0
        for point in self.reading.forecast:
            overlap_s = min(point.end_s, end_s) - max(point.start_s, now_s)
            if overlap_s > 0:
                covered_s += overlap_s
                weighted += overlap_s * point.g_per_kwh
        return (weighted + (horizon_s - covered_s) * current) / horizon_s


@dataclass(frozen=True, eq=False)
class CarbonSnapshot:
    """Every zone's and node-local intensity as the sources last read them; immutable.

    `zones` and `nodes` map (zone or node name, signal) to an `Entry`.
    """

    zones: Mapping[tuple[str, str], Entry]
    nodes: Mapping[tuple[str, str], Entry]
    published_at_s: float
    sources: Mapping[str, str] = field(default_factory=dict)  # name -> description


EMPTY_SNAPSHOT = CarbonSnapshot(MappingProxyType({}), MappingProxyType({}), -math.inf)


def node_g_per_kwh(
    snapshot: CarbonSnapshot,
    node: str,
    zone: str | None,
    signal: str,
    now_s: float,
    *,
    annotations: Mapping[str, str] | None = None,
    max_age_s: float = math.inf,
    horizon_s: float = 0.0,
) -> float:
    """One node's usable intensity (g/kWh), NaN when it has none; the Carbon plugin's rule.

    The node's own supply first: its intensity annotation (`livedata.carbon`; it ages from its
    `-at` annotation when that is set, then counts until `max_age_s`), then a node-local
    reading. Else its zone's: the current value while fresh, else a fresh forecast's value
    for now. Stale or missing everywhere: NaN (the readers treat it as neutral).

    With `horizon_s` > 0 the value is the outlook over the next `horizon_s` seconds
    (`Entry.outlook_g_per_kwh`: the forecast's time-weighted mean, the current value where the
    forecast ends); an annotation has no forecast and counts as it is.
    """
    local = annotated_intensity(annotations)
    if math.isfinite(local) and now_s - annotated_at_s(annotations) <= max_age_s:
        return local
    for entries, name in ((snapshot.nodes, node), (snapshot.zones, zone)):
        entry = entries.get((name, signal)) if name else None
        if entry is not None:
            value = entry.outlook_g_per_kwh(now_s, horizon_s)
            if math.isfinite(value):
                return value
    return math.nan


def build_snapshot(
    zone_readings: Iterable[IntensityReading],
    node_readings: Iterable[IntensityReading],
    *,
    published_at_s: float,
    max_age_s: float,
    forecast_max_age_s: float,
    source_max_age_s: Mapping[str, float] | None = None,
    sources: Mapping[str, str] | None = None,
) -> CarbonSnapshot:
    """Readings into a snapshot; the newest reading per (name, signal) wins.

    `source_max_age_s` overrides `max_age_s` (and the forecast's) for the sources it names.
    """
    overrides = source_max_age_s or {}

    def entries(readings: Iterable[IntensityReading]) -> Mapping[tuple[str, str], Entry]:
        chosen: dict[tuple[str, str], Entry] = {}
        for reading in readings:
            age_s = overrides.get(reading.source, max_age_s)
            forecast_age_s = overrides.get(reading.source, forecast_max_age_s)
            entry = Entry(
                reading,
                reading.observed_at_s + age_s if math.isfinite(reading.g_per_kwh) else -math.inf,
                reading.forecast_generated_at_s + forecast_age_s
                if reading.forecast and math.isfinite(reading.forecast_generated_at_s)
                else -math.inf,
            )
            key = (reading.name, reading.signal)
            previous = chosen.get(key)
            if previous is None or reading.observed_at_s >= previous.reading.observed_at_s:
                chosen[key] = entry
        return MappingProxyType(chosen)

    return CarbonSnapshot(
        entries(zone_readings),
        entries(node_readings),
        published_at_s,
        MappingProxyType(dict(sources or {})),
    )


@dataclass
class ProviderStatus:
    """One provider's health, for /status and /metrics."""

    description: str
    polls_total: int = 0
    failures_total: int = 0
    consecutive_failures: int = 0
    last_success_at_s: float | None = None
    last_error: str | None = None
    readings: Readings = field(default_factory=Readings)


class CarbonSource:
    """Background poller of the carbon providers, handing each `CarbonSnapshot` to `publish`.

    `registry`, when given, gets the snapshot's gauges and the polls' counters under
    `metric_prefix`.
    """

    def __init__(
        self,
        providers: Sequence[Provider],
        publish: Callable[[CarbonSnapshot], None],
        zones: Callable[[], Iterable[str]],
        *,
        interval_s: float,
        max_age_s: float,
        forecast_max_age_s: float,
        clock: Clock = time.time,
        registry: object = None,
        metric_prefix: str = "power_aware_extender_carbon",
    ) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        self.providers = tuple(providers)
        self.interval_s = float(interval_s)
        self.max_age_s = max_age_s
        self.forecast_max_age_s = forecast_max_age_s
        self._publish = publish
        self._zones = zones
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.health = {p.name: ProviderStatus(p.describe()) for p in self.providers}
        self.snapshot = EMPTY_SNAPSHOT
        if registry is not None:
            registry.register(_SnapshotCollector(self, metric_prefix))

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="carbon-source", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    # ---- one poll -------------------------------------------------------------------------

    def poll_once(self) -> CarbonSnapshot:
        """Ask every provider once and publish the merged snapshot. Never raises."""
        with self._lock:
            now_s = self._clock()
            try:
                zones = sorted({zone for zone in self._zones() if zone})
            except Exception:  # the view must not stop the poll
                log.exception("carbon source: cannot list the cluster's zones")
                zones = []
            for provider in self.providers:
                self._poll(provider, now_s, zones)
            snapshot = build_snapshot(
                (r for h in self.health.values() for r in h.readings.zones),
                (r for h in self.health.values() for r in h.readings.nodes),
                published_at_s=now_s,
                max_age_s=self.max_age_s,
                forecast_max_age_s=self.forecast_max_age_s,
                source_max_age_s={
                    p.name: p.max_age_s for p in self.providers if p.max_age_s is not None
                },
                sources={p.name: p.describe() for p in self.providers},
            )
            self.snapshot = snapshot
            self._publish(snapshot)
            return snapshot

    def _poll(self, provider: Provider, now_s: float, zones: Sequence[str]) -> None:
        health = self.health[provider.name]
        health.polls_total += 1
        try:
            readings = provider.fetch(now_s, zones)
        except CarbonSourceError as exc:
            self._failed(provider, health, str(exc))
            return
        except Exception as exc:  # a bug in one provider must not stop the others
            log.exception("carbon source %s failed unexpectedly", provider.name)
            self._failed(provider, health, f"{type(exc).__name__}: {exc}")
            return
        if health.consecutive_failures:
            log.info(
                "carbon source %s recovered after %d failed polls",
                provider.name,
                health.consecutive_failures,
            )
        asked = set(zones)
        missing = sorted(asked - {r.name for r in readings.zones}) if readings.zones else []
        if missing and provider.kind not in ("prometheus", "file"):
            log.debug("carbon source %s has no data for zones %s", provider.name, missing)
        health.readings = readings
        health.consecutive_failures = 0
        health.last_error = None
        health.last_success_at_s = now_s

    def _failed(self, provider: Provider, health: ProviderStatus, message: str) -> None:
        if health.consecutive_failures == 0:
            log.warning(
                "carbon source %s failed, keeping its last readings until they expire: %s",
                provider.name,
                message,
            )
        health.consecutive_failures += 1
        health.failures_total += 1
        health.last_error = message

    def status(self) -> dict[str, object]:
        """Each provider's health and the zones it reported (JSON-ready)."""
        return {
            name: {
                "source": h.description,
                "polls_total": h.polls_total,
                "failures_total": h.failures_total,
                "consecutive_failures": h.consecutive_failures,
                "last_success_at_s": h.last_success_at_s,
                "last_error": h.last_error,
                "zones": sorted({r.name for r in h.readings.zones}),
                "nodes": sorted({r.name for r in h.readings.nodes}),
            }
            for name, h in self.health.items()
        }


class _SnapshotCollector(Collector):
    """Scrape-time gauges from the latest snapshot and the providers' counters."""

    def __init__(self, source: CarbonSource, prefix: str) -> None:
        self._source = source
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        source = self._source
        now_s = source._clock()
        snapshot = source.snapshot
        families = {}
        for kind in ("zone", "node"):
            infix = "" if kind == "zone" else "node_"
            families[kind] = (
                GaugeMetricFamily(
                    f"{self._prefix}_{infix}intensity_g_per_kwh",
                    f"Carbon intensity a source last reported for a {kind} (gCO2eq/kWh)",
                    labels=[kind, "signal", "source"],
                ),
                GaugeMetricFamily(
                    f"{self._prefix}_{infix}intensity_age_seconds",
                    "Age of that value: now minus the time it describes",
                    labels=[kind, "signal", "source"],
                ),
            )
        horizon = GaugeMetricFamily(
            f"{self._prefix}_forecast_horizon_seconds",
            "How far ahead of now the zone's forecast reaches (0: none left)",
            labels=["zone", "signal", "source"],
        )
        for kind, entries in (("zone", snapshot.zones), ("node", snapshot.nodes)):
            intensity, age = families[kind]
            for (name, signal), entry in sorted(entries.items()):
                reading = entry.reading
                labels = [name, signal, reading.source]
                if math.isfinite(reading.g_per_kwh):
                    intensity.add_metric(labels, reading.g_per_kwh)
                    age.add_metric(labels, now_s - reading.observed_at_s)
                if kind == "zone" and reading.forecast:
                    horizon.add_metric(labels, max(0.0, reading.forecast[-1].end_s - now_s))
        polls = CounterMetricFamily(
            f"{self._prefix}_source_polls",
            "Polls of each carbon source, by outcome (success, failure)",
            labels=["source", "outcome"],
        )
        last = GaugeMetricFamily(
            f"{self._prefix}_source_last_success_timestamp_seconds",
            "When each carbon source last answered (Unix seconds)",
            labels=["source"],
        )
        for name, health in source.health.items():
            polls.add_metric([name, "success"], health.polls_total - health.failures_total)
            polls.add_metric([name, "failure"], health.failures_total)
            if health.last_success_at_s is not None:
                last.add_metric([name], health.last_success_at_s)
        yield from (*families["zone"], *families["node"], horizon, polls, last)
