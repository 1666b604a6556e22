"""`controllers.node_power.headroom`: the headroom learned for a pod wait target."""

from __future__ import annotations

import math

import pytest

from controllers.node_power.headroom import (
    HeadroomLearner,
    HeadroomSettings,
    hour_of_day,
    wait_p99_s,
    weighted_quantile,
)
from controllers.node_power.policy import (
    ArrivalRate,
    NodeView,
    PodInfo,
    PolicySettings,
    decide,
    headroom_cores,
)
from livedata.labels import POWER_OFF, POWER_ON

HOUR_S = 3600.0
DAY_S = 86_400.0


def learner(**overrides: float) -> HeadroomLearner:
    values = {"target_wait_p99_s": 30.0, "boot_s": 300.0, **overrides}
    return HeadroomLearner(HeadroomSettings(**values))  # type: ignore[arg-type]


def feed_waits(model: HeadroomLearner, at_s: float, waits_s: list[float]) -> None:
    for wait_s in waits_s:
        model.add_wait(at_s, wait_s)


def test_growth_is_the_requested_cores_created_within_one_boot_time() -> None:
    model = learner(boot_s=300.0)
    model.add_arrival(100.0, 2.0)
    model.add_arrival(350.0, 1.5)
    model.add_arrival(390.0, 0.5)
    assert model.growth_cores(399.0) == pytest.approx(4.0)
    # 100 s falls out of the window (399 - 300, 399] once 400 s is reached.
    assert model.growth_cores(400.0) == pytest.approx(2.0)
    assert model.growth_cores(10_000.0) == 0.0  # never negative: nothing arrives, nothing grows


def test_arrivals_without_cores_or_time_are_ignored() -> None:
    model = learner()
    for created_s, cores in ((10.0, 0.0), (10.0, -3.0), (math.nan, 1.0), (10.0, math.inf)):
        model.add_arrival(created_s, cores)
    assert model.growth_cores(20.0) == 0.0


def test_each_slots_largest_growth_goes_to_its_hour_of_day_bucket() -> None:
    model = learner(boot_s=600.0)
    # Hour 2: a burst of 10 cores within one slot; hour 5: 3 cores. Rounds every 60 s.
    for created_s, cores in ((2 * HOUR_S + 100.0, 4.0), (2 * HOUR_S + 200.0, 6.0)):
        model.add_arrival(created_s, cores)
    model.add_arrival(5 * HOUR_S + 30.0, 3.0)
    for now_s in range(0, 6 * 3600 + 1, 60):
        model.update(float(now_s))
    hour_2 = model.bucket_samples(2)
    assert max(v for v, _ in hour_2) == pytest.approx(10.0)
    assert len(hour_2) == 6  # six slots of 600 s start in each hour
    assert max(v for v, _ in model.bucket_samples(5)) == pytest.approx(3.0)
    assert all(v == 0.0 for v, _ in model.bucket_samples(3))
    assert all(v >= 0.0 for hour in range(24) for v, _ in model.bucket_samples(hour))


def test_the_learned_headroom_is_the_quantile_of_this_hours_growth_across_days() -> None:
    model = learner(boot_s=300.0, day_decay=0.5, min_bucket_weight=1.0)
    # Three days in which hour 9 sees a burst of 40 cores and every other hour 2 cores.
    for day in range(3):
        for now_s in range(int(day * DAY_S), int((day + 1) * DAY_S), 60):
            if hour_of_day(now_s) == 9 and now_s % 3600 == 1800:
                model.add_arrival(float(now_s), 40.0)
            elif now_s % 300 == 0:
                model.add_arrival(float(now_s), 2.0)
            model.update(float(now_s))
    # Day 3, just before 9:00 (a boot starting now reaches into hour 9): the burst is
    # expected; at 3:00 it is not.
    at_9 = 3 * DAY_S + 9 * HOUR_S - 200.0
    at_3 = 3 * DAY_S + 3 * HOUR_S + 10.0
    model.quantile = 0.99
    assert model.learned_cores(at_9) >= 40.0
    assert model.learned_cores(at_3) < 5.0
    model.quantile = 0.5
    assert model.learned_cores(at_9) < 5.0  # one slot in twelve: not at the median


