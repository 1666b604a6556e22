"""The node power policy on hand-built snapshots: what it powers off, drains and wakes."""

from __future__ import annotations

import math

import pytest

from controllers.node_power.policy import (
    NodeView,
    PendingPod,
    PodInfo,
    PolicySettings,
    decide,
    headroom_cores,
)
from livedata.labels import POWER_DRAINING, POWER_OFF, POWER_ON

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
