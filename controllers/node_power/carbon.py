"""Each node's carbon intensity for `--rank-by grams`: the extender's sources, polled aside.

With `--rank-by grams` (the default when `--carbon-sources` is given) the policy
(`PolicySettings.rank_by`) ranks nodes by the grams of CO2 per hour their watts emit: the
node to power off is the one with the most grams per idle core, the node to wake the one with
the fewest per core of the pods it takes. A node's intensity is read as the extender's Carbon
plugin reads it (`livedata.carbon_source.node_g_per_kwh`): its own supply's annotation, else
a node-local reading, else its grid zone's (the label `power-aware-scheduler/carbon-zone`,
else `--carbon-zone-label`), fresh values only; but over time: its outlook, the mean of the
forecast over the next `--carbon-horizon` (4 h; the current value where the forecast ends,
and all of it without a forecast). A node powered off stays off for hours, and one woken stays
on: what it would emit over those hours, not in the present one, is what the choice changes.

The sources are the Carbon plugin's (`livedata.carbon_providers`: Prometheus, the
carbon-aware-sdk WebAPI, Electricity Maps, WattTime, a file), listed in `--carbon-sources`: a
YAML file holding the same list as the plugin's `sources` argument (or a mapping with a
`sources` key, so the plugin's args block can be mounted as it is). A `CarbonSource` thread
polls them every `--carbon-poll-interval`; a round reads the latest snapshot and never waits
for a source. A node without a usable intensity counts at the mean of the others (neutral);
with none known the policy ranks by watts, as without the flag. The snapshot's gauges are on
/metrics as `power_aware_node_power_carbon_*`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from livedata.carbon import SIGNALS
from livedata.carbon_providers import provider_from_config
from livedata.carbon_source import EMPTY_SNAPSHOT, CarbonSnapshot, CarbonSource
from livedata.carbon_source import node_g_per_kwh as snapshot_g_per_kwh
from livedata.labels import CARBON_ZONE_LABEL, REGION_LABEL

log = logging.getLogger(__name__)

METRIC_PREFIX = "power_aware_node_power_carbon"


@dataclass(frozen=True)
class CarbonSettings:
    """Where intensities come from and how long they count (the Carbon plugin's defaults)."""

    sources: tuple[Mapping[str, Any], ...] = ()
    signal: str = "average"
    zone_label: str = REGION_LABEL
    max_age_s: float = 7200.0
    forecast_max_age_s: float = 7200.0
    poll_interval_s: float = 300.0
    timeout_s: float = 10.0
    # Each node ranks by its mean intensity over the next this many seconds (0: now).
    horizon_s: float = 4 * 3600.0

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}, got {self.signal!r}")
        if not self.zone_label:
            raise ValueError("the zone label must not be empty")
        for name in ("max_age_s", "forecast_max_age_s", "poll_interval_s", "timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not (self.horizon_s >= 0 and math.isfinite(self.horizon_s)):
            raise ValueError(f"horizon_s must be >= 0 seconds, got {self.horizon_s!r}")


def read_sources_file(path: Path) -> tuple[Mapping[str, Any], ...]:
    """The list of source entries in `path`; ValueError naming the file and what is wrong."""
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ValueError(f"{path}: cannot read it: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML: {error}") from None
    if isinstance(loaded, Mapping):
        if set(loaded) - {"sources"}:
            # The plugin's whole args block: only the sources are taken, the rest are flags here.
            log.info("%s: reading its 'sources' only (the other keys are flags here)", path)
        loaded = loaded.get("sources")
    if not isinstance(loaded, list) or not all(isinstance(entry, Mapping) for entry in loaded):
        raise ValueError(
            f"{path}: expected a list of sources (each a mapping with a 'kind'), or a mapping "
            f"with such a list under 'sources', got {type(loaded).__name__}"
        )
    return tuple(loaded)


class NodeIntensity:
    """The latest carbon snapshot, polled in the background, and each node's intensity in it."""

    def __init__(
        self,
        settings: CarbonSettings,
        nodes: Callable[[], Sequence[Mapping[str, Any]]],
        *,
        prometheus_url: str | None = None,
        clock: Callable[[], float] = time.time,
        registry: object = None,
    ) -> None:
        """`nodes()` returns the current Node objects (the controller's cache): their zones
        are what the sources are asked for."""
        self.settings = settings
        self.snapshot: CarbonSnapshot = EMPTY_SNAPSHOT
        self._nodes = nodes
        # The last `g_per_kwh` answer: node -> (zone, outlook g/kWh, at), for /status.
        self.last: dict[str, tuple[str | None, float, float]] = {}
        providers = [
            provider_from_config(
                raw,
                f"--carbon-sources[{i}]",
                index=i,
                timeout_s=settings.timeout_s,
                prometheus_url=prometheus_url,
            )
            for i, raw in enumerate(settings.sources)
        ]
        self.source: CarbonSource | None = None
        if providers:
            self.source = CarbonSource(
                providers,
                self._published,
                self._zones,
                interval_s=settings.poll_interval_s,
                max_age_s=settings.max_age_s,
                forecast_max_age_s=settings.forecast_max_age_s,
                registry=registry,
                metric_prefix=METRIC_PREFIX,
                clock=clock,
            )

    def _published(self, snapshot: CarbonSnapshot) -> None:
        self.snapshot = snapshot  # one reference swap: a round reads a whole snapshot

    def _zones(self) -> list[str]:
        return [zone for node in self._nodes() if (zone := self.zone_of(node))]

    def zone_of(self, node: Mapping[str, Any]) -> str | None:
        labels = (node.get("metadata") or {}).get("labels") or {}
        return labels.get(CARBON_ZONE_LABEL) or labels.get(self.settings.zone_label) or None

    def start(self) -> None:
        if self.source is not None:
            self.source.start()

    def stop(self) -> None:
        if self.source is not None:
            self.source.stop()

    def poll_once(self) -> CarbonSnapshot:
        """Poll the sources now (the thread does it every interval; `--once` calls it)."""
        return self.source.poll_once() if self.source is not None else self.snapshot

    def status(self) -> dict[str, Any]:
        """The sources' health, what they reported, and each node's outlook as the last round
        read it (JSON-ready, for /status; an unknown outlook is null: the node ranks at the
        mean of the others)."""
        return {
            "signal": self.settings.signal,
            "zone_label": self.settings.zone_label,
            "horizon_s": self.settings.horizon_s,
            "sources": self.source.status() if self.source is not None else {},
            "nodes": {
                name: {
                    "zone": zone,
                    "outlook_g_per_kwh": value if math.isfinite(value) else None,
                    "at_s": at_s,
                }
                for name, (zone, value, at_s) in sorted(self.last.items())
            },
        }

    def g_per_kwh(self, nodes: Sequence[Mapping[str, Any]], now_s: float) -> dict[str, float]:
        """Node name -> usable intensity (g/kWh), NaN where there is none: the mean over the
        next `horizon_s` (`livedata.carbon_source.node_g_per_kwh`)."""
        snapshot = self.snapshot
        found, last = {}, {}
        for node in nodes:
            metadata = node.get("metadata") or {}
            name = metadata.get("name", "")
            zone = self.zone_of(node)
            found[name] = snapshot_g_per_kwh(
                snapshot,
                name,
                zone,
                self.settings.signal,
                now_s,
                annotations=metadata.get("annotations"),
                max_age_s=self.settings.max_age_s,
                horizon_s=self.settings.horizon_s,
            )
            last[name] = (zone, found[name], now_s)
        self.last = last  # one reference swap: /status reads a whole round
        return found
