"""The node power policy on hand-built snapshots: what it powers off, drains and wakes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controllers.node_power.policy import (
    ArrivalRate,
    ArrivalRateMeter,
    NodeView,
    PendingPod,
    PodInfo,
    PolicySettings,
    decide,
    headroom_cores,
    off_headroom_cores,
)
from livedata.carbon import AVERAGE, IntensityPoint, IntensityReading
from livedata.carbon_source import CarbonSnapshot, build_snapshot, node_g_per_kwh
from livedata.labels import POWER_DRAINING, POWER_OFF, POWER_ON, POWER_WAKING

GIB = 1024**3
NOW_S = 100_000.0
SETTINGS = PolicySettings(unneeded_time_s=600.0, cooldown_s=1800.0, min_on_nodes=1)


def node(name: str, cores: float = 16, idle_w: float = 100.0, state: str = POWER_ON, pods=(), **kw):
    return NodeView(
        name,
        cores,
        64 * GIB,
        state,
        kw.pop("since_s", 0.0),
        kw.pop("managed", True),
        idle_w,
        tuple(pods),
        **kw,
    )


def pod(cores: float, name: str = "p", **kw) -> PodInfo:
    return PodInfo(name, cores, **kw)


def long_unneeded(*names: str) -> dict[str, float]:
    return dict.fromkeys(names, NOW_S - 1000.0)


def test_empty_nodes_go_off_worst_idle_watts_per_core_first_down_to_the_floor() -> None:
    nodes = [
        node("busy", pods=[pod(12)]),
        node("a", idle_w=80),  # 5 W/core
        node("b", idle_w=160),  # 10 W/core: worst
        node("c", cores=8, idle_w=60),  # 7.5 W/core
    ]
    settings = PolicySettings(min_on_nodes=2)
    decisions = decide(nodes, [], 0.0, long_unneeded("a", "b", "c"), NOW_S, settings)
    assert [a.node for a in decisions.power_off] == ["b", "c"]  # then the floor of 2 holds
    assert decisions.power_off[0].watts == 160.0 and "empty" in decisions.power_off[0].reason
    assert not decisions.drain and not decisions.wake


def test_nodes_go_off_only_after_the_unneeded_time_and_the_cooldown() -> None:
    nodes = [node("busy", pods=[pod(12)]), node("fresh"), node("rebooted", since_s=NOW_S - 60)]
    first = decide(nodes, [], 0.0, {}, NOW_S, SETTINGS)
    assert not first.power_off
    assert set(first.unneeded_since) == {"fresh", "rebooted"}
    later = decide(nodes, [], 0.0, first.unneeded_since, NOW_S + 600, SETTINGS)
    assert [a.node for a in later.power_off] == ["fresh"]  # rebooted: still cooling down


def test_headroom_for_the_arrival_rate_keeps_nodes_on() -> None:
    nodes = [node("busy", pods=[pod(14)]), node("a"), node("b")]
    # 0.01 cores/s for a 300 s boot: keep 3 free cores; busy has only 2 free.
    assert headroom_cores(0.01, SETTINGS) == pytest.approx(3.0)
    decisions = decide(nodes, [], 0.01, long_unneeded("a", "b"), NOW_S, SETTINGS)
    assert len(decisions.power_off) == 1  # one of a, b stays on for the headroom


def test_a_lightly_used_node_is_drained_when_its_pods_fit_elsewhere() -> None:
    nodes = [
        node("keep", idle_w=50, pods=[pod(8)]),
        node("light", idle_w=200, pods=[pod(2, "x"), pod(1, "ds", daemon=True)]),
    ]
    decisions = decide(nodes, [], 0.0, long_unneeded("light"), NOW_S, SETTINGS)
    assert [a.node for a in decisions.drain] == ["light"]
    assert "fit elsewhere" in decisions.drain[0].reason
    blocked = [node("keep", pods=[pod(8)]), node("light", pods=[pod(2, eviction_blocker="PDB")])]
    assert not decide(blocked, [], 0.0, long_unneeded("light"), NOW_S, SETTINGS).drain


def test_pending_pods_wake_only_the_nodes_their_demand_needs_cheapest_first() -> None:
    nodes = [
        node("full", pods=[pod(16)]),
        node("off-dear", idle_w=300, state=POWER_OFF),
        node("off-cheap", idle_w=90, state=POWER_OFF),
        node("off-cheap-2", idle_w=95, state=POWER_OFF),
        node("off-unmanaged", idle_w=10, state=POWER_OFF, managed=False),
    ]
    one = decide(nodes, [PendingPod("p1", 4), PendingPod("p2", 8)], 0.0, {}, NOW_S, SETTINGS)
    assert [a.node for a in one.wake] == ["off-cheap"]
    two = decide(nodes, [PendingPod(f"p{i}", 10) for i in range(2)], 0.0, {}, NOW_S, SETTINGS)
    assert [a.node for a in two.wake] == ["off-cheap", "off-cheap-2"]
    assert not one.power_off and not two.power_off


def test_a_drain_is_cancelled_before_any_node_is_woken() -> None:
    nodes = [
        node("full", pods=[pod(16)]),
        node("draining", state=POWER_DRAINING, pods=[pod(2)]),
        node("off", state=POWER_OFF),
    ]
    decisions = decide(nodes, [PendingPod("p", 4)], 0.0, {}, NOW_S, SETTINGS)
    assert [a.node for a in decisions.cancel_drain] == ["draining"]
    assert not decisions.wake


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="max_off_fraction"):
        PolicySettings(max_off_fraction=1.5)
    with pytest.raises(ValueError, match="unneeded_time_s"):
        PolicySettings(unneeded_time_s=-1)
    assert math.isnan(node("x", idle_w=math.nan).idle_w_per_core)


def test_pods_that_fit_on_a_node_on_or_waking_wake_nothing() -> None:
    nodes = [
        node("roomy", pods=[pod(8)]),  # 8 cores free
        node("booting", state=POWER_WAKING, since_s=NOW_S - 60),  # 16 free once up
        node("off", state=POWER_OFF),
    ]
    # 6 cores fit on roomy, 12 on the waking node: no second boot for the same demand.
    pending = [PendingPod("a", 6), PendingPod("b", 12)]
    decisions = decide(nodes, pending, 0.0, {}, NOW_S, SETTINGS)
    assert decisions.empty
    # One more 12-core pod fits nowhere that is on or waking: the off node wakes.
    more = decide(nodes, [*pending, PendingPod("c", 12)], 0.0, {}, NOW_S, SETTINGS)
    assert [a.node for a in more.wake] == ["off"]


def test_the_node_woken_is_the_cheapest_for_the_pods_waiting_not_per_idle_core() -> None:
    curve = tuple(100.0 + 10.0 * i for i in range(11))  # 100 W idle, 200 W full
    nodes = [
        node("full", cores=4, pods=[pod(4)]),
        # 64 cores at 200 W idle: 3.1 W per core, but 200 W for a 1-core pod.
        node("big", cores=64, idle_w=200, state=POWER_OFF),
        # 8 cores at 60 W idle: 7.5 W per core, and 60 W for the same pod.
        node("small", cores=8, idle_w=60, state=POWER_OFF),
        node("curved", cores=16, idle_w=100, state=POWER_OFF, curve_w=curve),
    ]
    one = decide(nodes, [PendingPod("p", 1)], 0.0, {}, NOW_S, SETTINGS)
    assert [a.node for a in one.wake] == ["small"]
    assert one.wake[0].watts == pytest.approx(60.0)
    # 40 cores of pods: the big node takes them all at 200 W; any mix of the others costs more.
    many = [PendingPod(f"p{i}", 2) for i in range(20)]
    assert [a.node for a in decide(nodes, many, 0.0, {}, NOW_S, SETTINGS).wake] == ["big"]


def test_boot_energy_counts_when_choosing_the_node_to_wake() -> None:
    nodes = [
        node("full", pods=[pod(16)]),
        node("slow-boot", idle_w=90, state=POWER_OFF, boot_energy_j=3600.0 * 50),  # +50 W
        node("quick-boot", idle_w=100, state=POWER_OFF, boot_energy_j=3600.0 * 5),  # +5 W
    ]
    decisions = decide(nodes, [PendingPod("p", 4)], 0.0, {}, NOW_S, SETTINGS)
    assert [a.node for a in decisions.wake] == ["quick-boot"]
    assert decisions.wake[0].watts == pytest.approx(105.0)
    assert "boot 5 W" in decisions.wake[0].reason


def test_no_woken_node_is_spare_even_when_the_greedy_pick_started_small() -> None:
    nodes = [
        node("full", pods=[pod(16)]),
        node("a", cores=8, idle_w=40, state=POWER_OFF),  # one 6-core pod: 6.7 W per core
        node("b", cores=16, idle_w=90, state=POWER_OFF),  # both: 7.5 W per core
    ]
    decisions = decide(nodes, [PendingPod("x", 6), PendingPod("y", 6)], 0.0, {}, NOW_S, SETTINGS)
    # Greedy takes a for x, then needs b for y; b alone takes both, so a is dropped.
    assert [a.node for a in decisions.wake] == ["b"]
    assert "2 pending pod(s)" in decisions.wake[0].reason


def test_a_pod_too_big_for_every_node_wakes_nothing_and_is_named() -> None:
    nodes = [node("full", pods=[pod(16)]), node("off", state=POWER_OFF)]
    decisions = decide(nodes, [PendingPod("huge", 40)], 0.0, {}, NOW_S, SETTINGS)
    assert not decisions.wake and decisions.unplaceable == ("huge",)
    too_much_memory = [PendingPod("fat", 1, memory_bytes=100 * GIB)]
    assert decide(nodes, too_much_memory, 0.0, {}, NOW_S, SETTINGS).unplaceable == ("fat",)


def test_memory_decides_which_node_can_take_a_waiting_pod() -> None:
    nodes = [
        node("full", pods=[pod(16)]),
        NodeView("small-memory", 16, 8 * GIB, POWER_OFF, 0.0, True, 50.0),
        NodeView("large-memory", 16, 128 * GIB, POWER_OFF, 0.0, True, 120.0),
    ]
    decisions = decide(nodes, [PendingPod("p", 2, 32 * GIB)], 0.0, {}, NOW_S, SETTINGS)
    assert [a.node for a in decisions.wake] == ["large-memory"]


def test_a_node_at_its_pod_limit_takes_no_more_pods_whatever_its_free_cpu() -> None:
    # "roomy" has 12 cores free but admits 4 pods (status.allocatable.pods) and runs 4,
    # its DaemonSet pod counted: the waiting pod wakes a node, as kube-scheduler would need.
    at_limit = [pod(1, "a"), pod(1, "b"), pod(1, "c"), pod(1, "ds", daemon=True)]
    nodes = [node("roomy", pods=at_limit, allocatable_pods=4), node("off", state=POWER_OFF)]
    decisions = decide(nodes, [PendingPod("p", 1)], 0.0, {}, NOW_S, SETTINGS)
    assert [a.node for a in decisions.wake] == ["off"]
    # Without a known limit the same node takes it and nothing wakes.
    unlimited = [replace(nodes[0], allocatable_pods=None), nodes[1]]
    assert not decide(unlimited, [PendingPod("p", 1)], 0.0, {}, NOW_S, SETTINGS).wake


def test_a_node_is_not_drained_when_the_others_have_no_pod_slots_for_its_pods() -> None:
    light = node("light", idle_w=200, pods=[pod(1, "x"), pod(1, "y")])
    keep = node("keep", idle_w=50, pods=[pod(4, "k")], allocatable_pods=2)
    assert not decide([keep, light], [], 0.0, long_unneeded("light"), NOW_S, SETTINGS).drain
    roomier = replace(keep, allocatable_pods=3)  # room for both of light's pods
    drained = decide([roomier, light], [], 0.0, long_unneeded("light"), NOW_S, SETTINGS).drain
    assert [a.node for a in drained] == ["light"]


def test_only_the_drains_the_demand_needs_are_cancelled() -> None:
    nodes = [
        node("full", pods=[pod(16)]),
        node("draining-1", state=POWER_DRAINING, pods=[pod(2)]),
        node("draining-2", state=POWER_DRAINING, pods=[pod(2)]),
    ]
    decisions = decide(nodes, [PendingPod("p", 4)], 0.0, {}, NOW_S, SETTINGS)
    assert len(decisions.cancel_drain) == 1 and not decisions.wake


def test_headroom_wakes_the_cheapest_idle_watts_per_free_core() -> None:
    nodes = [
        node("busy", pods=[pod(15)]),  # 1 core free
        node("dear", cores=16, idle_w=200, state=POWER_OFF),  # 12.5 W per core
        node("cheap", cores=32, idle_w=160, state=POWER_OFF),  # 5 W per core
    ]
    # 0.02 cores/s over a 300 s boot: 6 cores of headroom wanted, 1 free.
    decisions = decide(nodes, [], 0.02, {}, NOW_S, SETTINGS)
    assert [a.node for a in decisions.wake] == ["cheap"]
    assert "headroom" in decisions.wake[0].reason
    # With enough room on, nothing wakes.
    assert decide(nodes, [], 0.002, {}, NOW_S, SETTINGS).empty


def test_drains_go_one_node_per_round_empty_nodes_all_at_once() -> None:
    nodes = [
        node("keep", cores=64, idle_w=100, pods=[pod(40)]),
        node("light-1", idle_w=300, pods=[pod(2, "x")]),
        node("light-2", idle_w=290, pods=[pod(2, "y")]),
        node("empty-1", idle_w=280),
        node("empty-2", idle_w=270),
    ]
    unneeded = long_unneeded("light-1", "light-2", "empty-1", "empty-2")
    decisions = decide(nodes, [], 0.0, unneeded, NOW_S, SETTINGS)
    assert [a.node for a in decisions.drain] == ["light-1"]
    assert [a.node for a in decisions.power_off] == ["empty-1", "empty-2"]
    two = PolicySettings(max_drains_per_round=2)
    assert len(decide(nodes, [], 0.0, unneeded, NOW_S, two).drain) == 2


def test_arrival_rate_is_the_highest_of_its_windows_and_forgets_old_arrivals() -> None:
    meter = ArrivalRateMeter(windows_s=(60.0, 600.0))
    for i in range(1, 61):  # one core every 10 s for ten minutes: 0.1 cores/s
        meter.add(i * 10.0, 1.0)
    assert meter.rate(600.0) == pytest.approx(0.1)
    meter.add(600.0, 30.0)  # a burst: 30 cores at once
    assert meter.rate(600.0) == pytest.approx((6 + 30) / 60.0)
    assert meter.rate(2000.0) == 0.0
    with pytest.raises(ValueError, match="windows_s"):
        ArrivalRateMeter(windows_s=(0.0,))


def test_a_node_is_unneeded_only_while_the_others_keep_the_headroom_without_it() -> None:
    nodes = [node("busy", pods=[pod(12)]), node("spare")]  # 4 + 16 cores free
    # 0.005 cores/s over a 300 s boot: 1.5 cores of headroom; busy keeps it without spare.
    calm = decide(nodes, [], 0.005, {}, NOW_S, SETTINGS)
    assert set(calm.unneeded_since) == {"spare"}
    # A burst: 0.02 cores/s wants 6 cores; without spare only 4 are free. Its clock restarts,
    # so it goes off only once the headroom has held without it for the whole unneeded time.
    burst = decide(nodes, [], 0.02, calm.unneeded_since, NOW_S + 300, SETTINGS)
    assert burst.unneeded_since == {} and not burst.power_off
    after = decide(nodes, [], 0.005, burst.unneeded_since, NOW_S + 600, SETTINGS)
    assert after.unneeded_since == {"spare": NOW_S + 600}
    assert not decide(nodes, [], 0.005, after.unneeded_since, NOW_S + 1199, SETTINGS).power_off
    assert decide(nodes, [], 0.005, after.unneeded_since, NOW_S + 1200, SETTINGS).power_off


def test_the_meter_for_a_boot_time_looks_back_one_boot_and_six() -> None:
    assert ArrivalRateMeter.for_boot_time(300.0).windows_s == (300.0, 1800.0)
    assert ArrivalRateMeter.for_boot_time(5.0).windows_s == (60.0, 360.0)


def test_a_node_goes_off_only_past_a_margin_of_arrival_noise_over_the_wake_headroom() -> None:
    """The hysteresis between waking and powering off: with none, a node goes off while the
    others keep the headroom exactly, and the next pod wakes it again."""
    nodes = [node("busy", pods=[pod(10)]), node("spare")]  # 6 + 16 cores free
    # 0.016 cores/s over a 300 s boot: 4.8 cores of headroom, which busy keeps without spare.
    # Pods of 1 core at 0.016/s: a boot time's arrivals vary by sqrt(0.016 x 300) = 2.19 cores.
    noisy = ArrivalRate(0.016, square_cores_per_s=0.016)
    assert noisy.sd_cores(300.0) == pytest.approx(math.sqrt(4.8))
    no_margin = PolicySettings(off_margin_sd=0.0)
    assert off_headroom_cores(noisy, no_margin) == pytest.approx(4.8)
    assert decide(nodes, [], noisy, long_unneeded("spare"), NOW_S, no_margin).power_off
    # Two standard deviations: 4.8 + 4.38 = 9.18 cores the others would have to keep.
    held = decide(nodes, [], noisy, long_unneeded("spare"), NOW_S, SETTINGS)
    assert held.off_headroom_cores == pytest.approx(4.8 + 2 * math.sqrt(4.8))
    assert held.headroom_cores == pytest.approx(4.8)
    assert not held.power_off and held.unneeded_since == {}  # its clock stops too
    # Nothing wakes while the free CPU is between the two: the dead band.
    assert not held.wake
    # A bare rate (no noise known) has no margin.
    assert decide(nodes, [], 0.016, long_unneeded("spare"), NOW_S, SETTINGS).power_off
    with pytest.raises(ValueError, match="off_margin_sd"):
        PolicySettings(off_margin_sd=-1.0)


def test_the_meter_measures_the_noise_of_arrivals_from_their_squared_requests() -> None:
    meter = ArrivalRateMeter(windows_s=(60.0, 600.0))
    for i in range(60):  # alternately 1 and 3 cores, every 10 s for ten minutes
        meter.add(i * 10.0 + 5.0, 1.0 if i % 2 else 3.0)
    estimate = meter.estimate(600.0)
    assert estimate.cores_per_s == pytest.approx(120 / 600)
    # Compound Poisson: the variance over t seconds is t x (sum of squared requests per second).
    assert estimate.square_cores_per_s == pytest.approx((30 * 1 + 30 * 9) / 600)
    assert estimate.sd_cores(300.0) == pytest.approx(math.sqrt(0.5 * 300))
    # Late arrivals (out of time order) count in their windows; what is older leaves.
    meter.add(590.0, 6.0)
    assert meter.estimate(600.0).cores_per_s == pytest.approx((3 * 1 + 3 * 3 + 6) / 60)
    assert meter.estimate(5000.0) == ArrivalRate(0.0, 0.0)


# ---- ranking by grams of CO2 -----------------------------------------------------------------


def test_ranking_by_grams_powers_off_the_most_grams_per_idle_core_first() -> None:
    nodes = [
        node("busy", pods=[pod(12)], g_per_kwh=300.0),
        node("efficient-dirty", idle_w=80, g_per_kwh=700.0),  # 56 g/h idle
        node("hungry-clean", idle_w=120, g_per_kwh=50.0),  # 6 g/h idle
    ]
    since = long_unneeded("efficient-dirty", "hungry-clean")
    by_watts = decide(nodes, [], 0.0, since, NOW_S, PolicySettings(min_on_nodes=2))
    assert [a.node for a in by_watts.power_off] == ["hungry-clean"]
    grams = PolicySettings(min_on_nodes=2, rank_by="grams")
    by_grams = decide(nodes, [], 0.0, since, NOW_S, grams)
    assert [a.node for a in by_grams.power_off] == ["efficient-dirty"]
    assert "700 g CO2/kWh" in by_grams.power_off[0].reason
    assert by_grams.power_off[0].watts == 80.0  # the watts it saves, not grams


def test_ranking_by_grams_wakes_the_fewest_grams_for_the_waiting_pods() -> None:
    nodes = [
        node("full", pods=[pod(16)]),
        node("efficient-dirty", idle_w=80, state=POWER_OFF, g_per_kwh=700.0),
        node("hungry-clean", idle_w=120, state=POWER_OFF, g_per_kwh=50.0),
    ]
    waiting = [PendingPod("job", 4.0)]
    by_watts = decide(nodes, waiting, 0.0, {}, NOW_S, SETTINGS)
    assert [a.node for a in by_watts.wake] == ["efficient-dirty"]
    by_grams = decide(nodes, waiting, 0.0, {}, NOW_S, replace(SETTINGS, rank_by="grams"))
    assert [a.node for a in by_grams.wake] == ["hungry-clean"]
    assert "50 g CO2/kWh" in by_grams.wake[0].reason


def test_a_node_of_unknown_intensity_ranks_as_the_mean_and_none_known_ranks_by_watts() -> None:
    nodes = [
        node("busy", cores=64, pods=[pod(8)]),
        node("clean", idle_w=100, g_per_kwh=100.0),  # 10 g/h
        node("dirty", idle_w=100, g_per_kwh=500.0),  # 50 g/h
        node("unknown", idle_w=110),  # at the mean (300 g/kWh of the known): 33 g/h
    ]
    since = long_unneeded("clean", "dirty", "unknown")
    grams = PolicySettings(rank_by="grams")
    by_grams = decide(nodes, [], 0.0, since, NOW_S, grams)
    assert [a.node for a in by_grams.power_off] == ["dirty", "unknown", "clean"]
    # No intensity known anywhere: exactly the watts ranking.
    blind = [replace(n, g_per_kwh=math.nan) for n in nodes]
    by_watts = decide(blind, [], 0.0, since, NOW_S, PolicySettings())
    assert [a.node for a in by_watts.power_off] == ["unknown", "clean", "dirty"]
    assert decide(blind, [], 0.0, since, NOW_S, grams).power_off == by_watts.power_off


def test_rank_by_is_watts_or_grams() -> None:
    with pytest.raises(ValueError, match="rank_by must be one of watts, grams"):
        PolicySettings(rank_by="euros")
    with pytest.raises(ValueError, match="carbon_horizon_s"):
        PolicySettings(carbon_horizon_s=-1.0)


def grid(now_s: float, zones: dict[str, tuple[float, float]]) -> CarbonSnapshot:
    """Each zone's intensity now and forecast for the next 4 hours: zone -> (now, ahead)."""
    return build_snapshot(
        [
            IntensityReading(
                zone,
                AVERAGE,
                "api",
                now_g,
                now_s,
                (
                    IntensityPoint(now_s, now_s + 3600, now_g),
                    IntensityPoint(now_s + 3600, now_s + 5 * 3600, ahead_g),
                ),
                now_s,
            )
            for zone, (now_g, ahead_g) in zones.items()
        ],
        [],
        published_at_s=now_s,
        max_age_s=7200.0,
        forecast_max_age_s=7200.0,
    )


