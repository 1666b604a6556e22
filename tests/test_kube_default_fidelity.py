"""The simulator's kube-scheduler (`bench.sim.kube_default`) against a real v1.36 kube-scheduler.

Every energy figure compares against `bench.sim.kube_default`, so its scores must be the real
scheduler's, not a guess at them. Here a real kube-scheduler (the control plane's binaries,
default profile, its own schedulerName, `-v=10`) schedules a seeded sequence of pods onto nodes
of varied allocatable CPU and memory: bare pods, CPU-only, memory-only, small and large, with
deletions between; and the replicas of real Deployments (the controllers create them), which
PodTopologySpread's system defaults spread over hostnames and zones. At -v=10 the scheduler logs
each score plugin's weighted score for each node ("Plugin scored node for pod") and each node's
total ("Calculated node's final score for pod"). The log is replayed through the simulator's
`NodeLedger`: for every scheduling cycle the simulator must give the same feasible nodes, the
same score from every plugin on every node and the same totals, and the node the scheduler
picked must be among the simulator's best (ties are broken at random, by both). The real choice
is then applied to the ledger, so a tie cannot make the two diverge.

The pods carry a nodeSelector for this test's nodes: other tests' nodes on the shared control
plane are filtered out (and PodTopologySpread counts only nodes the selector admits).
"""

from __future__ import annotations

import contextlib
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client
import numpy as np
import pytest
from kubernetes.client.exceptions import ApiException

from bench.sim.kube_default import NodeLedger, PodRequest, fits, plugin_scores
from envtest import ControlPlane, NodeAgent

SCHEDULER = "kube-default-fidelity"  # its own schedulerName: the other schedulers leave its pods
MIB = 1024 * 1024
GIB = 1024 * MIB
ZONE_LABEL = "topology.kubernetes.io/zone"
# Nodes: (cpu cores, memory GiB, zone), varied so that CPU and memory fractions differ.
NODES = ((4, 8, "z1"), (8, 32, "z1"), (16, 16, "z2"), (6, 48, "z2"), (32, 64, "z3"))

# What the scheduler logs at -v=10 (kube-scheduler v1.36.2, schedule_one.go).
ATTEMPT = re.compile(r'"Attempting to schedule pod" pod="(?P<pod>[^"]+)"')
PLUGIN_SCORE = re.compile(
    r'"Plugin scored node for pod" pod="(?P<pod>[^"]+)" plugin="(?P<plugin>[^"]+)" '
    r'node="(?P<node>[^"]+)" score=(?P<score>-?\d+)'
)
FINAL_SCORE = re.compile(
    r'"Calculated node\'s final score for pod" pod="(?P<pod>[^"]+)" node="(?P<node>[^"]+)" '
    r"score=(?P<score>-?\d+)"
)
BOUND = re.compile(r'"Successfully bound pod to node" pod="(?P<pod>[^"]+)" node="(?P<node>[^"]+)"')
DELETED = re.compile(r'"Delete event for scheduled pod" pod="(?P<pod>[^"]+)"')
NODE_ADDED = re.compile(r'"Add event for node" node="(?P<node>[^"]+)"')


@pytest.fixture(scope="module")
def scheduler(control_plane: ControlPlane) -> Iterator[Path]:
    """A default-profile kube-scheduler at -v=10 for this module's pods; yields its log."""
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": SCHEDULER}],
    }
    control_plane.start_scheduler(SCHEDULER, config, verbosity=10)
    try:
        yield control_plane.scheduler_log(SCHEDULER)
    finally:
        control_plane.stop_component(SCHEDULER)


# ---- the cluster -------------------------------------------------------------------------------


