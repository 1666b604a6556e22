"""Model swap: watch the (ConfigMap-mounted) bundle directory, validate, swap atomically.

kubelet updates a mounted ConfigMap by writing a new ``..<timestamp>`` directory, pointing a
``..data_tmp`` symlink at it and renaming that over ``..data``; the visible files are symlinks
``name -> ..data/name``. ``BundleWatcher`` polls the resolved target of ``..data`` (or, for a
plain directory, a stat signature of its files), and when it changes loads the new bundle off
the request path from the resolved timestamped directory (a consistent snapshot, even if
kubelet swaps again meanwhile), validates it completely and only then hands the new
``Predictor`` to ``on_swap``.

A bad bundle never replaces a good one: the caller keeps serving what it has, the refusal is
logged, counted and kept in ``last_refused`` for ``/status`` and ``/metrics``. A directory that
vanishes is a refusal too.

``ModelHolder`` pairs the current predictor with the curve table computed from it and swaps
both in one reference assignment, so a request never sees half of two bundles.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from predictor.bundle import FALLBACK_NODE, MANIFEST_NAME, BundleError, thermal_slopes
from predictor.curves import CurveBuilder, CurveTable
from predictor.model import UTIL_FEATURE, Predictor

log = logging.getLogger(__name__)

DATA_LINK = "..data"


# ---------------------------------------------------------------------------------------------
# Validation on a probe grid


@dataclass(frozen=True)
class ProbeGrid:
    """Where every model must predict plausible, finite, non-decreasing watts."""

    utils: tuple[float, ...] = tuple(float(u) for u in np.linspace(0.0, 1.0, 11))
    ambient_temps_c: tuple[float, ...] = (18.0, 24.0, 30.0)
    # CPU temperature above ambient at u = 0.5 (thermal slopes move it along u). Relative to
    # ambient because that is how servers behave: a probe at 18 C ambient with a 65 C CPU at
    # half load asks a model about air it never breathed, and polynomials answer nonsense there.
    cpu_above_ambient_c: tuple[float, ...] = (25.0, 32.0, 40.0)
    min_power_w: float = 0.0  # exclusive
    max_power_w: float = 20_000.0  # exclusive
    drop_tolerance_w: float = 2.0  # a step may fall by this much (trees and BMC noise)...
    drop_tolerance_frac: float = 0.01  # ...or by this share of the power, whichever is larger


def validate_predictor(predictor: Predictor, probe: ProbeGrid | None = None) -> None:
    """Raise ``BundleError`` unless every model is plausible on the probe grid."""
    served: dict[str, str] = {}  # model key -> a node it serves (for thermal and messages)
    for node in predictor.bundle.nodes:
        served.setdefault(predictor.model_key(node), node)  # type: ignore[arg-type]
    if predictor.bundle.fallback is not None:
        served.setdefault(predictor.bundle.fallback.file, FALLBACK_NODE)

    for key, node in served.items():
        entry = predictor.bundle.fallback if node == FALLBACK_NODE else predictor.entry(node)
        probe_model(
            lambda rows, key=key: predictor.run_model_w(key, rows),
            predictor.features,
            thermal_slopes(entry) if entry is not None else {},
            where=f"{predictor.bundle.directory / key}: node {node!r} model",
            probe=probe,
        )


def probe_model(
    predict_w: Callable[[np.ndarray], np.ndarray],
    features: Sequence[str],
    slopes: Mapping[str, float],
    *,
    where: str,
    probe: ProbeGrid | None = None,
) -> None:
    """Raise ``BundleError`` unless one model is plausible on the probe grid.

    The model runs once on all probe curves (every ambient x CPU temperature combination, u
    swept over ``probe.utils``). ``ambient*`` features take the ambient temperature, other
    ``*_temp_c`` features the CPU temperature moved along the node's thermal slope; any other
    feature is probed at 0. Training runs this same check on every candidate model, so it never
    writes a bundle that the extender would refuse.
    """
    probe = probe or ProbeGrid()
    utils = np.asarray(probe.utils, dtype=np.float64)
    conditions = [(a, a + d) for a in probe.ambient_temps_c for d in probe.cpu_above_ambient_c]
    rows = np.zeros((len(conditions), len(utils), len(features)), dtype=np.float32)
    for n, (ambient_c, cpu_c) in enumerate(conditions):
        for column, name in enumerate(features):
            if name == UTIL_FEATURE:
                rows[n, :, column] = utils
            elif name.startswith("ambient"):
                rows[n, :, column] = ambient_c
            elif name.endswith("_temp_c"):
                rows[n, :, column] = cpu_c + slopes.get(name, 0.0) * (utils - 0.5)
    watts = np.asarray(predict_w(rows.reshape(-1, len(features))), dtype=np.float64)
    for (ambient_c, cpu_c), curve_w in zip(
        conditions, watts.reshape(len(conditions), len(utils)), strict=True
    ):
        at = f"{where} at ambient {ambient_c:g} C, cpu {cpu_c:g} C at u=0.5"
        _check_curve(curve_w, utils, probe, at)


def _check_curve(watts: np.ndarray, utils: np.ndarray, probe: ProbeGrid, where: str) -> None:
    if not np.isfinite(watts).all():
        u = utils[np.flatnonzero(~np.isfinite(watts))[0]]
        raise BundleError(f"{where}: predicts a non-finite value at u={u:g}")
    implausible = (watts <= probe.min_power_w) | (watts >= probe.max_power_w)
    if implausible.any():
        i = int(np.flatnonzero(implausible)[0])
        raise BundleError(
            f"{where}: predicts {watts[i]:.1f} W at u={utils[i]:g}, outside the plausible "
            f"({probe.min_power_w:g}, {probe.max_power_w:g}) W"
        )
    drops = watts[:-1] - watts[1:]
    tolerance = np.maximum(probe.drop_tolerance_w, probe.drop_tolerance_frac * watts[:-1])
    falling = drops > tolerance
    if falling.any():
        i = int(np.flatnonzero(falling)[0])
        raise BundleError(
            f"{where}: power decreases with utilisation, {watts[i]:.1f} W at u={utils[i]:g} "
            f"to {watts[i + 1]:.1f} W at u={utils[i + 1]:g}"
        )


def load_validated(
    directory: Path, *, intra_op_threads: int = 1, probe: ProbeGrid | None = None
) -> Predictor:
    """Load the bundle at ``directory`` and validate it on the probe grid; ``BundleError``."""
    predictor = Predictor.load(directory, intra_op_threads=intra_op_threads)
    validate_predictor(predictor, probe)
    return predictor


# ---------------------------------------------------------------------------------------------
# Watching the directory


@dataclass(frozen=True)
class Refusal:
    version: str | None  # the refused manifest's version, if it could be read
    error: str
    at: float  # Unix seconds

    def as_dict(self) -> dict[str, object]:
        return {"version": self.version, "error": self.error, "at": self.at}


@dataclass
class WatcherCounters:
    checks: int = 0
    swaps: int = 0
    refusals: int = 0


def _source_of(directory: Path) -> tuple[tuple[object, ...], Path]:
    """(identity of what the directory holds now, the directory to load it from).

    A kubelet mount is identified by the target of ``..data`` and loaded from that timestamped
    directory; a plain directory by the names, sizes and mtimes of its entries.
    """
    link = directory / DATA_LINK
    if link.is_symlink():
        target = os.readlink(link)
        resolved = (directory / target).resolve()
        return ("kubelet", str(resolved), resolved.is_dir()), resolved
    if not directory.is_dir():
        return ("missing",), directory
    entries = []
    with os.scandir(directory) as scan:
        for entry in scan:
            try:
                stat = entry.stat()
            except FileNotFoundError:  # removed while we looked: the next poll sees the rest
                continue
            entries.append((entry.name, stat.st_size, stat.st_mtime_ns))
    return ("plain", tuple(sorted(entries))), directory


def _manifest_version(directory: Path) -> str | None:
    try:
        version = json.loads((directory / MANIFEST_NAME).read_text()).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return version if isinstance(version, str) else None


class BundleWatcher:
    """Polls a bundle directory and hands each new, fully validated ``Predictor`` to ``on_swap``."""

    def __init__(
        self,
        directory: Path,
        on_swap: Callable[[Predictor], None],
        *,
        poll_interval_s: float = 2.0,
        intra_op_threads: int = 1,
        probe: ProbeGrid | None = None,
        loader: Callable[[Path], Predictor] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.on_swap = on_swap
        self.poll_interval_s = poll_interval_s
        self.probe = probe
        self._loader = loader or (
            lambda path: load_validated(path, intra_op_threads=intra_op_threads, probe=probe)
        )
        self._lock = threading.Lock()  # one check at a time (thread vs. check_now)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: tuple[object, ...] | None = None
        self.counters = WatcherCounters()
        self.current_version: str | None = None
        self.last_refused: Refusal | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="bundle-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check_now()
            except Exception:  # never let the watcher die: the old bundle keeps serving
                log.exception("bundle watcher: unexpected error while checking %s", self.directory)
            self._stop.wait(self.poll_interval_s)

    # --- one check -------------------------------------------------------------------------

    def check_now(self) -> bool:
        """Check once; True if a new bundle was swapped in. Safe to call from any thread."""
        with self._lock:
            self.counters.checks += 1
            try:
                identity, source = _source_of(self.directory)
            except OSError as exc:
                identity, source = ("error", str(exc)), self.directory
            if identity == self._seen:
                return False
            self._seen = identity
            if identity[0] == "missing" or not source.is_dir():
                self._refuse(None, f"{source}: bundle directory is missing")
                return False
            try:
                predictor = self._loader(source)
            except BundleError as exc:
                self._refuse(_manifest_version(source), str(exc))
                return False
            except Exception as exc:  # a loader bug must not take down the service either
                self._refuse(_manifest_version(source), f"{source}: {type(exc).__name__}: {exc}")
                return False
            if predictor.version == self.current_version:
                log.info("bundle %s unchanged (same version at %s)", predictor.version, source)
                return False
            try:
                self.on_swap(predictor)
            except Exception as exc:  # e.g. curves cannot be built: the old pair stays in place
                log.exception("bundle %s: on_swap failed", predictor.version)
                self._refuse(predictor.version, f"{source}: installing failed: {exc}")
                return False
            previous, self.current_version = self.current_version, predictor.version
            self.counters.swaps += 1
            log.info("bundle swapped: %s -> %s (from %s)", previous, predictor.version, source)
            return True

    def _refuse(self, version: str | None, error: str) -> None:
        self.counters.refusals += 1
        self.last_refused = Refusal(version=version, error=error, at=time.time())
        log.error(
            "bundle refused (version %s), keeping %s: %s", version, self.current_version, error
        )

    def status(self) -> dict[str, object]:
        """For ``/status``: what is served, what was refused last, and the counters."""
        return {
            "bundle_version": self.current_version,
            "last_refused": None if self.last_refused is None else self.last_refused.as_dict(),
            "bundle_checks": self.counters.checks,
            "bundle_swaps": self.counters.swaps,
            "bundle_refusals": self.counters.refusals,
        }


# ---------------------------------------------------------------------------------------------
# The pair the request path reads


@dataclass(frozen=True)
class ModelState:
    predictor: Predictor
    curves: CurveTable
    built_at_s: float


TelemetrySource = Callable[[], Mapping[str, Mapping[str, float]]]


class ModelHolder:
    """The current predictor and its curve table, replaced together in one assignment.

    Readers take ``holder.state`` once per request and use only that object. Writers
    (``install`` from the watcher, ``refresh`` from the telemetry loop) are serialised, so a
    refresh computed with the old predictor can never be published after a swap.
    """

    def __init__(
        self,
        telemetry_source: TelemetrySource,
        builder: CurveBuilder | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._telemetry_source = telemetry_source
        self._builder = builder or CurveBuilder()
        self._clock = clock  # the service's clock, so curve ages agree with telemetry ages
        self._write_lock = threading.Lock()
        self._state: ModelState | None = None

    @property
    def state(self) -> ModelState | None:
        return self._state

    def install(self, predictor: Predictor) -> None:
        """Build curves for a new predictor from current telemetry, then publish both."""
        with self._write_lock:
            curves = self._builder.build(predictor, self._telemetry_source(), None)
            self._state = ModelState(predictor, curves, self._clock())

    def refresh(self) -> CurveTable | None:
        """Rebuild curves incrementally for the current predictor; None before any install."""
        with self._write_lock:
            state = self._state
            if state is None:
                return None
            curves = self._builder.build(state.predictor, self._telemetry_source(), state.curves)
            self._state = ModelState(state.predictor, curves, self._clock())
            return curves
