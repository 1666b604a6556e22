"""ClusterState: writers, cached views, assumed load of recently bound pods, thread safety."""

from __future__ import annotations

import logging
import math
import threading
import time
from types import MappingProxyType

import numpy as np
import pytest

from extender.plugins.energy_level import ENERGY_LEVEL, EnergyLevel
from extender.plugins.power_cap import MAX_POWER_W
from extender.state import ClusterState, NodeAttribute, NodeInfo

T0 = 1_700_000_000.0


def cluster(window_s: float = 120.0) -> ClusterState:
    state = ClusterState(assumed_window_s=window_s, node_attributes=(ENERGY_LEVEL, MAX_POWER_W))
    state.replace_nodes(
        [
            NodeInfo("node-a", 8.0, {"energy-status": "well-powered"}, {}),
            NodeInfo("node-b", 16.0, {}, {"power-aware-scheduler/max-power-w": "450"}),
            NodeInfo("node-c", 4.0, {"energy-status": "powerless"}, {}),
        ]
    )
    return state


def assumed(state: ClusterState, node: str, now_s: float) -> float:
    view = state.view(now_s)
    return float(view.assumed_cpu[view.node(node)])


def test_view_arrays_are_aligned_to_names() -> None:
    state = cluster()
    state.set_telemetry("node-b", {"cpu_util": 0.4, "cpu1_temp_c": 50.0}, T0 - 5)
    view = state.view(T0)
    assert view.names == ("node-a", "node-b", "node-c")
    b = view.node("node-b")
    assert view.allocatable_cpu[b] == 16.0
    assert view.cpu_util[b] == 0.4
    assert view.observed_at_s[b] == T0 - 5
    assert view.node_values(MAX_POWER_W)[b] == 450.0
    assert view.node_values(ENERGY_LEVEL).tolist() == [
        EnergyLevel.WELL_POWERED,
        EnergyLevel.GRID,
        EnergyLevel.POWERLESS,
    ]
    a = view.node("node-a")
    assert math.isnan(view.cpu_util[a])
    assert view.observed_at_s[a] == -math.inf
    assert math.isnan(view.node_values(MAX_POWER_W)[a])
    assert view.index_of(["node-c", "ghost", "node-a"]).tolist() == [2, -1, 0]
    with pytest.raises(ValueError):
        view.cpu_util[b] = 0.9  # a view is immutable


def test_assumed_load_adds_and_expires_after_the_window() -> None:
    state = cluster(window_s=120.0)
    state.pod_bound("node-a", "uid-1", 0.5, T0)
    state.pod_bound("node-a", "uid-2", 1.5, T0 + 10)
    state.pod_bound("node-b", "uid-3", 2.0, T0 + 10)
    assert assumed(state, "node-a", T0 + 20) == 2.0
    assert assumed(state, "node-b", T0 + 20) == 2.0
    assert assumed(state, "node-c", T0 + 20) == 0.0
    # uid-1 expires at T0 + 120, the others at T0 + 130.
    assert assumed(state, "node-a", T0 + 125) == 1.5
    assert assumed(state, "node-a", T0 + 130) == 0.0
    assert assumed(state, "node-b", T0 + 130) == 0.0


def test_pod_gone_removes_its_load() -> None:
    state = cluster()
    state.pod_bound("node-a", "uid-1", 1.0, T0)
    state.pod_bound("node-a", "uid-2", 2.0, T0)
    state.pod_gone("uid-1")
    state.pod_gone("never-bound")
    assert assumed(state, "node-a", T0 + 1) == 2.0


def test_a_pod_bound_twice_counts_once() -> None:
    state = cluster()
    state.pod_bound("node-a", "uid-1", 1.0, T0)
    state.pod_bound("node-a", "uid-1", 1.0, T0 + 1)
    assert assumed(state, "node-a", T0 + 2) == 1.0
    # Re-bound elsewhere: it moves.
    state.pod_bound("node-b", "uid-1", 1.0, T0 + 3)
    assert assumed(state, "node-a", T0 + 4) == 0.0
    assert assumed(state, "node-b", T0 + 4) == 1.0