def add_nodes(
    agent: NodeAgent, namespace: str, core: kubernetes.client.CoreV1Api, log: Path
) -> list[str]:
    """The test's nodes, registered, Ready and untainted in the scheduler's cache.

    The API server's admission taints a new node not-ready (NoSchedule) until the node
    lifecycle controller sees it Ready: the scheduler would filter it out until then."""
    names = []
    for index, (cpu, memory_gib, zone) in enumerate(NODES):
        name = f"{namespace}-n{index}"
        try:
            agent.add_node(
                name,
                cpu=cpu,
                memory=f"{memory_gib}Gi",
                labels={"fidelity": namespace, ZONE_LABEL: zone},
            )
        except ApiException as error:
            # The agent's heartbeat may make the node's Lease first (a 409 on the Lease);
            # the node itself is registered.
            if error.status != 409:
                raise
            core.read_node(name)
        names.append(name)
    for name in names:
        wait_for_line(log, NODE_ADDED, name, key="node")
    deadline = time.monotonic() + 30
    while any(core.read_node(name).spec.taints for name in names):
        assert time.monotonic() < deadline, "the new nodes kept their not-ready taint"
        time.sleep(0.1)
    time.sleep(1.0)  # the scheduler's informer hears the untainting within milliseconds
    return names


def empty_ledger() -> NodeLedger:
    return NodeLedger(
        np.array([cpu * 1000 for cpu, _, _ in NODES]),
        np.array([memory_gib * GIB for _, memory_gib, _ in NODES]),
        [zone for _, _, zone in NODES],
        kube_version="1.36",
    )


def requests_of(pod: PodRequest) -> dict[str, str]:
    requests = {}
    if pod.cpu_m:
        requests["cpu"] = f"{pod.cpu_m}m"
    if pod.memory_bytes:
        requests["memory"] = f"{pod.memory_bytes // MIB}Mi"
    return requests


def pod_spec(namespace: str, pod: PodRequest) -> dict[str, Any]:
    return {
        "schedulerName": SCHEDULER,
        "nodeSelector": {"fidelity": namespace},
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": "app", "resources": {"requests": requests_of(pod)}}],
    }


# ---- the scheduler's log -----------------------------------------------------------------------


def log_text(log: Path) -> str:
    return log.read_text(errors="replace")


def wait_for_line(
    log: Path, pattern: re.Pattern[str], name: str, key: str = "pod", timeout_s: float = 30.0
) -> str:
    """The first line matching `pattern` whose `key` group is `name`; waits for it."""
    deadline = time.monotonic() + timeout_s
    while True:
        for match in pattern.finditer(log_text(log)):
            if match[key] == name:
                return match.group(0)
        if time.monotonic() > deadline:
            raise AssertionError(f"the scheduler logged no {pattern.pattern!r} for {name}")
        time.sleep(0.05)


@dataclass
class Cycle:
    """One scheduling cycle as the scheduler logged it."""

    pod: str
    plugin_scores: dict[tuple[str, str], int] = field(default_factory=dict)  # (plugin, node)
    final_scores: dict[str, int] = field(default_factory=dict)
    node: str | None = None  # where it was bound


def read_events(log: Path, namespace: str) -> list[Cycle | str]:
    """This namespace's scheduling cycles and deletions, in the order the scheduler saw them
    (a deletion as the pod's name). A cycle's binding is logged later, by the binding goroutine;
    the scheduler assumed the pod on its node at the end of the cycle, which is where it goes."""
    events: list[Cycle | str] = []
    current: dict[str, Cycle] = {}
    patterns = (ATTEMPT, PLUGIN_SCORE, FINAL_SCORE, BOUND, DELETED)
    for line in log_text(log).splitlines():
        for pattern in patterns:
            match = pattern.search(line)
            if match is None:
                continue
            pod = match["pod"]
            if not pod.startswith(f"{namespace}/"):
                break
            if pattern is ATTEMPT:
                current[pod] = Cycle(pod)
                events.append(current[pod])
            elif pattern is PLUGIN_SCORE:
                current[pod].plugin_scores[match["plugin"], match["node"]] = int(match["score"])
            elif pattern is FINAL_SCORE:
                current[pod].final_scores[match["node"]] = int(match["score"])
            elif pattern is BOUND:
                current[pod].node = match["node"]
            else:
                events.append(pod)
            break
    return events


