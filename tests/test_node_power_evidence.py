"""Since when a node can have been unneeded, read from what the cluster holds (`--once`, a new
leader): `views.unneeded_evidence_s` on plain API objects."""

from __future__ import annotations

from controllers.node_power.views import NodePowerRecord, unneeded_evidence_s
from tests.support.power_cluster import pod, stamp

NOW_S = 1.8e9
HOUR_S = 3600.0


def kubelet_event(node: str, pod_name: str, ago_s: float, *, uid: str = "") -> dict:
    return {
        "metadata": {"name": f"{pod_name}.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": "default", "uid": uid},
        "reason": "Killing",
        "source": {"component": "kubelet", "host": node},
        "lastTimestamp": stamp(NOW_S - ago_s),
    }


def daemon_pod(name: str, node: str, uid: str) -> dict:
    obj = pod(name, node, "100m", owner="DaemonSet")
    obj["metadata"].update(uid=uid, creationTimestamp=stamp(NOW_S - 30))
    return obj


def test_the_clock_starts_at_the_last_sign_of_a_pod_that_kept_the_node_needed() -> None:
    records = {
        name: NodePowerRecord("on", NOW_S - 2 * HOUR_S)
        for name in ("quiet", "restarted-daemon", "deleted-pod", "other-events")
    }
    records["woken"] = NodePowerRecord("on", NOW_S - 600)
    pods = [daemon_pod("agent-x1", "restarted-daemon", "uid-agent")]
    events = [
        kubelet_event("restarted-daemon", "agent-x1", 30, uid="uid-agent"),  # a DaemonSet pod
        kubelet_event("deleted-pod", "web-7", 90, uid="uid-gone"),  # a pod no longer listed
        # Not the kubelet of a node we know, or not about a pod: no evidence about ours.
        kubelet_event("another-node", "web-8", 10),
        {**kubelet_event("other-events", "web-9", 10), "source": {"component": "scheduler"}},
    ]
    since = unneeded_evidence_s(records, pods, events, NOW_S, HOUR_S)
    assert since == {
        "quiet": NOW_S - HOUR_S,  # no sign for two hours: as far back as Events reach
        "restarted-daemon": NOW_S - HOUR_S,  # DaemonSet pods go with their node
        "deleted-pod": NOW_S - 90,
        "other-events": NOW_S - HOUR_S,
        "woken": NOW_S - 600,  # powered on ten minutes ago
    }


def test_a_pod_being_deleted_or_running_counts_as_now_or_its_start() -> None:
    records = {"a": NodePowerRecord("on", NOW_S - 2 * HOUR_S), "b": NodePowerRecord("on", 0.0)}
    stopping = pod("web-1", "a", "1")
    stopping["metadata"].update(
        creationTimestamp=stamp(NOW_S - 1800), deletionTimestamp=stamp(NOW_S + 30)
    )
    running = pod("web-2", "b", "1")
    running["metadata"]["creationTimestamp"] = stamp(NOW_S - 1800)
    running["status"]["startTime"] = stamp(NOW_S - 1700)
    since = unneeded_evidence_s(records, [stopping, running], [], NOW_S, HOUR_S)
    assert since == {"a": NOW_S, "b": NOW_S - 1700}
