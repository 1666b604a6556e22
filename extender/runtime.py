"""The running service's moving parts, wired together; everything off the request path.

``Runtime`` owns the cluster state, the model holder (predictor + curve table in one
reference), the bundle watcher, the background curve refresher and, in live mode, the
Kubernetes and Prometheus sources. The request path reads exactly two references per request:
``holder.state`` (predictor and curves, swapped together) and ``state.view(now)`` (an
immutable cluster snapshot); it never waits on a background thread, a model call or I/O.

Background work:
- the bundle watcher (``predictor.reload.BundleWatcher``) polls the bundle directory, validates
  a new bundle and installs it with freshly tabulated curves;
- the curve refresher wakes every ``curve_refresh_interval_s`` and, when the telemetry changed
  since the last table, rebuilds the curve table incrementally (only changed nodes are
  re-predicted) and swaps it in.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from extender.accuracy import FLEET_FALLBACK_MEANS, bundle_accuracy, model_metric
from extender.config import ExtenderConfig
from extender.metrics import NodeSample, ServiceMetrics, StateSample
from extender.plugins.base import LiveSource, SourceContext
from extender.profile import Profile, ProfileError, load_profile
from extender.sources.snapshot import demo_snapshot, load_into, read_snapshot
from extender.state import ClusterState
from livedata.metrics_table import POWER_W
from predictor.core_scaling import CLIPPED, SCALED, shipped_core_exponents
from predictor.curves import CurveBuilder
from predictor.model import Predictor
from predictor.reload import BundleWatcher, ModelHolder, ModelState

log = logging.getLogger(__name__)

Clock = Callable[[], float]
MAX_NODES_LOGGED = 20  # node names in one log line; /status lists more
MAX_NODES_LISTED = 500  # node names in one /status list
# Requests of one verb, with none of the other, before the extender says that kube-scheduler's
# extender entry and the profile disagree about the filter verb.
VERB_CHECK_AFTER_REQUESTS = 100


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class TelemetrySummary:
    """Freshness of the telemetry of the nodes a node source reported."""

    nodes: int
    fresh: int
    max_age_s: float | None
    median_age_s: float | None

    @property
    def without_telemetry(self) -> int:
        return self.nodes - self.fresh


class Runtime:
    """State, model and background threads of one extender process."""

    def __init__(
        self,
        config: ExtenderConfig,
        *,
        state: ClusterState | None = None,
        clock: Clock = time.time,
    ) -> None:
        self.config = config
        self.clock = clock
        self.mode = config.mode
        self.profile = _profile(config)
        self.state = state or ClusterState(
            assumed_window_s=config.assumed_window_s,
            node_attributes=self.profile.node_attributes,
        )
        # Snapshot telemetry is fixed and never goes stale (contract 3).
        self.telemetry_ttl_s: float | None = config.telemetry_ttl_s if self.mode == "live" else None
        # Fleet-fallback curves scaled by core count: the builder needs the exponents and the
        # nodes' allocatable CPU, and the curves are rebuilt when the node set changes too.
        self.fallback_core_scaling = config.fallback_core_scaling
        builder = CurveBuilder(
            fallback_core_exponents=shipped_core_exponents() if self.fallback_core_scaling else None
        )
        self.holder = ModelHolder(
            self._telemetry_for_curves,
            builder,
            clock=clock,
            node_cores_source=self._node_cores_for_curves if self.fallback_core_scaling else None,
        )
        self.watcher = BundleWatcher(
            config.bundle_dir,
            self._on_bundle_swap,
            poll_interval_s=config.bundle_poll_interval_s,
        )
        self.started_at_s = clock()
        self.live_sources: list[LiveSource] = []
        self.kube_api: Any = None  # the Kubernetes ApiClient, in live mode
        self.plugin_sources: list[LiveSource] = []
        self._curves_telemetry_version: int | None = None
        self._curves_layout_version: int | None = None
        self._checked_view_version: int | None = None
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        self._last_no_telemetry_warning_s = -math.inf
        self._verb_problem_logged: str | None = None
        self._fallback_named: tuple[str | None, set[str]] = (None, set())
        self._fallback_lock = threading.Lock()  # the watcher and the refresher both name them
        self.metrics = ServiceMetrics(
            self.metrics_sample,
            self.node_sample,
            filter_plugins=[plugin.name for plugin in self.profile.filters],
            known_names=self.known_node_names,
        )

    # ---- lifecycle ------------------------------------------------------------------------

    def load_cluster(self) -> int:
        """Fill the state from the snapshot file or the demo cluster; returns the node count."""
        if self.mode == "live":
            return 0
        if self.config.cluster_file is not None:
            nodes = read_snapshot(self.config.cluster_file)
            source = str(self.config.cluster_file)
        else:
            nodes = demo_snapshot()
            source = "built-in demo cluster"
        load_into(self.state, nodes, observed_at_s=self.clock())
        with_telemetry = sum(1 for node in nodes if node.telemetry)
        log.info(
            "cluster loaded",
            extra={"source": source, "nodes": len(nodes), "with_telemetry": with_telemetry},
        )
        return len(nodes)

    def load_bundle(self) -> bool:
        """First bundle load, synchronously; True when a bundle is serving.

        A refusal is not logged here: the caller says it once (`bundle_problem`), as the exit
        message or as a warning when live mode serves on without a bundle.
        """
        self.watcher.check_now(log_refusal=False)
        return self.holder.state is not None

    def bundle_problem(self) -> str:
        """Why no bundle serves, for a person: the directory and what is wrong with it."""
        refused = self.watcher.last_refused
        directory = self.config.bundle_dir
        if refused is None:
            return f"no model bundle in {directory}"
        version = f" (version {refused.version})" if refused.version else ""
        error = refused.error.rstrip(". ")  # the caller goes on with a sentence of its own
        return f"the model bundle in {directory}{version} cannot be used: {error}"

    def start_background(self) -> None:
        """Start the bundle watcher, the curve refresher and (live mode) the sources."""
        self._stop.clear()
        self.watcher.start()
        self._refresher = threading.Thread(
            target=self._refresh_loop, name="curve-refresher", daemon=True
        )
        self._refresher.start()
        for source in (*self.live_sources, *self.plugin_sources):
            source.start()
        log.info(
            "background started",
            extra={
                "bundle_poll_interval_s": self.config.bundle_poll_interval_s,
                "curve_refresh_interval_s": self.config.curve_refresh_interval_s,
                "live_sources": [type(s).__name__ for s in self.live_sources],
                "plugin_sources": [type(s).__name__ for s in self.plugin_sources],
            },
        )

    def build_plugin_sources(self) -> list[LiveSource]:
        """Ask every enabled plugin for its background sources (before `start_background`)."""
        context = SourceContext(
            state=self.state,
            clock=self.clock,
            mode=self.mode,
            prometheus_url=self.config.prometheus_url,
            kube_api=self.kube_api,
            registry=self.metrics.registry,
            pod_watch=next((s for s in self.live_sources if hasattr(s, "add_pod_listener")), None),
        )
        self.plugin_sources = [
            source for plugin in self.profile.plugins for source in plugin.background(context)
        ]
        return self.plugin_sources

    def stop(self) -> None:
        self._stop.set()
        self.watcher.stop()
        for source in (*self.live_sources, *self.plugin_sources):
            try:
                source.stop()
            except Exception:
                log.exception("stopping %s failed", type(source).__name__)
        if self._refresher is not None:
            self._refresher.join(timeout=5)
            self._refresher = None

    # ---- background ----------------------------------------------------------------------

    def _telemetry_for_curves(self) -> Mapping[str, Mapping[str, float]]:
        # Called by the holder under its write lock: the version recorded here is exactly the
        # telemetry the published table was built from.
        version, snapshot = self.state.telemetry_snapshot()
        self._curves_telemetry_version = version
        return {name: values for name, (values, _observed_at_s) in snapshot.items()}

    def _node_cores_for_curves(self) -> Mapping[str, float]:
        # Called by the holder under its write lock, like the telemetry: the layout version
        # recorded here is the node set the published table's core scaling saw.
        version, cores = self.state.node_cores_snapshot()
        self._curves_layout_version = version
        return cores

    def _on_bundle_swap(self, predictor: Predictor) -> None:
        started = time.perf_counter()
        self.holder.install(predictor)
        self.metrics.curve_rebuild_duration.observe(time.perf_counter() - started)
        self.metrics.curve_rebuilds.inc()
        self.metrics.bundle_reloads.inc()
        model = self.holder.state
        fallback_nodes = len(model.curves.fallback_names) if model else 0
        log.info(
            "bundle installed",
            extra={
                "bundle_version": predictor.version,
                "bundle_dir": str(predictor.bundle.directory),
                "curves": len(model.curves) if model else 0,
                "own_model_nodes": (len(model.curves) - fallback_nodes) if model else 0,
                "fallback_nodes": fallback_nodes,
                "build_s": round(time.perf_counter() - started, 4),
            },
        )
        if model is not None:
            self._name_fallback_nodes(model)

    def refresh_curves(self) -> bool:
        """Rebuild the curve table if the telemetry changed since the last one; True if so."""
        if self.holder.state is None:
            return False
        # The view's version changes with any write and is cheap to read (the view is cached);
        # only then ask whether the telemetry itself changed.
        view_version = self.state.view(self.clock()).version
        if view_version == self._checked_view_version:
            return False
        self._checked_view_version = view_version
        version = self.state.telemetry_version()
        # With core scaling, a node joining or resizing moves the anchor or a node's ratio
        # while the telemetry may not move at all.
        layout_moved = (
            self.fallback_core_scaling
            and self.state.layout_version() != self._curves_layout_version
        )
        if version == self._curves_telemetry_version and not layout_moved:
            return False
        started = time.perf_counter()
        try:
            curves = self.holder.refresh()
        except Exception:
            self.metrics.curve_rebuild_failures.inc()
            log.exception("curve rebuild failed; the previous table keeps serving")
            return False
        self.metrics.curve_rebuild_duration.observe(time.perf_counter() - started)
        self.metrics.curve_rebuilds.inc()
        if curves is not None:
            log.debug(
                "curves rebuilt",
                extra={"computed_rows": curves.computed_rows, "reused_rows": curves.reused_rows},
            )
        model = self.holder.state
        if model is not None:
            self._name_fallback_nodes(model)
        return True

    def _name_fallback_nodes(self, model: ModelState) -> None:
        """Log the nodes scored by the fleet fallback: all of them when a bundle is installed,
        then each node that joins them (its telemetry arrived later), once per bundle."""
        version = model.predictor.version
        with self._fallback_lock:
            named_version, named = self._fallback_named
            if named_version != version:
                named = set()
                self._fallback_named = (version, named)
            new = [name for name in model.curves.fallback_names if name not in named]
            named.update(new)
        if not new:
            return
        shown = ", ".join(new[:MAX_NODES_LOGGED])
        if len(new) > MAX_NODES_LOGGED:
            shown += f" and {len(new) - MAX_NODES_LOGGED} more (GET /status lists them)"
        error = _fallback_error_text(model)
        scaling = _core_scaling_text(model, new)
        log.warning(
            f"{len(new)} {'more ' if len(named) > len(new) else ''}node(s) have no model of their "
            f"own in bundle {version} and are scored with its fleet fallback model{error}, "
            f"{scaling}: {shown}",
            extra={
                "bundle_version": version,
                "fallback_nodes": len(named),
                "fallback_core_scaling": self.fallback_core_scaling,
            },
        )

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.config.curve_refresh_interval_s):
            try:
                self.refresh_curves()
                self.check_verbs()
            except Exception:  # the loop must outlive any one failure
                log.exception("curve refresher: unexpected error")

    def verb_problem(self) -> str | None:
        """What the verbs kube-scheduler calls say about its extender entry, or None."""
        return verb_problem(
            [plugin.name for plugin in self.profile.filters],
            filter_requests=self.metrics.answered.get("filter", 0),
            prioritize_requests=self.metrics.answered.get("prioritize", 0),
        )

    def check_verbs(self) -> None:
        """Log `verb_problem` once, when it first shows."""
        problem = self.verb_problem()
        if problem is not None and problem != self._verb_problem_logged:
            self._verb_problem_logged = problem
            log.warning(problem)

    # ---- what the request path and the status endpoints read -------------------------------

    @property
    def model(self) -> ModelState | None:
        return self.holder.state

    def telemetry_summary(self, now_s: float) -> TelemetrySummary:
        view = self.state.view(now_s)
        observed = view.observed_at_s[view.has_node_info]
        utils = view.cpu_util[view.has_node_info]
        ages = now_s - observed
        fresh_mask = np.isfinite(ages) & np.isfinite(utils)
        if self.telemetry_ttl_s is not None:
            fresh_mask &= ages <= self.telemetry_ttl_s
        fresh_ages = ages[np.isfinite(ages)]
        return TelemetrySummary(
            nodes=int(observed.size),
            fresh=int(np.count_nonzero(fresh_mask)),
            max_age_s=float(fresh_ages.max()) if fresh_ages.size else None,
            median_age_s=float(np.median(fresh_ages)) if fresh_ages.size else None,
        )

    def readiness(self, now_s: float | None = None) -> Readiness:
        """Ready when a bundle serves and nodes are known; in live mode also when the Node/Pod
        watch has listed (and has not been failing for longer than the telemetry TTL) and at
        least ``ready_min_fresh_share`` of the nodes have fresh telemetry. Each unmet condition
        is one reason, for ``/readyz``.
        """
        now_s = self.clock() if now_s is None else now_s
        reasons: list[str] = []
        if self.holder.state is None:
            refused = self.watcher.last_refused
            detail = f": {refused.error}" if refused else ""
            reasons.append(f"no model bundle loaded from {self.config.bundle_dir}{detail}")
        if self.mode == "live":
            reasons.extend(_watch_not_ready_reasons(self.live_sources, now_s, self.telemetry_ttl_s))
        summary = self.telemetry_summary(now_s)
        if summary.nodes == 0:
            reasons.append("no nodes known yet")
        elif self.mode == "live":
            share = summary.fresh / summary.nodes
            if share < self.config.ready_min_fresh_share:
                reasons.append(
                    f"only {summary.fresh} of {summary.nodes} nodes have telemetry fresher than "
                    f"{self.config.telemetry_ttl_s:g} s (need "
                    f"{self.config.ready_min_fresh_share:.0%})"
                )
        return Readiness(ready=not reasons, reasons=tuple(reasons))

    def known_node_names(self) -> tuple[str, ...]:
        """The nodes a node source reported (not telemetry-only names)."""
        view = self.state.view(self.clock())
        return view.names[: int(np.count_nonzero(view.has_node_info))]

    def node_sample(self) -> NodeSample:
        """Per-node series for /metrics: predicted power at the current telemetry, measured
        power as read with it, the serving model and its held-out error, the plugins' node
        metrics. Nodes whose telemetry is stale (or that no node source reported) are left out:
        a gap, not a value that is no longer true."""
        now_s = self.clock()
        view = self.state.view(now_s)
        extra = [metric for plugin in self.profile.plugins for metric in plugin.node_metrics(view)]
        model = self.holder.state
        if model is None or len(model.curves) == 0:
            return NodeSample(extra=extra)
        curves = model.curves
        positions = view.index_of(curves.names)
        in_view = positions >= 0
        at = np.where(in_view, positions, 0)
        shown = in_view & view.has_node_info[at]
        if self.telemetry_ttl_s is not None:
            shown &= now_s - view.observed_at_s[at] <= self.telemetry_ttl_s
        rows = np.flatnonzero(shown)
        _, telemetry = self.state.telemetry_snapshot()
        names = [curves.names[row] for row in rows.tolist()]
        measured_w = np.array(
            [telemetry[name][0].get(POWER_W, math.nan) for name in names], dtype=np.float64
        )
        return NodeSample(
            names=names,
            model=[curves.model_kind[row] for row in rows.tolist()],
            predicted_w=curves.predicted_now_w()[rows],
            measured_w=measured_w,
            model_mape_pct=curves.model_mape_pct[rows],
            extra=extra,
        )

    def metrics_sample(self) -> StateSample:
        now_s = self.clock()
        summary = self.telemetry_summary(now_s)
        model = self.holder.state
        fallback_nodes = len(model.curves.fallback_names) if model else 0
        return StateSample(
            nodes=summary.nodes,
            nodes_without_telemetry=summary.without_telemetry,
            telemetry_max_age_s=summary.max_age_s,
            telemetry_median_age_s=summary.median_age_s,
            bundle_version=model.predictor.version if model else None,
            bundle_created_at=model.predictor.bundle.created_at if model else None,
            curve_table_age_s=(now_s - model.built_at_s) if model else None,
            ready=self.readiness(now_s).ready,
            bundle_reload_refusals=self.watcher.counters.refusals,
            nodes_by_model=(
                {"own": len(model.curves) - fallback_nodes, "fallback": fallback_nodes}
                if model
                else {}
            ),
            fallback_mape_pct=_fallback_metric(model, "mape_pct"),
        )

    def status(self) -> dict[str, Any]:
        now_s = self.clock()
        model = self.holder.state
        summary = self.telemetry_summary(now_s)
        readiness = self.readiness(now_s)
        bundle: dict[str, Any] | None = None
        curves: dict[str, Any] | None = None
        if model is not None:
            b = model.predictor.bundle
            bundle = {
                "version": b.version,
                "created_at": b.created_at,
                "directory": str(b.directory),
                "features": list(b.features),
                "node_models": len(b.nodes),
                "fallback": b.fallback is not None,
                "accuracy": bundle_accuracy(b),
            }
            skipped: dict[str, int] = {}
            for reason in model.curves.skipped.values():
                skipped[reason] = skipped.get(reason, 0) + 1
            fallback_names = sorted(model.curves.fallback_names)
            curves = {
                "nodes": len(model.curves),
                "skipped": skipped,
                "built_at_s": model.built_at_s,
                "age_s": now_s - model.built_at_s,
                "own_model_nodes": len(model.curves) - len(fallback_names),
                # Scored with the bundle's fleet model: rougher than a node's own model.
                "fallback": {
                    "nodes": len(fallback_names),
                    "names": fallback_names[:MAX_NODES_LISTED],
                    "heldout_mape_pct": _fallback_metric(model, "mape_pct"),
                    "heldout_mae_w": _fallback_metric(model, "mae_w"),
                    "heldout_means": FLEET_FALLBACK_MEANS if b.fallback is not None else None,
                    # Each fallback curve scaled by the node's CPU count, or why not.
                    "core_scaling": model.curves.fallback_scaling.summary(),
                },
            }
        watcher = self.watcher.status()
        return {
            "mode": self.mode,
            "bundle_version": model.predictor.version if model else None,
            "bundle": bundle,
            "last_refused": watcher["last_refused"],
            "bundle_swaps": watcher["bundle_swaps"],
            "bundle_refusals": watcher["bundle_refusals"],
            "ready": readiness.ready,
            "not_ready_reasons": list(readiness.reasons),
            "nodes": {
                "known": summary.nodes,
                "with_fresh_telemetry": summary.fresh,
                "without_telemetry": summary.without_telemetry,
                "assumed_pods": self.state.assumed_pod_count(),
            },
            "telemetry": {
                "ttl_s": self.telemetry_ttl_s,
                "max_age_s": summary.max_age_s,
                "median_age_s": summary.median_age_s,
            },
            "curves": curves,
            "scoring": {
                "profile": self.profile.describe(),
                "weights": self.profile.weights,
                "assumed_window_s": self.state.assumed_window_s,
            },
            "requests_answered": dict(self.metrics.answered),
            "verb_problem": self.verb_problem(),
            "live_sources": [_source_status(s) for s in self.live_sources],
            "plugins": {
                plugin.name: status
                for plugin in self.profile.plugins
                if (status := plugin.status()) is not None
            },
            "uptime_s": now_s - self.started_at_s,
        }

    def note_unscored(self, count: int, now_s: float) -> None:
        """Count candidates answered without a prediction; warn at most once a minute."""
        if count <= 0:
            return
        self.metrics.nodes_scored_without_telemetry.inc(count)
        if now_s - self._last_no_telemetry_warning_s >= 60.0:
            self._last_no_telemetry_warning_s = now_s
            log.warning(
                "candidates without telemetry or curve get the lowest power score",
                extra={"nodes_in_request": count},
            )


def _fallback_metric(model: ModelState | None, name: str) -> float | None:
    """A held-out figure of the bundle's fleet fallback model (manifest `metrics`), if any."""
    fallback = model.predictor.bundle.fallback if model is not None else None
    return None if fallback is None else model_metric(fallback, name)


