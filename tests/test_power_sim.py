"""The simulation's power states, cluster-autoscaler's rule, the controller's policy in the loop,
and the realism of the default scheduler (topology spreading, DaemonSet pods)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench.energy_sim import BenchSettings, main
from bench.sim.autoscaler import ClusterAutoscaler
from bench.sim.cluster import DAEMONSET_PODS, build_cluster
from bench.sim.engine import SimSettings, Simulation, simulate
from bench.sim.kube_default import (
    NO_OWNER,
    NodeLedger,
    PodRequest,
    default_schedule,
    fits,
    topology_spread_scores,
)
from bench.sim.policies import DefaultPolicy
from bench.sim.power import NodeState, PowerManager
from bench.sim.power_policies import power_management_for
from bench.sim.scenario import Scenario
from bench.sim.workload import OWNED_SHARE, Trace, generate_trace, load_trace_csv
from controllers.node_power.policy import ArrivalRateMeter, PolicySettings
from extender.config import DEFAULT_BUNDLE_DIR
from extender.node_requests import REQUESTED_CPU_SIGNAL
from extender.plugins.power_state import POWER_STATE, PowerStateCode
from tests.support.sim import power_managed_extender, sim_cluster

GIB = 1024**3


def trace_of(arrival_s, cpu_m, duration_s, owner=None) -> Trace:
    count = len(arrival_s)
    return Trace(
        names=[f"p{i}" for i in range(1, count + 1)],
        arrival_s=np.asarray(arrival_s, dtype=float),
        cpu_m=np.asarray(cpu_m, dtype=np.int64),
        memory_bytes=np.zeros(count, dtype=np.int64),
        duration_s=np.asarray(duration_s, dtype=float),
        usage_ratio=np.ones(count),
        owner=None if owner is None else np.asarray(owner, dtype=np.int64),
    )


def flat_cluster(count: int, idle_w: float = 100.0, peak_w: float = 200.0, cores: float = 4.0):
    """Nodes whose power rises linearly from idle to peak with CPU, no fans."""
    share = np.linspace(idle_w / peak_w, 1.0, 11)
    return sim_cluster([share] * count, [peak_w] * count, [cores] * count)


# ---- kube-scheduler's default topology spreading --------------------------------------------


def test_topology_spread_scores_follow_upstream_arithmetic() -> None:
    ledger = NodeLedger(np.full(4, 8000), np.full(4, 8 * GIB), ["z1", "z1", "z2", "z2"])
    for node in (0, 0, 1, 2):
        ledger.add(node, PodRequest(100, 0, owner=7))
    ledger.add(3, PodRequest(100, 0, owner=8))  # another Deployment's pod counts for nothing
    nodes = np.arange(4)
    # Per node: n_host * ln(4 + 2) + 2 + n_zone * ln(2 + 2) + 4, rounded:
    # node 0: 2 * 1.792 + 2 + 3 * 1.386 + 4 = 13.74 -> 14; node 1: 1.79 + 6 + 4.16 -> 12;
    # node 2: 1.79 + 6 + 1.39 -> 9; node 3: 0 + 6 + 1.39 -> 7.
    # Normalised 100 * (max + min - s) // max with max 14, min 7.
    expected = [100 * (14 + 7 - s) // 14 for s in (14, 12, 9, 7)]
    assert topology_spread_scores(ledger, PodRequest(100, 0, owner=7), nodes).tolist() == expected
    # A pod without an owner has no default constraint: 0 everywhere (the plugin skips).
    assert topology_spread_scores(ledger, PodRequest(100, 0), nodes).tolist() == [0, 0, 0, 0]
    # Only the feasible nodes' zones count, and the hostname weight uses their number.
    two = topology_spread_scores(ledger, PodRequest(100, 0, owner=7), np.array([1, 3]))
    # node 1: 1 * ln 4 + 2 + 3 * ln 4 + 4 = 11.5 -> 12 (half away from zero); node 3: 6 + ln 4 -> 7
    assert two.tolist() == [100 * (12 + 7 - 12) // 12, 100 * (12 + 7 - 7) // 12]


def test_the_default_scheduler_spreads_a_deployments_replicas() -> None:
    # Two nodes; b is half full with another workload, so LeastAllocated prefers a.
    ledger = NodeLedger(np.full(2, 16000), np.full(2, 64 * GIB), ["z1", "z2"])
    ledger.add(1, PodRequest(4000, 8 * GIB))
    rng = np.random.default_rng(0)
    unowned, owned = [], []
    for _ in range(4):
        node = default_schedule(ledger, PodRequest(500, GIB), rng)
        ledger.add(node, PodRequest(500, GIB))
        unowned.append(node)
    assert unowned == [0, 0, 0, 0]
    for _ in range(4):
        node = default_schedule(ledger, PodRequest(500, GIB, owner=1), rng)
        ledger.add(node, PodRequest(500, GIB, owner=1))
        owned.append(node)
    assert 0 < owned.count(1) < 4  # replicas of one owner land on both nodes


def test_unschedulable_nodes_take_no_pod() -> None:
    ledger = NodeLedger(np.full(3, 4000), np.full(3, 8 * GIB))
    ledger.schedulable[1] = False
    assert fits(ledger, PodRequest(100, 0)).tolist() == [True, False, True]


def test_daemonset_requests_count_on_every_node_and_nodes_carry_zones() -> None:
    cluster = build_cluster(6, 7)
    assert cluster.zone_labels == ("zone-a", "zone-b", "zone-c") * 2
    sim = Simulation(cluster, trace_of([0.0], [100], [60.0]), DefaultPolicy(None), SimSettings())
    daemon_m = sum(p.cpu_m for p in DAEMONSET_PODS)
    assert sim.ledger.requested_cpu_m.tolist() == [daemon_m] * 6
    assert sim.ledger.pod_count.tolist() == [len(DAEMONSET_PODS)] * 6


def test_generated_pods_mostly_belong_to_deployments_of_one_size(tmp_path: Path) -> None:
    trace = generate_trace(256.0, hours=6, load=0.45, seed=3)
    owned = trace.owners != NO_OWNER
    assert owned.mean() == pytest.approx(OWNED_SHARE, abs=0.05)
    for owner in np.unique(trace.owners[owned]):
        assert np.unique(trace.cpu_m[trace.owners == owner]).size == 1  # replicas alike
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,cpu_request,duration_s,owner\n0,1,60,web\n1,1,60,\n2,1,60,web\n")
    assert load_trace_csv(path).owners.tolist() == [0, NO_OWNER, 0]


# ---- power states ------------------------------------------------------------------------


class Scripted(PowerManager):
    """Powers nodes off and on at set times: the physics, without a decision rule."""

    def __init__(self, settings: SimSettings, script: list[tuple[float, str, int]]) -> None:
        super().__init__(settings)
        self.script = sorted(script)

    def control(self, sim: Simulation, now_s: float) -> None:
        while self.script and self.script[0][0] <= now_s:
            _, what, node = self.script.pop(0)
            (self.power_off if what == "off" else self.wake)(sim, node, now_s)


def run_scripted(cluster, trace, settings, script):
    policy = DefaultPolicy(np.random.default_rng(0))
    policy.power = Scripted(settings, script)
    return simulate(cluster, trace, policy, settings), policy.power


def test_off_boot_and_shutdown_draw_what_the_settings_say() -> None:
    # One node of 100 W idle, 200 W peak, no pods; 3600 s run. Off at 0: 60 s shutting down at
    # idle, then off at 10 W until 1800 s, then 300 s booting at 150 W (half-way), then idle.
    settings = SimSettings(tick_s=5.0, tail_s=3600.0, power_interval_s=10.0)
    cluster = flat_cluster(1)
    trace = trace_of([0.0], [100], [1.0])  # evicted at once: it never runs
    result, manager = run_scripted(cluster, trace, settings, [(0.0, "off", 0), (1800.0, "on", 0)])
    expected_j = 100 * 60 + 10 * (1800 - 60) + 150 * 300 + 100 * (3600 - 2100)
    assert result.energy_kwh == pytest.approx(expected_j / 3.6e6)
    assert result.power_cycles == 1 and result.kpis["wakes"] == 1
    assert result.kpis["booting_node_hours"] == pytest.approx(300 / 3600, abs=1e-3)
    assert manager.state[0] == NodeState.ON


def test_pods_wait_while_the_node_they_need_boots() -> None:
    settings = SimSettings(tick_s=5.0, tail_s=600.0, boot_s=300.0, power_interval_s=10.0)
    cluster = flat_cluster(2)
    # Node 1 off at once; at 900 s a pod too big for the busy node 0 arrives; node 1 is woken
    # at 900 s and the pod is placed when it is up, 300 s later (the Node event requeues it).
    trace = trace_of([20.0, 900.0], [4000, 2000], [3000.0, 600.0])
    result, _ = run_scripted(cluster, trace, settings, [(0.0, "off", 1), (900.0, "on", 1)])
    assert result.placed_pods == 2 and result.unplaced_pods == 0
    assert result.pod_waits_s.max() == pytest.approx(300.0, abs=settings.tick_s)


def test_evicted_pods_wait_again_and_keep_the_work_they_had_left() -> None:
    settings = SimSettings(tick_s=5.0, tail_s=1800.0, power_interval_s=10.0)
    cluster = flat_cluster(2)
    trace = trace_of([0.0], [1000], [1200.0])
    # The pod lands on one of the two empty nodes; power that node off at 600 s.
    probe = simulate(cluster, trace, DefaultPolicy(np.random.default_rng(0)), settings)
    node = [d.node for d in probe.decisions].pop()
    result, manager = run_scripted(
        cluster, trace, settings, [(600.0, "off", cluster.names.index(node))]
    )
    assert manager.evicted_pods == 1 == result.kpis["evicted_pods"]
    assert result.placed_pods == 2  # placed, then placed again
    moved = result.decisions[-1]
    assert moved.node != node and moved.time_s == pytest.approx(605.0)
    # Evicted at 600 s with 600 s of work left: done by 1205 s, the run is not longer.
    assert result.unfinished_pods == 0 and result.pod_waits_s.max() <= settings.tick_s


# ---- cluster-autoscaler ------------------------------------------------------------------


def autoscaler_sim(count: int, pods_cpu_m: list[int], autoscaler=None):
    """`count` empty 4-core nodes with cluster-autoscaler, and pods to run or to wait (`run_pod`,
    `sim.pending`), not yet run: the autoscaler's rounds are called by hand."""
    settings = SimSettings()
    policy = DefaultPolicy(np.random.default_rng(0))
    policy.power = ClusterAutoscaler(settings, np.random.default_rng(1), autoscaler)
    trace = trace_of([1e6] * len(pods_cpu_m), pods_cpu_m, [1.0] * len(pods_cpu_m))
    sim = Simulation(flat_cluster(count), trace, policy, settings)
    return sim, policy.power


