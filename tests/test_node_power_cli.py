"""`python -m controllers.node_power`: its help, flags, one round, and its HTTP endpoints."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client import generate_latest

from controllers.node_power.carbon import CarbonSettings, NodeIntensity
from controllers.node_power.cli import build_parser, main, settings_from_args
from controllers.node_power.health import serve_health
from controllers.node_power.metrics import ControllerMetrics
from controllers.node_power.views import parse_rfc3339_s
from tests.support.bmc import RedfishEmulator
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.power_cluster import (
    make_kube,
    node,
    pod,
    settings,
    stamp,
    started_controller,
)


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
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = make_kube(
        [node("busy"), node("idle"), node("spare", state="off", unschedulable=True)],
        [pod("web-1", "busy", "12")],
    )
    try:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        common = [
            f"--kubeconfig={kubeconfig}",
            "--once",
            "--namespace=power-aware-scheduler",
            "--scale-down-unneeded-time=0",  # one round: nothing else is unneeded long enough
            "--node-cooldown=0",
            "--max-off-fraction=1",
            "--boot-time=0",  # no headroom for web-1, which "arrived" a moment ago
        ]
        code = main(common)
        assert code == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["apply"] is False
        assert summary["acted"] == []
        assert [a["node"] for a in summary["power_off"]] == ["idle"]
        assert {n["name"]: n["state"] for n in summary["nodes"]} == {
            "busy": "on",
            "idle": "on",
            "spare": "off",
        }
        assert not [r for r in kube.requests if r.method in ("PATCH", "POST", "PUT")]
        code = main([*common, "--apply"])
        assert code == 0
        assert json.loads(capsys.readouterr().out)["acted"] == ["power_off idle"]
        annotations = kube.get("nodes", "idle")["metadata"]["annotations"]
        assert annotations["power-aware-scheduler/power-state"] == "off"
        # Acting, it took the Lease and gave it back; while a controller holds it, it refuses.
        lease = kube.get("leases", "power-node-controller", "power-aware-scheduler")
        assert not lease["spec"].get("holderIdentity")
        kube.patch(
            "leases",
            "power-node-controller",
            {"spec": {"holderIdentity": "running-replica", "leaseDurationSeconds": 15}},
            "power-aware-scheduler",
        )
        assert main([*common, "--apply"]) == 1
        assert "held by running-replica" in capsys.readouterr().err
    finally:
        kube.stop()


def test_probes_metrics_and_status_over_http() -> None:
    kube = make_kube(
        [node("busy"), node("spare", state="off", unschedulable=True)], [pod("web-1", "busy", "12")]
    )
    controller = started_controller(kube, settings())
    server = serve_health(controller, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
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
        kube.failing = True
        try:
            assert controller.run_round(time.time()).error
        finally:
            kube.failing = False
        not_ready = requests.get(base + "/readyz", timeout=5)
        assert not_ready.status_code == 503 and "last round failed" in not_ready.text
    finally:
        server.shutdown()
        controller.stop()
        kube.stop()


def test_check_bmc_asks_each_nodes_bmc_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with RedfishEmulator(tmp_path / "redfish", ["rack-1"], auth=("admin", "bmc-pass")) as bmc:
        secret = tmp_path / "bmc"
        secret.mkdir()
        (secret / "rack-1").write_text(f"address: {bmc.url}\nusername: admin\npassword: bmc-pass\n")
        (secret / "rack-2").write_text(f"address: {bmc.url}\nusername: admin\npassword: wrong\n")
        kube = make_kube([node("rack-1", driver="redfish"), node("rack-2", driver="redfish")])
        try:
            kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
            common = [f"--kubeconfig={kubeconfig}", f"--bmc-secret-dir={secret}"]
            assert main([*common, "--check-bmc", "rack-1"]) == 0
            assert capsys.readouterr().out.strip() == f"rack-1: redfish ({bmc.url}): power on"
            assert main([*common, "--check-bmc", "rack-2", "--check-bmc", "rack-9"]) == 1
            out = capsys.readouterr().out
            assert "rack-2: FAILED (refused)" in out and "wrong" not in out
            assert "rack-9: FAILED (config): node rack-9: no such node" in out
            assert not [r for r in kube.requests if r.method in ("PATCH", "POST", "PUT")]
            assert bmc.power_state("rack-1") == "On"
        finally:
            kube.stop()


def test_rank_by_grams_reads_the_carbon_sources_and_powers_off_the_dirtiest_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two empty nodes: the efficient one sits in a coal-heavy zone, the hungry one on hydro.
    make_bundle(
        tmp_path / "bundle",
        {
            "busy": PowerCurveSpec(100.0, 300.0),
            "efficient-dirty": PowerCurveSpec(80.0, 250.0),
            "hungry-clean": PowerCurveSpec(120.0, 300.0),
        },
    )
    zones = {"busy": "hydro", "efficient-dirty": "coal", "hungry-clean": "hydro"}
    nodes = [node(name) for name in zones]
    for obj in nodes:
        obj["metadata"]["labels"]["topology.kubernetes.io/region"] = zones[obj["metadata"]["name"]]
    sources = tmp_path / "carbon-sources.yaml"
    intensities = tmp_path / "intensities.yaml"
    intensities.write_text(
        "intensities:\n  - {zone: coal, g_per_kwh: 700}\n  - {zone: hydro, g_per_kwh: 30}\n"
    )
    sources.write_text(f"sources:\n  - {{kind: file, name: site, path: {intensities}}}\n")
    kube = make_kube(nodes, [pod("web-1", "busy", "12")])
    try:
        common = [
            f"--kubeconfig={kube.write_kubeconfig(tmp_path / 'kubeconfig')}",
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
        assert [a["node"] for a in by_watts["power_off"]] == ["hungry-clean"]  # 7.5 W/core

        assert main([*common, "--rank-by=grams", f"--carbon-sources={sources}"]) == 0
        by_grams = json.loads(capsys.readouterr().out)
        assert [a["node"] for a in by_grams["power_off"]] == ["efficient-dirty"]
        assert "700 g CO2/kWh" in by_grams["power_off"][0]["reason"]
        assert {n["name"]: n["g_per_kwh"] for n in by_grams["nodes"]} == {
            "busy": 30.0,
            "efficient-dirty": 700.0,
            "hungry-clean": 30.0,
        }
    finally:
        kube.stop()


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
    assert main([f"--kubeconfig={tmp_path / 'none'}", f"--carbon-sources={sources}"]) == 2
    assert "--carbon-sources is read only with --rank-by grams" in capsys.readouterr().err


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
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now_s = time.time()
    two_hours_ago = now_s - 7200
    finished = pod("batch-1", "finished-recently", "2")
    finished["status"] = {
        "phase": "Succeeded",
        "startTime": stamp(now_s - 900),
        "containerStatuses": [
            {
                "name": "app",
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
    kube = make_kube(
        [
            node("busy", state="on", since_s=two_hours_ago),
            node("empty-for-long", state="on", since_s=two_hours_ago),
            node("pod-deleted-recently", state="on", since_s=two_hours_ago),
            node("finished-recently", state="on", since_s=two_hours_ago),
        ],
        [pod("web-1", "busy", "12"), finished],
    )
    # A pod deleted two minutes ago left no object, only its kubelet's Events.
    kube.create(
        "events",
        {
            "metadata": {"name": "gone-1.killing", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "gone-1", "namespace": "default"},
            "reason": "Killing",
            "message": "Stopping container app",
            "source": {"component": "kubelet", "host": "pod-deleted-recently"},
            "firstTimestamp": stamp(now_s - 130),
            "lastTimestamp": stamp(now_s - 120),
            "count": 1,
            "type": "Normal",
        },
        "default",
    )
    try:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        # Defaults: 10 min unneeded, 30 min cool-down; only no headroom for web-1 and batch-1,
        # which "arrived" a moment ago in the fake API server.
        code = main([f"--kubeconfig={kubeconfig}", "--once", "--boot-time=0"])
        out = capsys.readouterr().out
        assert code == 0, out
        summary = _strict_json(out)
        assert [a["node"] for a in summary["power_off"]] == ["empty-for-long"]
        assert summary["drain"] == []
        # Its clock starts an --event-ttl (1 h) back: Events older than that are gone, so
        # further back the evidence proves nothing.
        since = summary["unneeded_since"]
        assert abs(parse_rfc3339_s(since["empty-for-long"]) - (now_s - 3600)) < 120
        assert now_s - parse_rfc3339_s(since["pod-deleted-recently"]) < 180
        assert now_s - parse_rfc3339_s(since["finished-recently"]) < 240
        # No bundle: the idle watts are unknown, null in the JSON (NaN is not JSON).
        assert summary["power_off"][0]["watts"] is None
        assert {n["idle_w"] for n in summary["nodes"]} == {None}
        assert not [r for r in kube.requests if r.method in ("PATCH", "POST", "PUT")]
        # An unneeded time longer than the Events' retention can never be shown by evidence.
        code = main([f"--kubeconfig={kubeconfig}", "--once", "--boot-time=0", "--event-ttl=5m"])
        assert code == 0
        assert _strict_json(capsys.readouterr().out)["power_off"] == []
    finally:
        kube.stop()