def _fallback_error_text(model: ModelState) -> str:
    mape_pct = _fallback_metric(model, "mape_pct")
    mae_w = _fallback_metric(model, "mae_w")
    figures = [f"MAPE {mape_pct:.1f} %" if mape_pct is not None else None]
    figures.append(f"MAE {mae_w:.1f} W" if mae_w is not None else None)
    shown = ", ".join(f for f in figures if f)
    return f" (held-out {shown})" if shown else " (no held-out error in its manifest)"


def _core_scaling_text(model: ModelState, names: list[str]) -> str:
    """How the named fallback nodes' curves were scaled by core count, for the log line."""
    scaling = model.curves.fallback_scaling
    if scaling.exponents is None:
        return "unscaled (fallback core scaling is off)"
    counts: dict[str, int] = {}
    for name in names:
        row = model.curves.row_of(name)
        reason = scaling.reason[row] if row >= 0 else None
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
    scaled = counts.pop(SCALED, 0) + counts.pop(CLIPPED, 0)
    anchor = (
        f"the median {scaling.anchor_cores:g} cores of {scaling.anchor_nodes} own-model node(s)"
        if scaling.anchor_cores is not None
        else "no own-model node with a known CPU count"
    )
    unscaled = "".join(f", {count} not ({reason})" for reason, count in sorted(counts.items()))
    return f"{scaled} scaled by their CPU count against {anchor}{unscaled}"


