"""`python -m controllers.node_power`: its help, flags, one round, and its HTTP endpoints.

Rounds run on the real control plane (`control_plane`) as the controller's own ServiceAccount,
on nodes of `envtest.NodeAgent` (`PowerCluster`); an API server that fails is a `FaultProxy` in
front of the real one, cut.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import generate_latest

from controllers.node_power.carbon import CarbonSettings, NodeIntensity
from controllers.node_power.cli import (
    build_parser,
    carbon_settings_from_args,
    main,
    settings_from_args,
)
from controllers.node_power.controller import NodePowerController
from controllers.node_power.health import serve_health
from controllers.node_power.idle_power import IdlePower
from controllers.node_power.metrics import ControllerMetrics
from controllers.node_power.policy import PolicySettings
from controllers.node_power.views import parse_rfc3339_s
from envtest import ControlPlane
from tests.support.bmc import RedfishEmulator
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.fault_proxy import FaultProxy, kubeconfig_through
from tests.support.power_cluster import (
    CONTROLLER_ACCOUNT,
    NAMESPACE,
    PowerCluster,
    node,
    settings,
    stamp,
    started_controller,
    wait_until,
)

PREFIX = "power-aware-scheduler/"  # the controller's labels and annotations
LEASE = "power-node-controller"  # the one Lease the shipped Role grants the controller


@pytest.fixture
def cluster(control_plane: ControlPlane, namespace: str) -> Iterator[PowerCluster]:
    with PowerCluster(control_plane, namespace) as power_cluster:
        yield power_cluster


@pytest.fixture
def leases(kube_api: client.ApiClient) -> Iterator[client.CoordinationV1Api]:
    """The shipped Lease's API (admin), with no Lease left over before or after the test."""
    api = client.CoordinationV1Api(kube_api)

    def delete_lease() -> None:
        with contextlib.suppress(ApiException):
            api.delete_namespaced_lease(LEASE, NAMESPACE)

    delete_lease()
    yield api
    delete_lease()


@pytest.fixture
def kubeconfig(control_plane: ControlPlane, tmp_path: Path) -> Path:
    """The controller's own ServiceAccount: the manifests' RBAC is what it gets."""
    return control_plane.service_account_kubeconfig(
        *CONTROLLER_ACCOUNT, tmp_path / "controller.kubeconfig"
    )


def written(cluster: PowerCluster) -> dict[str, Any]:
    """What the controller writes: this test's nodes' power-aware-scheduler/ labels and
    annotations and their cordons, and its pods (an eviction is a pod gone). Others write to a
    node too (the node controllers: labels, taints; its kubelet: status)."""
    nodes = {}
    for name in cluster.agent.node_names:
        obj = cluster.node(cluster.short(name))
        metadata = obj["metadata"]
        ours = {
            key: value
            for key, value in {
                **(metadata.get("labels") or {}),
                **(metadata.get("annotations") or {}),
            }.items()
            if key.startswith(PREFIX)
        }
        nodes[name] = (ours, bool(obj["spec"].get("unschedulable")))
    return {"nodes": nodes, "pods": cluster.uids()}


def lease_exists(leases: client.CoordinationV1Api) -> bool:
    try:
        leases.read_namespaced_lease(LEASE, NAMESPACE)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def test_help_explains_the_safety_defaults() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "controllers.node_power", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for needle in (
        "--apply",
        "Dry run is the default",
        "power-aware-scheduler/power-management=enabled",
        "power-aware-scheduler/power-management-disabled",
        "--scale-down-unneeded-time",
        "--max-off-fraction",
        "--bmc-secret-dir",
        "--leader-elect",
        "--target-wait-p99-s",
    ):
        assert needle in text, needle