def run_pod(sim: Simulation, pod: int, node: int) -> None:
    sim.ledger.add(node, sim.requests[pod])
    sim.running.add(pod, node, sim.requests[pod].cpu_m / 1000.0, 10_000.0, 0.0)


def test_autoscaler_removes_empty_nodes_in_bulk_after_ten_minutes_down_to_its_floor() -> None:
    sim, autoscaler = autoscaler_sim(4, [3000])
    run_pod(sim, 0, 0)  # 75 % of node 0: over the threshold, needed
    for now_s in range(0, 600, 10):
        autoscaler.control(sim, float(now_s))
    assert autoscaler.power_offs == 0 and set(autoscaler.unneeded_since) == {1, 2, 3}
    autoscaler.control(sim, 600.0)
    assert autoscaler.power_offs == 3  # empty nodes in bulk, in one scan
    assert [NodeState(s) for s in autoscaler.state] == [NodeState.ON] + [
        NodeState.SHUTTING_DOWN
    ] * 3
    assert not sim.ledger.schedulable[1:].any()
    # With its pod gone, node 0 is empty too, but the floor of one node keeps it on.
    sim, autoscaler = autoscaler_sim(2, [100])
    autoscaler.control(sim, 0.0)
    autoscaler.control(sim, 600.0)
    assert autoscaler.power_offs == 1


