"""Scheduling end to end: the real control plane, the real extender, real telemetry.

kube-scheduler runs as `power-aware-scheduler` with the shipped KubeSchedulerConfiguration
(envtest.ControlPlane), its extender URL pointing at `python -m extender` in live mode: the
extender watches the API server as ServiceAccount power-aware-scheduler/power-extender (the
shipped RBAC) and reads each node's CPU utilisation from a real Prometheus scraping one tiny
exporter per node. Nodes are registered and their pods run by `envtest.NodeAgent`.

Every node shares one convex power curve (a test bundle's fleet model), so the extender's
ranking comes from telemetry alone: the idlest node adds the fewest watts. Each scenario sets
kube-scheduler's own plugins against that ranking (the node the power score wants is the one
they like least), so a pod landing there is the extender's doing:

- pods bind to the extender's top choice, read from its `/explain` for that pod, and never to
  a powerless node nor one the node power controller has off or waking, though those are the
  cheapest by telemetry;
- with the extender stopped, then slower than `httpTimeout`, the scheduler goes on without it
  (`ignorable: true`) and every pod binds;
- a Deployment whose pods crash on the cheapest node: the Reward plugin learns it from the pod
  watch, its filter then keeps the next replicas off that node, and what it learned survives a
  restart of the extender through its ConfigMap.

Every Deployment ends with all its replicas Running and Ready: no pod is lost.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from bench.support.server import ExtenderProcess
from envtest import ControlPlane, NodeAgent
from envtest.ports import free_port
from livedata.labels import ENERGY_LABEL, POWER_STATE_ANNOTATION
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.exporters import wait_until
from tests.support.fault_proxy import FaultProxy
from tests.support.live_scheduling import (
    NodeTelemetry,
    explain,
    live_extender,
    node_telemetry,
    stop_extender,
    top_choice,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

SCHEDULER = "power-aware-scheduler"
EXTENDER_NAMESPACE = "power-aware-scheduler"
EXTENDER_ACCOUNT = "power-extender"
REWARDS_CONFIG_MAP = "power-extender-rewards"  # the one name the shipped Role lets it write
NODE_CPU = 16
NODE_MEMORY = "64Gi"
POD_CPU = "250m"  # a 64th of a node: a few pods move a node's assumed load little
# The score lead the extender's top node needs over the next for kube-scheduler to follow it:
# each extender point counts its weight (5) x 10 = 50 of kube-scheduler's points, and its own
# plugins differ here by less than 200 between nodes (resource fit and balance about 85 on the
# node whose memory is taken; the spreading of a Deployment's pods by hostname up to 200, met
# with a lead of 6 or more where it matters).
DECISIVE_LEAD = 4


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One convex curve for every node (the fleet model): an idler node adds fewer watts."""
    directory = tmp_path_factory.mktemp("bundle")
    make_bundle(directory, {}, fallback=PowerCurveSpec(idle_w=120.0, max_w=420.0, exponent=3))
    return directory


@pytest.fixture
def agent(kube_api: kubernetes.client.ApiClient) -> Iterator[NodeAgent]:
    """A kubelet stand-in, not started: a test registers its nodes, then starts it (a node
    added while the agent runs can race its heartbeat to create the node's Lease)."""
    node_agent = NodeAgent(kube_api, heartbeat_s=1.0)
    yield node_agent
    node_agent.stop()
    for name in node_agent.node_names:
        node_agent.remove_node(name)


@pytest.fixture
def extender_kubeconfig(control_plane: ControlPlane, tmp_path: Path) -> Path:
    return control_plane.service_account_kubeconfig(
        EXTENDER_NAMESPACE, EXTENDER_ACCOUNT, tmp_path / "extender.kubeconfig"
    )


# ---- objects -------------------------------------------------------------------------------


def container(cpu: str = POD_CPU, memory: str = "1Gi") -> dict[str, Any]:
    return {
        "name": "app",
        "image": "app",
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
    }


def pod(name: str, namespace: str, *, scheduler: str = SCHEDULER, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"schedulerName": scheduler, "containers": [container()], **spec},
    }


def deployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"schedulerName": SCHEDULER, "containers": [container()]},
            },
        },
    }


