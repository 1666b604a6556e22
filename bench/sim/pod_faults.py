"""Hidden node faults that fail some workloads' pods: what the `faults` preset simulates.

A `NodeFault` makes a node fail the pods of some workloads with some probability per start (a
bad DIMM that crashes memory-heavy services, a driver mismatch that breaks one image), until it
is repaired. A failing start runs like any pod, using its CPU, for `crash_after_s`; then its
container crashes and the kubelet restarts it (restartCount + 1, last state terminated with
the fault's reason), again and again; after `restarts_before_replaced` restarts the pod is
given up (the descheduler's RemovePodsHavingTooManyRestarts evicts it) and its controller
re-creates it, so it is scheduled again, from scratch. Crash-loop back-off pauses between the
restarts are not modelled: a failing start burns CPU for restarts x `crash_after_s`.

`PodFaults` is one run's bookkeeping, driven by the engine (`bench.sim.engine.Simulation`):
`started` when a pod is bound (is this start doomed?); each tick `running` (which cores are
failing, before any pod ends), `tick` (the crashes due, told to the policy as the pod watch
would see them) and `account` (the energy the failing pods burned: their share of the node's
power above idle); `ended` when a running pod's work is done (a doomed start ends given up, and
the pod goes back to the queue). Whether a start fails is drawn from the pod's own random
stream (seed, pod, start number), so every policy that puts the same start on a faulty node
meets the same luck.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from bench.sim.policies import Policy


class RunningPods(Protocol):
    """The engine's running pods (`bench.sim.engine.RunningPods`), one entry per pod."""

    pod: np.ndarray
    node: np.ndarray
    used_cores: np.ndarray


@dataclass(frozen=True)
class NodeFault:
    """Node `node` fails starts of `workloads`' pods with `fail_probability` until repaired."""

    node: int
    workloads: frozenset[int]
    fail_probability: float
    reason: str = "Error"  # the crashed container's lastState.terminated.reason
    repaired_at_s: float = math.inf

    def fails(self, node: int, workload: int, now_s: float) -> bool:
        """Whether this fault can fail a start of `workload` on `node` at `now_s`."""
        return node == self.node and workload in self.workloads and now_s < self.repaired_at_s


@dataclass(frozen=True)
class FaultPlan:
    """The preset's hidden faults and the workload of every trace pod."""

    workload_names: tuple[str, ...]
    pod_workload: np.ndarray  # workload index of each trace pod
    faults: tuple[NodeFault, ...]
    crash_after_s: float = 60.0
    restarts_before_replaced: int = 3
    warmup_s: float = 7200.0  # failed starts before this are reported apart
    seed: int = 7

    def run(self, idle_w: np.ndarray) -> PodFaults:
        """Fresh bookkeeping for one policy's run; `idle_w` is each node's idle power."""
        return PodFaults(self, idle_w)


@dataclass
class _FailingStart:
    uid: str
    node: int
    started_s: float
    reason: str
    crashes: int = 0