def test_autoscaler_drains_one_node_with_pods_per_scan() -> None:
    sim, autoscaler = autoscaler_sim(3, [500, 500, 500])
    for node in range(3):
        run_pod(sim, node, node)  # 12.5 % each
    autoscaler.control(sim, 0.0)
    # Node 0's pod fits elsewhere, so does node 1's (node 0 counted as gone); then node 2's
    # pods would have nowhere left to go.
    assert set(autoscaler.unneeded_since) == {0, 1}
    autoscaler.control(sim, 600.0)
    assert autoscaler.power_offs == 1 and autoscaler.evicted_pods == 1
    assert list(sim.pending) == [0]  # node 0's pod waits again, to be placed elsewhere
    autoscaler.control(sim, 605.0)  # within --scale-down-delay-after-delete (10 s)
    assert autoscaler.power_offs == 1


def test_autoscaler_waits_ten_minutes_after_a_scale_up_before_removing() -> None:
    sim, autoscaler = autoscaler_sim(3, [3000])
    run_pod(sim, 0, 0)
    autoscaler.control(sim, 0.0)
    autoscaler.last_scale_up_s = 300.0
    autoscaler.control(sim, 890.0)  # ripe since 600 s, but 590 s after a scale-up
    assert autoscaler.power_offs == 0
    autoscaler.control(sim, 900.0)
    assert autoscaler.power_offs == 2


