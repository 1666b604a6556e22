"""Consolidation (score): prefer nodes already busy enough to stay on, so the others empty out.

kube-scheduler's default scores spread pods (LeastAllocated, BalancedAllocation, the default
topology spreading), so every node keeps a few pods and none is ever empty enough to power
off. This score pulls the other way, towards the nodes the node power controller keeps on:

    share  = CPU requested on the node / allocatable CPU   (before placing the pod)
    points = 10 * min(share / busyShare, 1)

A node at or above `busyShare` scores 10: busy enough to stay on, so a pod there costs no
power cycle, and among such nodes the power score (PowerIncrease) decides. Below it, the
fuller the node the more points, and an empty node scores 0: pods go where they keep a
node busy, and the emptiest nodes drain as their pods finish, until the controller powers
them off without evicting anything.

Why the share before placing the pod: a pod big enough to make an empty node busy would
otherwise score 10 there, and keep on a node that could have stayed off. Why requested CPU:
the controller's rule is on requests (a node is a consolidation candidate below its
`--utilization-threshold` of allocatable CPU, cluster-autoscaler's
`--scale-down-utilization-threshold`, 0.5 by default), so `busyShare` is that same threshold:
above it the controller keeps the node, below it the node is on its way out. DaemonSet and
mirror pods do not count, as for the controller. The requests come from the Pod watch
(`extender.sources.kube_watch` publishes `extender.node_requests.NodeRequests`); without them (no
Pod watch: snapshot or demo mode) the share is the measured utilisation plus the assumed load
of pods bound recently, an estimate of the same thing from usage. A node with neither scores
0, so a missing input never looks best. The measured effect is in the README (bench
`python -m bench.energy_sim`, policy `power-aware+power-management`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from extender.node_requests import REQUESTED_CPU_SIGNAL, NodeRequests
from extender.plugins.base import MAX_POINTS, Plugin, finite_or_none

if TYPE_CHECKING:
    from extender.cycle import Cycle


@dataclass(frozen=True)
class ConsolidationArgs:
    # Share of allocatable CPU requested from which a node counts as busy enough to stay on:
    # the node power controller's --utilization-threshold (cluster-autoscaler's 0.5).
    busy_share: float = 0.5

    def __post_init__(self) -> None:
        if not (math.isfinite(self.busy_share) and 0 < self.busy_share <= 1):
            raise ValueError(f"busyShare must be in (0, 1], got {self.busy_share!r}")


class Consolidation(Plugin):
    name = "Consolidation"
    Args = ConsolidationArgs

    def score(self, cycle: Cycle) -> np.ndarray:
        return self._shares(cycle)[0]

    def normalise(self, raw: np.ndarray, cycle: Cycle) -> np.ndarray:
        points = np.nan_to_num(raw, nan=0.0) * (MAX_POINTS / self.args.busy_share)
        return np.clip(points, 0.0, MAX_POINTS)

    def explain(self, cycle: Cycle) -> Mapping[str, Sequence[object]]:
        share, from_requests = self._shares(cycle)
        basis = np.where(from_requests, "requests", "measured")
        basis[~np.isfinite(share)] = "unknown"
        return {"requested_share": finite_or_none(share), "requested_share_from": basis.tolist()}

    def _shares(self, cycle: Cycle) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate: the requested share of allocatable CPU, and whether from requests.

        Without the Pod watch's requests a node's share is its measured utilisation plus its
        assumed load (NaN without telemetry).
        """
        requests = cycle.view.signal(REQUESTED_CPU_SIGNAL)
        nodes = cycle.nodes
        if not isinstance(requests, NodeRequests):
            measured = nodes.u + nodes.a
            return measured, np.zeros(len(cycle), dtype=bool)
        key = ("consolidation_share", id(cycle.candidates), id(requests))
        cached = cycle.view.recall(key)
        if cached is None:
            cores = requests.cores
            requested = np.fromiter(
                (cores.get(name, 0.0) for name in cycle.names), np.float64, len(cycle)
            )
            with np.errstate(invalid="ignore", divide="ignore"):
                share = requested / nodes.allocatable
                # Unknown nodes and nodes without allocatable CPU cannot tell.
                share[~(nodes.known & (nodes.allocatable > 0))] = np.nan
            share.flags.writeable = False
            cached = (share, np.isfinite(share))
            cycle.view.remember(key, cached, cycle.candidates, requests)
        return cached
