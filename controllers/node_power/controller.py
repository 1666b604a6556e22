"""The controller's round: read the cluster, ask the policy, act, report; and the loop around it.

Every `scan_interval_s`, on the replica that holds the Lease:

1. **read** the cached Nodes, Pods and PodDisruptionBudgets (`kube.Informer`), the
   controller's Namespace (kill switch), each node's predicted idle watts (`idle_power`) and,
   ranking by grams, its carbon intensity (`carbon`, polled in the background), and map them
   to the policy's views (`views.cluster_view`); nodes backing off after a
   failure are shown to the policy as unmanaged;
2. **decide** with `policy.decide` (the same code the energy simulation runs), on the pending
   pods that the nodes already waking will not take (`views.pending_beyond_waking`);
3. **act** (`actuator`): cancel drains first, carry on with what is in flight (drains,
   wakes; off nodes powered on by someone else), then wake, power off empty nodes (at most
   `max_bulk_power_off` a round) and start drains (at most `max_drain_parallelism` at once):
   every node to empty is cordoned before the first eviction, so that no evicted pod lands
   on a node that is about to be drained too;
4. **report**: each decision logged with its reason and predicted watts, and the metrics.

Without `apply` (the default) nothing is written and no BMC is asked to switch anything:
each decision the policy would act on is logged once, as "would ...", until it changes. With
`apply`, nodes without a driver label use `default_driver` (dry-run unless set otherwise), so
a cluster can run the whole cordon-drain-annotate cycle before any BMC is trusted with it.

A round that fails (API server unreachable, a bug) changes nothing more and the next round
starts afresh from the cluster's state: everything the controller must remember across
rounds is written on the nodes, except backoff and the unneeded-since bookkeeping. The
first round a process leads (a `--once` run, a new leader, a leader back after losing the
Lease) has no memory of since when each node has been unneeded: it starts each clock where the
evidence the cluster holds puts it (`views.unneeded_evidence_s`: the power-state annotation's
time, the node's pods, its kubelet's Events about pods within the Events' retention
`event_ttl_s`): at the last sign that the node was needed. Later rounds carry their own
observation forward, as cluster-autoscaler's unneeded clock does. Without leave to list Events
the clocks start at that first round.

The controller acts only while it leads, and stops at once when the process is told to stop
(`stop` set): every write asks `may_write()` first, so neither a lapsed renewal nor a
shutdown can power off a node in the middle of a round.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from controllers.node_power.actuator import (
    Actuator,
    ActuatorSettings,
    LostLeadership,
    saved_watts,
)
from controllers.node_power.carbon import NodeIntensity
from controllers.node_power.drivers import BmcSecret
from controllers.node_power.headroom import HeadroomLearner, HeadroomSettings, HeadroomState
from controllers.node_power.idle_power import IdlePower
from controllers.node_power.kube import Informer, KubeOps, api_unavailable, describe_api_error
from controllers.node_power.lease import LeaderElector
from controllers.node_power.metrics import ControllerMetrics
from controllers.node_power.policy import (
    RANK_BY_GRAMS,
    Action,
    ArrivalRate,
    ArrivalRateMeter,
    Decisions,
    NodeView,
    PolicySettings,
    decide,
)
from controllers.node_power.views import (
    ArrivalTracker,
    ClusterView,
    WaitTracker,
    cluster_view,
    node_allocatable,
    pending_beyond_waking,
    unneeded_evidence_s,
)
from livedata.labels import POWER_DRAINING, POWER_OFF, POWER_STATES, POWER_WAKING
from livedata.logs import FailureStreak

log = logging.getLogger(__package__)

# Decision names in the logs -> the `action` label of power_aware_node_power_actions_total.
ACTION_LABELS = {
    "cancel drain": "cancel_drain",
    "wake": "wake",
    "power off": "power_off",
    "drain and power off": "drain",
}


@dataclass(frozen=True)
class ControllerSettings:
    """Everything one controller process is told on its command line."""

    policy: PolicySettings = field(default_factory=PolicySettings)
    actuator: ActuatorSettings = field(default_factory=ActuatorSettings)
    apply: bool = False
    scheduler_name: str = "power-aware-scheduler"
    namespace: str = "power-aware-scheduler"
    scan_interval_s: float = 10.0
    # The arrival-rate meter's windows; empty: `ArrivalRateMeter.for_boot_time(policy.boot_s)`,
    # as the simulation measures it.
    arrival_windows_s: tuple[float, ...] = ()
    max_drain_parallelism: int = 1
    max_bulk_power_off: int = 10
    api_timeout_s: float = 10.0
    # How long the API server keeps Events (its --event-ttl, 1 h by default): how far back the
    # first round's evidence of a node's last pod can reach (`views.unneeded_evidence_s`).
    event_ttl_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("scan_interval_s", "api_timeout_s", "event_ttl_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not all(w > 0 for w in self.arrival_windows_s):
            raise ValueError(f"arrival_windows_s must be positive, got {self.arrival_windows_s}")
        if self.max_drain_parallelism < 0 or self.max_bulk_power_off < 0:
            raise ValueError("max_drain_parallelism and max_bulk_power_off must be >= 0")


@dataclass
class RoundResult:
    """What one round saw and did (for tests, `--once` and the logs)."""

    leader: bool = True
    decisions: Decisions | None = None
    view: ClusterView | None = None
    acted: list[str] = field(default_factory=list)  # "wake node-a", "drain node-b"...
    error: str | None = None


class NodePowerController:
    """Reads, decides, acts; one round at a time, only while leading."""

    def __init__(
        self,
        settings: ControllerSettings,
        api_client: client.ApiClient,
        *,
        idle_power: IdlePower | None = None,
        carbon: NodeIntensity | None = None,
        secret: BmcSecret | None = None,
        elector: LeaderElector | None = None,
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.elector = elector
        self.metrics = metrics or ControllerMetrics()
        self.clock = clock
        self.idle_power = idle_power or IdlePower(None)
        # Each node's carbon outlook, read only when the policy ranks by grams.
        self.carbon = carbon if settings.policy.rank_by == RANK_BY_GRAMS else None
        if self.carbon is not None:
            horizon_s = self.carbon.settings.horizon_s
            if horizon_s != settings.policy.carbon_horizon_s:
                # The reasons would name another window than the one the values describe.
                raise ValueError(
                    f"the carbon source reads {horizon_s} s ahead but the policy says "
                    f"{settings.policy.carbon_horizon_s} s (one --carbon-horizon sets both)"
                )
            self.metrics.rank_by_grams(horizon_s)
        core = client.CoreV1Api(api_client)
        policy_api = client.PolicyV1Api(api_client)
        self.nodes = Informer("nodes", core.list_node, clock=clock)
        self.pods = Informer("pods", core.list_pod_for_all_namespaces, clock=clock)
        self.budgets = Informer(
            "poddisruptionbudgets",
            policy_api.list_pod_disruption_budget_for_all_namespaces,
            clock=clock,
        )
        self.ops = KubeOps(api_client, timeout_s=settings.api_timeout_s)
        self.actuator = Actuator(
            self.ops,
            self.nodes,
            secret or BmcSecret(None),
            settings.actuator,
            self.metrics,
            self.may_write,
        )
        # With a wait target: the headroom learned from the pods' creations and waits.
        target_s = settings.policy.target_wait_p99_s
        self.learner = (
            HeadroomLearner(HeadroomSettings(target_s, boot_s=settings.policy.boot_s))
            if target_s > 0
            else None
        )
        self.waits = (
            WaitTracker(self.learner, self.learner.settings.wait_window_s)
            if self.learner is not None
            else None
        )
        self.headroom: HeadroomState | None = None
        self.arrivals = ArrivalTracker(
            ArrivalRateMeter(settings.arrival_windows_s)
            if settings.arrival_windows_s
            else ArrivalRateMeter.for_boot_time(settings.policy.boot_s),
            self.learner,
        )
        self.unneeded_since: dict[str, float] = {}
        # No memory yet of since when nodes are unneeded: the next round reads the evidence.
        self._from_evidence = True
        self._evidence_warned = False
        self._stopping = threading.Event()
        self._idle_w: dict[str, float] = {}
        self._announced: dict[tuple[str, str], str] = {}  # dry-run: (node, action) -> reason
        self.last_round_at_s: float | None = None  # monotonic, for /healthz
        self.last_success_at_s: float | None = None
        self._failures = FailureStreak(
            log,
            "round failed, nothing more done until the next: %s",
            "round succeeded again after %d failed",
        )
        self.metrics.apply.set(1 if settings.apply else 0)

    @property
    def last_error(self) -> str | None:
        """Why the last round failed; None when it succeeded."""
        return self._failures.cause

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        for informer in (self.nodes, self.pods, self.budgets):
            informer.start()
        if self.carbon is not None:
            self.carbon.start()

    def stop(self) -> None:
        for informer in (self.nodes, self.pods, self.budgets):
            informer.stop()
        if self.carbon is not None:
            self.carbon.stop()

    @property
    def synced(self) -> bool:
        return self.nodes.synced and self.pods.synced and self.budgets.synced

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def may_write(self) -> bool:
        return self.settings.apply and not self._stopping.is_set() and self.is_leader()

    # ---- one round ------------------------------------------------------------------------

    def run_round(self, now_s: float | None = None) -> RoundResult:
        """One round (see the module docstring); never raises for API or BMC trouble."""
        now_s = self.clock() if now_s is None else now_s
        self.last_round_at_s = time.monotonic()
        leader = self.is_leader()
        self.metrics.leader.set(1 if leader else 0)
        if not leader:
            # What this replica saw unneeded is stale once another may have acted: a next
            # leadership starts from the evidence again.
            self.unneeded_since = {}
            self._from_evidence = True
            return RoundResult(leader=False)
        result = RoundResult()
        try:
            self._round(now_s, result)
        except LostLeadership as stop:
            if not self._stopping.is_set():
                log.warning("%s", stop)
            result.error = str(stop)
        except ApiException as error:
            result.error = describe_api_error(error)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            # The API server unreachable (urllib3's errors are not OSErrors).
            unavailable = api_unavailable(error) or f"{type(error).__name__}: {error}"
            result.error = f"the API server is unreachable: {unavailable}"
        if result.error is None:
            self.metrics.rounds.labels(result="ok").inc()
            self.metrics.last_round.set(time.time())
            self.last_success_at_s = time.monotonic()
            self._failures.succeeded()
        else:
            self.metrics.rounds.labels(result="error").inc()
            self._failures.failed(result.error)
        return result

    def _round(self, now_s: float, result: RoundResult) -> None:
        if not self.synced:
            raise OSError("the node, pod and budget caches are not synced yet")
        view = self._read(now_s)
        result.view = view
        arrival = self.arrivals.observe(self.pods.items(), now_s)
        learned_cores = self._learn_headroom(now_s)
        considered = self._with_backoff(view.nodes, now_s)
        previous = self.unneeded_since
        if self._from_evidence:
            previous = self._evidence(view, now_s)
        decisions = decide(
            considered,
            pending_beyond_waking(view.pending, view.nodes),
            arrival,
            previous,
            now_s,
            self.settings.policy,
            learned_cores,
        )
        result.decisions = decisions
        self.unneeded_since = dict(decisions.unneeded_since)
        self._from_evidence = False
        self._report_inputs(view, considered, decisions, arrival)
        if not self.settings.apply:
            self._announce(decisions, view)
            return
        self._act(view, decisions, now_s, result)

    def _learn_headroom(self, now_s: float) -> float:
        """With a wait target: the pods' waits into the learner, its headroom (and a line in
        the log when its quantile moves); 0 without one."""
        if self.learner is None or self.waits is None:
            return 0.0
        self.waits.observe(self.pods.items(), now_s)
        before = self.learner.last_change
        state = self.learner.update(now_s)
        self.headroom = state
        if state.last_change != before:
            log.info(
                "headroom %s; learned %.1f cores for hour %d",
                state.last_change,
                state.learned_cores,
                state.hour,
                extra={
                    "headroom_quantile": round(state.quantile, 4),
                    "wait_p99_s": round(state.wait_p99_s, 1),
                    "learned_headroom_cores": round(state.learned_cores, 2),
                },
            )
        return state.learned_cores

    def _read(self, now_s: float) -> ClusterView:
        namespace = self.ops.read_namespace(self.settings.namespace)
        nodes = self.nodes.items()
        self.idle_power.refresh()
        names = [(n.get("metadata") or {}).get("name", "") for n in nodes]
        cores = {name: node_allocatable(n)[0] for name, n in zip(names, nodes, strict=True)}
        self._idle_w = self.idle_power.idle_w(names, cores)
        view = cluster_view(
            nodes,
            self.pods.items(),
            self.budgets.items(),
            namespace,
            self._idle_w,
            self.settings.scheduler_name,
            self.carbon.g_per_kwh(nodes, now_s) if self.carbon is not None else None,
        )
        for problem in view.problems:
            log.warning("%s", problem)
        self.actuator.forget(set(names))
        return view

    def _evidence(self, view: ClusterView, now_s: float) -> dict[str, float]:
        """Since when each node can have been unneeded, by the evidence the cluster holds;
        nothing (every clock starts now) when the Events may not be read. An unreachable
        API server fails the round, which the next round retries with the evidence."""
        try:
            events = self.ops.pod_events()
        except ApiException as error:
            if api_unavailable(error) is not None:
                raise
            if not self._evidence_warned:
                self._evidence_warned = True
                log.warning(
                    "cannot list Events (%s): the unneeded clocks start now instead of at each "
                    "node's last pod; grant list on events to start them from the evidence",
                    describe_api_error(error),
                )
            return {}
        return unneeded_evidence_s(
            view.records, self.pods.items(), events, now_s, self.settings.event_ttl_s
        )

    def _with_backoff(self, nodes: tuple[NodeView, ...], now_s: float) -> list[NodeView]:
        shown = []
        for node in nodes:
            backoff = self.actuator.backing_off(node.name, now_s)
            if backoff is not None and node.managed:
                node = replace(
                    node,
                    managed=False,
                    unmanaged_reason=f"backing off until {backoff.retry_at_s - now_s:.0f} s from "
                    f"now after: {backoff.reason}",
                )
            shown.append(node)
        return shown

    # ---- acting ---------------------------------------------------------------------------

    def _act(
        self, view: ClusterView, decisions: Decisions, now_s: float, result: RoundResult
    ) -> None:
        objects = {(n.get("metadata") or {}).get("name", ""): n for n in self.nodes.items()}
        views = {node.name: node for node in view.nodes}
        cancelled = set()
        for action in decisions.cancel_drain:
            self._log_decision("cancel drain", action)
            self.actuator.cancel_drain(action, now_s)
            cancelled.add(action.node)
            result.acted.append(f"cancel_drain {action.node}")

        draining_now = 0
        for name, record in view.records.items():
            node, node_view = objects.get(name), views[name]
            if node is None or name in cancelled:
                continue
            if record.state == POWER_DRAINING:
                if not node_view.managed:
                    self.actuator.abort(
                        name,
                        f"power management disabled: {node_view.unmanaged_reason}",
                        "disabled",
                        now_s,
                    )
                    continue
                self.actuator.continue_drain(node, now_s, since_s=record.since_s)
                draining_now += 1
            elif record.state == POWER_WAKING:
                self.actuator.continue_wake(
                    node, record.since_s, node_view.ready, view.ready_at_s[name], now_s
                )
            elif record.state == POWER_OFF:
                self.actuator.check_off(
                    node, record.since_s, node_view.ready, view.ready_at_s[name], now_s
                )

        room = max(self.settings.max_drain_parallelism - draining_now, 0)
        planned = [
            *(("wake", a) for a in decisions.wake),
            *(("power off", a) for a in decisions.power_off[: self.settings.max_bulk_power_off]),
            *(("drain and power off", a) for a in decisions.drain[:room]),
        ]
        # Every node this round empties is cordoned before anything is evicted: a pod evicted
        # from one must not be scheduled onto another, to be evicted again a moment later.
        cordoned = []
        for what, action in planned:
            node = objects.get(action.node)
            if node is None:  # deleted since the round began
                continue
            self._log_decision(what, action)
            if what == "wake":
                started = self.actuator.wake(node, action, now_s)
            else:
                started = self.actuator.begin_power_off(node, action, now_s, evict=False)
                if started:
                    cordoned.append(node)
            if started:
                result.acted.append(f"{ACTION_LABELS[what]} {action.node}")
        for node in cordoned:
            self.actuator.continue_drain(node, now_s, since_s=now_s)

    def _log_decision(self, what: str, action: Action, *, would: bool = False) -> None:
        watts = f"{action.watts:.0f} W" if math.isfinite(action.watts) else "unknown W"
        effect = "draws" if what == "wake" else "saves"
        log.info(
            "%s%s node %s: %s (%s %s by the model)",
            "would " if would else "",
            what,
            action.node,
            action.reason,
            effect,
            watts,
            extra={
                "node": action.node,
                "action": what,
                "reason": action.reason,
                "watts": None if not math.isfinite(action.watts) else round(action.watts, 1),
                "dry_run": would,
                **self._carbon_fields(action),
            },
        )

    def _carbon_fields(self, action: Action) -> dict[str, object]:
        """Ranking by grams: the intensity that chose the node and its horizon, as JSON log
        fields (the reason says them in words)."""
        if self.carbon is None:
            return {}
        value = action.g_per_kwh
        return {
            "carbon_outlook_g_per_kwh": round(value, 1) if math.isfinite(value) else None,
            "carbon_horizon_s": self.carbon.settings.horizon_s,
        }

    def _announce(self, decisions: Decisions, view: ClusterView) -> None:
        """Dry run: log each decision once, until it changes."""
        current: dict[tuple[str, str], str] = {}
        for what, actions in (
            ("cancel drain", decisions.cancel_drain),
            ("wake", decisions.wake),
            ("power off", decisions.power_off),
            ("drain and power off", decisions.drain),
        ):
            for action in actions:
                key = (action.node, what)
                current[key] = action.reason
                if key not in self._announced:
                    self._log_decision(what, action, would=True)
                    self.metrics.actions.labels(action=ACTION_LABELS[what], result="dry_run").inc()
        self._announced = current

    # ---- reporting ------------------------------------------------------------------------

    def _report_inputs(
        self,
        view: ClusterView,
        considered: Sequence[NodeView],
        decisions: Decisions,
        arrival: ArrivalRate,
    ) -> None:
        """Gauges of what the round decided from; `considered` are the nodes as the policy saw
        them (a node backing off after a failure is not managed until its retry)."""
        counts = dict.fromkeys(POWER_STATES, 0)
        for node in view.nodes:
            counts[node.state] += 1
        for state, count in counts.items():
            self.metrics.nodes.labels(state=state).set(count)
        self.metrics.managed_nodes.set(sum(1 for n in considered if n.managed))
        off = {n.name for n in view.nodes if n.state == POWER_OFF}
        self.metrics.saved_watts.set(saved_watts(self._idle_w, off))
        self.metrics.pending_pods.set(len(view.pending))
        self.metrics.free_cores.set(decisions.free_cores)
        self.metrics.headroom_cores.set(decisions.headroom_cores)
        self.metrics.off_headroom_cores.set(decisions.off_headroom_cores)
        self.metrics.arrival_rate.set(arrival.cores_per_s)
        if self.headroom is not None:
            self.metrics.set_headroom(self.headroom)
        if self.carbon is not None:
            self.metrics.set_carbon_outlook({n.name: n.g_per_kwh for n in considered if n.managed})

    # ---- the loop -------------------------------------------------------------------------

    def run_forever(self, stop: threading.Event) -> bool:
        """Rounds every scan interval until `stop`; the elector runs in its own thread.

        On `stop` (SIGTERM, Ctrl-C): writes stop at once (`may_write`), the loop ends, the
        election thread is stopped and waited for, so it cannot take the Lease back, and only
        then is the Lease released (client-go's ReleaseOnCancel). Returns whether it was
        released.
        """
        self._stopping = stop
        election: threading.Thread | None = None
        if self.elector is not None:
            election = threading.Thread(
                target=self.elector.run, args=(stop,), name="leader-election", daemon=True
            )
            election.start()
        self.start()
        try:
            while not stop.is_set():
                if not self.synced:  # the caches are listing: no round on half a picture
                    stop.wait(0.1)
                    continue
                started = time.monotonic()
                try:
                    self.run_round()
                except Exception:  # a bug must not end the controller: log, next round
                    log.exception("round failed unexpectedly")
                    self.metrics.rounds.labels(result="error").inc()
                stop.wait(max(self.settings.scan_interval_s - (time.monotonic() - started), 0.0))
        finally:
            stop.set()
            if election is not None:
                # An attempt in flight ends within its request timeouts (a read and a write).
                election.join(2 * self.elector.settings.request_timeout_s + 1)  # type: ignore[union-attr]
            self.stop()
        return self.elector.release() if self.elector is not None else False

    def health(self) -> tuple[bool, bool, str]:
        """(alive, ready, details) for /healthz and /readyz."""
        now = time.monotonic()
        stalled_after_s = 3 * self.settings.scan_interval_s + 60
        alive = self.last_round_at_s is None or now - self.last_round_at_s < stalled_after_s
        details = []
        if not self.synced:
            details.append("caches not synced")
        if self.idle_power.bundle_dir is not None and self.idle_power.bundle_version is None:
            details.append("no model bundle loaded")
        leading = self.is_leader()
        if leading and self.last_error:
            details.append(f"last round failed: {self.last_error}")
        ready = not details
        role = ("leader" if leading else "standby") + (
            ", applying" if self.settings.apply else ", dry run"
        )
        return alive, ready, "; ".join(details) or role

    def status(self) -> Mapping[str, Any]:
        return {
            "apply": self.settings.apply,
            "leader": self.is_leader(),
            "holder": self.elector.holder if self.elector is not None else None,
            "synced": self.synced,
            "watches": {
                informer.name: vars(informer.status).copy()
                for informer in (self.nodes, self.pods, self.budgets)
            },
            "bundle": self.idle_power.status(),
            "carbon": self.carbon.status() if self.carbon is not None else None,
            "backoff": {
                name: {"failures": b.failures, "retry_at_s": b.retry_at_s, "reason": b.reason}
                for name, b in self.actuator.backoff.items()
            },
            "headroom": self._headroom_status(),
            "last_error": self.last_error,
        }

    def _headroom_status(self) -> Mapping[str, Any] | None:
        """The wait target's learning (None without a target)."""
        if self.learner is None:
            return None
        state = self.headroom
        p99 = state.wait_p99_s if state is not None else math.nan
        return {
            "target_wait_p99_s": self.learner.settings.target_wait_p99_s,
            "learned_cores": state.learned_cores if state is not None else None,
            "quantile": self.learner.quantile,
            "observed_wait_p99_s": p99 if math.isfinite(p99) else None,
            "waits_in_window": state.waits if state is not None else 0,
            "wait_window_s": self.learner.settings.wait_window_s,
            "hour": state.hour if state is not None else None,
            "last_change": self.learner.last_change or None,
        }
