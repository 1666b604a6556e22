"""Carbon (score and filter): fewest grams of CO2 per hour; deferrable pods wait for cleaner power.

**Score.** Placing the pod adds `increase_w` watts to a node (`extender.cycle`); the node's
grid zone has a carbon intensity `I` (g/kWh), so the pod's predicted emissions rate there is

    emissions_g_per_h = increase_w x I / 1000

and the lowest scores highest, normalised like the power score: the cheapest candidate gets 10
points and each doubling against it loses `pointsPerDoubling` (`cost_ratio_points`). Watts and
intensity count alike: a node adding twice the watts in a zone a third as dirty still wins.

**Where intensity comes from.** A node's zone is its `power-aware-scheduler/carbon-zone`
label, else the label `zoneLabel` names (default `topology.kubernetes.io/region`). The zone's
intensity of the configured `signal` (`average` or `marginal`, never mixed: see
`livedata.carbon`) comes from the background source (`livedata.carbon_source`: Prometheus,
the carbon-aware-sdk WebAPI, Electricity Maps, WattTime, a file), read off the request path. A
node with its own supply (solar on site) overrides its zone: the annotation
`power-aware-scheduler/carbon-intensity-g-per-kwh` (a standing declaration, or one that ages
from `power-aware-scheduler/carbon-intensity-at` when that is set), or a `prometheus-node`
source. A value older than `maxAgeSeconds` is stale (a forecast older than
`forecastMaxAgeSeconds` likewise); a stale zone's fresh forecast still gives the value for now.

**No data scores neutral.** A candidate without a usable intensity (no zone, a zone no source
reports, stale values) is scored as if its zone had the mean intensity of the candidates that
have one: by its watts alone, neither rewarded nor punished for carbon; with no data at all
every candidate is scored by its watts. `/explain` says so per node (`carbon_note`), and
`power_aware_extender_carbon_nodes_scored_neutral_total` counts them.

**Deferral (filter).** A pod annotated `power-aware-scheduler/defer-until` (RFC 3339, or a
duration from its creationTimestamp; `livedata.deferral`) may wait for cleaner power. While
fresh forecasts say that the candidates' mean intensity over a window of `deferWindowMinutes`
starting after now and no later than the deadline will be lower than their mean now by more
than `deferMargin` (a fraction) and more than `deferMinSavingGPerKwh`, every candidate fails
with one reason, the same for all (so kube-scheduler's message aggregates it), naming the
window: `power-aware-scheduler/carbon-hold: waiting for a cleaner window 13:00-14:00Z ...`.
The mean, not the cleanest candidate: where the pod lands is the scores' choice (see
`hold_reason`). The
failures are unresolvable (preempting pods does not make power cleaner). kube-scheduler
keeps the pod pending and retries it (see docs/operations.md on backoff and on autoscalers);
each retry asks again. The pod is never held at or past its deadline, and never when any
candidate lacks a fresh value or its zone a fresh forecast, or the annotation cannot be read:
then it passes as if it had none. `power_aware_extender_carbon_deferral_decisions_total
{decision}` counts each filter call's outcome (held, released, deadline_passed, no_forecast,
unreadable).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from extender.plugins.base import (
    PASS_ALL,
    FilterVerdict,
    LiveSource,
    Plugin,
    SourceContext,
    cost_ratio_points,
    finite_or_none,
)
from extender.state import NodeAttribute, NodeInfo
from livedata.carbon import (
    SIGNALS,
    annotated_at_s,
    annotated_intensity,
    format_timestamp,
    window_means,
)
from livedata.carbon_providers import provider_from_config
from livedata.carbon_source import EMPTY_SNAPSHOT, CarbonSnapshot, CarbonSource, Entry
from livedata.deferral import DeferralError, pod_deadline_s
from livedata.labels import (
    CARBON_HOLD_REASON,
    CARBON_INTENSITY_ANNOTATION,
    CARBON_INTENSITY_AT_ANNOTATION,
    CARBON_ZONE_LABEL,
    REGION_LABEL,
)

if TYPE_CHECKING:
    from extender.cycle import Cycle

CARBON_SIGNAL = "carbon"  # the cluster-state signal the source's snapshots are published under
NO_ZONE = -1
ANNOTATION_SOURCE = "node annotation"
DECISIONS = ("held", "released", "deadline_passed", "no_forecast", "unreadable")
# Stands for the source prometheus_url fills in at start; checked again in background().
_URL_CHECKED_LATER = "http://prometheus-url-from-flags"


@dataclass(frozen=True)
class CarbonArgs:
    # Which signal scores and defers: "average" or "marginal" (livedata.carbon).
    signal: str = "average"
    # Node label naming the grid zone (power-aware-scheduler/carbon-zone wins when set).
    zone_label: str = REGION_LABEL
    # A current value older than this (from the time it describes) is stale.
    max_age_seconds: float = 7200.0
    # A forecast generated longer ago than this is stale.
    forecast_max_age_seconds: float = 7200.0
    # Points lost each time a node's g/h doubles against the cleanest candidate's.
    points_per_doubling: float = 5.0
    # Emissions below this count as this much (the ratio stays finite at 0 g/kWh).
    min_emissions_g_per_h: float = 1e-6
    # A deferrable pod waits only for a window cleaner than now by more than this fraction...
    defer_margin: float = 0.2
    # ... and by more than this many g/kWh.
    defer_min_saving_g_per_kwh: float = 10.0
    # The length of the window a forecast's mean is taken over (about a pod's run time).
    defer_window_minutes: float = 60.0
    # Seconds between polls of the sources, and each HTTP call's timeout.
    poll_seconds: float = 300.0
    timeout_seconds: float = 10.0
    # Where intensities come from (livedata.carbon_providers); empty: annotations only.
    sources: tuple = ()

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}, got {self.signal!r}")
        if not self.zone_label:
            raise ValueError("zoneLabel must not be empty")
        for key, value in (
            ("maxAgeSeconds", self.max_age_seconds),
            ("forecastMaxAgeSeconds", self.forecast_max_age_seconds),
            ("pointsPerDoubling", self.points_per_doubling),
            ("minEmissionsGPerH", self.min_emissions_g_per_h),
            ("deferWindowMinutes", self.defer_window_minutes),
            ("pollSeconds", self.poll_seconds),
            ("timeoutSeconds", self.timeout_seconds),
        ):
            if not value > 0:
                raise ValueError(f"{key} must be > 0, got {value!r}")
        if not 0 <= self.defer_margin < 1:
            raise ValueError(f"deferMargin must be a fraction 0..1, got {self.defer_margin!r}")
        if not self.defer_min_saving_g_per_kwh >= 0:
            raise ValueError(
                f"deferMinSavingGPerKwh must be >= 0, got {self.defer_min_saving_g_per_kwh!r}"
            )
        if not isinstance(self.sources, list | tuple):
            raise ValueError(f"sources must be a list, got {type(self.sources).__name__}")
        object.__setattr__(self, "sources", tuple(self.sources))
        for i, raw in enumerate(self.sources):  # the structure now; URLs once the service starts
            provider_from_config(
                raw,
                f"sources[{i}]",
                index=i,
                timeout_s=self.timeout_seconds,
                prometheus_url=_URL_CHECKED_LATER,
            )


# ---- per-node attributes ------------------------------------------------------------------------


class ZoneCodes:
    """Zone names interned as small integers, so that the request path gathers arrays."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self.names: list[str] = []
        self._lock = threading.Lock()

    def code(self, zone: str | None) -> int:
        if not zone:
            return NO_ZONE
        code = self._codes.get(zone)
        if code is not None:
            return code
        with self._lock:
            code = self._codes.setdefault(zone, len(self.names))
            if code == len(self.names):
                self.names.append(zone)
            return code

    def __len__(self) -> int:
        return len(self.names)