def replay(
    events: list[Cycle | str], node_names: list[str], request_of: Callable[[str], PodRequest]
) -> tuple[int, list[str]]:
    """Replay the log through the simulator; returns (cycles compared, mismatches)."""
    ledger = empty_ledger()
    index = {name: i for i, name in enumerate(node_names)}
    placed: dict[str, tuple[int, PodRequest]] = {}
    mismatches: list[str] = []
    compared = 0
    for event in events:
        if isinstance(event, str):
            if event in placed:
                ledger.remove(*placed.pop(event))
            continue
        cycle, pod = event, request_of(event.pod)
        if cycle.node is None:
            mismatches.append(f"{cycle.pod}: the scheduler bound it nowhere")
            continue
        feasible = np.flatnonzero(fits(ledger, pod))
        real_feasible = {node for _, node in cycle.plugin_scores}
        if not real_feasible:  # one feasible node: schedulePod returns it without scoring
            real_feasible = {cycle.node}
        simulated = {node_names[i] for i in feasible}
        if simulated != real_feasible:
            mismatches.append(
                f"{cycle.pod}: feasible nodes {sorted(real_feasible)}, "
                f"simulated {sorted(simulated)}"
            )
        elif feasible.size > 1:
            compared += 1
            scores = plugin_scores(ledger, pod, feasible)
            simulated_scores = {
                (plugin, node_names[i]): int(score)
                for plugin, per_node in scores.items()
                for i, score in zip(feasible, per_node, strict=True)
            }
            if simulated_scores != cycle.plugin_scores:
                differ = sorted(
                    f"{plugin}@{node}: real {cycle.plugin_scores.get((plugin, node))}, "
                    f"simulated {simulated_scores.get((plugin, node))}"
                    for plugin, node in set(simulated_scores) | set(cycle.plugin_scores)
                    if simulated_scores.get((plugin, node))
                    != cycle.plugin_scores.get((plugin, node))
                )
                mismatches.append(f"{cycle.pod} ({pod}): " + "; ".join(differ))
            totals = np.sum(list(scores.values()), axis=0)
            simulated_totals = {
                node_names[i]: int(t) for i, t in zip(feasible, totals, strict=True)
            }
            if simulated_totals != cycle.final_scores:
                mismatches.append(
                    f"{cycle.pod}: final scores {cycle.final_scores}, simulated {simulated_totals}"
                )
            best = {node_names[i] for i in feasible[totals == totals.max()]}
            if cycle.node not in best:
                mismatches.append(
                    f"{cycle.pod}: bound to {cycle.node}, outside the simulator's best {best}"
                )
        placed[cycle.pod] = (index[cycle.node], pod)
        ledger.add(index[cycle.node], pod)
    return compared, mismatches


# ---- the tests ---------------------------------------------------------------------------------


def random_pod(rng: random.Random) -> PodRequest:
    """Bare, CPU-only, memory-only or both; small mostly, large sometimes."""
    kind = rng.choice(["bare", "cpu", "memory", "both", "both", "both"])
    large = rng.random() < 0.2
    cpu_m = rng.choice([3000, 4000, 6000] if large else [100, 250, 500, 1000, 1500])
    memory_mib = rng.choice([8192, 12288, 20480] if large else [128, 256, 512, 1024, 2048])
    return PodRequest(
        cpu_m if kind in ("cpu", "both") else 0,
        memory_mib * MIB if kind in ("memory", "both") else 0,
    )


def test_default_scores_match_a_real_kube_scheduler(
    control_plane: ControlPlane,
    scheduler: Path,
    node_agent: NodeAgent,
    namespace: str,
) -> None:
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    node_names = add_nodes(node_agent, namespace, core, scheduler)
    rng = random.Random(20260)
    shadow = empty_ledger()  # what will fit: only pods some node has room for are created
    index = {name: i for i, name in enumerate(node_names)}
    requests: dict[str, PodRequest] = {}
    where: dict[str, int] = {}  # live pod -> its node
    for number in range(48):
        pod = random_pod(rng)
        while not fits(shadow, pod).any():
            pod = random_pod(rng)
        name = f"p{number:02d}"
        requests[f"{namespace}/{name}"] = pod
        core.create_namespaced_pod(
            namespace, {"metadata": {"name": name}, "spec": pod_spec(namespace, pod)}
        )
        bound = BOUND.search(wait_for_line(scheduler, BOUND, f"{namespace}/{name}"))
        assert bound is not None
        where[name] = index[bound["node"]]
        shadow.add(where[name], pod)
        if rng.random() < 0.3:
            victim = rng.choice(sorted(where))
            core.delete_namespaced_pod(victim, namespace, grace_period_seconds=0)
            wait_for_line(scheduler, DELETED, f"{namespace}/{victim}")
            shadow.remove(where.pop(victim), requests[f"{namespace}/{victim}"])

    events = read_events(scheduler, namespace)
    compared, mismatches = replay(events, node_names, requests.__getitem__)
    assert not mismatches, f"{len(mismatches)} differences:\n" + "\n".join(mismatches)
    assert compared >= 40, f"only {compared} cycles scored more than one node"


