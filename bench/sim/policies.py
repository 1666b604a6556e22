"""Placement policies, each deciding one pod at a time as kube-scheduler's cycle does.

- `DefaultPolicy`: kube-scheduler's default profile (`bench.sim.kube_default`).
- `RandomPolicy`: a uniformly random node among those NodeResourcesFit accepts.
- `ExtenderPolicy`: kube-scheduler with our extender configured (`nodeCacheCapable: true`):
  NodeResourcesFit filters, then `POST /filter` with the feasible `NodeNames`, then (when more
  than one node is left) `POST /prioritize`; the extender's 0..10 scores count
  `score * weight * 10` beside the default plugins' scores, and `selectHost` picks the best.
  It also plays the parts of the Pod watch (`ClusterState.pod_bound` / `pod_gone`), the Node
  watch (`upsert_node` with new `energy-status` labels) and the Prometheus poller
  (`set_telemetry_many`) against the extender's own `ClusterState`.

Requests and memory: the extender only prices CPU. It reads the pod's CPU demand the way
NodeResourcesFit counts requests (`livedata.pod_resources.pod_cpu_demand_cores`: requests, else
limits, else 100m), so the pod objects sent here carry `resources.requests.cpu` in millicores
and memory in MiB. Memory never reaches the extender's decision: NodeResourcesFit (run here by
`fits`, before the extender, as in kube-scheduler) rejects nodes short of memory, and the
LeastAllocated/BalancedAllocation scores that are added to the extender's include memory. The
Pod watch's `pod_bound` is given the same CPU request the extender was asked about.

Three references, not deployable (nobody knows true curves): `OraclePolicy` (the extender's
scoring on the simulator's true curves), `CheapestPolicy` (the node whose true curve adds
the fewest watts, kube-scheduler's own scores ignored) and `ReschedulingPolicy` (the same, plus
free moves of running pods to cheaper nodes every so often: what a descheduler could add).

Every policy answers a `Decision`: the node (None = no node fits), the chosen node's total
score and, for the extender, its predicted power increase (from `POST /explain`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import numpy as np

from bench.sim.kube_default import (
    NodeLedger,
    PodRequest,
    default_plugin_scores,
    default_schedule,
    extender_contribution,
    fits,
    select_host,
)
from extender.plugins.energy_level import ENERGY_SCORES, EnergyLevel
from extender.profile import DEFAULT_PROFILE
from extender.scoring import combine
from extender.state import ClusterState, NodeInfo

SCHEDULER_NAME = "power-aware-scheduler"
GRID_ENERGY_SCORE = float(ENERGY_SCORES[EnergyLevel.GRID])
POWER_INCREASE = DEFAULT_PROFILE.plugin("PowerIncrease")
MIB = 1024 * 1024


@dataclass(frozen=True)
class Decision:
    node: int | None
    score: float = math.nan  # the chosen node's total (plugins + extender) score
    predicted_increase_w: float = math.nan
    reason: str = ""  # why no node was chosen
    # A policy that holds the pod on purpose (a carbon deferral) says when kube-scheduler tries
    # it next; None: when a cluster event may have made room (`bench.sim.engine`).
    retry_at_s: float | None = None


class PowerHooks(Protocol):
    """What the engine calls on a policy's power manager (`bench.sim.power.PowerManager`).

    `sim` is the `bench.sim.engine.Simulation` (typed loosely: the engine imports this module).
    """

    def attach(self, sim: Any) -> None: ...

    def step(self, sim: Any, t0_s: float, t1_s: float) -> None: ...

    def node_power(self, sim: Any, t0_s: float, power: Any) -> Any: ...

    def finish(self, sim: Any, result: Any) -> None: ...


class Policy:
    """A placement policy; the hooks let a policy mirror what the watches would report."""

    name = "policy"
    # Seconds between the engine's offers to move running pods (`reschedule`); None: never.
    reschedule_interval_s: float | None = None
    # The power manager the engine drives beside the placements (`bench.sim.power`): it powers
    # nodes off and on. None: every node stays on.
    power: PowerHooks | None = None

    def place(self, uid: str, pod: PodRequest, ledger: NodeLedger, now_s: float) -> Decision:
        raise NotImplementedError

    def bound(self, node: int, uid: str, cpu_cores: float, now_s: float) -> None:
        """The pod was bound (the Pod watch's event)."""

    def gone(self, uid: str) -> None:
        """The pod finished (the Pod watch's event)."""

    def pod_crashed(self, uid: str, node: int, now_s: float, restarts: int, reason: str) -> None:
        """A container of the pod crashed and was restarted (the Pod watch's event)."""

    def pod_replaced(self, uid: str, node: int, now_s: float) -> None:
        """The pod was evicted after crashing too often, to be re-created (before `gone`)."""

    def telemetry(self, readings: Sequence[tuple[str, Mapping[str, float], float]]) -> None:
        """A Prometheus poll round: (node, feature values, observed_at_s)."""

    def labels_changed(self, node: int, labels: Mapping[str, str]) -> None:
        """A node's labels changed (the Node watch's event)."""

    def reschedule(
        self,
        nodes: np.ndarray,
        used_cores: np.ndarray,
        pods: Sequence[PodRequest],
        ledger: NodeLedger,
    ) -> list[tuple[int, int]]:
        """Moves of running pods: (index into `nodes`, new node); the engine applies them.

        `nodes`, `used_cores` and `pods` describe the running pods, one entry each; `ledger`
        is the scheduler's view and must not be changed here. No moves by default.
        """
        return []


class DefaultPolicy(Policy):
    name = "default"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def place(self, uid: str, pod: PodRequest, ledger: NodeLedger, now_s: float) -> Decision:
        node = default_schedule(ledger, pod, self.rng)
        if node is None:
            return Decision(None, reason="NodeResourcesFit: no node has room")
        score = default_plugin_scores(ledger, pod, np.array([node]))[0]
        return Decision(node, score=float(score))


class RandomPolicy(Policy):
    name = "random"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def place(self, uid: str, pod: PodRequest, ledger: NodeLedger, now_s: float) -> Decision:
        feasible = np.flatnonzero(fits(ledger, pod))
        if feasible.size == 0:
            return Decision(None, reason="NodeResourcesFit: no node has room")
        return Decision(int(self.rng.choice(feasible)))


class TrueCurvePolicy(Policy):
    """A reference that prices pods on the simulator's true power curves (not deployable).

    The increase of placing a pod is read from the true curve at the node's *requested* load:
    no model error and no telemetry lag. Subclasses decide how to choose from it (`choose`).
    """

    def __init__(
        self, true_power_w: Callable[[np.ndarray], np.ndarray], node_cores: np.ndarray
    ) -> None:
        self.true_power_w = true_power_w  # utilisation per node -> watts per node
        self.node_cores = node_cores

    def place(self, uid: str, pod: PodRequest, ledger: NodeLedger, now_s: float) -> Decision:
        feasible = np.flatnonzero(fits(ledger, pod))
        if feasible.size == 0:
            return Decision(None, reason="NodeResourcesFit: no node has room")
        util = ledger.requested_cpu_m / 1000.0 / self.node_cores
        demand = pod.nonzero_cpu_m / 1000.0 / self.node_cores
        increase_w = (self.true_power_w(util + demand) - self.true_power_w(util))[feasible]
        return self.choose(pod, ledger, feasible, increase_w)

    def choose(
        self, pod: PodRequest, ledger: NodeLedger, feasible: np.ndarray, increase_w: np.ndarray
    ) -> Decision:
        raise NotImplementedError


class OraclePolicy(TrueCurvePolicy):
    """A reference for the extender: its ranking from the simulator's true power curves.

    The extender's own scoring (its default profile: PowerIncrease points combined with
    EnergyLevel's, as for grid-powered nodes) added to kube-scheduler's scores at `weight`,
    on true increases. It shows how much of the possible saving the learned models and lagging
    telemetry leave on the table.
    """

    name = "oracle"

    def __init__(
        self,
        true_power_w: Callable[[np.ndarray], np.ndarray],
        node_cores: np.ndarray,
        weight: int,
        rng: np.random.Generator,
    ) -> None:
        super().__init__(true_power_w, node_cores)
        self.weight = weight
        self.rng = rng

    def choose(
        self, pod: PodRequest, ledger: NodeLedger, feasible: np.ndarray, increase_w: np.ndarray
    ) -> Decision:
        if feasible.size == 1:
            return Decision(int(feasible[0]), predicted_increase_w=float(increase_w[0]))
        points = {
            "PowerIncrease": POWER_INCREASE.normalise(increase_w, None),
            "EnergyLevel": np.full(feasible.size, GRID_ENERGY_SCORE),
        }
        extender_scores = combine(DEFAULT_PROFILE, points, feasible.size)
        totals = default_plugin_scores(ledger, pod, feasible) + extender_contribution(
            extender_scores, self.weight
        )
        node = select_host(feasible, totals, self.rng)
        chosen = int(np.flatnonzero(feasible == node)[0])
        return Decision(
            node, score=float(totals[chosen]), predicted_increase_w=float(increase_w[chosen])
        )


class CheapestPolicy(TrueCurvePolicy):
    """A reference for per-pod greedy placement: the node whose true curve adds the fewest watts.

    It takes the cheapest node outright: no kube-scheduler scores beside it and no rounding to
    0..10 points (ties go to the lowest index). If it saves no more than the oracle, neither the
    scheduler's spreading scores nor the protocol's integer scores hold the extender back.
    """

    name = "cheapest"

    def choose(
        self, pod: PodRequest, ledger: NodeLedger, feasible: np.ndarray, increase_w: np.ndarray
    ) -> Decision:
        chosen = int(np.argmin(increase_w))
        return Decision(int(feasible[chosen]), predicted_increase_w=float(increase_w[chosen]))


class ReschedulingPolicy(CheapestPolicy):
    """A reference for consolidation by rescheduling: `CheapestPolicy` plus free moves.

    Every `interval_s` it looks at the running pods, biggest CPU use first, and moves each to
    the node whose true curve, at the CPU the pods there really use, adds the fewest watts,
    when that saves more than `min_saving_w` against leaving it where it is and the pod's
    requests fit there (NodeResourcesFit, as a re-created pod would be scheduled). Moves are
    free and instant: no restart, no lost work, no disruption budget. What it saves beyond
    `cheapest` is therefore an optimistic estimate of what a descheduler evicting pods towards
    efficient nodes could add to per-pod placement (a greedy one: a global re-packing could
    move more), not a deployable policy.
    """

    name = "rescheduling"

    def __init__(
        self,
        true_power_w: Callable[[np.ndarray], np.ndarray],
        node_cores: np.ndarray,
        interval_s: float,
        min_saving_w: float = 0.5,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"the rescheduling interval must be positive, got {interval_s}")
        super().__init__(true_power_w, node_cores)
        self.reschedule_interval_s = interval_s
        self.min_saving_w = min_saving_w

    def reschedule(
        self,
        nodes: np.ndarray,
        used_cores: np.ndarray,
        pods: Sequence[PodRequest],
        ledger: NodeLedger,
    ) -> list[tuple[int, int]]:
        planned = copy.deepcopy(ledger)  # the ledger as the moves decided so far leave it
        node_used_cores = np.bincount(nodes, weights=used_cores, minlength=self.node_cores.size)
        moves: list[tuple[int, int]] = []
        for slot in np.argsort(-used_cores, kind="stable").tolist():
            source, pod = int(nodes[slot]), pods[slot]
            planned.remove(source, pod)
            without = node_used_cores.copy()
            without[source] = max(without[source] - used_cores[slot], 0.0)
            base_util = np.minimum(without / self.node_cores, 1.0)
            with_pod_util = np.minimum(base_util + used_cores[slot] / self.node_cores, 1.0)
            added_w = self.true_power_w(with_pod_util) - self.true_power_w(base_util)
            added_w = np.where(fits(planned, pod), added_w, np.inf)
            target = int(np.argmin(added_w))
            if target != source and added_w[target] < added_w[source] - self.min_saving_w:
                moves.append((slot, target))
                node_used_cores = without
                node_used_cores[target] += used_cores[slot]
            else:
                target = source
            planned.add(target, pod)
        return moves


def pod_object(uid: str, pod: PodRequest) -> dict:
    """The pod as kube-scheduler serialises it into ExtenderArgs.Pod (trimmed of noise)."""
    requests = {"cpu": f"{pod.cpu_m}m"}
    if pod.memory_bytes > 0:
        requests["memory"] = f"{math.ceil(pod.memory_bytes / MIB)}Mi"
    return {
        "metadata": {"name": uid, "namespace": "default", "uid": uid, "labels": {"app": "sim"}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/app:1",
                    "resources": {"requests": requests},
                }
            ],
            "restartPolicy": "Never",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


class SimClock:
    """The simulated time, as the extender's `Runtime(clock=...)` reads it."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class WorldFeed(Protocol):
    """What a preset's world tells the extender beyond nodes and telemetry (`ExtenderPolicy`).

    Pod labels go into each pod object sent (a constraint such as `delay_<from>`), node labels
    into the Node watch's view, and `signals(now_s)` are published into the extender's state at
    each telemetry round (what a plugin's background source would publish: RTTs, intensities).
    """

    def pod_labels(self, uid: str) -> Mapping[str, str]: ...

    def node_labels(self, node: str) -> Mapping[str, str]: ...

    def signals(self, now_s: float) -> Mapping[str, object]: ...


class ExtenderPolicy(Policy):
    """kube-scheduler + our extender over HTTP; feeds the extender's state as the watches do.

    `clock` is the extender runtime's clock: it is moved to each decision's time, so assumed
    load expires in simulated time. With `hears_labels` False the Node watch's label changes
    are not passed on (the extender sees every node as grid-powered). A preset's `feed` adds
    pod labels, node labels and state signals of its world.
    """

    def __init__(
        self,
        name: str,
        base_url: str,
        state: ClusterState,
        refresh_curves: Callable[[], object],
        clock: SimClock,
        node_names: Sequence[str],
        node_cores: np.ndarray,
        weight: int,
        rng: np.random.Generator,
        *,
        hears_labels: bool = True,
        explain: bool = True,
        timeout_s: float = 5.0,
        feed: WorldFeed | None = None,
    ) -> None:
        self.name = name
        self.feed = feed
        self.state = state
        self.clock = clock
        self.hears_labels = hears_labels
        self.refresh_curves = refresh_curves
        self.node_names = list(node_names)
        self.node_cores = node_cores
        self.index = {name: i for i, name in enumerate(self.node_names)}
        self.weight = weight
        self.rng = rng
        self.explain = explain
        # httpTimeout 5 s is kube-scheduler's default for an extender.
        self.client = httpx.Client(base_url=base_url, timeout=timeout_s)
        self.requests = 0
        self.request_s = 0.0

    def close(self) -> None:
        self.client.close()

    def _post(self, path: str, body: dict) -> object:
        response = self.client.post(path, json=body)
        self.requests += 1
        self.request_s += response.elapsed.total_seconds()
        if response.status_code != 200:
            raise RuntimeError(f"extender {path} answered {response.status_code}: {response.text}")
        return response.json()

    def place(self, uid: str, pod: PodRequest, ledger: NodeLedger, now_s: float) -> Decision:
        self.clock.now_s = now_s
        feasible = np.flatnonzero(fits(ledger, pod))
        if feasible.size == 0:
            return Decision(None, reason="NodeResourcesFit: no node has room")
        pod_json = self.pod_object(uid, pod)
        if self.feed is not None:
            pod_json["metadata"]["labels"].update(self.feed.pod_labels(uid))
        names = [self.node_names[i] for i in feasible]
        answer = self._post("/filter", {"Pod": pod_json, "Nodes": None, "NodeNames": names})
        if not isinstance(answer, dict) or answer.get("Error"):
            raise RuntimeError(f"extender /filter failed for {uid}: {answer!r:.300}")
        passing = np.array([self.index[n] for n in answer.get("NodeNames") or []], dtype=np.intp)
        if passing.size == 0:
            reasons = sorted(set((answer.get("FailedNodes") or {}).values()))
            return Decision(None, reason="extender filter: " + "; ".join(reasons))
        if passing.size == 1:
            # schedulePod returns the only feasible node without scoring.
            node = int(passing[0])
            return Decision(node, predicted_increase_w=self._increase_w(pod_json, node))
        body = {"Pod": pod_json, "Nodes": None, "NodeNames": [self.node_names[i] for i in passing]}
        scores_list = self._post("/prioritize", body)
        if not isinstance(scores_list, list):
            raise RuntimeError(f"extender /prioritize for {uid} answered {scores_list!r:.300}")
        extender_scores = dict.fromkeys(passing.tolist(), 0)
        for entry in scores_list:
            extender_scores[self.index[entry["Host"]]] = int(entry["Score"])
        totals = default_plugin_scores(ledger, pod, passing) + extender_contribution(
            np.array([extender_scores[i] for i in passing.tolist()]), self.weight
        )
        node = select_host(passing, totals, self.rng)
        chosen = int(np.flatnonzero(passing == node)[0])
        return Decision(
            node,
            score=float(totals[chosen]),
            predicted_increase_w=self._increase_w(pod_json, node),
        )

    def pod_object(self, uid: str, pod: PodRequest) -> dict:
        """The Pod JSON sent to the extender (a subclass may add metadata, e.g. annotations)."""
        return pod_object(uid, pod)

    def _increase_w(self, pod_json: dict, node: int) -> float:
        if not self.explain:
            return math.nan
        body = {"Pod": pod_json, "Nodes": None, "NodeNames": [self.node_names[node]]}
        answer = self._post("/explain", body)
        if not isinstance(answer, dict):
            raise RuntimeError(f"extender /explain answered {answer!r:.300}")
        value = answer["nodes"][0].get("increase_w")
        return math.nan if value is None else float(value)

    def bound(self, node: int, uid: str, cpu_cores: float, now_s: float) -> None:
        self.state.pod_bound(self.node_names[node], uid, cpu_cores, now_s)

    def gone(self, uid: str) -> None:
        self.state.pod_gone(uid)

    def telemetry(self, readings: Sequence[tuple[str, Mapping[str, float], float]]) -> None:
        self.clock.now_s = max(self.clock.now_s, *(observed_s for _, _, observed_s in readings))
        self.state.set_telemetry_many(readings)
        if self.feed is not None:
            for signal, value in self.feed.signals(self.clock.now_s).items():
                self.state.set_signal(signal, value)
        # In the service the background refresher re-tabulates within curve_refresh_interval_s
        # (1 s); sim time stands still during a call, so it is done here, synchronously.
        self.refresh_curves()

    def labels_changed(self, node: int, labels: Mapping[str, str]) -> None:
        if not self.hears_labels:
            return
        name = self.node_names[node]
        if self.feed is not None:
            labels = {**self.feed.node_labels(name), **labels}
        self.state.upsert_node(NodeInfo(name, float(self.node_cores[node]), dict(labels)))