class Cluster:
    """The API as the tests read it (admin)."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.core = kubernetes.client.CoreV1Api(api)
        self.apps = kubernetes.client.AppsV1Api(api)

    def bound_node(self, name: str, timeout_s: float = 30.0) -> str:
        return wait_until(
            lambda: self.core.read_namespaced_pod(name, self.namespace).spec.node_name,
            f"pod {name} to be bound",
            timeout_s,
        )

    def wait_running(self, name: str) -> None:
        wait_until(
            lambda: self.core.read_namespaced_pod(name, self.namespace).status.phase == "Running",
            f"pod {name} to run",
        )

    def pods_of(self, app: str) -> list[Any]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"app={app}").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def scale(self, name: str, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(
            name, self.namespace, {"spec": {"replicas": replicas}}
        )

    def all_replicas_running(self, name: str, timeout_s: float = 60.0) -> list[Any]:
        """Every replica of the Deployment Running and Ready (and no more pods); those pods."""
        wanted = self.apps.read_namespaced_deployment(name, self.namespace).spec.replicas

        def done() -> list[Any]:
            pods = self.pods_of(name)
            ready = [p for p in pods if p.status.phase == "Running" and _ready(p)]
            status = self.apps.read_namespaced_deployment_status(name, self.namespace).status
            if len(pods) == len(ready) == wanted == (status.available_replicas or 0):
                return ready
            return []

        return wait_until(done, f"all {wanted} replicas of {name} Running and Ready", timeout_s)

    def as_sent(self, pod_object: Any) -> dict[str, Any]:
        """A Pod object as JSON, as kube-scheduler sends it to the extender."""
        return self.api.sanitize_for_serialization(pod_object)


def _ready(pod_object: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod_object.status.conditions or [])


def start_nodes(agent: NodeAgent, names: Mapping[str, Mapping[str, Any]]) -> None:
    """Register the nodes (`add_node` options by name), then start their kubelets."""
    for name, options in names.items():
        agent.add_node(name, cpu=NODE_CPU, memory=NODE_MEMORY, **options)
    agent.start()


def http_timeout_s(control_plane: ControlPlane) -> float:
    """The extender httpTimeout of the shipped scheduler configuration, in seconds."""
    (extender,) = control_plane.power_aware_scheduler_config()["extenders"]
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)", extender["httpTimeout"])
    assert match, f"unexpected httpTimeout {extender['httpTimeout']!r}"
    value, unit = float(match[1]), match[2]
    return value / 1000 if unit == "ms" else value


@contextlib.contextmanager
def extender_for(
    control_plane: ControlPlane,
    kubeconfig: Path,
    telemetry: NodeTelemetry,
    bundle: Path,
    *,
    port: int | None = None,
    profile: Path | None = None,
) -> Iterator[ExtenderProcess]:
    """The live extender where the power-aware scheduler calls it (or on `port`)."""
    with live_extender(
        port=port or control_plane.extender_port,
        kubeconfig=kubeconfig,
        telemetry=telemetry,
        bundle=bundle,
        profile=profile,
    ) as extender:
        yield extender


# ---- pods go where the extender says --------------------------------------------------------


def test_pods_bind_to_the_extenders_top_choice_and_never_to_a_node_it_fails(
    control_plane: ControlPlane,
    agent: NodeAgent,
    namespace: str,
    tmp_path: Path,
    bundle: Path,
    extender_kubeconfig: Path,
) -> None:
    cluster = Cluster(control_plane.api_client(), namespace)
    cheap = f"{namespace}-cheap"
    plain = [f"{namespace}-plain-{i}" for i in (1, 2)]
    powerless, off, waking = (f"{namespace}-{role}" for role in ("powerless", "off", "waking"))
    forbidden = [powerless, off, waking]
    start_nodes(
        agent,
        {
            cheap: {},
            **{name: {} for name in plain},
            powerless: {"labels": {ENERGY_LABEL: "powerless"}},
            off: {"annotations": {POWER_STATE_ANNOTATION: "off"}},
            waking: {"annotations": {POWER_STATE_ANNOTATION: "waking"}},
        },
    )
    nodes = [cheap, *plain, *forbidden]
    # kube-scheduler's own plugins dislike `cheap`: most of its memory is requested already
    # (resource fit and balance score it lowest). The extender does not count memory.
    filler = pod("filler", namespace, nodeName=cheap, containers=[container("10m", "56Gi")])
    cluster.core.create_namespaced_pod(namespace, filler)
    cluster.wait_running("filler")
    # By telemetry `cheap` is idle and the plain nodes busy; the nodes the extender must fail
    # are the idlest of all, so only its filters keep pods off them.
    utilisation = {cheap: 0.10, **dict.fromkeys(plain, 0.50), **dict.fromkeys(forbidden, 0.0)}

    with (
        node_telemetry(tmp_path, utilisation) as telemetry,
        extender_for(control_plane, extender_kubeconfig, telemetry, bundle) as extender,
    ):
        # Where kube-scheduler's plugins alone put such a pod: the default scheduler's answer.
        cluster.core.create_namespaced_pod(
            namespace, pod("alone", namespace, scheduler="default-scheduler")
        )
        assert cluster.bound_node("alone") != cheap
        cluster.core.delete_namespaced_pod("alone", namespace, grace_period_seconds=0)

        for index in range(4):
            body = pod(f"web-{index}", namespace)
            verdicts = explain(extender.url, body, nodes)
            for name in forbidden:
                record = verdicts[name]
                assert not record["passes"], record
                # ... though it would add fewer watts than any node that passes.
                assert record["increase_w"] < verdicts[cheap]["increase_w"], record
            # kube-scheduler asks for scores of the nodes that passed the filter only.
            passing = [name for name in nodes if verdicts[name]["passes"]]
            assert passing == [cheap, *plain]
            records = explain(extender.url, body, passing)
            choice, lead = top_choice(records)
            assert choice == cheap, records
            assert lead >= DECISIVE_LEAD, records
            cluster.core.create_namespaced_pod(namespace, body)
            bound = cluster.bound_node(body["metadata"]["name"])
            assert bound == choice, f"bound to {bound}, the extender ranked {choice} first"
            cluster.wait_running(body["metadata"]["name"])
        assert stop_extender(extender) == 0


# ---- the scheduler goes on without its extender ------------------------------------------------


def test_scheduler_goes_on_when_the_extender_is_stopped_or_slow(
    control_plane: ControlPlane,
    agent: NodeAgent,
    namespace: str,
    tmp_path: Path,
    bundle: Path,
    extender_kubeconfig: Path,
) -> None:
    cluster = Cluster(control_plane.api_client(), namespace)
    nodes = [f"{namespace}-{i}" for i in range(3)]
    start_nodes(agent, {name: {} for name in nodes})
    utilisation = dict(zip(nodes, (0.1, 0.5, 0.5), strict=True))
    timeout_s = http_timeout_s(control_plane)

    with node_telemetry(tmp_path, utilisation) as telemetry:
        with extender_for(control_plane, extender_kubeconfig, telemetry, bundle) as extender:
            cluster.apps.create_namespaced_deployment(namespace, deployment("steady", 2))
            cluster.all_replicas_running("steady")
            # Stopped: nothing listens on the extender's port any more.
            assert stop_extender(extender) == 0
        cluster.scale("steady", 4)
        cluster.all_replicas_running("steady")

        # Slow: every answer arrives twice the scheduler's httpTimeout late.
        upstream = free_port()
        with (
            extender_for(
                control_plane, extender_kubeconfig, telemetry, bundle, port=upstream
            ) as extender,
            FaultProxy(
                "127.0.0.1",
                upstream,
                scheme="http",
                listen_port=control_plane.extender_port,
                answer_delay_s=2 * timeout_s,
            ) as proxy,
        ):
            cluster.scale("steady", 6)
            cluster.all_replicas_running("steady", timeout_s=60 + 10 * timeout_s)
            assert proxy.posts_forwarded >= 2, "the scheduler never asked the slow extender"
            assert stop_extender(extender) == 0


# ---- learning from crashes ----------------------------------------------------------------------


@pytest.fixture
def rewards_config_map(kube_api: kubernetes.client.ApiClient) -> Iterator[str]:
    """The shared ConfigMap the Reward plugin saves to, absent before and deleted after."""
    core = kubernetes.client.CoreV1Api(kube_api)

    def delete() -> None:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_config_map(REWARDS_CONFIG_MAP, EXTENDER_NAMESPACE)

    delete()
    yield REWARDS_CONFIG_MAP
    delete()


def reward_profile(path: Path, namespace: str) -> Path:
    """The default scoring plus Reward as filter and score (bench/sim/profiles/
    power-aware+rewards.yaml), saving to the shipped ConfigMap only when the extender stops
    (the periodic save an hour away)."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "power-aware-scheduler/v1alpha1",
                "kind": "ExtenderConfiguration",
                "plugins": {
                    "filter": {"enabled": [{"name": "Reward"}]},
                    "score": {"enabled": [{"name": "Reward", "weight": 0.2}]},
                },
                "pluginConfig": [
                    {
                        "name": "Reward",
                        "args": {
                            "namespaces": [namespace],
                            "configMap": REWARDS_CONFIG_MAP,
                            "configMapNamespace": EXTENDER_NAMESPACE,
                            "saveIntervalS": 3600,
                        },
                    }
                ],
            }
        )
    )
    return path