def test_flags_become_settings_with_autoscaler_names() -> None:
    args = build_parser().parse_args(
        [
            "--scale-down-unneeded-time=20m",
            "--scale-down-utilization-threshold=0.4",
            "--node-cooldown=1h",
            "--min-on-nodes=3",
            "--max-off-fraction=0.25",
            "--boot-time=4m",
            "--boot-energy-kj=30",
            "--off-margin-sd=1.5",
            "--target-wait-p99-s=30",
            "--arrival-windows=2m,12m",
            "--empty-nodes-only",
            "--namespace=power",
        ]
    )
    parsed = settings_from_args(args)
    assert not parsed.apply  # dry run unless asked
    policy = parsed.policy
    assert (policy.unneeded_time_s, policy.utilization_threshold) == (1200.0, 0.4)
    assert (policy.cooldown_s, policy.min_on_nodes, policy.max_off_fraction) == (3600.0, 3, 0.25)
    assert (policy.boot_s, policy.boot_energy_j, policy.consolidate) == (240.0, 30000.0, False)
    assert (policy.off_margin_sd, parsed.arrival_windows_s) == (1.5, (120.0, 720.0))
    assert policy.target_wait_p99_s == 30.0
    assert settings_from_args(build_parser().parse_args([])).policy.target_wait_p99_s == 0.0
    assert parsed.namespace == "power"
    assert parsed.actuator.default_driver == "dry-run"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-off-fraction=2"], "must be between 0 and 1"),
        (["--scan-interval=10x"], "--scan-interval: bad duration"),
        (["--default-driver=wol"], "invalid choice"),
        (["--arrival-windows=5m,0s"], "--arrival-windows: positive durations"),
        (["--off-margin-sd=-1"], "argument --off-margin-sd: must be >= 0"),
        (["--target-wait-p99-s=-5"], "argument --target-wait-p99-s: must be >= 0"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_inconsistent_leader_election_times_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--kubeconfig", str(tmp_path / "none"), "--leader-elect-renew-deadline=20s"])
    assert code == 2
    assert "renew deadline < lease duration" in capsys.readouterr().err


def test_once_prints_the_round_and_changes_nothing_without_apply(
    cluster: PowerCluster,
    leases: client.CoordinationV1Api,
    kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    busy, idle = cluster.add_node("busy"), cluster.add_node("idle")
    spare = cluster.add_node("spare", state="off", unschedulable=True)
    cluster.wait_ready("busy", "idle", "spare")
    cluster.deployment("web", "12", on="busy")
    before = written(cluster)
    common = [
        f"--kubeconfig={kubeconfig}",
        "--once",
        "--namespace=power-aware-scheduler",
        "--scale-down-unneeded-time=0",  # one round: nothing else is unneeded long enough
        "--node-cooldown=0",
        "--max-off-fraction=1",
        "--boot-time=0",  # no headroom for web's pod, which arrived a moment ago
    ]
    code = main(common)
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["apply"] is False
    assert summary["acted"] == []
    assert [a["node"] for a in summary["power_off"]] == [idle]
    assert {n["name"]: n["state"] for n in summary["nodes"]} == {
        busy: "on",
        idle: "on",
        spare: "off",
    }
    assert written(cluster) == before
    assert not lease_exists(leases)  # a dry run does not even take the Lease
    code = main([*common, "--apply"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["acted"] == [f"power_off {idle}"]
    assert cluster.state_of("idle")[0] == "off"
    # Acting, it took the Lease and gave it back; while a controller holds it, it refuses.
    assert not leases.read_namespaced_lease(LEASE, NAMESPACE).spec.holder_identity
    leases.patch_namespaced_lease(
        LEASE,
        NAMESPACE,
        {"spec": {"holderIdentity": "running-replica", "leaseDurationSeconds": 15}},
    )
    assert main([*common, "--apply"]) == 1
    assert "held by running-replica" in capsys.readouterr().err


def test_probes_metrics_and_status_over_http(
    control_plane: ControlPlane,
    cluster: PowerCluster,
    kubeconfig: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="controllers.node_power")
    cluster.add_node("busy")
    cluster.add_node("spare", state="off", unschedulable=True)
    cluster.wait_ready("busy", "spare")
    cluster.deployment("web", "12", on="busy")
    # The controller's way to the API server, which the test cuts.
    proxy = FaultProxy("127.0.0.1", int(control_plane.server.rsplit(":", 1)[1])).start()
    api = control_plane.api_client(
        kubeconfig_through(kubeconfig, proxy.port, tmp_path / "proxied.kubeconfig")
    )
    api.configuration.retries = 0
    controller = started_controller(api, settings(api_timeout_s=2.0))
    server = serve_health(controller, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        cluster.caught_up(controller)
        assert controller.run_round(time.time()).error is None
        assert requests.get(base + "/healthz", timeout=5).status_code == 200
        ready = requests.get(base + "/readyz", timeout=5)
        assert ready.status_code == 200 and "leader, applying" in ready.text
        metrics = requests.get(base + "/metrics", timeout=5).text
        assert 'power_aware_node_power_nodes{state="off"} 1.0' in metrics
        assert 'power_aware_node_power_nodes{state="on"} 1.0' in metrics
        assert "power_aware_node_power_wake_latency_seconds_bucket" in metrics
        assert "power_aware_node_power_leader 1.0" in metrics
        status = requests.get(base + "/status", timeout=5).json()
        assert status["apply"] is True and status["synced"] is True
        assert set(status["watches"]) == {"nodes", "pods", "poddisruptionbudgets"}
        assert all(w["synced"] and w["relists_total"] >= 1 for w in status["watches"].values())
        assert status["carbon"] is None  # ranking by watts: no carbon source
        assert requests.get(base + "/nope", timeout=5).status_code == 404
        proxy.cut()
        try:
            failed = [controller.run_round(time.time()).error for _ in range(2)]
        finally:
            proxy.resume()
        assert all(failed)
        not_ready = requests.get(base + "/readyz", timeout=5)
        assert not_ready.status_code == 503 and "last round failed" in not_ready.text
        # the cause logged once, not every round; and the round that succeeds again says so
        wait_until(lambda: controller.run_round(time.time()).error is None, what="a good round")
        messages = [r.getMessage() for r in caplog.records]
        recovered = [m for m in messages if m.startswith("round succeeded again after ")]
        assert len(recovered) == 1
        failed_rounds = int(recovered[0].split()[4])  # the two above, then until re-synced
        causes = [m for m in messages if m.startswith("round failed")]
        assert failed_rounds >= 2 and len(causes) == len(set(causes)) < failed_rounds
    finally:
        server.shutdown()
        controller.stop()
        proxy.stop()


def test_the_wait_target_learns_from_the_pods_and_shows_on_status_and_metrics(
    cluster: PowerCluster, kubeconfig: Path, control_plane: ControlPlane
) -> None:
    cluster.add_node("busy")
    cluster.add_node("spare", state="off", unschedulable=True)
    cluster.wait_ready("busy", "spare")
    # Three pods of 2 cores created and scheduled within one boot time: 6 cores of growth.
    cluster.deployment("web", "2", 3, on="busy")
    api = control_plane.api_client(kubeconfig)
    policy = replace(settings().policy, boot_s=300.0, target_wait_p99_s=30.0)
    controller = started_controller(api, settings(policy=policy, apply=False))
    server = serve_health(controller, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        cluster.caught_up(controller)
        result = controller.run_round(time.time())
        assert result.error is None and result.decisions is not None
        status = requests.get(base + "/status", timeout=5).json()["headroom"]
        assert status["target_wait_p99_s"] == 30.0
        assert status["learned_cores"] == pytest.approx(6.0)
        assert status["quantile"] == 0.5
        assert status["waits_in_window"] == 3  # each scheduled pod's creation -> scheduled
        assert status["observed_wait_p99_s"] is None  # too few pods to judge a p99
        assert result.decisions.headroom_cores >= 6.0  # the policy keeps the learned headroom
        metrics = requests.get(base + "/metrics", timeout=5).text
        assert "power_aware_node_power_learned_headroom_cores 6.0" in metrics
        assert "power_aware_node_power_headroom_quantile_ratio 0.5" in metrics
        assert "power_aware_node_power_pod_wait_p99_seconds NaN" in metrics
    finally:
        server.shutdown()
        controller.stop()


def test_without_a_wait_target_status_has_no_headroom_block(
    cluster: PowerCluster, kubeconfig: Path, control_plane: ControlPlane
) -> None:
    cluster.add_node("busy")
    cluster.wait_ready("busy")
    controller = started_controller(control_plane.api_client(kubeconfig), settings(apply=False))
    try:
        cluster.caught_up(controller)
        assert controller.run_round(time.time()).error is None
        assert controller.status()["headroom"] is None
        assert controller.learner is None
    finally:
        controller.stop()


def test_check_bmc_asks_each_nodes_bmc_and_changes_nothing(
    cluster: PowerCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rack_1, rack_2, rack_9 = (cluster.name(short) for short in ("rack-1", "rack-2", "rack-9"))
    with RedfishEmulator(tmp_path / "redfish", [rack_1], auth=("admin", "bmc-pass")) as bmc:
        secret = tmp_path / "bmc"
        secret.mkdir()
        (secret / rack_1).write_text(f"address: {bmc.url}\nusername: admin\npassword: bmc-pass\n")
        (secret / rack_2).write_text(f"address: {bmc.url}\nusername: admin\npassword: wrong\n")
        cluster.add_node("rack-1", driver="redfish")
        cluster.add_node("rack-2", driver="redfish")
        before = written(cluster)
        common = [f"--kubeconfig={kubeconfig}", f"--bmc-secret-dir={secret}"]
        assert main([*common, "--check-bmc", rack_1]) == 0
        assert capsys.readouterr().out.strip() == f"{rack_1}: redfish ({bmc.url}): power on"
        assert main([*common, "--check-bmc", rack_2, "--check-bmc", rack_9]) == 1
        out = capsys.readouterr().out
        assert f"{rack_2}: FAILED (refused)" in out and "wrong" not in out
        assert f"{rack_9}: FAILED (config): node {rack_9}: no such node" in out
        assert written(cluster) == before
        assert bmc.power_state(rack_1) == "On"


def test_rank_by_grams_reads_the_carbon_sources_and_powers_off_the_dirtiest_node(
    cluster: PowerCluster, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two empty nodes: the efficient one sits in a coal-heavy zone, the hungry one on hydro.
    busy, dirty, clean = (cluster.name(s) for s in ("busy", "efficient-dirty", "hungry-clean"))
    make_bundle(
        tmp_path / "bundle",
        {
            busy: PowerCurveSpec(100.0, 300.0),
            dirty: PowerCurveSpec(80.0, 250.0),
            clean: PowerCurveSpec(120.0, 300.0),
        },
    )
    zones = {"busy": "hydro", "efficient-dirty": "coal", "hungry-clean": "hydro"}
    for short, zone in zones.items():
        cluster.add_node(short)
        cluster.core.patch_node(
            cluster.name(short), {"metadata": {"labels": {"topology.kubernetes.io/region": zone}}}
        )
    cluster.wait_ready(*zones)
    cluster.deployment("web", "12", on="busy")
    sources = tmp_path / "carbon-sources.yaml"
    intensities = tmp_path / "intensities.yaml"
    intensities.write_text(
        "intensities:\n  - {zone: coal, g_per_kwh: 700}\n  - {zone: hydro, g_per_kwh: 30}\n"
    )
    sources.write_text(f"sources:\n  - {{kind: file, name: site, path: {intensities}}}\n")
    common = [
        f"--kubeconfig={kubeconfig}",
        "--once",
        "--namespace=power-aware-scheduler",
        f"--bundle={tmp_path / 'bundle'}",
        "--scale-down-unneeded-time=0",
        "--node-cooldown=0",
        "--boot-time=0",
        "--min-on-nodes=2",  # one of the two empty nodes goes off
    ]
    assert main(common) == 0
    by_watts = json.loads(capsys.readouterr().out)
    assert [a["node"] for a in by_watts["power_off"]] == [clean]  # 7.5 W/core

    # Sources given: grams is the default ranking, over the next 4 h (no forecast here: the
    # current values hold throughout).
    assert main([*common, f"--carbon-sources={sources}"]) == 0
    by_grams = json.loads(capsys.readouterr().out)
    assert (by_grams["rank_by"], by_grams["carbon_horizon_s"]) == ("grams", 4 * 3600.0)
    assert [a["node"] for a in by_grams["power_off"]] == [dirty]
    assert "700 g CO2/kWh over the next 4 h" in by_grams["power_off"][0]["reason"]
    assert {n["name"]: n["g_per_kwh"] for n in by_grams["nodes"]} == {
        busy: 30.0,
        dirty: 700.0,
        clean: 30.0,
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("sources: {kind: file}", "expected a list of sources"),
        ("- {kind: smoke-signals}", "--carbon-sources[0].kind: one of"),
        ("- {kind: file, path: x, colour: red}", "--carbon-sources[0].colour: unknown key"),
    ],
)
def test_bad_carbon_sources_exit_2_naming_the_entry(
    tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = tmp_path / "sources.yaml"
    sources.write_text(content)
    argv = [f"--kubeconfig={tmp_path / 'none'}", "--rank-by=grams", f"--carbon-sources={sources}"]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    # Without --rank-by the sources make it grams, and are read (and refused) the same way.
    assert main([f"--kubeconfig={tmp_path / 'none'}", f"--carbon-sources={sources}"]) == 2
    assert message in capsys.readouterr().err
    # An explicit --rank-by watts is kept, and sources beside it are a mistake.
    argv = [f"--kubeconfig={tmp_path / 'none'}", "--rank-by=watts", f"--carbon-sources={sources}"]
    assert main(argv) == 2
    assert "--carbon-sources is read only with --rank-by grams" in capsys.readouterr().err


def test_rank_by_defaults_to_grams_with_sources_and_the_horizon_to_four_hours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def policy(*argv: str) -> PolicySettings:
        return settings_from_args(build_parser().parse_args(list(argv))).policy

    (tmp_path / "sources.yaml").write_text("- {kind: file, path: /nowhere}\n")
    sources = f"--carbon-sources={tmp_path / 'sources.yaml'}"
    assert (policy().rank_by, policy().carbon_horizon_s) == ("watts", 4 * 3600.0)
    assert policy(sources).rank_by == "grams"
    assert policy("--rank-by=grams").rank_by == "grams"  # own-supply annotations only
    assert policy(sources, "--rank-by=grams", "--carbon-horizon=90m").carbon_horizon_s == 5400.0
    assert policy(sources, "--carbon-horizon=0").carbon_horizon_s == 0.0
    parsed = build_parser().parse_args([sources, "--carbon-horizon=2h"])
    assert carbon_settings_from_args(parsed).horizon_s == 7200.0
    for bad in ("soon", "-1h"):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([f"--carbon-horizon={bad}"])
        assert exit_info.value.code == 2
        assert "--carbon-horizon" in capsys.readouterr().err
    help_text = " ".join(build_parser().format_help().split())  # unwrapped
    assert "--carbon-horizon" in help_text and "0: the present value only" in help_text
    assert "default: grams with --carbon-sources, watts without" in help_text


def test_status_metrics_and_logs_show_each_nodes_outlook_that_chose_it(
    control_plane: ControlPlane,
    cluster: PowerCluster,
    kubeconfig: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Two empty nodes of equal idle watts: one's zone is cleaner now (100 against 400 g/kWh)
    # but turns dirty for the next hours (700), the other's turns clean (50).
    busy, to_dirty, to_clean = (cluster.name(s) for s in ("busy", "to-dirty", "to-clean"))
    make_bundle(
        tmp_path / "bundle", {n: PowerCurveSpec(100.0, 300.0) for n in (busy, to_dirty, to_clean)}
    )
    now_s = time.time()
    zones = {"busy": ("steady", 300, 300), "to-dirty": ("dusk", 100, 700)}
    zones["to-clean"] = ("dawn", 400, 50)
    lines = ["intensities:"]
    for short, (zone, now_g, ahead_g) in zones.items():
        cluster.add_node(short)
        cluster.core.patch_node(
            cluster.name(short), {"metadata": {"labels": {"topology.kubernetes.io/region": zone}}}
        )
        lines.append(
            f"  - {{zone: {zone}, g_per_kwh: {now_g}, observed_at: '{stamp(now_s)}', forecast: "
            f"[{{start: '{stamp(now_s)}', end: '{stamp(now_s + 3600)}', g_per_kwh: {now_g}}}, "
            f"{{start: '{stamp(now_s + 3600)}', end: '{stamp(now_s + 5 * 3600)}', "
            f"g_per_kwh: {ahead_g}}}]}}"
        )
    cluster.wait_ready(*zones)
    cluster.deployment("web", "12", on="busy")
    (tmp_path / "intensities.yaml").write_text("\n".join(lines) + "\n")
    policy = PolicySettings(
        unneeded_time_s=0.0,
        cooldown_s=0.0,
        min_on_nodes=2,
        boot_s=0.0,
        rank_by="grams",
        carbon_horizon_s=4 * 3600.0,
    )
    api = control_plane.api_client(kubeconfig)
    metrics = ControllerMetrics()
    source = {"kind": "file", "name": "site", "path": str(tmp_path / "intensities.yaml")}
    carbon = NodeIntensity(
        CarbonSettings(sources=(source,), horizon_s=4 * 3600.0),
        lambda: controller.nodes.items(),
        registry=metrics.registry,
    )
    controller = NodePowerController(
        settings(policy=policy, apply=False),
        api,
        idle_power=IdlePower(tmp_path / "bundle"),
        carbon=carbon,
        metrics=metrics,
    )
    controller.start()
    server = serve_health(controller, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        wait_until(lambda: controller.synced, what="caches synced")
        cluster.caught_up(controller)
        carbon.poll_once()
        caplog.set_level(logging.INFO, logger="controllers.node_power")
        result = controller.run_round(time.time())
        assert result.error is None and result.decisions is not None
        # Now to-clean is the dirtier; over the next 4 h to-dirty is: ~550 against ~137.
        assert [a.node for a in result.decisions.power_off] == [to_dirty]
        status = requests.get(base + "/status", timeout=5).json()["carbon"]
        assert status["horizon_s"] == 4 * 3600.0
        outlook = {n: v["outlook_g_per_kwh"] for n, v in status["nodes"].items()}
        assert outlook[to_dirty] == pytest.approx(550.0, abs=1.0)
        assert outlook[to_clean] == pytest.approx(137.5, abs=1.0)
        assert outlook[busy] == pytest.approx(300.0)
        assert status["nodes"][to_dirty]["zone"] == "dusk"
        text = requests.get(base + "/metrics", timeout=5).text
        assert "power_aware_node_power_carbon_outlook_horizon_seconds 14400.0" in text
        gauge = f'power_aware_node_power_carbon_node_outlook_g_per_kwh{{node="{to_dirty}"}} 55'
        assert gauge in text
        (record,) = [r for r in caplog.records if getattr(r, "node", None) == to_dirty]
        assert record.getMessage().startswith(f"would power off node {to_dirty}")
        assert "g CO2/kWh over the next 4 h" in record.getMessage()
        assert record.carbon_outlook_g_per_kwh == pytest.approx(550.0, abs=1.0)
        assert record.carbon_horizon_s == 4 * 3600.0
    finally:
        server.shutdown()
        controller.stop()


def test_the_policy_and_the_carbon_source_must_agree_on_the_horizon() -> None:
    carbon = NodeIntensity(CarbonSettings(horizon_s=4 * 3600.0), list)
    policy = PolicySettings(rank_by="grams", carbon_horizon_s=0.0)
    with pytest.raises(ValueError, match="one --carbon-horizon sets both"):
        NodePowerController(settings(policy=policy), client.ApiClient(), carbon=carbon)
    agreed = replace(policy, carbon_horizon_s=4 * 3600.0)
    controller = NodePowerController(settings(policy=agreed), client.ApiClient(), carbon=carbon)
    assert controller.carbon is carbon


def test_the_controllers_carbon_source_reports_on_its_metrics(tmp_path: Path) -> None:
    intensities = tmp_path / "intensities.yaml"
    intensities.write_text("intensities:\n  - {zone: coal, g_per_kwh: 700}\n")
    metrics = ControllerMetrics()
    nodes = [node("a")]
    nodes[0]["metadata"]["labels"]["power-aware-scheduler/carbon-zone"] = "coal"
    carbon = NodeIntensity(
        CarbonSettings(sources=({"kind": "file", "name": "site", "path": str(intensities)},)),
        lambda: nodes,
        registry=metrics.registry,
    )
    carbon.poll_once()
    assert carbon.g_per_kwh(nodes, time.time()) == {"a": 700.0}
    assert carbon.status()["sources"]["site"]["zones"] == ["coal"]
    text = generate_latest(metrics.registry).decode()
    labels = 'signal="average",source="site",zone="coal"'
    assert f"power_aware_node_power_carbon_intensity_g_per_kwh{{{labels}}} 700.0" in text
    assert (
        'power_aware_node_power_carbon_source_polls_total{outcome="success",source="site"} 1.0'
        in text
    )


def _strict_json(text: str) -> dict:
    """JSON as any strict parser reads it: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_once_at_defaults_powers_off_only_the_node_the_evidence_shows_empty_for_long(
    cluster: PowerCluster, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now_s = time.time()
    two_hours_ago = now_s - 7200
    shorts = ("busy", "empty-for-long", "pod-deleted-recently", "finished-recently")
    for short in shorts:
        cluster.add_node(short, state="on", since_s=two_hours_ago)
    cluster.wait_ready(*shorts)
    cluster.deployment("web", "12", on="busy")
    # A batch pod that ran on finished-recently and ended three minutes ago, as its kubelet
    # wrote it (the agent runs it; the test writes its end).
    cluster.core.create_namespaced_pod(
        cluster.namespace,
        {
            "metadata": {"name": "batch-1", "labels": {"app": "batch"}},
            "spec": {
                "nodeName": cluster.name("finished-recently"),
                "restartPolicy": "Never",
                "containers": [
                    {"name": "app", "image": "app", "resources": {"requests": {"cpu": "2"}}}
                ],
            },
        },
    )
    wait_until(lambda: cluster.running("batch"), 30, "batch-1 running")
    pod = cluster.pods("batch")[0]
    pod["status"] = {
        "phase": "Succeeded",
        "startTime": stamp(now_s - 900),
        "containerStatuses": [
            {
                "name": "app",
                "image": "app",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "startedAt": stamp(now_s - 900),
                        "finishedAt": stamp(now_s - 180),
                    }
                },
            }
        ],
    }
    cluster.core.replace_namespaced_pod_status("batch-1", cluster.namespace, pod)
    # A pod deleted two minutes ago left no object, only its kubelet's Events.
    cluster.core.create_namespaced_event(
        cluster.namespace,
        {
            "metadata": {"name": "gone-1.killing"},
            "involvedObject": {"kind": "Pod", "name": "gone-1", "namespace": cluster.namespace},
            "reason": "Killing",
            "message": "Stopping container app",
            "source": {"component": "kubelet", "host": cluster.name("pod-deleted-recently")},
            "firstTimestamp": stamp(now_s - 130),
            "lastTimestamp": stamp(now_s - 120),
            "count": 1,
            "type": "Normal",
        },
    )
    try:
        before = written(cluster)
        # Defaults: 10 min unneeded, 30 min cool-down; only no headroom for web's and batch's
        # pods, which arrived a moment ago.
        code = main([f"--kubeconfig={kubeconfig}", "--once", "--boot-time=0"])
        out = capsys.readouterr().out
        assert code == 0, out
        summary = _strict_json(out)
        assert [a["node"] for a in summary["power_off"]] == [cluster.name("empty-for-long")]
        assert summary["drain"] == []
        # Its clock starts an --event-ttl (1 h) back: Events older than that are gone, so
        # further back the evidence proves nothing.
        since = summary["unneeded_since"]
        assert abs(parse_rfc3339_s(since[cluster.name("empty-for-long")]) - (now_s - 3600)) < 120
        assert now_s - parse_rfc3339_s(since[cluster.name("pod-deleted-recently")]) < 180
        assert now_s - parse_rfc3339_s(since[cluster.name("finished-recently")]) < 240
        # No bundle: the idle watts are unknown, null in the JSON (NaN is not JSON).
        assert summary["power_off"][0]["watts"] is None
        assert {n["idle_w"] for n in summary["nodes"]} == {None}
        assert written(cluster) == before
        # An unneeded time longer than the Events' retention can never be shown by evidence.
        code = main([f"--kubeconfig={kubeconfig}", "--once", "--boot-time=0", "--event-ttl=5m"])
        assert code == 0
        assert _strict_json(capsys.readouterr().out)["power_off"] == []
    finally:
        # A bare pod that ended stays until deleted: PowerCluster.close waits for none left.
        cluster.core.delete_namespaced_pod("batch-1", cluster.namespace, grace_period_seconds=0)