def deployment(namespace: str, name: str, pod: PodRequest) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec(namespace, pod)},
        },
    }


def test_system_default_spreading_matches_for_deployment_pods(
    control_plane: ControlPlane,
    scheduler: Path,
    node_agent: NodeAgent,
    namespace: str,
) -> None:
    api = control_plane.api_client()
    core, apps = kubernetes.client.CoreV1Api(api), kubernetes.client.AppsV1Api(api)
    node_names = add_nodes(node_agent, namespace, core, scheduler)
    shapes = {"web": PodRequest(500, 512 * MIB), "batch": PodRequest(1000, 0)}
    for name, pod in shapes.items():
        apps.create_namespaced_deployment(namespace, deployment(namespace, name, pod))
    # A bare pod beside them: it counts in the resource scores but in no one's spreading.
    bystander = PodRequest(2000, 2 * GIB)
    core.create_namespaced_pod(
        namespace, {"metadata": {"name": "bystander"}, "spec": pod_spec(namespace, bystander)}
    )
    wait_for_line(scheduler, BOUND, f"{namespace}/bystander")

    def running(app: str) -> list[Any]:
        pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
        return [p for p in pods if p.spec.node_name and not p.metadata.deletion_timestamp]

    def scale(app: str, replicas: int) -> None:
        apps.patch_namespaced_deployment_scale(app, namespace, {"spec": {"replicas": replicas}})
        deadline = time.monotonic() + 30
        while len(running(app)) != replicas:
            if time.monotonic() > deadline:
                raise AssertionError(f"{app} never reached {replicas} bound replicas")
            time.sleep(0.1)

    # One replica at a time, the two Deployments interleaved; then each scaled down by one
    # (its ReplicaSet picks the pod to delete) and up again, the new pod spread against the
    # survivors. Scaling, not deleting: a deleted pod's replacement can reach the scheduling
    # queue before the deletion reaches the scheduler's cache (two informer handlers), and the
    # log would not say which the scheduler saw first.
    for replicas in range(1, 7):
        for app in shapes:
            scale(app, replicas)
    for app in shapes:
        before = {p.metadata.name for p in running(app)}
        scale(app, 5)
        (gone,) = before - {p.metadata.name for p in running(app)}
        wait_for_line(scheduler, DELETED, f"{namespace}/{gone}")
        scale(app, 6)

    # Owner per ReplicaSet: pods are named <replicaset>-<suffix>, the ReplicaSet <app>-<hash>.
    owners: dict[str, int] = {}

    def request_of(pod: str) -> PodRequest:
        name = pod.split("/", 1)[1]
        if name == "bystander":
            return bystander
        replica_set = name.rsplit("-", 1)[0]
        app = replica_set.rsplit("-", 1)[0]
        owner = owners.setdefault(replica_set, len(owners))
        shape = shapes[app]
        return PodRequest(shape.cpu_m, shape.memory_bytes, owner=owner)

    events = read_events(scheduler, namespace)
    compared, mismatches = replay(events, node_names, request_of)
    assert not mismatches, f"{len(mismatches)} differences:\n" + "\n".join(mismatches)
    assert compared >= 12, f"only {compared} cycles scored more than one node"
    spread = sum(
        1
        for event in events
        if isinstance(event, Cycle)
        and any(plugin == "PodTopologySpread" for plugin, _ in event.plugin_scores)
    )
    assert spread >= 12, f"PodTopologySpread scored only {spread} cycles"
    with contextlib.suppress(ApiException):
        for app in shapes:
            apps.delete_namespaced_deployment(app, namespace)