def test_autoscaler_wakes_one_node_for_pods_that_fit_nowhere_up_or_coming() -> None:
    sim, autoscaler = autoscaler_sim(4, [1000, 2000, 3000, 3000])
    run_pod(sim, 0, 0)
    for node in (1, 2, 3):
        autoscaler.state[node] = NodeState.OFF
        sim.ledger.schedulable[node] = False
    sim.pending = {1: (0.0, 1)}  # 2 cores: fits on node 0 (3 free): no scale-up
    autoscaler.control(sim, 0.0)
    assert autoscaler.wakes == 0
    sim.pending = {1: (0.0, 1), 2: (0.0, 1), 3: (0.0, 1)}
    autoscaler.control(sim, 10.0)  # one node per scan
    assert autoscaler.wakes == 1
    booting = int(np.flatnonzero(autoscaler.state == NodeState.BOOTING)[0])
    autoscaler.control(sim, 20.0)  # the 3 cores left over fit nowhere up or coming: one more
    assert autoscaler.wakes == 2
    autoscaler.control(sim, 30.0)  # everything waiting fits on what is up or coming
    assert autoscaler.wakes == 2 and autoscaler.state[booting] == NodeState.BOOTING
    assert autoscaler.last_scale_up_s == 20.0


def test_autoscaler_saves_energy_on_a_quiet_night_and_its_pods_wait_for_boots() -> None:
    settings = SimSettings(tick_s=5.0, tail_s=1200.0, boot_s=300.0)
    cluster = flat_cluster(3)
    # 25 min of a small pod: two nodes go off. Then two 3-core pods: one fits on the node
    # that is up, the other needs a node: exactly one wake, and that pod waits for the boot.
    trace = trace_of([0.0, 1500.0, 1500.5], [100, 3000, 3000], [1500.0, 1200.0, 1200.0])
    policy = DefaultPolicy(np.random.default_rng(0))
    policy.power = ClusterAutoscaler(settings, np.random.default_rng(1))
    result = simulate(cluster, trace, policy, settings)
    always_on = simulate(cluster, trace, DefaultPolicy(np.random.default_rng(0)), settings)
    assert result.power_cycles == 2 and result.kpis["wakes"] == 1
    assert result.unplaced_pods == 0
    assert result.pod_waits_s.max() == pytest.approx(300.0, abs=15.0)
    assert result.energy_kwh < always_on.energy_kwh


