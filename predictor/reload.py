"""Model swap: watch the (ConfigMap-mounted) bundle directory, validate, swap atomically.

kubelet updates a mounted ConfigMap by writing a new ``..<timestamp>`` directory, pointing a
``..data_tmp`` symlink at it and renaming that over ``..data``; the visible files are symlinks
``name -> ..data/name``. ``BundleWatcher`` polls the resolved target of ``..data`` (or, for a
plain directory, a stat signature of its files), and when it changes loads the new bundle off
the request path from the resolved timestamped directory (a consistent snapshot, even if
kubelet swaps again meanwhile), validates every model on the probe grid
(``predictor.validation``) and only then hands the new ``Predictor`` to ``on_swap``.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from predictor.bundle import MANIFEST_NAME, BundleError
from predictor.curves import CurveBuilder, CurveTable
from predictor.model import Predictor
from predictor.validation import ProbeGrid, load_validated

log = logging.getLogger(__name__)

DATA_LINK = "..data"


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
