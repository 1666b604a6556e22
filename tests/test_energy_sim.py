"""The energy bench's parts: the default scheduler against hand-computed placements, energy
accounting, the trace loader, and a tiny power-aware run through a real uvicorn server."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench.energy_sim import BenchSettings, extender_policy, main
from bench.sim.cluster import SimCluster, build_cluster
from bench.sim.engine import SimSettings, simulate
from bench.sim.kube_default import (
    NodeLedger,
    PodRequest,
    balanced_allocation_scores,
    default_plugin_scores,
    default_schedule,
    extender_contribution,
    fits,
    least_allocated_scores,
    plugin_scores,
)
from bench.sim.policies import CheapestPolicy, Decision, DefaultPolicy, ReschedulingPolicy
from bench.sim.workload import Trace, TraceError, generate_trace, load_trace_csv
from extender.config import DEFAULT_BUNDLE_DIR
from tests.support.sim import sim_cluster

GIB = 1024**3
A, B, C = 0, 1, 2


def tiny_ledger(kube_version: str = "1.36") -> NodeLedger:
    # node a: 4 CPU, 8 GiB; node b: 8 CPU, 8 GiB; node c: 2 CPU, 16 GiB
    return NodeLedger(
        np.array([4000, 8000, 2000]),
        np.array([8 * GIB, 8 * GIB, 16 * GIB]),
        kube_version=kube_version,
    )


# Every node's total also holds TaintToleration's 100 x weight 3 (no PreferNoSchedule taint
# anywhere) and ImageLocality's and DynamicResources' 0: the same on every node.
SAME_EVERYWHERE = 300


def test_default_scheduler_matches_hand_computed_placements() -> None:
    ledger = tiny_ledger()
    rng = np.random.default_rng(0)
    all_nodes = np.arange(3)

    # Pod 1: 1 CPU, 1 GiB on an empty cluster.
    #   LeastAllocated = (cpu + mem) // 2 with each (cap - req) * 100 // cap:
    #     a: cpu 3000*100//4000 = 75, mem 7*100//8 = 87 -> 81
    #     b: cpu 7000*100//8000 = 87, mem 87           -> 87
    #     c: cpu 1000*100//2000 = 50, mem 15*100//16 = 93 -> 71
    #   BalancedAllocation (v1.36) = 50 + (50 + after - before) // 2, each balance
    #   int((1 - |f_cpu - f_mem| / 2) * 100); empty nodes are balanced (before 100):
    #     a: after |0.25 - 0.125|/2 = 0.0625 -> 93 -> 50 + 43 // 2 = 71
    #     b: after 0 -> 100 -> 75;  c: after |0.5 - 0.0625|/2 -> 78 -> 50 + 28 // 2 = 64
    #   totals a 152, b 162, c 135 -> b
    pod1 = PodRequest(1000, 1 * GIB)
    assert least_allocated_scores(ledger, pod1, all_nodes).tolist() == [81, 87, 71]
    assert balanced_allocation_scores(ledger, pod1, all_nodes).tolist() == [71, 75, 64]
    totals = default_plugin_scores(ledger, pod1, all_nodes) - SAME_EVERYWHERE
    assert totals.tolist() == [152, 162, 135]
    assert default_schedule(ledger, pod1, rng) == B
    ledger.add(B, pod1)

    # Pod 2: 3 CPU, 1 GiB. The filter rejects c (3 CPU > 2 allocatable).
    #   a: LA (25 + 87) // 2 = 56, BA after |0.75 - 0.125|/2 -> 68, before 100 -> 59; 115
    #   b: LA cpu 4000*100//8000 = 50, mem 6*100//8 = 75 -> 62,
    #      BA after |0.5 - 0.25|/2 -> 87, before |0.125 - 0.125| -> 100 -> 68; 130
    pod2 = PodRequest(3000, 1 * GIB)
    assert fits(ledger, pod2).tolist() == [True, True, False]
    totals = default_plugin_scores(ledger, pod2, np.array([A, B])) - SAME_EVERYWHERE
    assert totals.tolist() == [115, 130]
    assert default_schedule(ledger, pod2, rng) == B
    ledger.add(B, pod2)

    # Pod 3: 2 CPU, 4 GiB; b has 4 CPU and 2 GiB requested.
    #   a: LA (50 + 50) // 2 = 50, BA after 100, before 100 -> 75; 125
    #   b: LA (2000*100//8000 = 25, 2*100//8 = 25) -> 25,
    #      BA after |0.75 - 0.75| -> 100, before |0.5 - 0.25|/2 -> 87 -> 81; 106
    #   c: LA (0, 12*100//16 = 75) -> 37, BA after |1.0 - 0.25|/2 -> 62, before 100 -> 56; 93
    #   -> a: spreading wins over b, though the pod would even out b's balance.
    pod3 = PodRequest(2000, 4 * GIB)
    totals = default_plugin_scores(ledger, pod3, all_nodes) - SAME_EVERYWHERE
    assert totals.tolist() == [125, 106, 93]
    assert default_schedule(ledger, pod3, rng) == A
    ledger.add(A, pod3)

    # Pod 4: 3 CPU. Free CPU: a 2, b 4, c 2 -> only b fits, chosen without scoring.
    pod4 = PodRequest(3000, 0)
    assert fits(ledger, pod4).tolist() == [False, True, False]
    assert default_schedule(ledger, pod4, rng) == B
    ledger.add(B, pod4)

    # Pod 5: 3 CPU again: nothing has room left.
    assert default_schedule(ledger, PodRequest(3000, 0), rng) is None


def test_kube_scheduler_v1_28_scores_the_balance_after_placement() -> None:
    ledger = tiny_ledger("1.28")
    rng = np.random.default_rng(0)
    all_nodes = np.arange(3)
    # v1.28's BalancedAllocation is the balance with the pod placed, int((1 - std) * 100):
    #   pod 1 (1 CPU, 1 GiB): a 93, b 100, c 78; with LeastAllocated 81, 87, 71 -> b
    pod1 = PodRequest(1000, 1 * GIB)
    assert balanced_allocation_scores(ledger, pod1, all_nodes).tolist() == [93, 100, 78]
    totals = default_plugin_scores(ledger, pod1, all_nodes) - SAME_EVERYWHERE
    assert totals.tolist() == [174, 187, 149]
    assert default_schedule(ledger, pod1, rng) == B
    ledger.add(B, pod1)
    #   pod 2 (3 CPU, 1 GiB): a LA 56 + BA 68 = 124, b LA 62 + BA 87 = 149 (c does not fit)
    pod2 = PodRequest(3000, 1 * GIB)
    totals = default_plugin_scores(ledger, pod2, np.array([A, B])) - SAME_EVERYWHERE
    assert totals.tolist() == [124, 149]
    ledger.add(B, pod2)
    #   pod 3 (2 CPU, 4 GiB): a 50 + 100, b 25 + 100, c 37 + 62: where v1.36 gives b 81 for
    #   evening out its balance, v1.28 gives it the full 100 for the balance it ends at.
    pod3 = PodRequest(2000, 4 * GIB)
    totals = default_plugin_scores(ledger, pod3, all_nodes) - SAME_EVERYWHERE
    assert totals.tolist() == [150, 125, 99]
    with pytest.raises(ValueError, match=r"1\.29"):
        NodeLedger(np.array([1000]), np.array([GIB]), kube_version="1.29")


def test_zero_requests_score_as_defaults_but_fit_anywhere() -> None:
    empty = PodRequest(0, 0)
    for kube_version in ("1.36", "1.28"):
        ledger = tiny_ledger(kube_version)
        # The filter ignores unrequested resources; LeastAllocated counts 100m and 200 MiB:
        #   a: cpu 3900*100//4000 = 97, mem (8192-200)*100//8192 = 97 -> 97
        assert fits(ledger, empty).all()
        assert least_allocated_scores(ledger, empty, np.array([A])).tolist() == [97]
    # BalancedAllocation uses the actual (zero) requests. v1.28: fractions 0 and 0 -> 100.
    # v1.36 skips best-effort pods: the plugin adds nothing, to no node.
    v1_28, v1_36 = tiny_ledger("1.28"), tiny_ledger("1.36")
    assert balanced_allocation_scores(v1_28, empty, np.array([A])).tolist() == [100]
    assert "NodeResourcesBalancedAllocation" in plugin_scores(v1_28, empty, np.array([A]))
    assert "NodeResourcesBalancedAllocation" not in plugin_scores(v1_36, empty, np.array([A]))
    assert default_plugin_scores(v1_36, empty, np.array([A])).tolist() == [97 + SAME_EVERYWHERE]


def test_extender_scores_count_weight_times_ten() -> None:
    # prioritizeNodes: score * weight * (MaxNodeScore 100 / MaxExtenderPriority 10)
    assert extender_contribution(np.array([0, 7, 10]), 5).tolist() == [0, 350, 500]


def test_cheapest_reference_takes_the_fewest_true_watts_where_the_scheduler_spreads() -> None:
    # Linear curves, so a pod's increase is (max - idle) x demand / cores, by hand:
    #   a: 4 CPU, 100 -> 300 W: 1 CPU adds 50 W;  b: 8 CPU, 100 -> 260 W: 1 CPU adds 20 W;
    #   c: 2 CPU, 100 -> 140 W: 1 CPU adds 20 W (tie with b: the lower index, b, wins).
    ledger = tiny_ledger()

    def true_power_w(util: np.ndarray) -> np.ndarray:
        return 100.0 + np.array([200.0, 160.0, 40.0]) * util

    cheapest = CheapestPolicy(true_power_w, np.array([4.0, 8.0, 2.0]))
    pod = PodRequest(1000, 1 * GIB)
    ledger.add(B, PodRequest(5000, 1 * GIB))  # b busy: kube-scheduler's spreading prefers a
    assert default_schedule(ledger, pod, np.random.default_rng(0)) == A
    decision = cheapest.place("pod-1", pod, ledger, 0.0)
    assert (decision.node, decision.predicted_increase_w) == (B, pytest.approx(20.0))
    ledger.add(B, pod)  # bound, as the engine does
    ledger.add(B, PodRequest(2000, 0))  # b full (8 of 8 CPU): c adds the same 20 W
    decision = cheapest.place("pod-2", pod, ledger, 0.0)
    assert (decision.node, decision.predicted_increase_w) == (C, pytest.approx(20.0))
    assert cheapest.place("pod-3", PodRequest(5000, 0), ledger, 0.0).node is None


def one_node_cluster(curve_share: np.ndarray, max_power_w: float, cores: float) -> SimCluster:
    return sim_cluster([curve_share], [max_power_w], [cores])


def one_pod_trace(cpu_m: int, duration_s: float) -> Trace:
    return Trace(
        names=["pod-1"],
        arrival_s=np.zeros(1),
        cpu_m=np.array([cpu_m]),
        memory_bytes=np.zeros(1, dtype=np.int64),
        duration_s=np.array([duration_s]),
        usage_ratio=np.ones(1),
    )


def pods_trace(
    names: list[str], arrival_s: list[float], cpu_m: list[int], duration_s: list[float]
) -> Trace:
    """Pods that use what they request, no memory, arriving as given."""
    n = len(names)
    return Trace(
        names=names,
        arrival_s=np.asarray(arrival_s, dtype=float),
        cpu_m=np.asarray(cpu_m),
        memory_bytes=np.zeros(n, dtype=np.int64),
        duration_s=np.asarray(duration_s, dtype=float),
        usage_ratio=np.ones(n),
    )


def test_energy_of_a_constant_power_node_is_power_times_time() -> None:
    # A flat curve: 250 W at any load, for the one hour the run lasts -> 0.25 kWh.
    cluster = one_node_cluster(np.ones(11), 250.0, 4.0)
    settings = SimSettings(tick_s=5.0, tail_s=3600.0)
    result = simulate(
        cluster, one_pod_trace(1000, 600.0), DefaultPolicy(np.random.default_rng()), settings
    )
    assert result.duration_s == pytest.approx(3600.0)
    assert result.energy_kwh == pytest.approx(0.25, rel=1e-9)
    assert result.mean_power_w == pytest.approx(250.0)
    assert result.placed_pods == 1 and result.unplaced_pods == 0


def test_energy_follows_load_on_a_linear_curve() -> None:
    # 100 W idle, 200 W at full load, linear. A pod using 2 of 4 cores for 1800 s of a 3600 s
    # run: 150 W for 1800 s + 100 W for 1800 s = 450 kJ = 0.125 kWh.
    cluster = one_node_cluster(np.linspace(0.5, 1.0, 11), 200.0, 4.0)
    settings = SimSettings(tick_s=5.0, tail_s=3600.0)
    result = simulate(
        cluster, one_pod_trace(2000, 1800.0), DefaultPolicy(np.random.default_rng()), settings
    )
    assert result.energy_kwh == pytest.approx(0.125, rel=1e-9)
    # Idle is 100 W for the hour (0.1 kWh); the pod added 50 W for half an hour.
    assert result.dynamic_energy_kwh == pytest.approx(0.025, rel=1e-9)
    assert result.peak_power_w == pytest.approx(150.0)
    assert result.mean_slowdown == pytest.approx(1.0)


def test_energy_above_the_convex_envelope_is_the_price_of_a_concave_curve() -> None:
    # 100 W idle, 180 W at 10 % load, then linear to 200 W at 100 %: concave, so the envelope
    # is the chord 100 -> 200 W. A pod using 2 of 4 cores for 1800 s runs at u = 0.5: the curve
    # gives 180 + 20 x 0.4 / 0.9 W, the chord 150 W; idle, curve and chord agree.
    concave = [0.5] + [0.9 + 0.1 * (k / 10 - 0.1) / 0.9 for k in range(1, 11)]
    settings = SimSettings(tick_s=5.0, tail_s=3600.0)
    trace = one_pod_trace(2000, 1800.0)
    result = simulate(
        one_node_cluster(np.array(concave), 200.0, 4.0),
        trace,
        DefaultPolicy(np.random.default_rng()),
        settings,
    )
    above_w = 180.0 + 20.0 * 0.4 / 0.9 - 150.0
    assert result.above_envelope_energy_kwh == pytest.approx(above_w * 1800.0 / 3.6e6, rel=1e-6)
    linear = simulate(
        one_node_cluster(np.linspace(0.5, 1.0, 11), 200.0, 4.0),
        trace,
        DefaultPolicy(np.random.default_rng()),
        settings,
    )
    assert linear.above_envelope_energy_kwh == pytest.approx(0.0, abs=1e-9)
    assert result.fan_energy_kwh == linear.fan_energy_kwh == 0.0


def test_fan_energy_is_what_fans_add_to_the_total() -> None:
    # Hot CPUs (idle 40 C above a ~22 C inlet, +30 C at full load) with 0.5 W per degree
    # above 50 C: the run with fans uses exactly its fan energy more than the run without.
    cool = one_node_cluster(np.linspace(0.5, 1.0, 11), 200.0, 4.0)
    hot_spec = dataclasses.replace(
        cool.spec, idle_rise_c=np.array([40.0]), load_rise_c=np.array([30.0])
    )
    hot = dataclasses.replace(cool, spec=hot_spec)
    fans = dataclasses.replace(hot, spec=dataclasses.replace(hot_spec, fan_w_per_c=np.array([0.5])))
    trace = one_pod_trace(3000, 1800.0)
    without = simulate(hot, trace, DefaultPolicy(np.random.default_rng()), SimSettings())
    with_fans = simulate(fans, trace, DefaultPolicy(np.random.default_rng()), SimSettings())
    assert without.fan_energy_kwh == 0.0
    assert with_fans.fan_energy_kwh > 0.005  # >= ~12 C over the threshold for the whole run
    assert with_fans.energy_kwh - without.energy_kwh == pytest.approx(
        with_fans.fan_energy_kwh, rel=1e-9
    )


def test_an_empty_node_sleeps_only_when_allowed() -> None:
    # 200 W while the 600 s pod runs; then the node is empty for 3000 s: idle 100 W by default,
    # 10 W with empty_node_power_w=10.
    cluster = one_node_cluster(np.linspace(0.5, 1.0, 11), 200.0, 1.0)
    trace = one_pod_trace(1000, 600.0)
    always_on = simulate(cluster, trace, DefaultPolicy(np.random.default_rng()), SimSettings())
    sleeping = simulate(
        cluster,
        trace,
        DefaultPolicy(np.random.default_rng()),
        SimSettings(empty_node_power_w=10.0),
    )
    assert always_on.energy_kwh == pytest.approx((200 * 600 + 100 * 3000) / 3.6e6)
    assert sleeping.energy_kwh == pytest.approx((200 * 600 + 10 * 3000) / 3.6e6)


def test_overcommitted_node_slows_its_pods() -> None:
    # Two pods each requesting 2 of 4 cores but using twice that: 8 cores wanted on 4 -> every
    # pod runs at half speed and 600 s of work takes 1200 s.
    cluster = one_node_cluster(np.ones(11), 100.0, 4.0)
    trace = dataclasses.replace(
        one_pod_trace(2000, 600.0),
        names=["p1", "p2"],
        arrival_s=np.zeros(2),
        cpu_m=np.array([2000, 2000]),
        memory_bytes=np.zeros(2, dtype=np.int64),
        duration_s=np.array([600.0, 600.0]),
        usage_ratio=np.array([2.0, 2.0]),
    )
    result = simulate(cluster, trace, DefaultPolicy(np.random.default_rng()), SimSettings())
    assert result.mean_slowdown == pytest.approx(2.0)
    assert result.overcommitted_node_hours == pytest.approx(1200.0 / 3600.0)


def test_a_pod_that_found_no_room_waits_for_an_event_and_goes_before_later_arrivals() -> None:
    # One 4-core node. p1 takes it for 600 s (it ends with the tick ending at 600 s); p2 arrives
    # at 10 s and finds no room; p3 arrives at 602 s. kube-scheduler's queue: p2 waits in the
    # unschedulable pool, is flushed back after 5 minutes with no event (310 s: still no room),
    # and is tried when p1 ends (600 s), before p3, which arrived later and must wait in turn.
    cluster = one_node_cluster(np.ones(11), 100.0, 4.0)
    trace = pods_trace(["p1", "p2", "p3"], [0.0, 10.0, 602.0], [4000] * 3, [600.0] * 3)
    result = simulate(cluster, trace, DefaultPolicy(np.random.default_rng()), SimSettings())
    tries = [(d.pod, d.time_s, d.node, d.attempt) for d in result.decisions]
    assert [t for t in tries if t[0] == "p2"] == [
        ("p2", 10.0, "", 1),
        ("p2", 310.0, "", 2),
        ("p2", 600.0, "node-01", 3),
    ]
    # p3 finds p2 there: flushed back at 902 s, placed when p2 ends (1200 s).
    assert [t for t in tries if t[0] == "p3"] == [
        ("p3", 602.0, "", 1),
        ("p3", 902.0, "", 2),
        ("p3", 1200.0, "node-01", 3),
    ]
    assert result.placed_pods == 3 and result.unplaced_pods == 0


def test_a_pod_held_on_purpose_is_tried_when_the_policy_says_not_on_events() -> None:
    # A policy that holds "held" until 100 s (as a carbon deferral does) while "busy" pods end
    # every tick around it: the held pod is tried at 0 and 100 s only, then placed.
    class HoldUntil100(DefaultPolicy):
        def place(self, uid: str, pod: PodRequest, ledger: NodeLedger, now_s: float) -> Decision:
            if uid == "held" and now_s < 100.0:
                return Decision(None, reason="held", retry_at_s=100.0)
            return super().place(uid, pod, ledger, now_s)

    cluster = one_node_cluster(np.ones(11), 100.0, 4.0)
    n_busy = 20
    trace = pods_trace(
        ["held", *[f"busy-{i}" for i in range(n_busy)]],
        [0.0, *(5.0 * i for i in range(n_busy))],
        [1000] * (n_busy + 1),
        [5.0] * (n_busy + 1),
    )
    result = simulate(cluster, trace, HoldUntil100(np.random.default_rng()), SimSettings())
    held = [(d.time_s, d.node) for d in result.decisions if d.pod == "held"]
    assert held == [(0.0, ""), (100.0, "node-01")]


def test_a_pod_gives_up_after_its_patience_and_counts_as_unplaced() -> None:
    cluster = one_node_cluster(np.ones(11), 100.0, 4.0)
    trace = pods_trace(["long", "late"], [0.0, 10.0], [4000, 4000], [3000.0, 60.0])
    result = simulate(
        cluster, trace, DefaultPolicy(np.random.default_rng()), SimSettings(max_pending_s=600.0)
    )
    late = [d.time_s for d in result.decisions if d.pod == "late"]
    # Its arrival, then the 5-minute flushes; the second is the last moment of its patience.
    assert late == [10.0, 310.0, 610.0]
    assert result.placed_pods == 1 and result.unplaced_pods == 1


def blocked_then_freed_trace() -> Trace:
    # p1 takes all 4 cores of the efficient node a for 600 s; p2 (2 cores, 3000 s) arrives at
    # 10 s, finds a full and goes to b, the inefficient node.
    return pods_trace(["p1", "p2"], [0.0, 10.0], [4000, 2000], [600.0, 3000.0])


def test_rescheduling_moves_a_pod_to_the_efficient_node_once_it_has_room() -> None:
    # Linear curves, 100 W idle each: a adds 20 W per busy core (180 W at 4 cores), b 50 W
    # (300 W). Rounds every 60 s = every 12th tick of 5 s. p1 leaves a in the tick ending at
    # 600 s; the round at 600 s moves p2 from b to a. By hand, p2 then draws 40 W instead of
    # 100 W for the rest of its work: ticks 120..601, 2410 s -> 60 W x 2410 s less.
    cluster = sim_cluster(
        [np.linspace(100 / 180, 1.0, 11), np.linspace(100 / 300, 1.0, 11)],
        [180.0, 300.0],
        [4.0, 4.0],
    )

    def true_power_w(util: np.ndarray) -> np.ndarray:
        return 100.0 + np.array([80.0, 200.0]) * util

    settings = SimSettings(tick_s=5.0, tail_s=3600.0)
    trace = blocked_then_freed_trace()
    stays = simulate(cluster, trace, CheapestPolicy(true_power_w, cluster.cores), settings)
    moves = simulate(
        cluster, trace, ReschedulingPolicy(true_power_w, cluster.cores, 60.0), settings
    )
    assert [d.node for d in stays.decisions] == ["node-01", "node-02"]
    assert stays.moved_pods == 0
    assert moves.moved_pods == 1
    moved = moves.decisions[-1]
    assert (moved.pod, moved.node, moved.note) == ("p2", "node-01", "moved from node-02")
    # Not earlier: while p1 ran, a had no room for p2's requests.
    assert moved.time_s == pytest.approx(600.0)
    assert stays.energy_kwh - moves.energy_kwh == pytest.approx(60.0 * 2410.0 / 3.6e6)
    # A move is free: the pod's work is done as fast as it would have been.
    assert moves.mean_slowdown == pytest.approx(1.0)
    assert moves.placed_pods == stays.placed_pods == 2


def test_rescheduling_leaves_the_scheduler_ledger_to_the_engine() -> None:
    ledger = NodeLedger(np.array([4000, 4000]), np.array([8 * GIB, 8 * GIB]))
    pod = PodRequest(2000, 0)
    ledger.add(1, pod)
    before = (ledger.requested_cpu_m.copy(), ledger.pod_count.copy())
    policy = ReschedulingPolicy(
        lambda util: 100.0 + np.array([80.0, 200.0]) * util, np.array([4.0, 4.0]), 60.0
    )
    assert policy.reschedule(np.array([1]), np.array([2.0]), [pod], ledger) == [(0, 0)]
    assert np.array_equal(ledger.requested_cpu_m, before[0])
    assert np.array_equal(ledger.pod_count, before[1])
    with pytest.raises(ValueError, match="interval must be positive"):
        ReschedulingPolicy(policy.true_power_w, policy.node_cores, 0.0)


def test_cli_runs_the_rescheduling_reference_and_reports_moves(tmp_path: Path) -> None:
    trace_csv = tmp_path / "trace.csv"
    # 9 pods of 8 cores at once fill 72 of the 3 nodes' 76 cores; every other one leaves
    # after 300 s, and the long ones left behind on costlier nodes have somewhere to move.
    trace_csv.write_text(
        "arrival_s,cpu_request,duration_s\n"
        + "".join(f"0,8,{300 if i % 2 else 3000}\n" for i in range(9))
    )
    summary_json = tmp_path / "summary.json"
    args = ["--trace", str(trace_csv), "--nodes", "3", "--quiet", "--out-dir", str(tmp_path)]
    code = main([*args, "--policies", "cheapest,rescheduling", "--json", str(summary_json)])
    assert code == 0
    policies = json.loads(summary_json.read_text())["policies"]
    assert policies["cheapest"]["moved_pods"] == 0
    # The count in the summary is the moves the decisions CSV records, one row each.
    with (tmp_path / "energy_sim_decisions.csv").open(newline="") as handle:
        moved_rows = [
            row
            for row in csv.DictReader(handle)
            if row["policy"] == "rescheduling" and row["note"].startswith("moved from ")
        ]
    assert policies["rescheduling"]["moved_pods"] == len(moved_rows) > 0
    assert all(row["node"] != row["note"].removeprefix("moved from ") for row in moved_rows)
    assert policies["rescheduling"]["placed_pods"] == 9
    assert main([*args, "--policies", "rescheduling", "--reschedule-every", "0"]) == 2


def test_trace_csv_loads_sorted_with_quantities(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(
        "name,arrival_s,cpu_request,duration_s,memory_mib\nlate,30,500m,60,256\nearly,0,2,120,\n"
    )
    trace = load_trace_csv(path)
    assert trace.names == ["early", "late"]
    assert trace.cpu_m.tolist() == [2000, 500]
    assert trace.memory_bytes.tolist() == [0, 256 * 1024 * 1024]
    assert trace.usage_ratio.tolist() == [1.0, 1.0]


def test_trace_csv_bad_row_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,cpu_request,duration_s\n0,1,60\n5,0.5,30\n10,lots,60\n")
    with pytest.raises(TraceError) as caught:
        load_trace_csv(path)
    message = str(caught.value)
    assert str(path) in message
    assert "line 4" in message
    assert "cpu_request" in message and "'lots'" in message

    path.write_text("arrival_s,cpu_request,duration_s\n0,1,-5\n")
    with pytest.raises(TraceError, match=r"line 2, field duration_s"):
        load_trace_csv(path)
    path.write_text("arrival_s,cpu_request\n0,1\n")
    with pytest.raises(TraceError, match=r"line 1: missing column\(s\) duration_s"):
        load_trace_csv(path)


def test_cli_bad_trace_exits_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,cpu_request,duration_s\nsoon,1,60\n")
    assert (
        main(["--trace", str(path), "--policies", "default", "--quiet", "--out-dir", str(tmp_path)])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "line 2, field arrival_s" in err


def test_generated_trace_requests_the_target_load() -> None:
    trace = generate_trace(total_cpu_cores=200.0, hours=48.0, load=0.45, seed=3)
    # Little's law: requested CPU-seconds over the span / (capacity x span) ~ load.
    cpu_seconds = float(np.sum(trace.cpu_m / 1000.0 * trace.duration_s))
    assert cpu_seconds / (200.0 * 48 * 3600.0) == pytest.approx(0.45, rel=0.15)
    assert np.all(np.diff(trace.arrival_s) >= 0)


def test_power_aware_policy_through_a_real_server_places_every_pod() -> None:
    # The shipped default bundle was fitted on training.synth's 12-node fleet, seed 7: the same
    # nodes build_cluster(12, 7) simulates.
    cluster = build_cluster(12, 7, battery_share=0.25)
    trace = generate_trace(float(cluster.cores.sum()), hours=0.25, load=0.3, seed=1)
    settings = BenchSettings(nodes=12, seed=7)
    sim_settings = SimSettings(tail_s=600.0)
    with extender_policy("power-aware+battery", cluster, DEFAULT_BUNDLE_DIR, settings) as policy:
        result = simulate(cluster, trace, policy, sim_settings)
        requests = policy.requests
    assert len(trace) > 5
    assert result.placed_pods == len(trace)
    assert result.unplaced_pods == 0
    # filter, then prioritize (or not, with one feasible node), then explain, per pod
    assert requests >= 2 * len(trace)
    increases = [d.predicted_increase_w for d in result.decisions]
    assert all(math.isfinite(w) and w >= 0 for w in increases)
    assert {d.node for d in result.decisions} <= set(cluster.names)


CONTRACT_KEYS = {
    "energy_kwh",
    "unplaced_pods",
    "pod_wait_s",
    "power_cycles_per_node_day",
    "co2_kg",
    "delay_violations",
    "failed_pod_starts",
}


def test_summary_reports_contract_5_for_every_policy_and_the_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_csv = tmp_path / "trace.csv"
    # Two 3-node cluster's worth of 20-core pods at once: the second wave waits for the first.
    trace_csv.write_text(
        "arrival_s,cpu_request,duration_s\n" + "".join("0,20,600\n" for _ in range(6))
    )
    summary_json = tmp_path / "summary.json"
    args = ["--trace", str(trace_csv), "--nodes", "3", "--quiet", "--out-dir", str(tmp_path)]
    assert main([*args, "--policies", "default,cheapest", "--json", str(summary_json)]) == 0
    report = json.loads(summary_json.read_text())
    assert report["settings"]["preset"] == "default" and report["settings"]["seed"] == 7
    # The default scheduler is kube-scheduler v1.36's unless --kube-version says otherwise.
    assert report["settings"]["kube_version"] == "1.36"
    assert "default (kube-scheduler v1.36) " in capsys.readouterr().out
    older_json = tmp_path / "v1.28.json"
    older = [*args, "--policies", "default", "--kube-version", "1.28", "--json", str(older_json)]
    assert main(older) == 0
    assert json.loads(older_json.read_text())["settings"]["kube_version"] == "1.28"
    assert "default (kube-scheduler v1.28) " in capsys.readouterr().out
    for entry in report["policies"].values():
        assert set(entry) >= CONTRACT_KEYS
        assert set(entry["pod_wait_s"]) == {"p50", "p99", "max"}
        assert entry["co2_kg"] == entry["delay_violations"] == entry["failed_pod_starts"] == 0
    waits = report["policies"]["default"]["pod_wait_s"]
    placed = report["policies"]["default"]["placed_pods"]
    with (tmp_path / "energy_sim_decisions.csv").open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["policy"] == "default" and r["node"]]
    # Each placed pod's wait is its placement time (all arrived at 0), as the CSV records it.
    times = sorted(float(r["time_s"]) for r in rows)
    assert len(times) == placed and times[0] == 0.0
    assert waits["max"] == pytest.approx(times[-1]) and waits["max"] >= 600.0
    assert waits["p50"] == pytest.approx(float(np.percentile(times, 50)), abs=1e-3)


def test_preset_settings_yield_to_flags_given(tmp_path: Path) -> None:
    from bench.energy_sim import build_parser, settings_from_args
    from bench.sim.scenario import PRESETS, Preset

    PRESETS["test-small"] = Preset(
        "test-small", "a test preset", ("default",), {"nodes": 4, "tick_s": 10.0}
    )
    try:
        settings, sim = settings_from_args(build_parser().parse_args(["--preset", "test-small"]))
        assert (settings.nodes, sim.tick_s, settings.preset) == (4, 10.0, "test-small")
        settings, sim = settings_from_args(
            build_parser().parse_args(
                ["--preset", "test-small", "--nodes", "6", "--tail-hours", "0.5"]
            )
        )
        assert (settings.nodes, sim.tick_s, sim.tail_s) == (6, 10.0, 1800.0)
    finally:
        del PRESETS["test-small"]


def test_a_policys_random_stream_follows_its_seed_and_name_not_the_registry() -> None:
    from types import SimpleNamespace

    from bench.sim.runner import POLICIES, PolicySpec, policy_rng, register_policy

    scenario = SimpleNamespace(settings=SimpleNamespace(seed=7))
    before = policy_rng(scenario, "default").random(4)
    register_policy(PolicySpec("test-inserted-policy", "a policy added later", lambda s, r: None))
    try:
        assert np.array_equal(policy_rng(scenario, "default").random(4), before)
    finally:
        del POLICIES["test-inserted-policy"]
    assert not np.array_equal(policy_rng(scenario, "random").random(4), before)
    other_seed = SimpleNamespace(settings=SimpleNamespace(seed=8))
    assert not np.array_equal(policy_rng(other_seed, "default").random(4), before)