# ---- the node power controller's policy in the loop ----------------------------------------


def test_power_management_runs_the_controllers_policy_through_the_extender() -> None:
    # The shipped bundle was fitted on training.synth's 12-node fleet, seed 7.
    cluster = build_cluster(12, 7)
    trace = generate_trace(float(cluster.cores.sum()), hours=1.0, load=0.2, seed=1)
    settings = BenchSettings(nodes=12, seed=7)
    sim_settings = SimSettings(tail_s=1800.0, boot_s=120.0)
    with power_managed_extender(cluster, settings, sim_settings) as (policy, manager):
        run = Simulation(cluster, trace, policy, sim_settings)
        run.start()
        for tick in range(run.n_ticks):
            run.step(tick)
        result = run.result()
        view = policy.state.view(result.duration_s)
        states = view.node_values(POWER_STATE)
        codes = {name: int(states[view.node(name)]) for name in cluster.names}
        requested = view.signal(REQUESTED_CPU_SIGNAL)
    assert result.unplaced_pods == 0
    assert result.power_cycles > 0  # at 20 % load over an hour, some nodes go off
    offs = [entry for entry in manager.decision_log if entry[1] == "off"]
    assert offs and all("idle per core" in why for _, _, _, why in offs)
    # The extender heard each node's power state, and the requests per node.
    off = {cluster.names[n] for n in np.flatnonzero(manager.state == NodeState.OFF)}
    assert off and {n for n, code in codes.items() if code == PowerStateCode.OFF} == off
    running_m = np.bincount(
        run.running.node, weights=run.trace.cpu_m[run.running.pod], minlength=12
    )
    expected = {n: m / 1000 for n, m in zip(cluster.names, running_m, strict=True) if m}
    assert dict(requested.cores) == pytest.approx(expected)
    # The views the policy decided on: watts predicted by the bundle, DaemonSet pods included.
    views = manager.node_views(run, result.duration_s)
    assert all(math.isfinite(v.idle_w) and len(v.curve_w) == 11 for v in views)
    assert all(sum(p.daemon for p in v.pods) == len(DAEMONSET_PODS) for v in views)
    true_idle = cluster.spec.idle_share * cluster.spec.max_power_w
    assert not np.allclose([v.idle_w for v in views], true_idle)  # learned, not the truth


def test_the_controllers_knobs_reach_its_policy_in_the_simulation() -> None:
    """--cooldown, --off-margin-sd, --min-headroom-cores, --headroom-factor and
    --arrival-windows set what `decide` is given."""
    cluster = build_cluster(12, 7)
    trace = generate_trace(float(cluster.cores.sum()), hours=0.1, load=0.2, seed=1)
    bench = BenchSettings(
        nodes=12,
        power_cooldown_s=7200.0,
        off_margin_sd=0.5,
        min_headroom_cores=8.0,
        headroom_factor=1.5,
        arrival_windows_s=(60.0, 600.0),
    )
    scenario = Scenario(bench, SimSettings(boot_s=120.0), cluster, trace, DEFAULT_BUNDLE_DIR)
    manager = power_management_for(scenario, None)  # type: ignore[arg-type]
    policy = manager.policy_settings
    assert (policy.boot_s, policy.cooldown_s, policy.off_margin_sd) == (120.0, 7200.0, 0.5)
    assert (policy.min_headroom_cores, policy.headroom_factor) == (8.0, 1.5)
    assert manager.meter.windows_s == (60.0, 600.0)
    plain = Scenario(BenchSettings(nodes=12), SimSettings(boot_s=120.0), cluster, trace)
    plain.bundle_dir = DEFAULT_BUNDLE_DIR
    defaults = power_management_for(plain, None)  # type: ignore[arg-type]
    assert defaults.policy_settings == PolicySettings(boot_s=120.0)  # the controller's defaults
    assert defaults.meter.windows_s == ArrivalRateMeter.for_boot_time(120.0).windows_s


