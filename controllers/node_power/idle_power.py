"""Each node's predicted idle watts, P(u = 0), from the model bundle the extender serves.

The policy powers off first the nodes whose idle watts per allocatable core are worst and
counts the watts each power-off saves; both come from here. The bundle is the same one the
extender mounts (the `power-models-*` ConfigMaps): `predictor.reload.BundleWatcher` loads and
validates each new version, and a bad one never replaces a good one.

Temperatures move idle power a little (fans, leakage). With `--prometheus`, a node that
reports them is predicted at its current ambient temperature, its CPU temperatures taken back
along the model's thermal slope to u = 0. Otherwise, and for nodes that are off (no readings),
at nominal conditions: `nominal_ambient_c`, and CPUs `nominal_cpu_above_ambient_c` above it
at half load, moved along the slope to u = 0, as the bundle's validation probes models.
A node without a model (and a bundle without a fallback) has NaN idle watts: the policy ranks
it last. A node on the fleet fallback is scaled by its allocatable CPU as the extender scales
its curve (`predictor.core_scaling`: idle ~ cores^0.17 against the own-model nodes' median),
so a 64-core and an 8-core node without data do not look alike per core.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from livedata.collect_config import CollectConfig
from livedata.instant import read_instant
from livedata.metrics_table import CPU_UTIL
from livedata.prometheus import CollectError
from predictor.bundle import thermal_slopes
from predictor.core_scaling import CoreExponents, fallback_scaling_for
from predictor.model import Predictor
from predictor.reload import BundleWatcher

log = logging.getLogger(__package__)


@dataclass(frozen=True)
class NominalConditions:
    ambient_c: float = 24.0
    cpu_above_ambient_c: float = 32.0  # at u = 0.5, as predictor.validation.ProbeGrid


class IdlePower:
    """Predicted idle watts per node from the current bundle (and current temperatures)."""

    def __init__(
        self,
        bundle_dir: Path | None,
        *,
        prometheus: CollectConfig | None = None,
        nominal: NominalConditions | None = None,
        core_exponents: CoreExponents | None = None,
    ) -> None:
        self.bundle_dir = bundle_dir
        self.prometheus = prometheus
        self.nominal = nominal or NominalConditions()
        self.core_exponents = core_exponents  # None: fallback nodes unscaled
        self.fallback_scaling: dict[str, object] | None = None  # the last round's, for /status
        self._predictor: Predictor | None = None
        self._lock = threading.Lock()
        self._watcher = (
            BundleWatcher(bundle_dir, self._install, poll_interval_s=30.0)
            if bundle_dir is not None
            else None
        )
        self.last_reading_error: str | None = None

    def _install(self, predictor: Predictor) -> None:
        with self._lock:
            self._predictor = predictor

    @property
    def bundle_version(self) -> str | None:
        predictor = self._predictor
        return predictor.version if predictor is not None else None

    def refresh(self) -> None:
        """Pick up a new bundle version if the directory changed (cheap when it did not)."""
        if self._watcher is not None:
            self._watcher.check_now()

    def status(self) -> dict[str, object]:
        status: dict[str, object] = {
            "bundle_dir": str(self.bundle_dir) if self.bundle_dir else None
        }
        if self._watcher is not None:
            status.update(self._watcher.status())
        status["temperatures_error"] = self.last_reading_error
        status["fallback_core_scaling"] = self.fallback_scaling
        return status

    def idle_w(
        self, nodes: Iterable[str], cores: Mapping[str, float] | None = None
    ) -> dict[str, float]:
        """Predicted idle watts of each node (NaN without a model); `cores` (allocatable CPU
        by node) scales the fallback nodes when `core_exponents` is set."""
        names = list(nodes)
        predictor = self._predictor
        if predictor is None:
            return dict.fromkeys(names, math.nan)
        current = self._current_temperatures()
        rows: dict[str, list[tuple[str, np.ndarray]]] = {}
        result = dict.fromkeys(names, math.nan)
        for node in names:
            key = predictor.model_key(node)
            if key is None:
                continue
            row = predictor.feature_row(self._idle_telemetry(predictor, node, current.get(node)))
            if row is not None:
                rows.setdefault(key, []).append((node, row))
        for key, entries in rows.items():  # one model call per distinct model
            watts = predictor.run_model_w(key, np.stack([row for _, row in entries]))
            for (node, _), value in zip(entries, watts, strict=True):
                result[node] = float(value) if math.isfinite(value) and value > 0 else math.nan
        scaling = fallback_scaling_for(
            predictor,
            names,
            [predictor.model_kind(node) == "fallback" for node in names],
            cores,
            self.core_exponents,
        )
        self.fallback_scaling = scaling.summary()
        for node, factor in zip(names, scaling.idle_factor.tolist(), strict=True):
            result[node] *= factor  # 1 for own models and unscaled fallback nodes
        return result

    def _idle_telemetry(
        self, predictor: Predictor, node: str, reading: Mapping[str, float] | None
    ) -> dict[str, float]:
        """Feature values for u = 0: current temperatures where read, nominal elsewhere."""
        entry = predictor.entry(node)
        slopes = thermal_slopes(entry) if entry is not None else {}
        reading = reading or {}
        util_now = reading.get(CPU_UTIL, math.nan)
        ambient_c = reading.get("ambient_temp_c", math.nan)
        if not math.isfinite(ambient_c):
            ambient_c = self.nominal.ambient_c
        telemetry = {CPU_UTIL: 0.0}
        for feature in predictor.features:
            if feature == CPU_UTIL:
                continue
            if feature.startswith("ambient"):
                telemetry[feature] = ambient_c
            elif feature.endswith("_temp_c"):
                slope = slopes.get(feature, 0.0)
                now_c = reading.get(feature, math.nan)
                if math.isfinite(now_c) and math.isfinite(util_now):
                    telemetry[feature] = now_c - slope * util_now
                else:
                    nominal_c = ambient_c + self.nominal.cpu_above_ambient_c
                    telemetry[feature] = nominal_c - slope * 0.5
            else:
                telemetry[feature] = reading.get(feature, 0.0)
        return telemetry

    def _current_temperatures(self) -> dict[str, Mapping[str, float]]:
        if self.prometheus is None:
            return {}
        try:
            readings = read_instant(self.prometheus)
        except CollectError as error:
            if str(error) != self.last_reading_error:
                log.warning("temperatures unavailable, predicting at nominal ones: %s", error)
            self.last_reading_error = str(error)
            return {}
        self.last_reading_error = None
        return {reading.node: reading.values for reading in readings}