def test_older_days_weigh_less() -> None:
    assert weighted_quantile([(1.0, 1.0), (9.0, 1.0)], 0.5) == 1.0
    assert weighted_quantile([(1.0, 0.25), (9.0, 1.0)], 0.5) == 9.0
    assert weighted_quantile([], 0.9) == 0.0


def test_the_first_hours_borrow_from_the_nearest_hours() -> None:
    model = learner(boot_s=300.0, min_bucket_weight=3.0)
    for now_s in range(0, 3 * 3600, 60):
        # 20 cores per boot time in hour 0, 5 in hour 1, none yet in hour 2.
        if now_s % 300 == 0 and now_s < 2 * HOUR_S:
            model.add_arrival(float(now_s), 20.0 if now_s < HOUR_S else 5.0)
        model.update(float(now_s))
    model.quantile = 0.9
    # Day 0 at 3:00 (hour 3 has only the slot under way): hour 2 speaks for it, not hour 0.
    assert model.learned_cores(3 * HOUR_S + 1.0) == 0.0
    # Hour 1 has twelve slots of its own: hour 0's bigger ones do not count.
    assert model.learned_cores(1 * HOUR_S + 3000.0) == pytest.approx(5.0)


def test_the_quantile_rises_on_fresh_misses_at_most_once_per_interval() -> None:
    model = learner(initial_quantile=0.5, adjust_interval_s=600.0, min_waits=20)
    feed_waits(model, 100.0, [0.0] * 90 + [300.0] * 10)
    state = model.update(100.0)
    assert state.wait_p99_s == 300.0
    assert state.quantile == pytest.approx(0.75)
    assert "over the 30 s target" in state.last_change and "0.500 -> 0.750" in state.last_change
    # The same misses, still in the window, do not raise it again...
    assert model.update(700.0).quantile == pytest.approx(0.75)
    # ...new ones do, but not within the interval of the last move.
    feed_waits(model, 750.0, [200.0])
    assert model.update(800.0).quantile == pytest.approx(0.875)
    feed_waits(model, 850.0, [200.0])
    assert model.update(900.0).quantile == pytest.approx(0.875)
    assert model.update(1400.0).quantile == pytest.approx(0.9375)


def test_the_quantile_falls_slowly_when_met_with_margin_and_holds_in_between() -> None:
    model = learner(initial_quantile=0.9, lower_factor=1.05, margin_ratio=0.5)
    feed_waits(model, 100.0, [1.0] * 100)
    state = model.update(100.0)
    assert state.quantile == pytest.approx(1 - 0.1 * 1.05)
    assert "under 0.5 x the 30 s target" in state.last_change
    # Met, but not with margin (p99 20 s of 30 s): no change.
    model = learner(initial_quantile=0.9)
    feed_waits(model, 100.0, [20.0] * 100)
    assert model.update(100.0).quantile == 0.9


def test_the_quantile_stays_within_its_bounds() -> None:
    model = learner(initial_quantile=0.5, min_quantile=0.5, max_quantile=0.99)
    feed_waits(model, 0.0, [1.0] * 50)
    assert model.update(0.0).quantile == 0.5  # met with margin at the floor: stays
    assert model.last_change == ""
    for step in range(1, 30):
        feed_waits(model, step * 600.0, [600.0] * 50)
        model.update(step * 600.0)
    assert model.quantile == 0.99


def test_too_few_waits_judge_nothing() -> None:
    model = learner(min_waits=20)
    feed_waits(model, 100.0, [500.0] * 19)
    state = model.update(100.0)
    assert math.isnan(state.wait_p99_s) and state.waits == 19
    assert state.quantile == 0.5


def test_waits_leave_the_window() -> None:
    model = learner(wait_window_s=1800.0, min_waits=1)
    feed_waits(model, 0.0, [300.0])
    feed_waits(model, 1500.0, [2.0])
    assert model.update(1700.0).waits == 2
    assert model.update(1801.0).waits == 1