def test_foresight_is_told_how_far_requested_cpu_rises_within_a_boot_time() -> None:
    cluster = build_cluster(12, 7)
    # 2 cores from 0 s for 1000 s; 3 from 100 s for 50 s; 1 from 400 s for 100 s
    trace = trace_of([0.0, 100.0, 400.0], [2000, 3000, 1000], [1000.0, 50.0, 100.0])
    scenario = Scenario(BenchSettings(nodes=12), SimSettings(boot_s=300.0), cluster, trace)
    scenario.bundle_dir = DEFAULT_BUNDLE_DIR
    manager = power_management_for(scenario, None)  # type: ignore[arg-type]
    growth = [manager._requested_growth(trace, now_s) for now_s in (50.0, 200.0, 450.0, 1500.0)]
    # at 50 s the 3-core pod comes within the boot; at 200 s only the 1-core one; at 450 s
    # nothing more; at 1500 s everything has ended
    assert growth == pytest.approx([3.0, 1.0, 0.0, 0.0])


def test_with_foresight_nodes_are_up_before_a_burst_that_the_rate_makes_wait() -> None:
    """The foresight reference wakes nodes a boot time before the burst comes; the rate meter
    sees it only once it has come, so its pods wait for boots."""
    cluster = build_cluster(12, 7)
    quiet = np.arange(0.0, 3000.0, 60.0)
    burst = np.full(60, 3000.0) + np.arange(60)
    trace = trace_of(
        np.concatenate([quiet, burst]),
        [1000] * quiet.size + [2000] * burst.size,
        [120.0] * quiet.size + [1800.0] * burst.size,
    )
    sim_settings = SimSettings(tail_s=1800.0, boot_s=300.0)
    waits = {}
    for foresight in (False, True):
        with power_managed_extender(cluster, BenchSettings(nodes=12, seed=7), sim_settings) as (
            policy,
            manager,
        ):
            manager.foresight = foresight
            result = simulate(cluster, trace, policy, sim_settings)
        assert result.unplaced_pods == 0
        waits[foresight] = result.pod_waits_s
    assert waits[False].max() >= 200.0  # the rate's pods waited most of a boot
    assert waits[True].max() < 60.0


def test_cli_reports_power_figures_for_both_power_policies(tmp_path: Path) -> None:
    summary_json = tmp_path / "summary.json"
    code = main(
        [
            "--nodes",
            "12",
            "--hours",
            "1",
            "--load",
            "0.2",
            "--tail-hours",
            "0.5",
            "--boot-time",
            "120",
            "--quiet",
            "--out-dir",
            str(tmp_path),
            "--policies",
            "default,default+autoscaler",
            "--json",
            str(summary_json),
        ]
    )
    assert code == 0
    report = json.loads(summary_json.read_text())
    assert report["settings"]["boot_s"] == 120.0
    auto = report["policies"]["default+autoscaler"]
    assert auto["power_cycles_per_node_day"] > 0
    assert auto["energy_kwh"] < report["policies"]["default"]["energy_kwh"]
    assert {"wakes", "evicted_pods", "mean_nodes_off"} <= set(auto)
    assert main(["--boot-power-share", "2", "--quiet", "--out-dir", str(tmp_path)]) == 2