def test_replicas_leave_the_node_where_they_crash_and_the_lesson_survives_a_restart(
    control_plane: ControlPlane,
    agent: NodeAgent,
    namespace: str,
    tmp_path: Path,
    bundle: Path,
    extender_kubeconfig: Path,
    rewards_config_map: str,
) -> None:
    cluster = Cluster(control_plane.api_client(), namespace)
    bad = f"{namespace}-bad"
    good = [f"{namespace}-good-{i}" for i in (1, 2)]
    # The power score wants `bad`: idle and on grid power; the good nodes are busy and on
    # batteries (low-powered), so only what the Reward plugin learns can send pods there.
    start_nodes(
        agent,
        {bad: {}, **{name: {"labels": {ENERGY_LABEL: "low-powered"}} for name in good}},
    )
    nodes = [bad, *good]
    utilisation = {bad: 0.05, **dict.fromkeys(good, 0.5)}
    agent.fail_pods(bad, "crash-loop", {"app": "web"})
    profile = reward_profile(tmp_path / "profile.yaml", namespace)

    def rewards_fail_bad(extender_url: str) -> dict | None:
        """The Reward filter's verdict on `bad` for a pod of the Deployment, once it fails."""
        pods = cluster.pods_of("web")
        if not pods:
            return None
        record = explain(extender_url, cluster.as_sent(pods[0]), nodes)[bad]
        return None if record["passes"] else record

    with node_telemetry(tmp_path, utilisation) as telemetry:
        with extender_for(
            control_plane, extender_kubeconfig, telemetry, bundle, profile=profile
        ) as extender:
            records = explain(extender.url, pod("probe", namespace), nodes)
            choice, lead = top_choice(records)
            assert choice == bad and lead >= DECISIVE_LEAD + 2, records

            cluster.apps.create_namespaced_deployment(namespace, deployment("web", 2))

            def learned() -> dict | None:
                # What the descheduler's RemovePodsHavingTooManyRestarts does: delete the pods
                # that keep restarting; their ReplicaSet makes new ones.
                for crashing in cluster.pods_of("web"):
                    restarts = sum(
                        s.restart_count or 0 for s in crashing.status.container_statuses or []
                    )
                    if crashing.spec.node_name == bad and restarts > 0:
                        with contextlib.suppress(ApiException):
                            cluster.core.delete_namespaced_pod(
                                crashing.metadata.name, namespace, grace_period_seconds=0
                            )
                return rewards_fail_bad(extender.url)

            verdict = wait_until(learned, "the Reward filter to fail the crashing node", 90)
            assert "reward" in verdict["note"], verdict
            assert verdict["reward_bad"] >= 5, verdict

            cluster.scale("web", 4)
            for crashing in [p for p in cluster.pods_of("web") if p.spec.node_name == bad]:
                cluster.core.delete_namespaced_pod(
                    crashing.metadata.name, namespace, grace_period_seconds=0
                )
            placed = cluster.all_replicas_running("web")
            assert {p.spec.node_name for p in placed} <= set(good)

            assert saved_rewards(cluster) is None  # nothing saved while it runs
            assert stop_extender(extender) == 0
        # Its last save, on SIGTERM, created the ConfigMap.
        saved = saved_rewards(cluster)
        assert saved is not None and saved.pairs >= 1, saved

        # A new extender process knows only what the ConfigMap holds: no pod on `bad` is left
        # to learn from again.
        with extender_for(
            control_plane, extender_kubeconfig, telemetry, bundle, profile=profile
        ) as extender:
            verdict = wait_until(
                lambda: rewards_fail_bad(extender.url), "the saved rewards to be loaded", 30
            )
            assert verdict["reward_bad"] >= 5, verdict
            cluster.scale("web", 6)
            placed = cluster.all_replicas_running("web")
            assert {p.spec.node_name for p in placed} <= set(good)
            assert stop_extender(extender) == 0
        # ... and its last save updated the same ConfigMap.
        resaved = saved_rewards(cluster)
        assert resaved is not None and resaved.pairs >= 1, resaved
        assert resaved.uid == saved.uid and resaved.version != saved.version


@dataclass(frozen=True)
class SavedRewards:
    pairs: int  # node x workload pairs with evidence, from the ConfigMap's summary
    uid: str
    version: str


def saved_rewards(cluster: Cluster) -> SavedRewards | None:
    """What the Reward plugin's ConfigMap holds; None when there is none."""
    try:
        saved = cluster.core.read_namespaced_config_map(REWARDS_CONFIG_MAP, EXTENDER_NAMESPACE)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    match = re.search(r"pairs=(\d+)", (saved.data or {}).get("summary", ""))
    assert match, f"unexpected ConfigMap summary: {saved.data}"
    return SavedRewards(int(match[1]), saved.metadata.uid, saved.metadata.resource_version)