def test_wait_p99_is_the_nearest_rank() -> None:
    assert wait_p99_s([float(i) for i in range(1, 101)]) == 99.0
    assert wait_p99_s([5.0]) == 5.0
    assert math.isnan(wait_p99_s([]))


@pytest.mark.parametrize(
    "overrides",
    [
        {"target_wait_p99_s": 0.0},
        {"target_wait_p99_s": math.inf},
        {"boot_s": 0.0},
        {"initial_quantile": 0.3},
        {"max_quantile": 1.0},
        {"raise_factor": 1.0},
        {"lower_factor": 1.0},
        {"day_decay": 0.0},
        {"min_waits": 0},
    ],
)
def test_settings_refuse_nonsense(overrides: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        learner(**overrides)


def test_the_fixed_reserve_is_a_floor_and_the_larger_applies() -> None:
    settings = PolicySettings(min_headroom_cores=48.0, boot_s=300.0)
    assert headroom_cores(0.0, settings, learned_cores=20.0) == 48.0
    assert headroom_cores(0.0, settings, learned_cores=60.0) == 60.0
    assert headroom_cores(0.1, settings, learned_cores=60.0) == 60.0  # rate: 30 cores
    assert headroom_cores(0.3, settings, learned_cores=60.0) == pytest.approx(90.0)
    assert headroom_cores(0.0, settings, learned_cores=-5.0) == 48.0
    assert headroom_cores(0.0, settings, learned_cores=math.nan) == 48.0


def test_decide_wakes_a_node_for_the_learned_headroom() -> None:
    def node(name: str, state: str, used: float) -> NodeView:
        pods = (PodInfo(f"{name}/p", used),) if used else ()
        return NodeView(name, 16.0, 64 << 30, state, 0.0, True, 100.0, pods)

    nodes = [node("a", POWER_ON, 12.0), node("b", POWER_OFF, 0.0)]
    settings = PolicySettings(boot_s=300.0)
    quiet = decide(nodes, [], ArrivalRate(0.0), {}, 10_000.0, settings)
    assert not quiet.wake and quiet.headroom_cores == 0.0
    learned = decide(nodes, [], ArrivalRate(0.0), {}, 10_000.0, settings, 8.0)
    assert [a.node for a in learned.wake] == ["b"] and learned.headroom_cores == 8.0


def test_policy_settings_refuse_a_negative_or_infinite_target() -> None:
    for value in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            PolicySettings(target_wait_p99_s=value)


def _scheduled_pod(uid: str, created: str, scheduled: str | None, daemon: bool = False) -> dict:
    owner = {"kind": "DaemonSet" if daemon else "ReplicaSet", "controller": True, "name": "o"}
    status: dict = {"conditions": []}
    spec: dict = {}
    if scheduled is not None:
        spec["nodeName"] = "node-a"
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}
        ]
    return {
        "metadata": {"uid": uid, "creationTimestamp": created, "ownerReferences": [owner]},
        "spec": spec,
        "status": status,
    }


def test_the_wait_tracker_feeds_each_scheduled_pods_wait_once() -> None:
    from controllers.node_power.views import WaitTracker, parse_rfc3339_s

    model = learner(min_waits=1)
    tracker = WaitTracker(model, window_s=3600.0)
    pods = [
        _scheduled_pod("a", "2026-01-01T10:00:00Z", "2026-01-01T10:00:45Z"),
        _scheduled_pod("b", "2026-01-01T10:00:00Z", None),  # still pending: no wait yet
        _scheduled_pod("d", "2026-01-01T10:00:00Z", "2026-01-01T10:00:01Z", daemon=True),
        _scheduled_pod("old", "2026-01-01T08:00:00Z", "2026-01-01T08:00:09Z"),  # out of window
    ]
    now_s = parse_rfc3339_s("2026-01-01T10:01:00Z")
    assert tracker.observe(pods, now_s) == 1
    assert tracker.observe(pods, now_s + 10.0) == 0  # seen already
    state = model.update(now_s + 10.0)
    assert (state.waits, state.wait_p99_s) == (1, 45.0)
