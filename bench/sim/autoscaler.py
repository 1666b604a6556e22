"""cluster-autoscaler's rule at its defaults, powering nodes off and on: the fair competitor.

What cluster-autoscaler does every `--scan-interval` (10 s), from its FAQ
(https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/FAQ.md, "How does
scale-up work?", "How does scale-down work?", "What are the parameters to CA?"), with every
parameter at its default:

- **Scale-up.** Pods pending as unschedulable are first matched against the free room of the
  nodes that are up and of the nodes already coming up ("filter out schedulable"): those need
  no new node. For the rest, the expander picks a node group that can run at least one of them
  (`--expander=random`), and the binpacking estimator says how many of its nodes they need.
  Here every node is its own node group of one (a heterogeneous fleet has no two alike), so a
  scan wakes at most one node, chosen at random among the off nodes that fit a waiting pod;
  nothing about watts enters the choice.
- **Scale-down.** A node is unneeded when the requests of its pods, DaemonSet pods included
  (`--ignore-daemonsets-utilization=false`), are under `--scale-down-utilization-threshold`
  (0.5) of its allocatable CPU and memory (the larger of the two shares), and all its pods can
  move to other nodes (simulated one node after another, so two candidates do not count on the
  same room). After `--scale-down-unneeded-time` (10 min) unneeded it is removed (here:
  powered off): empty nodes in bulk, up to `--max-empty-bulk-delete` (10) a scan, nodes with
  pods one at a time (`--max-drain-parallelism` 1), their pods evicted. No scale-down within
  `--scale-down-delay-after-add` (10 min) of a scale-up, nor within
  `--scale-down-delay-after-delete` (the scan interval) of a removal; unneeded times are kept
  meanwhile, as cluster-autoscaler does.

Its node groups' minimum sizes are the one floor it keeps; the simulation gives it the same
floor of on-nodes as our controller (`PolicySettings.min_on_nodes`, 1), so that the two differ
by their rules only. The provisioning time is the simulation's boot time (`boot_s`), the
same for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bench.sim.kube_default import PodRequest
from bench.sim.power import NodeState, PowerManager

if TYPE_CHECKING:
    from bench.sim.engine import SimSettings, Simulation


@dataclass(frozen=True)
class AutoscalerSettings:
    """cluster-autoscaler's flags, at their defaults (its FAQ's parameter table)."""

    utilization_threshold: float = 0.5  # --scale-down-utilization-threshold
    unneeded_time_s: float = 600.0  # --scale-down-unneeded-time
    delay_after_add_s: float = 600.0  # --scale-down-delay-after-add
    delay_after_delete_s: float = 10.0  # --scale-down-delay-after-delete (= --scan-interval)
    max_empty_bulk_delete: int = 10  # --max-empty-bulk-delete
    max_drain_parallelism: int = 1  # --max-drain-parallelism
    min_on_nodes: int = 1  # the node groups' minimum sizes, summed (see the module docstring)


class ClusterAutoscaler(PowerManager):
    """cluster-autoscaler's scale-up and scale-down, every `power_interval_s` (its scan)."""

    def __init__(
        self,
        settings: SimSettings,
        rng: np.random.Generator,
        autoscaler: AutoscalerSettings | None = None,
    ) -> None:
        super().__init__(settings)
        self.autoscaler = autoscaler or AutoscalerSettings()
        self.rng = rng
        self.unneeded_since: dict[int, float] = {}
        self.last_scale_up_s = -np.inf
        self.last_delete_s = -np.inf

    def control(self, sim: Simulation, now_s: float) -> None:
        if self._scale_up(sim, now_s):
            return
        self._scale_down(sim, now_s)

    # ---- scale-up ---------------------------------------------------------------------------

    def _scale_up(self, sim: Simulation, now_s: float) -> bool:
        """Wake one node for pods that fit nowhere up or coming up; whether it did."""
        if not sim.pending:
            return False
        ledger = sim.ledger
        free_cpu = ledger.allocatable_cpu_m - ledger.requested_cpu_m
        free_memory = ledger.allocatable_memory_bytes - ledger.requested_memory_bytes
        free_pods = ledger.allowed_pods - ledger.pod_count
        state = self.state
        coming = (state == NodeState.BOOTING) | self.wake_queued
        serving = np.flatnonzero((state == NodeState.ON) & ledger.schedulable | coming)
        room = {int(n): [int(free_cpu[n]), int(free_memory[n]), int(free_pods[n])] for n in serving}
        waiting = sorted(sim.pending, key=lambda pod: -sim.requests[pod].cpu_m)
        left = [pod for pod in waiting if not _fit_into(room, sim.requests[pod])]
        if not left:
            return False
        off = np.flatnonzero((state == NodeState.OFF) | (state == NodeState.SHUTTING_DOWN))
        off = [int(n) for n in off if not self.wake_queued[n]]
        fitting = [
            node
            for node in off
            if any(
                _fits(
                    int(free_cpu[node]),
                    int(free_memory[node]),
                    int(free_pods[node]),
                    sim.requests[pod],
                )
                for pod in left
            )
        ]
        if not fitting:
            return False
        self.wake(sim, int(self.rng.choice(fitting)), now_s)  # --expander=random
        self.last_scale_up_s = now_s
        return True

    # ---- scale-down -------------------------------------------------------------------------

    def _scale_down(self, sim: Simulation, now_s: float) -> None:
        unneeded = self._unneeded_nodes(sim)
        self.unneeded_since = {n: self.unneeded_since.get(n, now_s) for n in unneeded}
        settings = self.autoscaler
        if (
            now_s - self.last_scale_up_s < settings.delay_after_add_s
            or now_s - self.last_delete_s < settings.delay_after_delete_s
        ):
            return
        ripe = [n for n in unneeded if now_s - self.unneeded_since[n] >= settings.unneeded_time_s]
        on_count = int(np.count_nonzero(self.state == NodeState.ON))
        empty_budget, drain_budget = settings.max_empty_bulk_delete, settings.max_drain_parallelism
        for node in ripe:
            if on_count - 1 < settings.min_on_nodes:
                break
            empty = not np.any(sim.running.node == node)
            if empty and empty_budget > 0:
                empty_budget -= 1
            elif not empty and drain_budget > 0:
                drain_budget -= 1
            else:
                continue
            self.power_off(sim, node, now_s)
            del self.unneeded_since[node]
            on_count -= 1
            self.last_delete_s = now_s

    def _unneeded_nodes(self, sim: Simulation) -> list[int]:
        """Nodes under the threshold whose pods all fit elsewhere, in node order."""
        ledger, running = sim.ledger, sim.running
        cpu_share = ledger.requested_cpu_m / ledger.allocatable_cpu_m
        memory_share = ledger.requested_memory_bytes / ledger.allocatable_memory_bytes
        share = np.maximum(cpu_share, memory_share)
        on = (self.state == NodeState.ON) & ledger.schedulable
        free_cpu = ledger.allocatable_cpu_m - ledger.requested_cpu_m
        free_memory = ledger.allocatable_memory_bytes - ledger.requested_memory_bytes
        free_pods = ledger.allowed_pods - ledger.pod_count
        # Room left on the nodes that stay, as earlier candidates' pods take it.
        room = {
            int(n): [int(free_cpu[n]), int(free_memory[n]), int(free_pods[n])]
            for n in np.flatnonzero(on)
        }
        unneeded: list[int] = []
        for node in np.flatnonzero(on & (share < self.autoscaler.utilization_threshold)).tolist():
            pods = [sim.requests[p] for p in running.pod[running.node == node].tolist()]
            destinations = {n: list(r) for n, r in room.items() if n != node and n not in unneeded}
            if all(_fit_into(destinations, pod) for pod in sorted(pods, key=lambda p: -p.cpu_m)):
                unneeded.append(node)
                room = {n: destinations.get(n, r) for n, r in room.items() if n != node}
        return unneeded


def _fits(free_cpu_m: int, free_memory_bytes: int, free_pods: int, pod: PodRequest) -> bool:
    # The scheduler's NodeResourcesFit, which cluster-autoscaler's simulation runs: the pod
    # count (kubelet --max-pods) as well as CPU and memory.
    return pod.cpu_m <= free_cpu_m and pod.memory_bytes <= free_memory_bytes and free_pods >= 1


def _fit_into(room: dict[int, list[int]], pod: PodRequest) -> bool:
    """First fit of `pod` into `room` (node -> [free millicores, free bytes, free pod slots]),
    taken if it fits."""
    for slot in room.values():
        if _fits(slot[0], slot[1], slot[2], pod):
            slot[0] -= pod.cpu_m
            slot[1] -= pod.memory_bytes
            slot[2] -= 1
            return True
    return False