def test_binding_to_an_unknown_node_is_ignored_until_the_node_appears() -> None:
    state = cluster()
    state.pod_bound("node-z", "uid-1", 1.0, T0)
    assert state.view(T0).node("node-z") == -1
    state.upsert_node(NodeInfo("node-z", 2.0, {}, {}))
    assert assumed(state, "node-z", T0 + 1) == 1.0


def test_expired_bindings_are_purged() -> None:
    state = cluster(window_s=10.0)
    for i in range(1000):
        state.pod_bound("node-a", f"uid-{i}", 0.1, T0 + i)
    # Only the last window's bindings are kept.
    assert state.assumed_pod_count() <= 11
    state.view(T0 + 5000)
    assert state.assumed_pod_count() == 0


def test_view_is_cached_until_something_changes() -> None:
    state = cluster()
    first = state.view(T0)
    assert state.view(T0 + 1) is first
    state.set_telemetry("node-a", {"cpu_util": 0.2}, T0)
    second = state.view(T0 + 2)
    assert second is not first
    assert state.view(T0 + 3) is second
    # Writing the same values again is not a change.
    state.set_telemetry("node-a", {"cpu_util": 0.2}, T0)
    state.upsert_node(NodeInfo("node-a", 8.0, {"energy-status": "well-powered"}, {}))
    assert state.view(T0 + 4) is second
    state.upsert_node(NodeInfo("node-a", 8.0, {"energy-status": "vulnerable"}, {}))
    assert state.view(T0 + 5) is not second


def test_view_is_rebuilt_when_a_binding_expires() -> None:
    state = cluster(window_s=60.0)
    state.pod_bound("node-a", "uid-1", 1.0, T0)
    view = state.view(T0 + 1)
    assert view.valid_until_s == T0 + 60
    assert state.view(T0 + 59) is view
    later = state.view(T0 + 60)
    assert later is not view
    assert later.assumed_cpu[later.node("node-a")] == 0.0
    assert later.valid_until_s == math.inf


def test_remove_node_forgets_it_and_its_telemetry() -> None:
    state = cluster()
    state.set_telemetry("node-c", {"cpu_util": 0.1}, T0)
    version, _ = state.telemetry_snapshot()
    state.remove_node("node-c")
    assert state.view(T0).node("node-c") == -1
    new_version, snapshot = state.telemetry_snapshot()
    assert new_version != version
    assert "node-c" not in snapshot


def test_telemetry_snapshot_versions_change_only_with_telemetry() -> None:
    state = cluster()
    version, snapshot = state.telemetry_snapshot()
    assert snapshot == {}
    state.pod_bound("node-a", "uid-1", 1.0, T0)
    assert state.telemetry_snapshot()[0] == version
    state.set_telemetry("node-a", {"cpu_util": 0.5, "ambient_temp_c": 21.0}, T0)
    new_version, snapshot = state.telemetry_snapshot()
    assert new_version != version
    values, observed_at_s = snapshot["node-a"]
    assert dict(values) == {"cpu_util": 0.5, "ambient_temp_c": 21.0}
    assert observed_at_s == T0


def test_telemetry_only_nodes_are_in_the_view_without_node_info() -> None:
    state = cluster()
    state.set_telemetry("node-x", {"cpu_util": 0.7}, T0)
    view = state.view(T0)
    x = view.node("node-x")
    assert x == 3
    assert not view.has_node_info[x]
    assert view.has_node_info[:x].all()
    assert view.cpu_util[x] == 0.7
    assert math.isnan(view.allocatable_cpu[x])