def with_outlook(
    nodes: list[NodeView], zone: dict[str, str], snapshot: CarbonSnapshot, horizon_s: float
) -> list[NodeView]:
    """The views as the controller fills them: each node's outlook over `horizon_s`."""
    return [
        replace(
            n,
            g_per_kwh=node_g_per_kwh(
                snapshot, n.name, zone.get(n.name), AVERAGE, NOW_S, horizon_s=horizon_s
            ),
        )
        for n in nodes
    ]


def test_ranking_by_the_outlook_empties_the_node_about_to_enter_a_dirty_hour_first() -> None:
    nodes = [node("busy", pods=[pod(12)]), node("a", idle_w=100), node("b", idle_w=100)]
    zone = {"busy": "z-busy", "a": "z-a", "b": "z-b"}
    since = long_unneeded("a", "b")
    # Now a's zone is the cleaner (100 against 400 g/kWh), but for the next hours it is 700
    # and b's falls to 50.
    turning = grid(NOW_S, {"z-busy": (300, 300), "z-a": (100, 700), "z-b": (400, 50)})

    def first_off(snapshot: CarbonSnapshot, horizon_s: float) -> tuple[str, str]:
        settings = PolicySettings(min_on_nodes=2, rank_by="grams", carbon_horizon_s=horizon_s)
        views = with_outlook(nodes, zone, snapshot, horizon_s)
        off = decide(views, [], 0.0, since, NOW_S, settings).power_off
        return off[0].node, off[0].reason

    # The present hour alone empties b, the dirtier now.
    assert first_off(turning, 0.0)[0] == "b"
    # Over the next 4 h a's mean is (100 + 3 x 700) / 4 = 550 and b's (400 + 3 x 50) / 4 = 137.5.
    name, reason = first_off(turning, 4 * 3600.0)
    assert name == "a"
    assert "550 g CO2/kWh over the next 4 h" in reason
    # The next hours flipped: so does the choice.
    flipped = grid(NOW_S, {"z-busy": (300, 300), "z-a": (100, 50), "z-b": (400, 700)})
    assert first_off(flipped, 4 * 3600.0)[0] == "b"


def test_ranking_by_the_outlook_wakes_the_node_about_to_enter_a_clean_hour() -> None:
    nodes = [
        node("full", pods=[pod(16)]),
        node("a", idle_w=100, state=POWER_OFF),
        node("b", idle_w=100, state=POWER_OFF),
    ]
    zone = {"a": "z-a", "b": "z-b"}
    waiting = [PendingPod("job", 4.0)]
    # a is the cleaner now (100 against 400) but turns dirty; b turns clean.
    turning = grid(NOW_S, {"z-a": (100, 700), "z-b": (400, 50)})

    def woken(horizon_s: float) -> list[str]:
        settings = replace(SETTINGS, rank_by="grams", carbon_horizon_s=horizon_s)
        views = with_outlook(nodes, zone, turning, horizon_s)
        return [a.node for a in decide(views, waiting, 0.0, {}, NOW_S, settings).wake]

    assert woken(0.0) == ["a"]
    assert woken(4 * 3600.0) == ["b"]
