"""The Delay filter and score and the CloudPreference score, on the request path.

The state is written the way the background sources write it (an `RttMatrix` and a `PodIndex`
as signals); pod-prefix origins are also resolved from the real Kubernetes watch against the
real control plane (tests/conftest.py), and `/explain` is read over HTTP from the whole service
with an RTT file.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import kubernetes.client
import pytest
import yaml

from envtest import ControlPlane, NodeAgent
from extender.config import DEFAULT_BUNDLE_DIR
from extender.plugins.delay import DelayPlugin, delay_constraints
from extender.pods import PODS_SIGNAL, PodIndex, PodPlacement
from extender.profile import ProfileError, build_profile
from extender.rtt import RTT_SIGNAL, RttLink, RttMatrix
from extender.scoring import Assessment, assess
from extender.sources.kube_watch import ClusterWatcher
from extender.sources.rtt_file import RttFileError
from extender.state import ClusterState, NodeInfo
from tests.support.manifests import find_object
from tests.support.server import extender_service, write_snapshot

NOW_S = 10_000.0
EDGE_1 = ("edge-1a", "edge-1b")
EDGE_2 = ("edge-2a",)
CLOUD = ("cloud-1", "cloud-2")
NODES = (*EDGE_1, *EDGE_2, *CLOUD)
# Measured 60 s before NOW_S, usable for 300 s.
MEASURED = (
    ("edge-1a", "edge-1b", 1.0),
    ("edge-1a", "edge-2a", 18.0),
    ("edge-1b", "edge-2a", 19.0),
    ("edge-1a", "cloud-1", 42.0),
    ("edge-1b", "cloud-1", 43.0),
    ("edge-2a", "cloud-1", 35.0),
    ("cloud-1", "cloud-2", 0.5),
    # edge-*-cloud-2 never measured
)


def profile(filter_args: dict[str, Any] | None = None, *, score_weight: float = 0.0):
    document: dict[str, Any] = {
        "plugins": {
            "filter": {"enabled": [{"name": "Delay"}]},
            "score": {"enabled": [{"name": "Delay", "weight": score_weight}]},
        }
    }
    if filter_args:
        document["pluginConfig"] = [{"name": "Delay", "args": filter_args}]
    return build_profile(document)


def state_with(
    links: tuple[tuple[str, str, float], ...] = MEASURED,
    *,
    measured_at_s: float = NOW_S - 60.0,
    pods: tuple[PodPlacement, ...] = (),
) -> ClusterState:
    state = ClusterState()
    state.replace_nodes(
        NodeInfo(name, 16.0, {"kubernetes.io/role": "cloud"} if name in CLOUD else {})
        for name in NODES
    )
    matrix = RttMatrix.build(
        [RttLink(a, b, ms, measured_at_s, measured_at_s + 300.0) for a, b, ms in links],
        built_at_s=measured_at_s,
    )
    state.set_signal(RTT_SIGNAL, matrix)
    state.set_signal(PODS_SIGNAL, PodIndex.of(pods))
    return state


def pod(labels: dict[str, str], namespace: str = "default") -> dict[str, Any]:
    return {"metadata": {"name": "app-1", "namespace": namespace, "labels": labels}}


def run(state: ClusterState, labels: dict[str, str], now_s: float = NOW_S, **args: Any):
    chosen = profile(args or None)
    return assess(
        state.view(now_s), None, list(NODES), 0.5, chosen, now_s=now_s, telemetry_ttl_s=None,
        pod=pod(labels),
    )  # fmt: skip


def passing(assessment: Assessment) -> list[str]:
    return [name for name in assessment.names if name not in assessment.failed]


def test_nodes_beyond_the_limit_fail_with_the_rtt_and_its_age() -> None:
    result = run(state_with(), {"delay_edge-1a": "20"})
    assert passing(result) == ["edge-1a", "edge-1b", "edge-2a"]
    assert result.failed["cloud-1"] == (
        "delay_edge-1a <= 20 ms: RTT to edge-1a is 42.0 ms (measured 60 s ago)"
    )
    # Evicting pods does not shorten a network path: no preemption.
    assert {"cloud-1", "cloud-2"} <= result.unresolvable


def test_an_unknown_link_fails_unless_configured_to_pass() -> None:
    result = run(state_with(), {"delay_edge-1a": "100"})
    assert "cloud-2" in result.failed and "cloud-1" not in result.failed
    assert result.failed["cloud-2"] == (
        "delay_edge-1a <= 100 ms: RTT to edge-1a unknown (never measured)"
    )
    lenient = run(state_with(), {"delay_edge-1a": "100"}, unknownPasses=True)
    assert passing(lenient) == list(NODES)


def test_a_stale_matrix_expires() -> None:
    state = state_with()
    assert passing(run(state, {"delay_edge-1a": "20"}, now_s=NOW_S + 200.0)) == [
        *EDGE_1, *EDGE_2,
    ]  # fmt: skip
    # 300 s after the measurement nothing is known any more: every node but edge-1a fails.
    late = run(state, {"delay_edge-1a": "20"}, now_s=NOW_S + 300.0)
    assert passing(late) == ["edge-1a"]
    assert late.failed["edge-1b"] == (
        "delay_edge-1a <= 20 ms: RTT to edge-1a unknown (last 1.0 ms, measured 360 s ago, "
        "more than maxAgeS 300 s)"
    )


def test_a_node_is_always_near_itself_even_without_measurements() -> None:
    state = state_with(links=())
    result = run(state, {"delay_cloud-2": "1"})
    assert passing(result) == ["cloud-2"]


def test_several_constraints_must_all_hold() -> None:
    result = run(state_with(), {"delay_edge-1a": "20", "delay_cloud-1": "40"})
    assert passing(result) == ["edge-2a"]
    assert result.failed["edge-1a"].startswith("delay_cloud-1 <= 40 ms: RTT to cloud-1 is 42.0")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("fast", 'label delay_edge-1a="fast": not a number of milliseconds'),
        ("25ms", 'label delay_edge-1a="25ms": not a number of milliseconds'),
        ("", 'label delay_edge-1a="": not a number of milliseconds'),
        ("-3", 'label delay_edge-1a="-3": not a number of milliseconds'),
    ],
)
def test_a_malformed_label_fails_every_node_with_a_reason(value: str, problem: str) -> None:
    result = run(state_with(), {"delay_edge-1a": value})
    assert passing(result) == []
    assert all(reason.startswith(problem) for reason in result.failed.values())


def test_a_label_naming_nothing_fails_every_node_with_a_reason() -> None:
    result = run(state_with(), {"delay_": "5"})
    assert set(result.failed.values()) == {'label delay_="5": names no node or pod after delay_'}
    unknown = run(state_with(), {"delay_nowhere": "5"})
    assert set(unknown.failed.values()) == {
        "delay_nowhere <= 5 ms: no node named nowhere and no running pod named nowhere* "
        "in namespace default"
    }


def test_pod_prefix_origins_resolve_to_the_nodes_running_those_pods() -> None:
    pods = (
        PodPlacement("default", "camera-7f9c-x2v", "edge-1a"),
        PodPlacement("default", "camera-7f9c-k8q", "edge-2a"),
        PodPlacement("other", "camera-0000-aaa", "cloud-2"),  # another namespace
        PodPlacement("default", "cameraman", "cloud-1"),  # does not start with "camera-"
    )
    state = state_with(pods=pods)
    # Near any one of them (as pod affinity): within 2 ms of edge-1a or of edge-2a.
    result = run(state, {"delay_camera-": "2"})
    assert passing(result) == ["edge-1a", "edge-1b", "edge-2a"]
    assert result.failed["cloud-1"] == (
        "delay_camera- <= 2 ms: RTT to edge-2a, the nearest node running pods camera-* "
        "(2 pods) is 35.0 ms (measured 60 s ago)"
    )
    # Near every one of them: within 20 ms of both edge-1a and edge-2a.
    every = run(state, {"delay_camera-": "20"}, sourcePodsMatch="all")
    assert passing(every) == ["edge-1a", "edge-1b", "edge-2a"]
    every = run(state, {"delay_camera-": "10"}, sourcePodsMatch="all")
    assert passing(every) == []
    assert every.failed["edge-1b"].startswith(
        "delay_camera- <= 10 ms: RTT to edge-2a, the farthest node running pods camera-* "
        "(2 pods) is 19.0 ms"
    )
    # In every namespace, the other namespace's camera counts too.
    anywhere = run(state, {"delay_camera-": "0"}, sourcePodsInAllNamespaces=True)
    assert passing(anywhere) == ["edge-1a", "edge-2a", "cloud-2"]


def test_the_score_prefers_lower_rtt_only_when_weighted() -> None:
    state = state_with()
    chosen = profile(score_weight=1.0)
    view = state.view(NOW_S)
    result = assess(view, None, list(NODES), 0.5, chosen, now_s=NOW_S, telemetry_ttl_s=None,
                    pod=pod({"delay_edge-2a": "40"}))  # fmt: skip
    points = dict(zip(result.names, result.points("Delay").tolist(), strict=True))
    assert points["edge-2a"] == 10.0
    assert points["edge-1a"] == pytest.approx(10 * (1 - 18 / 40))
    assert points["cloud-1"] == pytest.approx(10 * (1 - 35 / 40))
    assert points["cloud-2"] == 0.0  # unknown never looks best
    unconstrained = assess(view, None, list(NODES), 0.5, chosen, now_s=NOW_S,
                           telemetry_ttl_s=None, pod=pod({}))  # fmt: skip
    assert unconstrained.points("Delay").tolist() == [0.0] * len(NODES)
    assert profile().weights["Delay"] == 0.0  # shipped weight: power decides


def test_cloud_preference_steers_only_pods_without_constraints() -> None:
    chosen = build_profile(
        {"plugins": {"score": {"enabled": [{"name": "CloudPreference", "weight": 1.0}]}}}
    )
    view = state_with().view(NOW_S)

    def points(labels: dict[str, str]) -> list[float]:
        result = assess(view, None, list(NODES), 0.5, chosen, now_s=NOW_S,
                        telemetry_ttl_s=None, pod=pod(labels))  # fmt: skip
        return result.points("CloudPreference").tolist()

    assert points({}) == [0.0, 0.0, 0.0, 10.0, 10.0]
    assert points({"delay_edge-1a": "5"}) == [0.0] * 5
    with pytest.raises(ProfileError, match="nodeSelector must be key=value"):
        build_profile(
            {
                "plugins": {"score": {"enabled": [{"name": "CloudPreference"}]}},
                "pluginConfig": [{"name": "CloudPreference", "args": {"nodeSelector": "cloud"}}],
            }
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"quantile": 1.5}, "quantile must be between 0 and 1"),
        ({"window": "five minutes"}, "window must be a Prometheus duration"),
        ({"bucketEstimate": "guess"}, "bucketEstimate must be one of interpolate, upper"),
        ({"confidence": 1.0}, "confidence must be in"),
        ({"sourcePodsMatch": "most"}, "sourcePodsMatch must be one of any, all"),
        ({"maxAgeS": 0}, "maxAgeS must be a positive number"),
        ({"unknownPasses": "yes"}, "must be true or false"),
    ],
)
def test_bad_arguments_are_refused_naming_the_key(args: dict, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        profile(args)


def test_constraints_are_read_from_labels_only() -> None:
    assert delay_constraints(None) == []
    assert delay_constraints({"metadata": {"labels": None}}) == []
    (constraint,) = delay_constraints(pod({"app": "x", "delay_edge-1a": " 12.5 "}))
    assert (constraint.origin, constraint.limit_ms, constraint.problem) == ("edge-1a", 12.5, None)


# ---- pod-prefix origins from the real watch -----------------------------------------------------


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for: {what}")
        time.sleep(0.02)


def test_the_kubernetes_watch_publishes_where_pods_run(
    control_plane: ControlPlane, node_agent: NodeAgent, namespace: str
) -> None:
    # The cluster is shared with other tests: this test's nodes carry its namespace's name,
    # and only its own pods and nodes are looked at.
    named = {name: f"{namespace}-{name}" for name in NODES}
    for name in NODES:
        node_agent.add_node(named[name], cpu=16)
    names = [named[name] for name in NODES]
    links = tuple((named[a], named[b], ms) for a, b, ms in MEASURED)
    state = state_with(links)
    chosen = profile()
    core = kubernetes.client.CoreV1Api(control_plane.api_client())

    def passing_near_camera() -> list[str]:
        request = pod({"delay_camera-": "2"}, namespace)
        return passing(assess(state.view(NOW_S), None, names, 0.5, chosen, now_s=NOW_S,
                              telemetry_ttl_s=None, pod=request))  # fmt: skip

    def cameras() -> list[PodPlacement]:
        index = state.view(NOW_S).signal(PODS_SIGNAL)
        return [] if index is None else index.with_prefix("camera-", namespace)

    # A scheduler nobody runs: the pod stays pending until the test binds it.
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "camera-1"},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
    })  # fmt: skip
    watcher = ClusterWatcher(
        kubernetes.client.CoreV1Api(
            control_plane.api_client(
                control_plane.service_account_kubeconfig("power-aware-scheduler", "power-extender")
            )
        ),
        state,
        resync_backoff_s=0.05,
        watch_timeout_s=2,
    )
    watcher.start()
    try:
        wait_until(lambda: watcher.healthy, "the watch to sync")
        wait_until(lambda: set(names) <= {n.name for n in state.node_infos()}, "the nodes")
        # A pending pod runs nowhere yet: the constraint cannot be met.
        assert passing_near_camera() == []
        binding = {"target": {"kind": "Node", "name": named["edge-2a"]},
                   "metadata": {"name": "camera-1"}}  # fmt: skip
        # The client cannot decode the Binding API's answer (a Status): take it raw.
        core.create_namespaced_binding(namespace, binding, _preload_content=False)
        wait_until(lambda: len(cameras()) == 1, "the bound pod")
        assert passing_near_camera() == [named["edge-2a"]]
        # The node agent, as a kubelet, reports the pod's IP.
        wait_until(lambda: core.read_namespaced_pod("camera-1", namespace).status.pod_ip, "an IP")
        pod_ip = core.read_namespaced_pod("camera-1", namespace).status.pod_ip
        wait_until(lambda: cameras()[0].pod_ip == pod_ip, "the pod IP")
        core.delete_namespaced_pod("camera-1", namespace)
        wait_until(lambda: len(cameras()) == 0, "the pod gone")
        assert passing_near_camera() == []
        cloud = core.read_node(named["cloud-1"])
        assert {n.name: n.addresses for n in state.node_infos()}[named["cloud-1"]] == tuple(
            address.address for address in cloud.status.addresses
        )
    finally:
        watcher.stop()


# ---- the whole service: /explain shows the RTTs -------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def service_files(tmp_path: Path) -> tuple[Path, Path]:
    snapshot = write_snapshot(
        tmp_path / "cluster.json",
        [
            {"name": name, "allocatable_cpu": 16,
             "labels": {"kubernetes.io/role": "cloud"} if name in CLOUD else {},
             "telemetry": {"cpu_util": 0.3, "ambient_temp_c": 22.0, "cpu1_temp_c": 50.0}}
            for name in NODES
        ],
    )  # fmt: skip
    rtt_file = write(
        tmp_path / "rtt.yaml",
        """
        nodes: [edge-1a, edge-1b, edge-2a, cloud-1]
        rttMs:
          - [0, 1, 18, 42]
          - [1, 0, 19, 43]
          - [18, 19, 0, 35]
          - [42, 43, 35, 0]
        """,
    )
    config = write(
        tmp_path / "profile.yaml",
        f"""
        plugins:
          filter: {{enabled: [{{name: Delay}}]}}
          score: {{enabled: [{{name: Delay, weight: 0}}, {{name: CloudPreference, weight: 0.3}}]}}
        pluginConfig:
          - name: Delay
            args: {{rttFile: {rtt_file}}}
        """,
    )
    return snapshot, config


def request(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "Pod": {
            "metadata": {"name": "app-1", "namespace": "default", "uid": "u1", "labels": labels},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        },
        "Nodes": None,
        "NodeNames": list(NODES),
    }


def test_explain_filter_and_status_over_http(tmp_path: Path) -> None:
    snapshot, config = service_files(tmp_path)
    bundle = DEFAULT_BUNDLE_DIR
    with (
        extender_service(bundle, cluster_file=snapshot, config_file=config) as (url, runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        body = request({"delay_edge-1a": "20"})
        failed = client.post("/filter", json=body).json()["FailedNodes"]
        assert set(failed) == {"cloud-1", "cloud-2"}
        assert failed["cloud-1"].startswith("delay_edge-1a <= 20 ms: RTT to edge-1a is 42.0 ms")
        assert (
            failed["cloud-2"] == "delay_edge-1a <= 20 ms: RTT to edge-1a unknown (never measured)"
        )
        rows = {row["node"]: row for row in client.post("/explain", json=body).json()["nodes"]}
        assert rows["edge-2a"]["delay"]["delay_edge-1a"] == {
            "limit_ms": 20.0, "rtt_ms": 18.0, "age_s": pytest.approx(
                time.time() - config.parent.joinpath("rtt.yaml").stat().st_mtime, abs=30),
            "to": "edge-1a", "known": True, "passes": True,
        }  # fmt: skip
        assert rows["cloud-1"]["delay"]["delay_edge-1a"]["rtt_ms"] == 42.0
        assert rows["cloud-1"]["passes"] is False
        assert rows["cloud-2"]["delay"]["delay_edge-1a"]["rtt_ms"] is None
        assert rows["cloud-1"]["cloud_node"] is True
        # Without constraints: no delay fields, and the cloud nodes get CloudPreference's points.
        plain = {
            row["node"]: row for row in client.post("/explain", json=request({})).json()["nodes"]
        }
        assert "delay" not in plain["edge-1a"]
        assert plain["cloud-1"]["plugins"]["CloudPreference"]["points"] == 10.0
        status = client.get("/status").json()["plugins"]["Delay"]
        assert status["matrix"]["pairs_known"] == 6
        assert status["rtt_file"]["links"] == 12
        metrics = client.get("/metrics").text
        assert 'power_aware_extender_delay_rtt_pairs{state="known"} 6.0' in metrics
        assert isinstance(runtime.profile.plugin("Delay"), DelayPlugin)


def test_the_service_refuses_to_start_on_a_bad_rtt_file(tmp_path: Path) -> None:
    snapshot, config = service_files(tmp_path)
    (tmp_path / "rtt.yaml").write_text("nodes: [a, b]\nrttMs: [[0, 1]]\n")
    with (
        pytest.raises(RttFileError, match="rttMs has 1 rows for 2 nodes"),
        extender_service(DEFAULT_BUNDLE_DIR, cluster_file=snapshot,
                         config_file=config),
    ):  # fmt: skip
        pass


def test_without_any_rtt_source_the_service_says_what_to_configure(tmp_path: Path) -> None:
    snapshot, _ = service_files(tmp_path)
    config = write(tmp_path / "bare.yaml", "plugins: {filter: {enabled: [{name: Delay}]}}\n")
    with (
        pytest.raises(ValueError, match="no RTT source; give rttFile"),
        extender_service(DEFAULT_BUNDLE_DIR, cluster_file=snapshot,
                         config_file=config),
    ):  # fmt: skip
        pass


def uncomment_plugins(profile: str, names: set[str]) -> str:
    """The profile with the commented-out entries of `names` (and their lines below) enabled;
    the other commented plugins (Carbon, Consolidation...) stay commented."""
    out, block_indent = [], None
    for line in profile.splitlines():
        match = re.match(r"^(\s*)# (\s*)(.*)$", line)
        if match:
            indent = len(match.group(1)) + len(match.group(2))
            entry = re.match(r"- name: (\S+)", match.group(3))
            if entry:
                block_indent = indent if entry.group(1) in names else None
            elif block_indent is not None and indent <= block_indent:
                block_indent = None
            if block_indent is not None:
                out.append(match.group(1) + match.group(2) + match.group(3))
                continue
        else:
            block_indent = None
        out.append(line)
    return "\n".join(out) + "\n"


def test_the_shipped_profile_s_commented_delay_block_enables_when_uncommented() -> None:
    configmap = find_object("ConfigMap", "power-extender-config", "power-aware-scheduler")
    text = uncomment_plugins(configmap["data"]["profile.yaml"], {"Delay", "CloudPreference"})
    enabled = build_profile(yaml.safe_load(text))
    assert [p.name for p in enabled.filters] == ["EnergyLevel", "PowerCap", "PowerState", "Delay"]
    assert enabled.weights == {
        "PowerIncrease": 0.6, "EnergyLevel": 0.4, "Delay": 0.0, "CloudPreference": 0.2,
    }  # fmt: skip
    delay = enabled.plugin("Delay")
    assert delay.args.rtt_file == "/etc/power-aware-scheduler-rtt/rtt.yaml"
    assert delay.args.confidence == 0.95
    deployment = find_object("Deployment", "power-extender", "power-aware-scheduler")
    mounts = deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {
        "name": "rtt",
        "mountPath": "/etc/power-aware-scheduler-rtt",
        "readOnly": True,
    } in mounts
