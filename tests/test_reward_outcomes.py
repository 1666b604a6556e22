"""Outcomes from the Pod JSON kubelets write (`tests/fixtures/pods`): what counts for a node,
what counts against it, what is not its fault, and what a restart of the extender recounts."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from extender.rewards.outcomes import (
    Outcome,
    OutcomeKind,
    OutcomeSettings,
    PodOutcomes,
    workload_of,
)
from tests.support.server import REPO_ROOT

STATES: dict[str, dict[str, Any]] = json.loads(
    (REPO_ROOT / "tests" / "fixtures" / "pods" / "kubelet-states.json").read_text()
)
T0 = datetime(2025, 6, 2, 8, 0, 0, tzinfo=UTC).timestamp()  # the fixtures' 08:00:00Z
WEB = "shop/Deployment/web"
SETTINGS = OutcomeSettings(healthy_interval_s=600.0, readiness_grace_s=300.0, start_grace_s=600.0)


def state(name: str) -> dict[str, Any]:
    return copy.deepcopy(STATES[name])


def tracker(known_until_s: float = T0 - 3600.0, **kwargs: Any) -> PodOutcomes:
    return PodOutcomes(SETTINGS, known_until_s=known_until_s, **kwargs)


def kinds(outcomes: list[Outcome]) -> list[str]:
    return [o.kind.value for o in outcomes]


# ---- identity ---------------------------------------------------------------------------------


def test_workload_is_the_controller_deployment_through_its_replicaset_hash() -> None:
    assert workload_of(state("bound")) == WEB
    assert workload_of(state("job-failed")) == "shop/Job/nightly-report"
    assert workload_of(state("statefulset")) == "shop/StatefulSet/db"
    assert workload_of(state("preempted")) == "shop/app/batch-low"  # no owner: the app label
    assert workload_of(state("bare")) is None

    pod = state("bound")
    del pod["metadata"]["labels"]["pod-template-hash"]  # a bare ReplicaSet's pod
    assert workload_of(pod) == "shop/ReplicaSet/web-6f8b9c7d54"
    pod["metadata"]["ownerReferences"][0]["controller"] = False  # an owner, not a controller
    assert workload_of(pod) == "shop/app/web"


# ---- one outcome each -------------------------------------------------------------------------


def test_healthy_running_time_counts_for_the_node_every_interval() -> None:
    outcomes = tracker()
    assert outcomes.event("ADDED", state("bound"), T0) == []
    assert outcomes.event("MODIFIED", state("running-ready"), T0 + 5) == []
    assert outcomes.sweep(T0 + 5 + 599) == []  # ready since 08:00:05: not a full interval
    (healthy,) = outcomes.sweep(T0 + 5 + 600)
    assert (healthy.kind, healthy.good, healthy.node, healthy.workload) == (
        OutcomeKind.HEALTHY,
        True,
        "node-07",
        WEB,
    )
    assert healthy.at_s == T0 + 605 and healthy.pod == "shop/web-6f8b9c7d54-q2x7k"
    assert kinds(outcomes.sweep(T0 + 5 + 1800)) == ["healthy", "healthy"]


def test_an_oom_killed_restart_counts_against_the_node() -> None:
    outcomes = tracker()
    outcomes.event("ADDED", state("bound"), T0)
    outcomes.event("MODIFIED", state("running-ready"), T0 + 5)
    found = outcomes.event("MODIFIED", state("oom-restarted"), T0 + 20 * 60 + 12)
    # Ready from 08:00:05 until the restart (ready again since 08:20:12): two healthy
    # intervals, then the OOM kill.
    assert kinds(found) == ["healthy", "healthy", "oom_killed"]
    oom = found[-1]
    assert not oom.good and oom.workload == WEB and "OOMKilled" in oom.detail


def test_each_restart_of_a_crash_loop_counts_once() -> None:
    outcomes = tracker()
    outcomes.event("ADDED", state("bound"), T0)
    outcomes.event("MODIFIED", state("running-ready"), T0 + 5)
    outcomes.event("MODIFIED", state("oom-restarted"), T0 + 1212)
    # restartCount 1 -> 4 with CrashLoopBackOff: three more restarts (Error), no extra for the
    # back-off itself.
    found = outcomes.event("MODIFIED", state("crash-loop"), T0 + 1900)
    # Ready again since 08:20:12 until the loop: one healthy interval, then three restarts.
    assert kinds(found) == ["healthy", "restart", "restart", "restart"]
    assert "Error" in found[-1].detail
    # Nothing new while it stays in the loop.
    assert outcomes.event("MODIFIED", state("crash-loop"), T0 + 1950) == []
    assert outcomes.sweep(T0 + 4000) == []  # not ready, but crash looping: no readiness charge


def test_a_pod_first_seen_crash_looping_counts_once() -> None:
    # After a restart of the extender the list shows the loop; its restarts are older than
    # what the saved evidence covers, so the loop counts once.
    outcomes = tracker(known_until_s=T0 + 1950)
    assert kinds(outcomes.listed([state("crash-loop")], T0 + 2000)) == ["crash_loop"]
    # Had the last restart (08:31:40) come after the save, it would count as that restart.
    outcomes = tracker(known_until_s=T0 + 1800)
    assert kinds(outcomes.listed([state("crash-loop")], T0 + 2000)) == ["restart"]


def test_image_pull_backoff_is_not_the_nodes_fault() -> None:
    outcomes = tracker()
    pod = state("image-pull-backoff")
    bound = state("bound")
    bound["metadata"] = pod["metadata"]
    outcomes.event("ADDED", bound, T0)
    assert outcomes.event("MODIFIED", pod, T0 + 60) == []
    assert outcomes.sweep(T0 + 3 * 3600) == []  # never starts, but the image is to blame
    assert outcomes.ignored == {"ImagePullBackOff": 1}
    assert outcomes.in_flight() == {}


def test_a_pod_that_never_starts_counts_against_the_node_once() -> None:
    outcomes = tracker()
    outcomes.event("ADDED", state("bound"), T0)
    assert outcomes.in_flight() == {("node-07", WEB): 1}
    assert outcomes.sweep(T0 + 599) == []
    (never,) = outcomes.sweep(T0 + 600)
    assert never.kind is OutcomeKind.NEVER_STARTED and not never.good
    assert outcomes.sweep(T0 + 1800) == []
    assert outcomes.in_flight() == {}


def test_readiness_failing_past_the_grace_counts_once() -> None:
    outcomes = tracker()
    outcomes.event("ADDED", state("bound"), T0)
    outcomes.event("MODIFIED", state("running-ready"), T0 + 5)
    found = outcomes.event("MODIFIED", state("not-ready"), T0 + 3600 + 10)
    # Ready 08:00:05 -> 09:00:00: five full intervals, then not ready since 09:00:00.
    assert kinds(found) == ["healthy"] * 5
    assert outcomes.sweep(T0 + 3600 + 299) == []
    assert kinds(outcomes.sweep(T0 + 3600 + 300)) == ["not_ready"]
    assert outcomes.sweep(T0 + 3600 + 900) == []  # once per episode
    # Ready again: the next episode may count again.
    ready = state("running-ready")
    ready["status"]["conditions"][2]["lastTransitionTime"] = "2025-06-02T09:20:00Z"
    assert outcomes.event("MODIFIED", ready, T0 + 4800) == []
    outcomes.event("MODIFIED", state("not-ready"), T0 + 5000)
    assert kinds(outcomes.sweep(T0 + 5000 + 300)) == ["not_ready"]


def test_evicted_failed_and_succeeded_pods() -> None:
    outcomes = tracker()
    outcomes.event("ADDED", state("bound"), T0)
    outcomes.event("MODIFIED", state("running-ready"), T0 + 5)
    found = outcomes.event("MODIFIED", state("evicted"), T0 + 4354)
    assert kinds(found)[-1] == "evicted"
    assert "low on resource: memory" in found[-1].detail
    assert outcomes.event("DELETED", state("evicted"), T0 + 4400) == []  # counted once

    outcomes = tracker()
    (failed,) = outcomes.event("MODIFIED", state("job-failed"), T0 + 401)
    assert (failed.kind, failed.workload) == (OutcomeKind.FAILED, "shop/Job/nightly-report")
    (done,) = outcomes.event("MODIFIED", state("job-succeeded"), T0 + 721)
    assert (done.kind, done.good) == (OutcomeKind.SUCCEEDED, True)


def test_preemption_and_exit_0_restarts_are_not_the_nodes_fault() -> None:
    outcomes = tracker()
    assert outcomes.event("MODIFIED", state("preempted"), T0 + 1231) == []
    assert outcomes.ignored == {"failed_preemptionbyscheduler": 1}

    outcomes.event("ADDED", state("bound"), T0)
    restarted = state("oom-restarted")
    last = restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]
    last.update(reason="Completed", exitCode=0)
    outcomes.event("MODIFIED", state("running-ready"), T0 + 5)
    assert kinds(outcomes.event("MODIFIED", restarted, T0 + 1212)) == ["healthy", "healthy"]
    assert outcomes.ignored["restart_after_exit_0"] == 1


def test_a_relist_counts_only_what_happened_after_what_is_known() -> None:
    # The extender saved at 08:30 and restarts at 10:00: the job that failed at 08:06 was
    # counted before the save, the eviction at 09:12 was not.
    outcomes = tracker(known_until_s=T0 + 1800)
    found = outcomes.listed([state("job-failed"), state("evicted")], T0 + 7200)
    assert kinds(found) == ["evicted"]
    # The healthy time of a pod ready since 08:00:05 counts from the save on.
    outcomes = tracker(known_until_s=T0 + 1800)
    assert outcomes.listed([state("running-ready")], T0 + 1800 + 599) == []
    assert kinds(outcomes.sweep(T0 + 2400)) == ["healthy"]


def test_gone_pods_are_forgotten_and_the_follow_list_is_bounded() -> None:
    outcomes = tracker(max_pods=2)
    for i in range(4):
        pod = state("bound")
        pod["metadata"]["uid"] = f"uid-{i}"
        outcomes.event("ADDED", pod, T0 + i)
    assert outcomes.tracked_pods == 2 and outcomes.forgotten_pods == 2
    assert outcomes.in_flight() == {("node-07", WEB): 2}  # the forgotten ones no longer count
    outcomes.listed([], T0 + 10)  # a relist without them: gone
    assert outcomes.tracked_pods == 0 and outcomes.in_flight() == {}


def test_only_the_configured_namespaces_are_learned_from() -> None:
    outcomes = tracker(namespaces=["payments"])
    outcomes.event("ADDED", state("bound"), T0)
    assert outcomes.tracked_pods == 0
    assert outcomes.event("MODIFIED", state("job-failed"), T0 + 401) == []


@pytest.mark.parametrize("name", ["statefulset", "bare"])
def test_pods_without_a_node_or_uid_are_skipped(name: str) -> None:
    outcomes = tracker()
    pod = state(name)
    del pod["spec"]["nodeName"]
    assert outcomes.event("ADDED", pod, T0) == [] and outcomes.tracked_pods == 0
    pod = state(name)
    del pod["metadata"]["uid"]
    assert outcomes.event("ADDED", pod, T0) == [] and outcomes.tracked_pods == 0