def _unreadable_annotation(node: NodeInfo) -> str | None:
    annotations = node.annotations or {}
    raw = annotations.get(CARBON_INTENSITY_ANNOTATION)
    if raw is not None and math.isnan(annotated_intensity(annotations)):
        return f"ignoring {CARBON_INTENSITY_ANNOTATION} {raw!r} (not a number of g/kWh >= 0)"
    if (
        annotations.get(CARBON_INTENSITY_AT_ANNOTATION) is not None
        and annotated_at_s(annotations) == -math.inf
    ):
        return (
            f"{CARBON_INTENSITY_AT_ANNOTATION} "
            f"{annotations[CARBON_INTENSITY_AT_ANNOTATION]!r} is not RFC 3339: "
            "the node's own intensity counts as stale"
        )
    return None


LOCAL_G_PER_KWH = NodeAttribute(
    "carbon_local_g_per_kwh",
    lambda node: annotated_intensity(node.annotations),
    np.float64,
    math.nan,
    check=_unreadable_annotation,
)
LOCAL_AT_S = NodeAttribute(
    "carbon_local_at_s", lambda node: annotated_at_s(node.annotations), np.float64, math.nan
)


# ---- what one request knows of its candidates' intensity -----------------------------------------


@dataclass(frozen=True, eq=False)
class ZoneTable:
    """The snapshot's zone entries of one signal, indexed by zone code (last slot: no zone)."""

    entries: tuple[Entry | None, ...]
    g_per_kwh: np.ndarray
    observed_at_s: np.ndarray
    valid_until_s: np.ndarray
    has_forecast_until_s: np.ndarray