@dataclass
class PodFaults:
    """One run's failing starts, crashes and wasted energy; see the module docstring."""

    plan: FaultPlan
    idle_w: np.ndarray
    failing: dict[int, _FailingStart] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)  # pod -> starts so far
    failed_starts: int = 0
    failed_starts_after_warmup: int = 0
    restarts: int = 0
    wasted_wh: float = 0.0
    failing_cores: np.ndarray | None = None  # per node, during the current tick
    faulty_starts: int = 0  # starts of an affected workload on a faulty node (before repair)
    # Per fault: when an affected workload's pod first started on the node after its repair.
    reused_after_repair_s: dict[int, float] = field(default_factory=dict)
    starts_after_repair: int = 0  # affected workloads' starts on repaired nodes, after repair

    def started(self, pod: int, node: int, uid: str, now_s: float) -> float | None:
        """A pod was bound: the seconds its start runs before it is given up, if it fails."""
        start = self.starts.get(pod, 0) + 1
        self.starts[pod] = start
        workload = int(self.plan.pod_workload[pod])
        for index, fault in enumerate(self.plan.faults):
            repaired = node == fault.node and workload in fault.workloads
            if repaired and now_s >= fault.repaired_at_s:
                self.reused_after_repair_s.setdefault(index, now_s - fault.repaired_at_s)
                self.starts_after_repair += 1
            if not fault.fails(node, workload, now_s):
                continue
            self.faulty_starts += 1
            draw = np.random.default_rng([self.plan.seed, 19, pod, start]).random()
            if draw < fault.fail_probability:
                self.failing[pod] = _FailingStart(uid, node, now_s, fault.reason)
                return self.plan.restarts_before_replaced * self.plan.crash_after_s
        return None

    def tick(self, now_s: float, policy: Policy) -> None:
        """Tell the policy of the crashes due by `now_s`."""
        for start in self.failing.values():
            self._crash_until(start, now_s, policy)

    def ended(self, pod: int, node: int, now_s: float, policy: Policy) -> bool:
        """A running pod's work is done: True when it was a failing start (now given up)."""
        start = self.failing.pop(pod, None)
        if start is None:
            return False
        self._crash_until(start, math.inf, policy, last_at_s=now_s)
        policy.pod_replaced(start.uid, node, now_s)
        self.failed_starts += 1
        if start.started_s >= self.plan.warmup_s:
            self.failed_starts_after_warmup += 1
        return True

    def running(self, running: RunningPods) -> None:
        """The pods running this tick (before any of them ends): which cores are failing."""
        if not self.failing:
            self.failing_cores = None
            return
        doomed = np.isin(running.pod, np.fromiter(self.failing, np.intp, len(self.failing)))
        self.failing_cores = np.bincount(
            running.node[doomed], weights=running.used_cores[doomed], minlength=len(self.idle_w)
        )

    def account(self, total_w: np.ndarray, wanted_cores: np.ndarray, tick_s: float) -> None:
        """Add the tick's energy burned by failing pods (their share of power above idle)."""
        if self.failing_cores is None:
            return
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(wanted_cores > 0, self.failing_cores / wanted_cores, 0.0)
        above_idle_w = np.maximum(total_w - self.idle_w, 0.0)
        self.wasted_wh += float((above_idle_w * share).sum()) * tick_s / 3600.0

    def summary(self, duration_s: float) -> tuple[int, dict[str, float]]:
        """(failed pod starts, the preset's figures) for the run's result."""
        kpis: dict[str, float] = {
            "failed_pod_starts_after_warmup": self.failed_starts_after_warmup,
            "restarts": self.restarts,
            "wasted_energy_kwh": round(self.wasted_wh / 1000.0, 4),
            "faulty_node_starts": self.faulty_starts,
        }
        repaired = [
            index
            for index, fault in enumerate(self.plan.faults)
            if math.isfinite(fault.repaired_at_s) and fault.repaired_at_s < duration_s
        ]
        if repaired:
            # The slowest repaired node; -1: one never got an affected workload's pod again.
            waits_s = [self.reused_after_repair_s.get(index, -1.0) for index in repaired]
            kpis["repaired_node_reused_after_s"] = round(
                -1.0 if -1.0 in waits_s else max(waits_s), 1
            )
            kpis["repaired_node_starts_after_repair"] = self.starts_after_repair
        return self.failed_starts, kpis

    def _crash_until(
        self, start: _FailingStart, until_s: float, policy: Policy, last_at_s: float | None = None
    ) -> None:
        limit = self.plan.restarts_before_replaced
        while start.crashes < limit:
            at_s = start.started_s + (start.crashes + 1) * self.plan.crash_after_s
            if at_s > until_s:
                return
            start.crashes += 1
            self.restarts += 1
            when_s = at_s if last_at_s is None else min(at_s, last_at_s)
            policy.pod_crashed(start.uid, start.node, when_s, start.crashes, start.reason)
