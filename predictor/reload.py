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
vanishes is a refusal too. A payload that fails only because kubelet replaced it while it was
being read (the old timestamped directory is deleted after the swap) is not: what is mounted
now is read again at once, so a refusal always names what is actually mounted.

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

from predictor.bundle import MANIFEST_NAME, BundleError, directory_problem
from predictor.curves import CurveBuilder, CurveTable
from predictor.model import Predictor
from predictor.validation import ProbeGrid, load_validated

log = logging.getLogger(__name__)

DATA_LINK = "..data"
# Reads of the directory within one check when kubelet replaces the payload while we read it.
MAX_READS_PER_CHECK = 3


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


def describe_refusal(directory: Path, version: str | None, error: str, serving: str | None) -> str:
    """A refusal as a person reads it: which bundle, why, and what serves meanwhile."""
    refused = f"version {version} of the model bundle" if version else "the model bundle"
    if serving is None:
        outcome = "No bundle is serving: the extender is not ready until a valid one appears."
    else:
        outcome = f"Version {serving} keeps serving."
    return f"refused {refused} in {directory}: {error.rstrip('. ')}. {outcome}"


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

    def check_now(self, *, log_refusal: bool = True) -> bool:
        """Check once; True if a new bundle was swapped in. Safe to call from any thread.

        ``log_refusal=False`` leaves reporting a refusal to the caller (it is still counted and
        kept in ``last_refused``): the service's start-up says it once, as its exit message.
        """
        with self._lock:
            self.counters.checks += 1
            for _attempt in range(MAX_READS_PER_CHECK):
                swapped = self._check_source(log_refusal)
                if swapped is not None:
                    return swapped
            return False  # kubelet kept swapping while we read: the next poll looks again

    def _check_source(self, log_refusal: bool) -> bool | None:
        """One look at what the directory holds; None when it was replaced while being read."""
        try:
            identity, source = _source_of(self.directory)
        except OSError as exc:
            identity, source = ("error", str(exc)), self.directory
        if identity == self._seen:
            return False
        self._seen = identity
        predictor: Predictor | None = None
        version: str | None = None
        if identity[0] == "missing" or not source.is_dir():
            error = directory_problem(source) or f"{source}: bundle directory is missing"
        else:
            try:
                predictor = self._loader(source)
            except BundleError as exc:
                error, version = str(exc), _manifest_version(source)
            except Exception as exc:  # a loader bug must not take down the service either
                error = f"{source}: {type(exc).__name__}: {exc}"
                version = _manifest_version(source)
        if predictor is None:
            if self._replaced_since(identity):
                # kubelet swapped the volume while we read it (and removed the payload we were
                # reading): that payload is no longer what is mounted, so its failure is not a
                # refusal. Read what is mounted now.
                log.info("bundle in %s changed while being read; reading it again", source)
                self._seen = None
                return None
            self._refuse(version, error, log_refusal)
            return False
        if predictor.version == self.current_version:
            log.info("bundle %s unchanged (same version at %s)", predictor.version, source)
            return False
        try:
            self.on_swap(predictor)
        except Exception as exc:  # e.g. curves cannot be built: the old pair stays in place
            log.exception("bundle %s: on_swap failed", predictor.version)
            self._refuse(predictor.version, f"{source}: installing failed: {exc}", log_refusal)
            return False
        previous, self.current_version = self.current_version, predictor.version
        self.counters.swaps += 1
        log.info("bundle swapped: %s -> %s (from %s)", previous, predictor.version, source)
        return True

    def _replaced_since(self, identity: tuple[object, ...]) -> bool:
        try:
            return _source_of(self.directory)[0] != identity
        except OSError:
            return False

    def _refuse(self, version: str | None, error: str, log_refusal: bool = True) -> None:
        self.counters.refusals += 1
        self.last_refused = Refusal(version=version, error=error, at=time.time())
        if log_refusal:
            log.error("%s", describe_refusal(self.directory, version, error, self.current_version))

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
NodeCoresSource = Callable[[], Mapping[str, float]]  # node -> allocatable CPU (cores)


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
        node_cores_source: NodeCoresSource | None = None,
    ) -> None:
        self._telemetry_source = telemetry_source
        # The nodes' allocatable CPU, for scaling fleet-fallback curves by core count; None:
        # the builder is not given any (fallback curves stay unscaled).
        self._node_cores_source = node_cores_source
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
            curves = self._build(predictor, None)
            self._state = ModelState(predictor, curves, self._clock())

    def refresh(self) -> CurveTable | None:
        """Rebuild curves incrementally for the current predictor; None before any install."""
        with self._write_lock:
            state = self._state
            if state is None:
                return None
            curves = self._build(state.predictor, state.curves)
            self._state = ModelState(state.predictor, curves, self._clock())
            return curves

    def _build(self, predictor: Predictor, previous: CurveTable | None) -> CurveTable:
        telemetry = self._telemetry_source()
        if self._node_cores_source is None:
            return self._builder.build(predictor, telemetry, previous)
        return self._builder.build(
            predictor, telemetry, previous, node_cores=self._node_cores_source()
        )