def test_bad_inputs_are_refused_or_logged(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="assumed_window_s"):
        ClusterState(assumed_window_s=-1)
    state = cluster()
    with pytest.raises(ValueError, match="pod uid-9: cpu_cores"):
        state.pod_bound("node-a", "uid-9", math.nan, T0)
    with caplog.at_level(logging.WARNING, logger="extender.state"):
        state.upsert_node(NodeInfo("node-q", 2.0, {"energy-status": "solar-ish"}, {}))
        state.upsert_node(
            NodeInfo("node-r", 2.0, {}, {"power-aware-scheduler/max-power-w": "lots"})
        )
    assert "node-q: unknown energy-status label 'solar-ish'" in caplog.text
    assert "node-r: ignoring max-power annotation 'lots'" in caplog.text
    view = state.view(T0)
    assert view.node_values(ENERGY_LEVEL)[view.node("node-q")] == EnergyLevel.UNKNOWN
    assert math.isnan(view.node_values(MAX_POWER_W)[view.node("node-r")])


def test_concurrent_writers_and_readers_see_consistent_views() -> None:
    state = ClusterState(assumed_window_s=1e9)
    names = [f"node-{i}" for i in range(50)]
    state.replace_nodes(NodeInfo(name, 4.0, {}, {}) for name in names)
    errors: list[BaseException] = []
    per_writer = 400

    def bind(writer: int) -> None:
        try:
            for i in range(per_writer):
                state.pod_bound(names[i % len(names)], f"w{writer}-{i}", 0.25, T0 + i)
                if i % 7 == 0:
                    state.set_telemetry(names[i % len(names)], {"cpu_util": i / per_writer}, T0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def read() -> None:
        try:
            for i in range(300):
                view = state.view(T0 + per_writer + i)
                assert len(view.names) == len(view.assumed_cpu) == len(view.cpu_util)
                # Every binding is 0.25 cores, so any consistent view has a multiple of it.
                total = float(view.assumed_cpu.sum())
                assert total == pytest.approx(round(total / 0.25) * 0.25)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=bind, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    final = state.view(T0 + 10_000)
    assert final.assumed_cpu.sum() == pytest.approx(4 * per_writer * 0.25)
    assert np.all(final.assumed_cpu == final.assumed_cpu[0])


def test_a_poll_round_is_one_change_and_reuses_the_node_arrays() -> None:
    state = cluster()
    state.set_telemetry("node-a", {"cpu_util": 0.1}, T0)
    before = state.view(T0)
    version, _ = state.telemetry_snapshot()
    state.set_telemetry_many(
        [
            ("node-a", {"cpu_util": 0.2}, T0 + 15),
            ("node-b", {"cpu_util": 0.6}, T0 + 15),
        ]
    )
    after = state.view(T0 + 16)
    assert after is not before
    assert after.cpu_util.tolist()[:2] == [0.2, 0.6]
    assert state.telemetry_snapshot()[0] == version + 1
    # Telemetry changed, the node set did not: the node arrays are the same objects.
    assert after.allocatable_cpu is before.allocatable_cpu
    assert after.names is before.names
    # A node change rebuilds them.
    state.upsert_node(NodeInfo("node-a", 12.0, {}, {}))
    changed = state.view(T0 + 17)
    assert changed.allocatable_cpu is not before.allocatable_cpu
    assert changed.allocatable_cpu[0] == 12.0
    assert changed.cpu_util[0] == 0.2


class CountingCurves:
    """Just enough of a curve table to count the name lookups."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.lookups = 0

    def index_of(self, names):
        self.lookups += 1
        return np.array([self.names.index(n) if n in self.names else -1 for n in names])


def test_curve_rows_are_looked_up_once_per_view_and_table() -> None:
    state = cluster()
    view = state.view(T0)
    table = CountingCurves(["node-c", "node-a"])
    assert view.curve_rows(table).tolist() == [1, -1, 0]
    assert view.curve_rows(table).tolist() == [1, -1, 0]
    assert table.lookups == 1
    other = CountingCurves(["node-b"])
    assert view.curve_rows(other).tolist() == [-1, 0, -1]
    assert other.lookups == 1


def test_telemetry_version_matches_the_snapshot() -> None:
    state = cluster()
    assert state.telemetry_version() == state.telemetry_snapshot()[0]
    state.set_telemetry("node-a", {"cpu_util": 0.4}, T0)
    assert state.telemetry_version() == state.telemetry_snapshot()[0] == 1


def test_candidate_lists_are_resolved_once_per_layout_and_never_confused() -> None:
    state = cluster()
    first = state.view(T0).candidates(("node-a", "node-b", "node-c"))
    assert first.positions.tolist() == [0, 1, 2]
    assert first.allocatable_cpu.tolist() == [8.0, 16.0, 4.0]
    assert first.node_values(ENERGY_LEVEL).tolist() == [
        EnergyLevel.WELL_POWERED,
        EnergyLevel.GRID,
        0,
    ]
    # A binding rebuilds the view, not the layout: the same list (new string objects, as a
    # new request body brings) is the same resolved object.
    state.pod_bound("node-a", "uid-1", 1.0, T0)
    again = state.view(T0 + 1).candidates(tuple("node-" + c for c in "abc"))
    assert again is first
    # Same length, first and last name, other middle: resolved afresh, not taken from the cache.
    other = state.view(T0 + 1).candidates(("node-a", "ghost", "node-c"))
    assert other.positions.tolist() == [0, -1, 2]
    assert other.has_node_info.tolist() == [True, False, True]
    assert (
        np.isnan(other.allocatable_cpu[1])
        and other.node_values(ENERGY_LEVEL)[1] == EnergyLevel.UNKNOWN
    )
    assert not other.all_in_view
    # The cached arrays are shared between requests: nobody may write into them.
    with pytest.raises(ValueError):
        other.allocatable_cpu[0] = 1.0
    # A node change is a new layout: positions and node info are read again.
    state.upsert_node(NodeInfo("node-b", 32.0, {}, {}))
    changed = state.view(T0 + 2).candidates(("node-a", "node-b", "node-c"))
    assert changed is not first
    assert changed.allocatable_cpu.tolist() == [8.0, 32.0, 4.0]


def test_candidate_names_with_the_separator_are_never_confused() -> None:
    state = ClusterState()
    state.replace_nodes(
        NodeInfo(name, 8.0, {}, {}) for name in ("x", "a\nb", "c", "a", "b\nc", "y")
    )
    view = state.view(T0)
    first = view.candidates(["x", "a\nb", "c", "y"])
    # Same length, first and last name, and the same text when joined by newlines.
    second = view.candidates(["x", "a", "b\nc", "y"])
    assert first.positions.tolist() == [0, 1, 2, 5]
    assert second.positions.tolist() == [0, 3, 4, 5]


def test_node_attributes_are_derived_once_per_layout_and_checked_at_writes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    def cores_label(node: NodeInfo) -> float:
        calls.append(node.name)
        return float(node.labels.get("cores", "nan"))

    def check(node: NodeInfo) -> str | None:
        return None if "cores" in node.labels else "no cores label"

    attribute = NodeAttribute("cores", cores_label, np.float64, -1.0, check=check)
    state = ClusterState(node_attributes=(attribute,))
    with caplog.at_level(logging.WARNING, logger="extender.state"):
        state.replace_nodes([NodeInfo("a", 4.0, {"cores": "4"}), NodeInfo("b", 8.0)])
    assert "node b: no cores label" in caplog.text and "node a:" not in caplog.text
    state.set_telemetry("t", {"cpu_util": 0.1}, T0)  # a telemetry-only name: `missing`
    view = state.view(T0)
    np.testing.assert_array_equal(view.node_values(attribute), [4.0, np.nan, -1.0])
    first = view.candidates(("b", "ghost", "a")).node_values(attribute)
    np.testing.assert_array_equal(first, [np.nan, -1.0, 4.0])
    # Telemetry and bindings rebuild the view, not the layout: nothing is derived again.
    state.set_telemetry("a", {"cpu_util": 0.5}, T0)
    state.pod_bound("a", "uid-1", 1.0, T0)
    again = state.view(T0 + 1).candidates(("b", "ghost", "a")).node_values(attribute)
    assert again is first and calls == ["a", "b"]
    # Candidates from request objects take the objects' own labels.
    objects = state.view(T0 + 1).candidates_from_nodes([NodeInfo("a", 4.0, {"cores": "6"})])
    assert objects.node_values(attribute).tolist() == [6.0]
    state.upsert_node(NodeInfo("b", 8.0, {"cores": "8"}))
    assert state.view(T0 + 2).node_values(attribute).tolist() == [4.0, 8.0, -1.0]


def test_signals_reach_the_next_view_and_change_its_version() -> None:
    state = cluster()
    before = state.view(T0)
    assert before.signal("carbon") is None
    snapshot = MappingProxyType({"zone-a": 120.0})
    state.set_signal("carbon", snapshot)
    after = state.view(T0)
    assert after.version > before.version and after.signal("carbon") is snapshot
    state.set_signal("carbon", snapshot)  # the same object again: no change
    assert state.view(T0) is after


# ---- a new layout carries what the previous one derived ----------------------------------


def _counting_attribute(calls: list[str]) -> NodeAttribute:
    def cores_label(node: NodeInfo) -> float:
        calls.append(node.name)
        return float(node.labels.get("cores", "nan"))

    return NodeAttribute("cores", cores_label, np.float64, -1.0)


def _fresh_values(state: ClusterState, attribute: NodeAttribute, now_s: float) -> list[float]:
    """The attribute as a state that never saw an earlier layout derives it."""
    view = state.view(now_s)
    fresh = ClusterState(node_attributes=(attribute,))
    fresh.replace_nodes(state.view(now_s)._layout.nodes)
    for name in view.names[len(view._layout.nodes) :]:
        fresh.set_telemetry(name, {"cpu_util": 0.1}, now_s)
    assert fresh.view(now_s).names == view.names
    return fresh.view(now_s).node_values(attribute).tolist()


def test_a_new_layout_reads_only_the_nodes_that_changed() -> None:
    calls: list[str] = []
    attribute = _counting_attribute(calls)
    state = ClusterState(node_attributes=(attribute,))
    state.replace_nodes(NodeInfo(f"n{i}", 4.0, {"cores": str(i)}) for i in range(6))
    state.view(T0).node_values(attribute)
    steps = [
        lambda: state.upsert_node(NodeInfo("n2", 4.0, {"cores": "20"})),  # a label changed
        lambda: state.upsert_node(NodeInfo("n9", 4.0, {"cores": "9"})),  # a node came
        lambda: state.remove_node("n0"),  # one went: every position moves
        lambda: state.set_telemetry("t", {"cpu_util": 0.1}, T0),  # a telemetry-only name
        lambda: state.upsert_node(NodeInfo("n4", 4.0, {})),  # a label went
        lambda: state.upsert_node(NodeInfo("t", 2.0, {"cores": "2"})),  # same names, new info
    ]
    read_again = [["n2"], ["n9"], [], [], ["n4"], ["t"]]
    for step, expected_calls in zip(steps, read_again, strict=True):
        step()
        calls.clear()
        values = state.view(T0).node_values(attribute).tolist()
        assert calls == expected_calls
        np.testing.assert_array_equal(values, _fresh_values(state, attribute, T0))
    view = state.view(T0)
    assert view.names == ("n1", "n2", "n3", "n4", "n5", "n9", "t")
    assert view.has_node_info.all() and view.allocatable_cpu[-1] == 2.0


def test_a_layout_keeps_one_generation_and_lets_it_go_once_carried() -> None:
    import gc
    import weakref

    calls: list[str] = []
    attribute = _counting_attribute(calls)
    state = ClusterState(node_attributes=(attribute,))
    state.replace_nodes(NodeInfo(f"n{i}", 4.0, {"cores": "1"}) for i in range(3))
    first = state.view(T0)
    first.node_values(attribute)
    first.layout_memo("key", lambda: 1)
    layouts = [weakref.ref(first._layout)]
    del first
    for i in range(3):
        state.upsert_node(NodeInfo("n0", 4.0, {"cores": str(i + 2)}))
        view = state.view(T0)
        layouts.append(weakref.ref(view._layout))
        assert view.layout_memo("key", lambda: 1, carry=lambda old: old + 1) == i + 2
        assert view._layout._previous[0] is not None  # not everything carried yet
        view.node_values(attribute)
        assert view._layout._previous[0] is None  # now it is: the old layout may go
        del view
        gc.collect()
        assert all(ref() is None for ref in layouts[:-1])
    # A layout whose successor derived nothing is kept, but never the one before it.
    state.upsert_node(NodeInfo("n1", 4.0, {"cores": "7"}))
    state.view(T0)
    state.upsert_node(NodeInfo("n1", 4.0, {"cores": "8"}))
    latest = state.view(T0)
    gc.collect()
    assert latest._layout._previous[0]._previous[0] is None
    assert latest.node_values(attribute).tolist() == [4.0, 8.0, 1.0]


def test_a_node_info_change_keeps_the_telemetry_arrays_and_curve_rows() -> None:
    state = cluster()
    state.set_telemetry("node-a", {"cpu_util": 0.3}, T0)
    before = state.view(T0)
    table = CountingCurves(["node-c", "node-a"])
    before.curve_rows(table)
    state.upsert_node(NodeInfo("node-b", 32.0, {}, {}))
    changed = state.view(T0 + 1)
    assert changed.cpu_util is before.cpu_util and changed.names is before.names
    assert changed.curve_rows(table).tolist() == [1, -1, 0] and table.lookups == 1
    assert changed.allocatable_cpu.tolist() == [8.0, 32.0, 4.0]
    # A node that comes changes the names: everything aligned to them is built again.
    state.upsert_node(NodeInfo("node-d", 2.0, {}, {}))
    grown = state.view(T0 + 2)
    assert grown.cpu_util is not before.cpu_util
    assert grown.cpu_util[0] == 0.3 and math.isnan(grown.cpu_util[3])
    assert grown.curve_rows(table).tolist() == [1, -1, 0, -1] and table.lookups == 2


def test_node_changes_while_readers_derive_give_each_layout_its_own_values() -> None:
    calls: list[str] = []
    attribute = _counting_attribute(calls)
    state = ClusterState(node_attributes=(attribute,))
    names = [f"n{i}" for i in range(20)]
    state.replace_nodes(NodeInfo(name, 4.0, {"cores": "1"}) for name in names)
    errors: list[BaseException] = []
    writing = threading.Event()
    writing.set()

    def write() -> None:
        try:
            for i in range(240):  # each node's label counts how often it was written
                name = names[i % len(names)]
                state.upsert_node(NodeInfo(name, 4.0, {"cores": str(i // len(names) + 2)}))
                time.sleep(0.0005)  # let the readers derive from most layouts
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            writing.clear()

    def read() -> None:
        try:
            while writing.is_set():
                view = state.view(T0)
                values = view.node_values(attribute)
                expected = [float(node.labels["cores"]) for node in view._layout.nodes]
                assert values.tolist() == expected
                view.layout_memo("any", lambda: True, carry=lambda old: old)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert state.view(T0).node_values(attribute).tolist() == [13.0] * len(names)
    assert len(calls) < 240 * len(names) / 10  # most layouts carried, not read whole
