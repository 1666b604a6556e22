"""The Reward plugin in the running service: scores, filter reasons, /explain, /status and
/metrics, from outcomes fed to its source as the pod watch would."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from bench.support import pods
from extender.config import DEFAULT_BUNDLE_DIR
from extender.profile import ProfileError, build_profile
from extender.rewards.source import RewardSource
from extender.runtime import Runtime
from tests.support.manifests import find_object
from tests.support.server import REPO_ROOT, extender_service

NODES = [f"node-{i:02d}" for i in (1, 2, 3, 4, 7, 10, 12)]
HASH = "6f8b9c7d54"
PROFILE = textwrap.dedent(
    """
    apiVersion: power-aware-scheduler/v1alpha1
    kind: ExtenderConfiguration
    plugins:
      filter:
        enabled: [{name: Reward}]
      score:
        enabled: [{name: Reward, weight: 0.5}]
    pluginConfig:
      - name: Reward
        args: {halfLifeS: 7200, filterMinEvidence: 5, filterThreshold: 0.3}
    """
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Runtime]]:
    profile = tmp_path_factory.mktemp("reward") / "profile.yaml"
    profile.write_text(PROFILE)
    with extender_service(DEFAULT_BUNDLE_DIR, config_file=profile) as running:
        yield running


def source_of(runtime: Runtime) -> RewardSource:
    source = runtime.profile.plugin("Reward").source
    assert isinstance(source, RewardSource)
    return source


def request_pod(deployment: str, name: str) -> dict:
    metadata = pods.deployment_pod_metadata(name, f"uid-{name}", deployment, HASH, "shop")
    return {
        "metadata": metadata,
        "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "500m"}}}]},
    }


def crash_on(source: RewardSource, node: str, deployment: str, restarts: int, pod: str) -> None:
    """A pod of `deployment` bound to `node`, then crashing `restarts` times, via the watch API."""
    now_s = time.time()
    metadata = pods.deployment_pod_metadata(pod, f"uid-{pod}", deployment, HASH, "shop")
    bound = pods.bound_pod(metadata, node, at_s=now_s - 600)
    source.pod_event("ADDED", bound)
    source.pod_event("MODIFIED", pods.running_pod(bound, started_at_s=now_s - 590))
    looping = pods.crash_looping_pod(
        bound,
        restarts=restarts,
        reason="Error",
        exit_code=1,
        finished_at_s=now_s - 5,
        started_at_s=now_s - 10,
    )
    source.pod_event("MODIFIED", looping)


def explain(url: str, pod: dict, names: list[str]) -> dict[str, dict]:
    body = {"Pod": pod, "Nodes": None, "NodeNames": names}
    answer = httpx.post(f"{url}/explain", json=body, timeout=10).json()
    return {row["node"]: row for row in answer["nodes"]}


def test_a_node_that_crashes_a_workload_loses_points_for_it_only(
    service: tuple[str, Runtime],
) -> None:
    url, runtime = service
    source = source_of(runtime)
    crash_on(source, "node-03", "web", restarts=8, pod="web-6f8b9c7d54-aaaaa")
    source.run_once(force_publish=True)

    rows = explain(url, request_pod("web", "web-6f8b9c7d54-new01"), NODES)
    bad = rows["node-03"]
    assert bad["workload"] == "shop/Deployment/web"
    assert bad["reward"] < 0.3 and bad["reward_bad"] == pytest.approx(8.0, rel=1e-3)
    assert bad["reward_evidence"] == pytest.approx(bad["reward_good"] + bad["reward_bad"])
    entry = bad["plugins"]["Reward"]
    assert entry["points"] == pytest.approx(10 * bad["reward"], abs=1e-3)
    assert entry["contribution"] == pytest.approx(0.5 * entry["points"] / 1.5)
    for node in NODES:
        if node != "node-03":
            assert rows[node]["reward"] == 1.0 and rows[node]["reward_evidence"] == 0.0

    # Another workload on the same node: hardly touched (the node's evidence is a weak prior).
    other = explain(url, request_pod("api", "api-6f8b9c7d54-new01"), NODES)["node-03"]
    assert other["workload"] == "shop/Deployment/api"
    assert other["reward"] > 0.8 > 0.3 > bad["reward"]
    assert other["reward_bad"] == 0.0 and other["reward_node"] < 0.3


def test_the_filter_fails_the_bad_node_with_a_reason_but_never_every_node(
    service: tuple[str, Runtime],
) -> None:
    url, runtime = service
    source = source_of(runtime)
    crash_on(source, "node-04", "cart", restarts=9, pod="cart-6f8b9c7d54-aaaaa")
    source.run_once(force_publish=True)
    cart = request_pod("cart", "cart-6f8b9c7d54-new02")

    answer = httpx.post(
        f"{url}/filter", json={"Pod": cart, "Nodes": None, "NodeNames": NODES}, timeout=10
    ).json()
    assert "node-04" not in answer["NodeNames"]
    reason = answer["FailedNodes"]["node-04"]
    assert "shop/Deployment/cart" in reason and "9.0 failed" in reason and "<= 0.3" in reason
    assert "node-04" in answer.get("FailedAndUnresolvableNodes", {})
    # Other workloads pass there.
    api = request_pod("api", "api-6f8b9c7d54-new02")
    answer = httpx.post(
        f"{url}/filter", json={"Pod": api, "Nodes": None, "NodeNames": NODES}, timeout=10
    ).json()
    assert "node-04" in answer["NodeNames"]
    # When every candidate would fail, none does: the workload is failing, not the nodes.
    crash_on(source, "node-10", "cart", restarts=9, pod="cart-6f8b9c7d54-bbbbb")
    source.run_once(force_publish=True)
    answer = httpx.post(
        f"{url}/filter",
        json={"Pod": cart, "Nodes": None, "NodeNames": ["node-04", "node-10"]},
        timeout=10,
    ).json()
    assert answer["NodeNames"] == ["node-04", "node-10"] and not answer.get("FailedNodes")


def test_a_bad_node_is_probed_by_a_pod_or_two_at_a_time(service: tuple[str, Runtime]) -> None:
    url, runtime = service
    source = source_of(runtime)
    # Seven failures: the bound just clears the threshold, so the node may be tried again...
    crash_on(source, "node-12", "probe", restarts=7, pod="probe-6f8b9c7d54-aaaaa")
    source.run_once(force_publish=True)
    body = {"Pod": request_pod("probe", "probe-6f8b9c7d54-new03"), "Nodes": None}
    answer = httpx.post(f"{url}/filter", json={**body, "NodeNames": NODES}, timeout=10).json()
    assert "node-12" in answer["NodeNames"]
    # ... by a pod or two: placed there and not judged yet, they hold the next ones back.
    for probe in ("bbbbb", "ccccc"):
        name = f"probe-6f8b9c7d54-{probe}"
        metadata = pods.deployment_pod_metadata(name, f"uid-{name}", "probe", HASH, "shop")
        source.pod_event("ADDED", pods.bound_pod(metadata, "node-12", at_s=time.time()))
    source.run_once(force_publish=True)
    rows = explain(url, body["Pod"], NODES)
    assert rows["node-12"]["reward_in_flight"] == 2 and not rows["node-12"]["passes"]
    answer = httpx.post(f"{url}/filter", json={**body, "NodeNames": NODES}, timeout=10).json()
    assert "node-12" in answer["FailedNodes"]


def test_status_and_metrics_show_what_was_learned(service: tuple[str, Runtime]) -> None:
    url, runtime = service
    source = source_of(runtime)
    crash_on(source, "node-07", "shop-ui", restarts=2, pod="shop-ui-6f8b9c7d54-aaaaa")
    source.run_once(force_publish=True)
    status = httpx.get(f"{url}/status", timeout=10).json()["plugins"]["Reward"]
    assert status["learning_from"] == "nothing: no pod watch in demo mode"
    assert status["persistence"] == "off" and status["pairs"] >= 1
    assert status["outcomes"]["restart"] >= 2

    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert 'power_aware_extender_reward_outcomes_total{kind="restart",verdict="bad"}' in metrics
    line = next(
        m
        for m in metrics.splitlines()
        if m.startswith('power_aware_extender_reward_node{node="node-07"')
    )
    assert float(line.split()[-1]) < 0.5
    assert "power_aware_extender_reward_pairs " in metrics


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"halfLifeS": -1}, "halfLifeS must be a positive number"),
        ({"namespaces": "shop"}, "namespaces must be a list"),
        ({"filterThreshold": 2}, "filterThreshold must be 0..1"),
        ({"maxPairs": 0}, "maxPairs must be at least 1"),
        ({"exploration": -1}, "exploration must be >= 0"),
        ({"halfLife": 60}, "unknown argument of Reward"),
    ],
)
def test_bad_arguments_name_the_key(args: dict, message: str) -> None:
    document = {
        "plugins": {"score": {"enabled": [{"name": "Reward", "weight": 0.3}]}},
        "pluginConfig": [{"name": "Reward", "args": args}],
    }
    with pytest.raises(ProfileError, match=message):
        build_profile(document)


def test_the_shipped_profile_documents_reward_and_keeps_it_off() -> None:
    config = find_object("ConfigMap", "power-extender-config", "power-aware-scheduler")
    text = config["data"]["profile.yaml"]
    assert "name: Reward" in text
    profile = build_profile(yaml.safe_load(text))
    assert "Reward" not in {plugin.name for plugin in profile.plugins}


def test_the_reward_profile_in_the_operations_guide_builds() -> None:
    text = (REPO_ROOT / "docs" / "operations.md").read_text()
    block = text.split("<!-- reward-profile -->")[1].split("```yaml")[1].split("```")[0]
    profile = build_profile(yaml.safe_load(block))
    reward = profile.plugin("Reward")
    assert reward in profile.filters and "Reward" in profile.weights