def verb_problem(
    filters: Sequence[str], *, filter_requests: int, prioritize_requests: int
) -> str | None:
    """Whether kube-scheduler's extender entry and the profile disagree on the filter verb.

    Filters with no `filterVerb` never run (the power cap, for one, is not enforced); a
    `filterVerb` with no filters costs each pod a round trip for nothing. Said only once one
    verb has been called `VERB_CHECK_AFTER_REQUESTS` times and the other never.
    """
    guide = "(docs/operations.md, section 15)"
    if filters and filter_requests == 0 and prioritize_requests >= VERB_CHECK_AFTER_REQUESTS:
        return (
            f"kube-scheduler calls /prioritize but never /filter, so the profile's filters "
            f"({', '.join(filters)}) do not run: add filterVerb: filter to its extender entry, "
            f"or remove them from the profile {guide}"
        )
    if not filters and filter_requests >= VERB_CHECK_AFTER_REQUESTS:
        return (
            "kube-scheduler calls /filter but the profile has no filters: every pod pays a "
            f"round trip for nothing; remove filterVerb from its extender entry {guide}"
        )
    return None


def _profile(config: ExtenderConfig) -> Profile:
    """The scoring profile from --config, with --power-weight/--energy-weight applied."""
    profile = load_profile(config.config_file)
    overrides = {
        name: weight
        for name, weight in (
            ("PowerIncrease", config.power_weight),
            ("EnergyLevel", config.energy_weight),
        )
        if weight is not None
    }
    if not overrides:
        return profile
    try:
        return profile.with_weights(**overrides)
    except ProfileError as exc:
        raise ProfileError(f"--power-weight/--energy-weight: {exc}") from None


