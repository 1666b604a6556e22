"""Acting on one node: drain and power off, wake, cancel, give up; backoff after failures.

Every step is short and leaves the node's recorded state true, so a round never waits for a
server and a new leader (or a restarted controller) continues from the node annotations:

**Powering off** (`begin_power_off`, then `continue_drain` every round):

1. ask the node's driver for its power state: a BMC that cannot answer (timeout, refusal,
   garbage, no credentials) stops everything here, before the node is touched;
2. record `draining` and cordon the node, in one patch;
3. evict its pods (DaemonSet and mirror pods stay) through the Eviction API. A refusal (429:
   a PodDisruptionBudget allows no disruption now), any other eviction error, or a drain that
   outlasts `drain_timeout_s` gives up: uncordon, record `on` with the reason, back off;
4. once a fresh list of the node's pods shows nothing movable left, request a graceful power
   off; once the driver reports off, record `off` (the node stays cordoned). A node still on
   after `shutdown_timeout_s` is forced off; still on after that, the controller gives up.

A node whose pods cannot all be evicted is never powered off: step 4 reads the node's pods
from the API server itself, not from the cache.

**Waking** (`wake`, then `continue_wake`): request power on (a failure leaves the node `off`,
records why and backs off, so the next round's policy picks another node); record `waking`;
once the node reports Ready after that moment, uncordon it and record `on`, and observe the
wake latency. A node not Ready within `wake_timeout_s` is recorded `off` again with the
reason, and backed off.

**Backoff**: each failure of a node doubles its wait before the next attempt, from
`retry_backoff_s` up to `max_retry_backoff_s`; the controller hides nodes in backoff from the
policy (unmanaged, with the reason). A completed power-off or wake clears it.

Every write first asks `may_write()` (acting for real, and still the leader): when that is no
longer so, `LostLeadership` ends the round at once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException

from controllers.node_power.drivers import (
    POWER_STATE_OFF,
    BmcSecret,
    DriverError,
    PowerDriver,
    driver_kind,
    make_driver,
)
from controllers.node_power.kube import EvictionRefused, Informer, KubeOps, describe_api_error
from controllers.node_power.metrics import ControllerMetrics
from controllers.node_power.policy import Action
from controllers.node_power.views import TERMINAL_PHASES, is_daemon_pod, pod_key
from livedata.labels import POWER_DRAINING, POWER_DRIVER_DRY_RUN, POWER_OFF, POWER_ON, POWER_WAKING

log = logging.getLogger(__package__)

JsonObject = Mapping[str, Any]


class LostLeadership(Exception):
    """This replica may no longer act (the Lease lapsed): the round stops."""


@dataclass(frozen=True)
class ActuatorSettings:
    default_driver: str = POWER_DRIVER_DRY_RUN
    bmc_timeout_s: float = 10.0
    drain_timeout_s: float = 600.0
    shutdown_timeout_s: float = 300.0
    wake_timeout_s: float = 900.0
    # Eviction grace: at most this, the pod's own terminationGracePeriodSeconds if shorter.
    max_graceful_termination_s: int | None = 600
    retry_backoff_s: float = 60.0
    max_retry_backoff_s: float = 1800.0
    # An off node reporting Ready this long after it went off was powered on by someone else.
    foreign_power_on_grace_s: float = 120.0


@dataclass
class Backoff:
    failures: int
    retry_at_s: float
    reason: str


@dataclass
class DrainProgress:
    off_requested_s: float | None = None
    forced: bool = False


class Actuator:
    """Per-node operations for the controller's rounds (see the module docstring)."""

    def __init__(
        self,
        ops: KubeOps,
        nodes_cache: Informer,
        secret: BmcSecret,
        settings: ActuatorSettings,
        metrics: ControllerMetrics,
        may_write: Callable[[], bool],
    ) -> None:
        self.ops = ops
        self.nodes_cache = nodes_cache
        self.secret = secret
        self.settings = settings
        self.metrics = metrics
        self._may_write = may_write
        self._drains: dict[str, DrainProgress] = {}
        self._drivers: dict[str, tuple[str, PowerDriver]] = {}
        self.backoff: dict[str, Backoff] = {}

    # ---- backoff --------------------------------------------------------------------------

    def backing_off(self, node: str, now_s: float) -> Backoff | None:
        entry = self.backoff.get(node)
        return entry if entry is not None and now_s < entry.retry_at_s else None

    def _fail(self, node: str, why: str, now_s: float) -> None:
        previous = self.backoff.get(node)
        failures = (previous.failures if previous else 0) + 1
        delay_s = min(
            self.settings.retry_backoff_s * 2 ** (failures - 1), self.settings.max_retry_backoff_s
        )
        self.backoff[node] = Backoff(failures, now_s + delay_s, why)
        log.warning(
            "node %s: %s; next attempt in %.0f s (failure %d)",
            node,
            why,
            delay_s,
            failures,
            extra={"node": node, "retry_in_s": delay_s, "failures": failures},
        )

    def _succeeded(self, node: str) -> None:
        self.backoff.pop(node, None)

    # ---- writes, always through here ------------------------------------------------------

    def _record(
        self,
        node: str,
        state: str,
        since_s: float,
        reason: str,
        *,
        unschedulable: bool | None,
    ) -> None:
        self._check_may_write()
        try:
            written = self.ops.record_power_state(
                node, state, since_s, reason, unschedulable=unschedulable
            )
        except ApiException:
            self.metrics.api_errors.labels(operation="patch_node").inc()
            raise
        self.nodes_cache.observe(written)  # the next round sees it before the watch does

    def _record_reason(self, node: str, reason: str) -> None:
        self._check_may_write()
        try:
            self.nodes_cache.observe(self.ops.record_reason(node, reason))
        except (ApiException, OSError) as error:  # the failure itself is already handled
            self.metrics.api_errors.labels(operation="patch_node").inc()
            log.warning("node %s: could not record why (%s)", node, error)

    def _check_may_write(self) -> None:
        if not self._may_write():
            raise LostLeadership("no longer the leader: stopping this round")

    # ---- drivers --------------------------------------------------------------------------

    def driver_for(self, node: JsonObject, recorded_state: str) -> PowerDriver:
        """The node's driver. BMC drivers are built afresh from the Secret for every step (a
        rotated password or a new address takes effect at once); a dry-run driver is kept,
        since it remembers the power state it pretends to switch."""
        name = (node.get("metadata") or {}).get("name", "")
        kind = driver_kind(node, self.settings.default_driver)
        cached = self._drivers.get(name)
        if cached is not None and cached[0] == kind:
            return cached[1]
        driver = make_driver(
            kind,
            name,
            self.secret,
            timeout_s=self.settings.bmc_timeout_s,
            state=POWER_STATE_OFF if recorded_state == POWER_OFF else "on",
        )
        if kind == POWER_DRIVER_DRY_RUN:
            self._drivers[name] = (kind, driver)
        return driver

    def _driver_error(self, kind: str, error: DriverError) -> None:
        self.metrics.driver_errors.labels(driver=kind, kind=error.kind).inc()

    # ---- powering off ---------------------------------------------------------------------

    def begin_power_off(
        self, node: JsonObject, action: Action, now_s: float, *, evict: bool = True
    ) -> bool:
        """Check the BMC, cordon, record draining, start evicting (unless not `evict`: the
        caller then calls `continue_drain`). False if it did not start."""
        name = action.node
        try:
            driver = self.driver_for(node, POWER_ON)
            driver.power_state()  # can we reach it at all? nothing is touched before this
        except DriverError as error:
            self._driver_error(driver_kind(node, self.settings.default_driver), error)
            self.metrics.actions.labels(action="drain", result="failed").inc()
            self._record_reason(name, f"power-off not started: {error}")
            self._fail(name, f"power-off not started: {error}", now_s)
            return False
        self._record(name, POWER_DRAINING, now_s, action.reason, unschedulable=True)
        self.metrics.actions.labels(action="drain", result="ok").inc()
        self._drains[name] = DrainProgress()
        if evict:
            self.continue_drain(node, now_s, since_s=now_s)
        return True

    def continue_drain(self, node: JsonObject, now_s: float, *, since_s: float) -> None:
        """One step of a drain in progress (see the module docstring)."""
        name = (node.get("metadata") or {}).get("name", "")
        progress = self._drains.setdefault(name, DrainProgress())
        try:
            pods = self.ops.pods_on_node(name)
        except (ApiException, OSError) as error:  # try again next round
            self.metrics.api_errors.labels(operation="list_pods").inc()
            log.warning(
                "node %s: cannot list its pods (%s); drain continues next round", name, error
            )
            return
        movable = [
            pod
            for pod in pods
            if not is_daemon_pod(pod)
            and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES
        ]
        if movable:
            if now_s - since_s > self.settings.drain_timeout_s:
                left = ", ".join(pod_key(p) for p in movable[:5])
                self.abort(
                    name,
                    f"drain did not finish within {self.settings.drain_timeout_s:.0f} s "
                    f"({len(movable)} pod(s) left: {left})",
                    "timeout",
                    now_s,
                )
                return
            for pod in movable:
                if (pod.get("metadata") or {}).get("deletionTimestamp"):
                    continue  # already on its way out
                self._check_may_write()
                try:
                    self.ops.evict(pod, self.settings.max_graceful_termination_s)
                except EvictionRefused as refused:
                    self.abort(name, str(refused), "disruption_budget", now_s)
                    return
                except ApiException as error:
                    self.metrics.api_errors.labels(operation="evict").inc()
                    why = f"eviction of {pod_key(pod)} failed: {describe_api_error(error)}"
                    self.abort(name, why, "eviction_error", now_s)
                    return
                except OSError as error:
                    self.metrics.api_errors.labels(operation="evict").inc()
                    log.warning("node %s: eviction of %s: %s; retrying", name, pod_key(pod), error)
                    return
                log.info("node %s: evicted %s", name, pod_key(pod), extra={"node": name})
            return  # the evicted pods take their grace period to go: look again next round
        self._power_off_empty(node, progress, now_s)

    def _power_off_empty(self, node: JsonObject, progress: DrainProgress, now_s: float) -> None:
        name = (node.get("metadata") or {}).get("name", "")
        kind = driver_kind(node, self.settings.default_driver)
        try:
            driver = self.driver_for(node, POWER_DRAINING)
            if progress.off_requested_s is None:
                self._check_may_write()
                driver.request_power_off()
                progress.off_requested_s = now_s
                log.info("node %s: power off requested through %s", name, driver.describe())
            state = driver.power_state()
        except DriverError as error:
            self._driver_error(kind, error)
            waited_s = now_s - (progress.off_requested_s or now_s)
            if progress.off_requested_s is None or waited_s > self.settings.shutdown_timeout_s:
                self.abort(name, f"power off failed: {error}", "driver", now_s)
            else:
                log.warning("node %s: %s; asking again next round", name, error)
            return
        if state == POWER_STATE_OFF:
            self._drains.pop(name, None)
            self._record(
                name, POWER_OFF, now_s, "powered off: drained and shut down", unschedulable=True
            )
            self.metrics.power_cycles.inc()
            self.metrics.actions.labels(action="power_off", result="ok").inc()
            self._succeeded(name)
            log.info("node %s: off", name, extra={"node": name, "state": POWER_OFF})
            return
        assert progress.off_requested_s is not None
        if now_s - progress.off_requested_s <= self.settings.shutdown_timeout_s:
            return
        if not progress.forced:
            try:
                self._check_may_write()
                driver.request_power_off(force=True)
            except DriverError as error:
                self._driver_error(kind, error)
                self.abort(name, f"forced power off failed: {error}", "driver", now_s)
                return
            progress.forced, progress.off_requested_s = True, now_s
            log.warning(
                "node %s: still on %.0f s after a graceful shutdown; forcing it off",
                name,
                self.settings.shutdown_timeout_s,
            )
            return
        self.abort(name, "still on after a forced power off", "driver", now_s)

    def cancel_drain(self, action: Action, now_s: float) -> None:
        self._drains.pop(action.node, None)
        self._record(action.node, POWER_ON, now_s, action.reason, unschedulable=False)
        self.metrics.actions.labels(action="cancel_drain", result="ok").inc()

    def abort(self, node: str, why: str, cause: str, now_s: float) -> None:
        """Give up a power-off: uncordon, record on and why, back off."""
        self._drains.pop(node, None)
        self._record(node, POWER_ON, now_s, f"power-off given up: {why}", unschedulable=False)
        self.metrics.drain_failures.labels(cause=cause).inc()
        self.metrics.actions.labels(action="abort", result="ok").inc()
        self._fail(node, f"power-off given up: {why}", now_s)

    # ---- waking ---------------------------------------------------------------------------

    def wake(self, node: JsonObject, action: Action, now_s: float) -> bool:
        name = action.node
        kind = driver_kind(node, self.settings.default_driver)
        try:
            driver = self.driver_for(node, POWER_OFF)
            self._check_may_write()
            driver.request_power_on()
        except DriverError as error:
            self._driver_error(kind, error)
            self.metrics.actions.labels(action="wake", result="failed").inc()
            self._record_reason(name, f"wake failed: {error}")
            self._fail(name, f"wake failed: {error}", now_s)
            return False
        self._record(name, POWER_WAKING, now_s, action.reason, unschedulable=True)
        self.metrics.actions.labels(action="wake", result="ok").inc()
        return True

    def continue_wake(
        self, node: JsonObject, since_s: float, ready: bool, ready_at_s: float, now_s: float
    ) -> None:
        name = (node.get("metadata") or {}).get("name", "")
        dry_run = driver_kind(node, self.settings.default_driver) == POWER_DRIVER_DRY_RUN
        if ready and (dry_run or ready_at_s > since_s):
            latency_s = max(now_s - since_s, 0.0)
            self._record(
                name,
                POWER_ON,
                now_s,
                f"woken: Ready {latency_s:.0f} s after power on",
                unschedulable=False,
            )
            self.metrics.wake_latency.observe(latency_s)
            self._succeeded(name)
            log.info(
                "node %s: on, Ready %.0f s after power on", name, latency_s, extra={"node": name}
            )
            return
        if now_s - since_s > self.settings.wake_timeout_s:
            why = f"not Ready within {self.settings.wake_timeout_s:.0f} s of power on"
            self._record(name, POWER_OFF, now_s, f"wake failed: {why}", unschedulable=True)
            self.metrics.actions.labels(action="wake", result="failed").inc()
            self._fail(name, f"wake failed: {why}", now_s)

    def check_off(
        self, node: JsonObject, since_s: float, ready: bool, ready_at_s: float, now_s: float
    ) -> None:
        """An off node that reports Ready long after it went off was powered on by hand."""
        if driver_kind(node, self.settings.default_driver) == POWER_DRIVER_DRY_RUN:
            return  # it never went off
        if ready and ready_at_s > since_s + self.settings.foreign_power_on_grace_s:
            name = (node.get("metadata") or {}).get("name", "")
            self._record(
                name,
                POWER_ON,
                now_s,
                "powered on outside the controller (Ready again)",
                unschedulable=False,
            )
            self._drivers.pop(name, None)

    def forget(self, live_nodes: set[str]) -> None:
        """Drop memory of nodes that no longer exist."""
        for table in (self._drains, self._drivers, self.backoff):
            for name in [n for n in table if n not in live_nodes]:
                del table[name]


def saved_watts(idle_w: Mapping[str, float], off: set[str]) -> float:
    """Sum of the model's idle watts of the nodes that are off (unknown ones count 0)."""
    return sum(w for name, w in idle_w.items() if name in off and math.isfinite(w))