def zone_table(snapshot: CarbonSnapshot, codes: ZoneCodes, signal: str) -> ZoneTable:
    entries = [snapshot.zones.get((zone, signal)) for zone in list(codes.names)]
    entries.append(None)  # code -1 gathers the last slot

    def column(of) -> np.ndarray:
        return np.array([of(e) if e is not None else -math.inf for e in entries], dtype=float)

    return ZoneTable(
        entries=tuple(entries),
        g_per_kwh=np.array(
            [e.reading.g_per_kwh if e is not None else math.nan for e in entries], dtype=float
        ),
        observed_at_s=column(lambda e: e.reading.observed_at_s),
        valid_until_s=column(lambda e: e.valid_until_s),
        has_forecast_until_s=column(lambda e: e.forecast_valid_until_s),
    )


@dataclass(frozen=True, eq=False)
class Intensities:
    """Each candidate's usable intensity now (NaN: none), where it came from and its age."""

    zone_codes: np.ndarray
    g_per_kwh: np.ndarray
    age_s: np.ndarray
    origin: np.ndarray  # 0 none, 1 zone reading, 2 zone forecast for now, 3 annotation, 4 node
    table: ZoneTable
    node_sources: tuple[str | None, ...] | None  # per candidate, when a node reading was used

    @property
    def usable(self) -> np.ndarray:
        return np.isfinite(self.g_per_kwh)


ORIGIN_NONE, ORIGIN_ZONE, ORIGIN_FORECAST, ORIGIN_ANNOTATION, ORIGIN_NODE = range(5)


