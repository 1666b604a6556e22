"""The faults preset: failing starts, restarts and wasted energy computed by hand, the pod watch
the simulation plays, and power-aware+rewards against power-aware through a real server."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.sim import presets  # noqa: F401  (registers the faults preset and its policy)
from bench.sim.cluster import curve_power_w
from bench.sim.engine import SimSettings, simulate
from bench.sim.faults import cheapest_node
from bench.sim.pod_faults import FaultPlan, NodeFault
from bench.sim.policies import CheapestPolicy
from bench.sim.runner import run_policy
from bench.sim.scenario import BenchSettings, build_scenario
from bench.sim.workload import Trace
from extender.config import DEFAULT_BUNDLE_DIR
from tests.support.sim import sim_cluster

LINEAR = [0.5 + 0.05 * i for i in range(11)]  # 50 % idle, linear to max


class RecordingCheapest(CheapestPolicy):
    """The cheapest-node reference, writing down what the pod watch would report."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.events: list[tuple[str, float, int]] = []

    def pod_crashed(self, uid: str, node: int, now_s: float, restarts: int, reason: str) -> None:
        self.events.append(("crashed", now_s, restarts))

    def pod_replaced(self, uid: str, node: int, now_s: float) -> None:
        self.events.append(("replaced", now_s, 0))


def one_pod_trace(duration_s: float) -> Trace:
    return Trace(
        names=["pod-000001"],
        arrival_s=np.array([0.0]),
        cpu_m=np.array([1000]),
        memory_bytes=np.array([0]),
        duration_s=np.array([duration_s]),
        usage_ratio=np.array([1.0]),
    )


def test_a_faulty_node_fails_starts_until_repaired_and_the_waste_is_counted() -> None:
    # Node 0 is the cheaper (100 -> 200 W over 10 cores); node 1 dearer (200 -> 400 W). The
    # cheapest reference keeps sending the pod to node 0, which fails it until t = 1000 s.
    cluster = sim_cluster([LINEAR, LINEAR], [200.0, 400.0], [10.0, 10.0])

    def true_power_w(util: np.ndarray) -> np.ndarray:
        return curve_power_w(cluster, util)

    policy = RecordingCheapest(true_power_w, cluster.cores)
    plan = FaultPlan(
        workload_names=("svc-00",),
        pod_workload=np.array([0]),
        faults=(NodeFault(0, frozenset({0}), 1.0, "OOMKilled", repaired_at_s=1000.0),),
        crash_after_s=60.0,
        restarts_before_replaced=3,
        warmup_s=300.0,
    )
    settings = SimSettings(tick_s=5.0, tail_s=2400.0)
    faults = plan.run(cluster.spec.idle_share * cluster.spec.max_power_w)
    result = simulate(cluster, one_pod_trace(600.0), policy, settings, faults=faults)

    # Each failing start runs 3 x 60 s; its replacement is created at once and tried at the
    # next tick, as a ReplicaSet's would be: starts at 0, 180, 360, 540, 720 and 900 s fail;
    # the one at 1080 s (after the repair) runs its 600 s and finishes.
    assert result.failed_pod_starts == 6
    assert result.kpis["failed_pod_starts_after_warmup"] == 4  # started at 360, 540, 720, 900
    assert result.kpis["restarts"] == 18
    assert result.placed_pods == 7 and result.unplaced_pods == 0 and result.unfinished_pods == 0
    assert result.kpis["repaired_node_reused_after_s"] == pytest.approx(80.0)
    assert result.kpis["repaired_node_starts_after_repair"] == 1
    crashes = [t for kind, t, _ in policy.events if kind == "crashed"]
    assert crashes[:3] == [60.0, 120.0, 180.0] and len(crashes) == 18
    assert [k for k, _, _ in policy.events].count("replaced") == 6
    # Wasted: 1 core of 10 on a linear 100 W span = 10 W above idle, for 6 x 180 s = 3 Wh.
    assert result.kpis["wasted_energy_kwh"] == pytest.approx(0.003, rel=1e-6)
    # A wait is counted from the pod's re-creation, not from its first arrival: none here.
    assert result.pod_wait_summary_s()["max"] == pytest.approx(0.0)


def test_a_healthy_workload_is_never_failed_and_draws_are_per_pod_start() -> None:
    plan = FaultPlan(
        workload_names=("a", "b"),
        pod_workload=np.array([0, 1, 1]),
        faults=(NodeFault(0, frozenset({1}), 0.5),),
        seed=3,
    )
    first, second = plan.run(np.zeros(2)), plan.run(np.zeros(2))
    assert first.started(0, 0, "p0", 0.0) is None  # workload a: not affected
    assert first.started(1, 1, "p1", 0.0) is None  # another node
    outcomes = [first.started(2, 0, "p2", float(t)) is not None for t in range(40)]
    again = [second.started(2, 0, "p2", float(t)) is not None for t in range(40)]
    assert outcomes == again  # the same luck for the same pod and start, whatever the policy
    assert 5 < sum(outcomes) < 35


def test_the_preset_hides_two_faults_one_on_the_cheapest_node() -> None:
    scenario = build_scenario(BenchSettings(preset="faults", hours=2.0), SimSettings())
    plan = scenario.world["faults"]
    assert isinstance(plan, FaultPlan)
    cheapest, other = plan.faults
    assert cheapest.node == cheapest_node(scenario.cluster) != other.node
    assert cheapest.repaired_at_s == 3600.0 and math.isinf(other.repaired_at_s)
    assert len(plan.pod_workload) == len(scenario.trace)
    shares = np.bincount(plan.pod_workload, minlength=len(plan.workload_names))
    assert shares[0] == shares.max() and shares.min() > 0  # a few busy services, a tail


def test_rewards_keep_pods_off_the_node_that_fails_them_through_a_real_server() -> None:
    # The shipped bundle was fitted on training.synth's 12-node fleet, seed 7: these nodes.
    settings = BenchSettings(preset="faults", nodes=12, seed=7, hours=3.0, load=0.3)
    scenario = build_scenario(settings, SimSettings(tail_s=1800.0))
    scenario.bundle_dir = DEFAULT_BUNDLE_DIR

    power_aware, _ = run_policy("power-aware", scenario, progress=False)
    rewards, figures = run_policy("power-aware+rewards", scenario, progress=False)
    assert figures["extender_requests"] > 2 * len(scenario.trace)

    # Power-aware keeps sending the affected workloads to the cheapest node, where they fail;
    # with rewards they fail there a few times, then go elsewhere until it is repaired.
    assert power_aware.failed_pod_starts >= 20
    assert rewards.failed_pod_starts <= power_aware.failed_pod_starts / 3
    assert rewards.kpis["restarts"] == 3 * rewards.failed_pod_starts
    assert rewards.kpis["wasted_energy_kwh"] < power_aware.kpis["wasted_energy_kwh"]
    assert rewards.placed_pods >= len(scenario.trace) and rewards.unplaced_pods == 0
    # After the repair (half-way) the node runs those workloads again within the half-life,
    # and keeps running them (not one lucky exploration): the evidence against it fades.
    reused_s = rewards.kpis["repaired_node_reused_after_s"]
    assert 0 <= reused_s < 6 * 3600
    assert rewards.kpis["repaired_node_starts_after_repair"] >= 5
    assert rewards.energy_kwh <= power_aware.energy_kwh * 1.01