def _watch_not_ready_reasons(
    sources: list[LiveSource], now_s: float, stale_after_s: float | None
) -> list[str]:
    """Why the Kubernetes watch (any source with ``healthy``/``last_sync_at_s``) is not usable.

    Not ready until the node and pod watches have listed once: before that the node view is
    empty or partial. A watch that drops and reconnects within ``stale_after_s`` (the telemetry
    TTL) keeps the service ready, so a routine reconnect does not flap the endpoint; a watch
    failing for longer means the view may miss nodes and pods, and readiness says so.
    """
    reasons: list[str] = []
    for source in sources:
        if not hasattr(source, "healthy") or not hasattr(source, "last_sync_at_s"):
            continue
        last_sync_at_s = source.last_sync_at_s
        if last_sync_at_s is None:
            reasons.append("Kubernetes node/pod watch has not synced yet")
        elif not source.healthy and stale_after_s is not None:
            age_s = now_s - last_sync_at_s
            if age_s > stale_after_s:
                reasons.append(
                    f"Kubernetes node/pod watch failing for {age_s:.0f} s "
                    f"(more than {stale_after_s:g} s)"
                )
    return reasons


def _source_status(source: LiveSource) -> dict[str, Any]:
    status = getattr(source, "status", None)
    entry: dict[str, Any] = {"source": type(source).__name__}
    if callable(status):
        try:
            entry.update(status())
        except Exception as exc:
            entry["error"] = str(exc)
    return entry