class Carbon(Plugin):
    name = "Carbon"
    Args = CarbonArgs

    def __init__(self, args: Any = None) -> None:
        super().__init__(args)
        self.zones = ZoneCodes()
        zone_label = self.args.zone_label

        def zone_of(node: NodeInfo) -> int:
            labels = node.labels or {}
            return self.zones.code(labels.get(CARBON_ZONE_LABEL) or labels.get(zone_label))

        self.zone_code = NodeAttribute("carbon_zone", zone_of, np.int32, NO_ZONE)
        self.node_attributes = (self.zone_code, LOCAL_G_PER_KWH, LOCAL_AT_S)
        self.source: CarbonSource | None = None
        self._tables: tuple[object, int, ZoneTable] | None = None
        self._last: tuple[object, Intensities] | None = None
        self.decisions = dict.fromkeys(DECISIONS, 0)
        self._decision_counter: Any = None
        self._neutral_counter: Any = None

    # ---- background ----------------------------------------------------------------------

    def background(self, context: SourceContext) -> Sequence[LiveSource]:
        if context.registry is not None:
            from prometheus_client import Counter

            self._decision_counter = Counter(
                "power_aware_extender_carbon_deferral_decisions",
                "Carbon filter outcomes for pods with defer-until, one per filter call",
                ["decision"],
                registry=context.registry,
            )
            self._neutral_counter = Counter(
                "power_aware_extender_carbon_nodes_scored_neutral",
                "Candidates scored without a usable carbon intensity (by their watts alone)",
                registry=context.registry,
            )
        if not self.args.sources:
            return ()
        providers = [
            provider_from_config(
                raw,
                f"Carbon sources[{i}]",
                index=i,
                timeout_s=self.args.timeout_seconds,
                prometheus_url=context.prometheus_url,
            )
            for i, raw in enumerate(self.args.sources)
        ]

        def cluster_zones() -> list[str]:
            view = context.state.view(context.clock())
            codes = view.node_values(self.zone_code)
            return [self.zones.names[c] for c in np.unique(codes).tolist() if c >= 0]

        self.source = CarbonSource(
            providers,
            lambda snapshot: context.state.set_signal(CARBON_SIGNAL, snapshot),
            cluster_zones,
            interval_s=self.args.poll_seconds,
            max_age_s=self.args.max_age_seconds,
            forecast_max_age_s=self.args.forecast_max_age_seconds,
            clock=context.clock,
            registry=context.registry,
        )
        return (self.source,)

    # ---- intensities -----------------------------------------------------------------------

    def intensities(self, cycle: Cycle) -> Intensities:
        """Each candidate's usable intensity now (computed once per cycle)."""
        last = self._last
        if last is not None and last[0] is cycle:
            return last[1]
        snapshot = cycle.view.signal(CARBON_SIGNAL) or EMPTY_SNAPSHOT
        now_s = cycle.now_s
        codes = cycle.node_values(self.zone_code)
        table = self._table(snapshot)
        fresh = now_s <= table.valid_until_s
        # A stale zone value gives way to a fresh forecast's value for now (WattTime's advice).
        zone_now = np.where(fresh, table.g_per_kwh, math.nan)
        zone_at = table.observed_at_s.copy()
        origin_by_zone = np.where(fresh, ORIGIN_ZONE, ORIGIN_NONE)
        for code in np.flatnonzero(~fresh & (now_s <= table.has_forecast_until_s)).tolist():
            value = table.entries[code].current_g_per_kwh(now_s)
            if math.isfinite(value):
                zone_now[code], zone_at[code], origin_by_zone[code] = value, now_s, ORIGIN_FORECAST
        g_per_kwh = zone_now[codes]
        age_s = now_s - zone_at[codes]
        origin = origin_by_zone[codes]

        local = cycle.node_values(LOCAL_G_PER_KWH)
        if not np.isnan(local).all():
            local_at = cycle.node_values(LOCAL_AT_S)
            with np.errstate(invalid="ignore"):
                usable = np.isfinite(local) & (now_s - local_at <= self.args.max_age_seconds)
            g_per_kwh = np.where(usable, local, g_per_kwh)
            age_s = np.where(usable, np.where(np.isinf(local_at), 0.0, now_s - local_at), age_s)
            origin = np.where(usable, ORIGIN_ANNOTATION, origin)
        node_sources = None
        if snapshot.nodes:
            # Node-local readings (a prometheus-node or file source): the few candidates that
            # have one, found once per candidate list and snapshot.
            positions, entries = self._node_entries(cycle, snapshot)
            g_per_kwh, age_s, origin = g_per_kwh.copy(), age_s.copy(), origin.copy()
            sources: list[str | None] = [None] * len(cycle)
            for i, entry in zip(positions, entries, strict=True):
                value = entry.current_g_per_kwh(now_s)
                if math.isfinite(value) and origin[i] != ORIGIN_ANNOTATION:
                    g_per_kwh[i], origin[i] = value, ORIGIN_NODE
                    age_s[i] = now_s - entry.reading.observed_at_s
                    sources[i] = entry.reading.source
            node_sources = tuple(sources)
        age_s = np.where(np.isfinite(g_per_kwh), age_s, math.nan)
        result = Intensities(codes, g_per_kwh, age_s, origin, table, node_sources)
        self._last = (cycle, result)
        return result

    def _node_entries(
        self, cycle: Cycle, snapshot: CarbonSnapshot
    ) -> tuple[list[int], list[Entry]]:
        """(positions, entries) of the candidates with a node-local reading of the signal."""
        key = ("carbon-node-entries", id(cycle.candidates), id(snapshot), self.args.signal)
        cached = cycle.view.recall(key)
        if cached is None:
            signal, nodes = self.args.signal, snapshot.nodes
            found = [
                (i, entry)
                for i, name in enumerate(cycle.names)
                if (entry := nodes.get((name, signal))) is not None
            ]
            cached = ([i for i, _ in found], [entry for _, entry in found])
            # The key holds ids: keep the objects alive with the entry.
            cycle.view.remember(key, cached, cycle.candidates, snapshot)
        return cached

    def _table(self, snapshot: CarbonSnapshot) -> ZoneTable:
        cached = self._tables
        if cached is not None and cached[0] is snapshot and cached[1] == len(self.zones):
            return cached[2]
        table = zone_table(snapshot, self.zones, self.args.signal)
        self._tables = (snapshot, len(self.zones), table)
        return table

    # ---- score -----------------------------------------------------------------------------

    def emissions_g_per_h(self, cycle: Cycle) -> np.ndarray:
        """Predicted g/h per candidate; NaN without an intensity (or without an increase)."""
        return cycle.increase_w * self.intensities(cycle).g_per_kwh / 1000.0

    def score(self, cycle: Cycle) -> np.ndarray:
        intensities = self.intensities(cycle)
        usable = intensities.usable
        if usable.all():
            return cycle.increase_w * intensities.g_per_kwh / 1000.0
        # Neutral: as if at the mean intensity of the candidates that have one (by watts alone
        # when none has), so a missing value neither wins nor loses on carbon.
        reference = float(intensities.g_per_kwh[usable].mean()) if usable.any() else 1.0
        if self._neutral_counter is not None:
            self._neutral_counter.inc(int(np.count_nonzero(~usable & cycle.nodes.known)))
        return cycle.increase_w * np.where(usable, intensities.g_per_kwh, reference) / 1000.0

    def normalise(self, raw: np.ndarray, cycle: Cycle) -> np.ndarray:
        return cost_ratio_points(
            raw,
            points_per_doubling=self.args.points_per_doubling,
            floor=self.args.min_emissions_g_per_h,
        )

    # ---- filter: deferral -------------------------------------------------------------------

    def filter(self, cycle: Cycle) -> FilterVerdict:
        try:
            deadline_s = pod_deadline_s(cycle.pod)
        except DeferralError:
            return self._decided("unreadable")
        if deadline_s is None:
            return PASS_ALL
        hold = self.hold_reason(cycle, deadline_s)
        if hold is None:
            return PASS_ALL
        everyone = range(len(cycle))
        return FilterVerdict(dict.fromkeys(everyone, hold), frozenset(everyone))

    def hold_reason(self, cycle: Cycle, deadline_s: float) -> str | None:
        """The reason to hold the pod until a cleaner window; None (counted why) to let it pass.

        "Cleaner" is measured over the candidates, each counted once: their mean intensity now
        against their mean over a window of `deferWindowMinutes` (each zone's forecast there;
        node-local supplies, which have none, as they are now). Where the pod lands among them
        is the scores' business, not known here: the mean is what a wait buys wherever it
        lands, where the cleanest candidate alone would promise what the scores may not deliver
        (measured on bench.energy_sim's multizone preset: held on the cleanest zone's forecast,
        deferred pods ran at a higher intensity than the others).
        """
        now_s = cycle.now_s
        if now_s >= deadline_s:
            self._decided("deadline_passed")
            return None
        considered = np.flatnonzero(cycle.nodes.known)
        if considered.size == 0:
            self._decided("no_forecast")
            return None
        intensities = self.intensities(cycle)
        now_values = intensities.g_per_kwh[considered]
        if not np.isfinite(now_values).all():
            self._decided("no_forecast")
            return None
        mean_now = float(now_values.mean())
        origin = intensities.origin[considered]
        from_zone = (origin == ORIGIN_ZONE) | (origin == ORIGIN_FORECAST)
        # Candidates per zone (codes are small integers: a bincount beats a sort); the others
        # (node-local supplies) count at their value now.
        counts = np.bincount(intensities.zone_codes[considered][from_zone], minlength=1)
        flat_sum = float(now_values[~from_zone].sum())
        forecasts = []
        for code in np.flatnonzero(counts).tolist():
            entry = intensities.table.entries[code]
            if entry is None or now_s > entry.forecast_valid_until_s:
                self._decided("no_forecast")
                return None
            forecasts.append((int(counts[code]), self.zones.names[code], entry.reading.forecast))
        # Windows may start at any forecast point after now, up to the deadline.
        starts = np.unique(
            [p.start_s for _, _, points in forecasts for p in points if now_s < p.start_s]
        )
        starts = starts[starts <= deadline_s]
        if starts.size == 0:
            self._decided("released")
            return None
        window_s = 60.0 * self.args.defer_window_minutes
        weighted = np.full(starts.size, flat_sum)
        cleanest = np.full(starts.size, np.inf)
        cleanest_zone = np.zeros(starts.size, dtype=np.intp)
        for z, (count, _, points) in enumerate(forecasts):
            means = window_means(points, starts, window_s)  # NaN where not covered
            weighted += count * means
            better = means < cleanest
            cleanest[better], cleanest_zone[better] = means[better], z
        window_mean = weighted / considered.size
        if not np.isfinite(window_mean).any():
            self._decided("released")
            return None
        best = int(np.nanargmin(window_mean))
        value = float(window_mean[best])
        saving = mean_now - value
        if saving <= self.args.defer_min_saving_g_per_kwh or value >= mean_now * (
            1.0 - self.args.defer_margin
        ):
            self._decided("released")
            return None
        self._decided("held")
        start_s = float(starts[best])
        zone = forecasts[cleanest_zone[best]][1] if forecasts else None
        cleanest_then = f"; cleanest zone then {zone} at {cleanest[best]:.0f}" if zone else ""
        return (
            f"{CARBON_HOLD_REASON}: waiting for a cleaner window "
            f"{format_timestamp(start_s)}-{format_timestamp(start_s + window_s)}: the "
            f"candidates' mean forecast {value:.0f} g/kWh against {mean_now:.0f} now "
            f"({saving / mean_now:.0%} cleaner{cleanest_then}); released by the defer-until "
            f"deadline {format_timestamp(deadline_s)}"
        )

    def _decided(self, decision: str) -> FilterVerdict:
        self.decisions[decision] += 1
        if self._decision_counter is not None:
            self._decision_counter.labels(decision=decision).inc()
        return PASS_ALL

    # ---- explain and status -------------------------------------------------------------------

    def explain(self, cycle: Cycle) -> Mapping[str, Sequence[object]]:
        intensities = self.intensities(cycle)
        names = self.zones.names
        zones = [names[c] if c >= 0 else None for c in intensities.zone_codes.tolist()]
        sources = self._sources(intensities)
        usable = intensities.usable
        reference = (
            float(intensities.g_per_kwh[usable].mean())
            if usable.any() and not usable.all()
            else None
        )
        notes = [
            "" if ok else self._neutral_note(zone, reference, cycle, i, intensities)
            for i, (ok, zone) in enumerate(zip(usable.tolist(), zones, strict=True))
        ]
        return {
            "carbon_zone": zones,
            "carbon_intensity_g_per_kwh": finite_or_none(intensities.g_per_kwh),
            "carbon_signal": [self.args.signal] * len(cycle),
            "carbon_source": sources,
            "carbon_age_s": finite_or_none(intensities.age_s),
            "carbon_g_per_h": finite_or_none(self.emissions_g_per_h(cycle)),
            "carbon_note": notes,
        }

    def _sources(self, intensities: Intensities) -> list[str | None]:
        table, node_sources = intensities.table, intensities.node_sources
        out: list[str | None] = []
        for i, (code, origin) in enumerate(
            zip(intensities.zone_codes.tolist(), intensities.origin.tolist(), strict=True)
        ):
            if origin == ORIGIN_ANNOTATION:
                out.append(ANNOTATION_SOURCE)
            elif origin == ORIGIN_NODE and node_sources is not None:
                out.append(node_sources[i])
            elif origin in (ORIGIN_ZONE, ORIGIN_FORECAST):
                entry = table.entries[code]
                suffix = " (forecast for now)" if origin == ORIGIN_FORECAST else ""
                out.append(f"{entry.reading.source}{suffix}" if entry else None)
            else:
                out.append(None)
        return out

    def _neutral_note(
        self, zone: str | None, reference: float | None, cycle: Cycle, i: int, ints: Intensities
    ) -> str:
        scored = (
            f"scored neutral (at the candidates' mean {reference:.0f} g/kWh)"
            if reference is not None
            else "scored by watts alone (no candidate has carbon data)"
        )
        if zone is None:
            return f"no carbon zone (labels {CARBON_ZONE_LABEL}, {self.args.zone_label}): {scored}"
        entry = ints.table.entries[ints.zone_codes[i]]
        if entry is None:
            return f"no {self.args.signal} carbon intensity for zone {zone}: {scored}"
        age_s = cycle.now_s - entry.reading.observed_at_s
        return (
            f"carbon intensity of zone {zone} is stale ({age_s:.0f} s old, max "
            f"{self.args.max_age_seconds:g} s; no fresh forecast): {scored}"
        )

    def status(self) -> Mapping[str, Any] | None:
        snapshot = self.source.snapshot if self.source is not None else None
        zones: dict[str, Any] = {}
        if snapshot is not None:
            for (zone, signal), entry in sorted(snapshot.zones.items()):
                if signal != self.args.signal:
                    continue
                reading = entry.reading
                zones[zone] = {
                    "g_per_kwh": reading.g_per_kwh if math.isfinite(reading.g_per_kwh) else None,
                    "observed_at_s": reading.observed_at_s,
                    "usable_until_s": entry.valid_until_s
                    if math.isfinite(entry.valid_until_s)
                    else None,
                    "forecast_points": len(reading.forecast),
                    "forecast_usable_until_s": entry.forecast_valid_until_s
                    if math.isfinite(entry.forecast_valid_until_s)
                    else None,
                    "source": reading.source,
                }
        return {
            "signal": self.args.signal,
            "max_age_s": self.args.max_age_seconds,
            "forecast_max_age_s": self.args.forecast_max_age_seconds,
            "sources": self.source.status() if self.source is not None else {},
            "zones": zones,
            "deferral_decisions": dict(self.decisions),
        }