def build_live_sources(runtime: Runtime) -> list[LiveSource]:
    """Kubernetes watches and the Prometheus poller for live mode (thin wiring only)."""
    from kubernetes import client

    from extender.sources.kube_watch import ClusterWatcher
    from livedata.kube_client import kube_api_client

    # The collect settings first: a bad --collect-config is the likelier mistake to report.
    telemetry = _prometheus_source(runtime)
    runtime.kube_api = kube_api_client(
        kubeconfig=runtime.config.kubeconfig, in_cluster=runtime.config.in_cluster
    )
    api = client.CoreV1Api(runtime.kube_api)
    return [ClusterWatcher(api, runtime.state, clock=runtime.clock), telemetry]


def _prometheus_source(runtime: Runtime) -> LiveSource:
    from extender.sources.telemetry import TelemetryPoller
    from livedata.collect_config import load_collect_config

    config = runtime.config
    assert config.prometheus_url is not None  # live mode, checked by the config
    # The flag's URL wins over a url in the file: the file describes the metrics, the flag
    # where this deployment reaches Prometheus.
    collect = load_collect_config(config.collect_config, url=config.prometheus_url)
    return TelemetryPoller(
        collect,
        runtime.state,
        interval_s=runtime.config.refresh_interval_s,
        timeout_s=runtime.config.prometheus_timeout_s,
    )
