"""What the extender costs kube-scheduler: pods/s of a real scheduler with and without it.

A real control plane (envtest: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
v1.36 from KUBEBUILDER_ASSETS) holds N Nodes and M pods created before the scheduler starts, as
kube-scheduler's scheduler_perf measures it. Then, several rounds alternating:

- `no extender`: a kube-scheduler with the default plugins only;
- `extender`: the same scheduler with the extender entry the manifests ship (verbs, weight,
  `nodeCacheCapable`, `httpTimeout`, `ignorable`), calling the real extender (`python -m
  extender`, uvicorn) serving the shipped bundle on a snapshot of the same N nodes;
- `prioritize only`: that entry without its `filterVerb`, one round trip per pod instead of two;
- `protocol floor`: the prioritize-only entry calling `bench.support.floor_extender`, which
  parses the request and answers every candidate with score 0: what one Python HTTP round trip
  costs here with no scoring at all, so its throughput bounds any such extender's;
- `floor, both verbs`: the shipped entry (filter + prioritize) calling the same floor, which
  passes every candidate: the bound for an extender with the shipped entry's two round trips.

Throughput is pods/s from the first binding to the last, as seen by a watch on the pods. Both
schedulers get scheduler_perf's client rate limits (QPS and burst 5000): with kube-scheduler's
default of 50 QPS, binding calls alone cap a scheduler at about 50 pods/s whatever its plugins
cost, and the comparison would measure the rate limiter. Where the time goes is read from both
sides after each run: the scheduler's `scheduler_framework_extension_point_duration_seconds`
(per extension point) and `scheduler_scheduling_algorithm_duration_seconds`, and the
extender's `/metrics` (time per verb, server side).

    python -m bench.scheduler_throughput                       # 500 and 5000 nodes
    python -m bench.scheduler_throughput --nodes 500 --pods 1000 --rounds 3 --json out.json

Kubelets are not needed: pods stay Pending once bound, and no node controller runs (nodes
would otherwise go NotReady without heartbeats). Everything runs on this machine, the
extender and the scheduler sharing its cores, as they would share a control-plane node.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client
import numpy as np

from bench.support.floor_extender import run_floor_extender
from bench.support.server import run_extender, write_snapshot
from envtest import ControlPlane

SCHEDULER_NAME = "bench-scheduler"
NAMESPACE = "default"
# Only what the bench needs from kube-controller-manager: the `default` ServiceAccount pods use.
CONTROLLERS = "serviceaccount-controller,serviceaccount-token-controller,namespace-controller"
CLIENT_QPS = 5000  # scheduler_perf's (kube-scheduler's own default is 50): module docstring
# The shipped entry (filter + prioritize: two round trips per pod), and the same without its
# filter verb (one): what a profile whose filters only depend on the node costs, since the
# controllers' cordons and taints then filter for free in kube-scheduler (docs/operations.md).
# And the same round trips, one or both verbs, to an extender that decides nothing: the
# protocol's floor for each entry.
MODES = ("no extender", "extender", "prioritize only", "protocol floor", "floor, both verbs")
FLOOR_MODES = ("protocol floor", "floor, both verbs")


@dataclass
class Run:
    mode: str
    nodes: int
    pods: int
    round: int
    pods_per_s: float
    bound: int
    seconds: float
    # per extension point: mean ms per scheduling attempt (scheduler's own histogram)
    scheduler_ms: dict[str, float] = field(default_factory=dict)
    # per verb: mean ms per request, server side (extender's /metrics)
    extender_ms: dict[str, float] = field(default_factory=dict)


# ---- the cluster -----------------------------------------------------------------------------


def node_body(name: str) -> dict[str, Any]:
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def node_names(count: int) -> list[str]:
    return [f"node-{i:05d}" for i in range(count)]


def create_nodes(core: kubernetes.client.CoreV1Api, names: list[str]) -> None:
    def create(name: str) -> None:
        core.create_node(node_body(name))
        # The TaintNodesByCondition admission plugin taints every new Node not-ready; with no
        # node lifecycle controller running, lifting it is ours to do.
        core.patch_node(name, {"spec": {"taints": []}})

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, names))


def pod_body(name: str, rng: np.random.Generator) -> dict[str, Any]:
    cpu_m = int(rng.choice([100, 250, 500, 1000]))
    return {
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [
                {
                    "name": "app",
                    "image": "bench",
                    "resources": {"requests": {"cpu": f"{cpu_m}m", "memory": "128Mi"}},
                }
            ],
        },
    }


def pod_prefix(seed: int) -> str:
    return f"bench-{seed}-"


def create_pods(core: kubernetes.client.CoreV1Api, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    bodies = [pod_body(f"{pod_prefix(seed)}{i:05d}", rng) for i in range(count)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda body: core.create_namespaced_pod(NAMESPACE, body), bodies))


def delete_pods(core: kubernetes.client.CoreV1Api) -> None:
    core.delete_collection_namespaced_pod(
        NAMESPACE, label_selector="app=bench", grace_period_seconds=0
    )
    deadline = time.monotonic() + 120
    while core.list_namespaced_pod(NAMESPACE, label_selector="app=bench", limit=1).items:
        if time.monotonic() > deadline:
            raise RuntimeError("bench pods were not deleted within 120 s")
        time.sleep(0.5)


# ---- measuring ---------------------------------------------------------------------------------


BOUND_LINE = re.compile(
    r'^I\d{4} (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d\.\d+) .*"Successfully bound pod to node" '
    r'pod="(?P<pod>[^"]+)"'
)


def bindings(log: Path, prefix: str) -> dict[str, float]:
    """Pod -> time of day (s) the scheduler bound it, from its own log (`-v=2` logs each
    binding with microseconds): server-side times, no watch in between."""
    bound: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = BOUND_LINE.match(line)
        if match and match["pod"].startswith(prefix):
            bound[match["pod"]] = int(match["h"]) * 3600 + int(match["m"]) * 60 + float(match["s"])
    return bound


def wait_for_bindings(log: Path, prefix: str, expected: int, timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        bound = bindings(log, prefix)
        if len(bound) >= expected:
            return bound
        if time.monotonic() > deadline:
            print(
                f"  warning: {len(bound)} of {expected} pods bound after {timeout_s:.0f} s",
                file=sys.stderr,
            )
            return bound
        time.sleep(0.5)


def binding_rate(bound: dict[str, float]) -> tuple[float, float]:
    """(pods/s from the first binding to the last, seconds between them)."""
    times = sorted(bound.values())
    if len(times) < 2:
        return 0.0, 0.0
    span_s = (times[-1] - times[0]) % 86400  # a run across midnight
    return (len(times) - 1) / span_s if span_s > 0 else float("inf"), span_s


METRIC_LINE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


Totals = dict[str, tuple[float, float]]  # label value -> (sum of seconds, count)


def histogram_totals(text: str, metric: str, label: str) -> Totals:
    """A Prometheus histogram's `_sum` and `_count` per value of `label`."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        match = METRIC_LINE.match(line)
        if not match or not match["name"].startswith(metric):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        key = labels.get(label, "")
        if match["name"] == f"{metric}_sum":
            sums[key] = sums.get(key, 0.0) + float(match["value"])
        elif match["name"] == f"{metric}_count":
            counts[key] = counts.get(key, 0.0) + float(match["value"])
    return {key: (sums[key], counts.get(key, 0.0)) for key in sums}


def means_ms(after: Totals, before: Totals | None = None) -> dict[str, float]:
    """Mean ms per observation between two scrapes (or since start)."""
    before = before or {}
    means = {}
    for key, (total_s, count) in after.items():
        earlier_s, earlier_count = before.get(key, (0.0, 0.0))
        if count > earlier_count:
            means[key] = 1000.0 * (total_s - earlier_s) / (count - earlier_count)
    return means


def scheduler_breakdown(plane: ControlPlane, port: int) -> dict[str, float]:
    url = f"https://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, context=plane.admin_tls(), timeout=10) as response:
        text = response.read().decode()
    breakdown = means_ms(
        histogram_totals(
            text, "scheduler_framework_extension_point_duration_seconds", "extension_point"
        )
    )
    for mean_ms in means_ms(
        histogram_totals(text, "scheduler_scheduling_algorithm_duration_seconds", "")
    ).values():
        breakdown["algorithm (all)"] = mean_ms
    return breakdown


def extender_totals(url: str) -> Totals:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals = histogram_totals(text, "power_aware_extender_request_duration_seconds", "verb")
    return {verb: sc for verb, sc in totals.items() if verb in ("filter", "prioritize")}


def scheduler_config(extender: dict[str, Any] | None, client_qps: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        # Burst twice the QPS, kube-scheduler's own ratio (50 and 100 by default).
        "clientConnection": {"qps": client_qps, "burst": 2 * client_qps},
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
    }
    if extender is not None:
        config["extenders"] = [extender]
    return config


def shipped_extender(plane: ControlPlane, url: str) -> dict[str, Any]:
    (extender,) = plane.power_aware_scheduler_config()["extenders"]
    return {**extender, "urlPrefix": url}


def one_run(
    plane: ControlPlane,
    core: kubernetes.client.CoreV1Api,
    mode: str,
    urls: dict[str, str],
    nodes: int,
    pods: int,
    round_index: int,
    timeout_s: float,
    client_qps: int,
) -> Run:
    seed = round_index * 10 + MODES.index(mode)
    create_pods(core, pods, seed)
    extender_url = urls["floor" if mode in FLOOR_MODES else "extender"]
    extender = None if mode == "no extender" else shipped_extender(plane, extender_url)
    if mode in ("prioritize only", "protocol floor"):
        assert extender is not None
        extender.pop("filterVerb", None)
    measured = extender is not None and mode not in FLOOR_MODES  # the floor has no /metrics
    before = extender_totals(extender_url) if measured else {}
    component = plane.start_scheduler(
        "bench-scheduler", scheduler_config(extender, client_qps), verbosity=2
    )
    bound = wait_for_bindings(component.log, f"{NAMESPACE}/{pod_prefix(seed)}", pods, timeout_s)
    pods_per_s, seconds = binding_rate(bound)
    assert component.port is not None
    scheduler_ms = scheduler_breakdown(plane, component.port)
    run = Run(
        mode=mode,
        nodes=nodes,
        pods=pods,
        round=round_index,
        pods_per_s=round(pods_per_s, 1),
        bound=len(bound),
        seconds=round(seconds, 2),
        scheduler_ms={k: round(v, 3) for k, v in scheduler_ms.items()},
    )
    if measured:
        this_run = means_ms(extender_totals(extender_url), before)
        run.extender_ms = {verb: round(ms, 3) for verb, ms in this_run.items()}
    plane.stop_component("bench-scheduler")
    delete_pods(core)
    return run


@contextmanager
def cluster(nodes: int, work_dir: Path) -> Iterator[tuple[ControlPlane, dict[str, str]]]:
    with ExitStack() as stack:
        plane = stack.enter_context(
            ControlPlane(
                default_scheduler=False, power_aware_scheduler=False, controllers=CONTROLLERS
            )
        )
        core = kubernetes.client.CoreV1Api(plane.api_client())
        names = node_names(nodes)
        started = time.monotonic()
        create_nodes(core, names)
        print(f"  {nodes} nodes created in {time.monotonic() - started:.0f} s", file=sys.stderr)
        rng = np.random.default_rng(nodes)
        snapshot = write_snapshot(
            work_dir / f"cluster-{nodes}.json",
            [
                {
                    "name": name,
                    "allocatable_cpu": 32,
                    "telemetry": {
                        "cpu_util": float(rng.uniform(0.05, 0.9)),
                        "ambient_temp_c": 22.0,
                        "cpu1_temp_c": 50.0,
                        "cpu2_temp_c": 48.0,
                    },
                }
                for name in names
            ],
        )
        served = stack.enter_context(run_extender(["--cluster", str(snapshot)]))
        floor_url = stack.enter_context(run_floor_extender())
        yield plane, {"extender": served.url, "floor": floor_url}


def measure(
    nodes: int, pods: int, rounds: int, timeout_s: float, client_qps: int = CLIENT_QPS
) -> list[Run]:
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp, cluster(nodes, Path(tmp)) as (plane, urls):
        core = kubernetes.client.CoreV1Api(plane.api_client())
        for round_index in range(rounds):
            # Alternate which mode goes first, so that a machine warming up favours neither.
            order = MODES if round_index % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                run = one_run(
                    plane, core, mode, urls, nodes, pods, round_index, timeout_s, client_qps
                )
                print(
                    f"  {nodes} nodes, round {round_index + 1}, {mode}: "
                    f"{run.pods_per_s:.0f} pods/s ({run.bound}/{pods} bound in {run.seconds} s)",
                    file=sys.stderr,
                )
                runs.append(run)
    return runs


def summarise(runs: list[Run]) -> dict[str, Any]:
    """Per node count: each mode's median pods/s and its ratio to no extender.

    A ratio is the median over rounds of that round's ratio: the modes of one round run back
    to back, so a machine whose speed drifts between rounds (a shared one does) moves both
    sides of each ratio together.
    """
    summary: dict[str, Any] = {}
    for nodes in sorted({r.nodes for r in runs}):
        by_mode = {mode: [r for r in runs if r.nodes == nodes and r.mode == mode] for mode in MODES}
        medians = {m: float(np.median([r.pods_per_s for r in rs])) for m, rs in by_mode.items()}
        baseline = by_mode["no extender"]
        ratio = {mode: _median_round_ratio(rs, baseline) for mode, rs in by_mode.items()}
        last = {m: rs[-1] for m, rs in by_mode.items()}
        summary[str(nodes)] = {
            "pods_per_s": medians,
            "ratio": ratio["extender"],
            "ratio_prioritize_only": ratio["prioritize only"],
            "ratio_floor": ratio["protocol floor"],
            "ratio_floor_both_verbs": ratio["floor, both verbs"],
            "scheduler_ms": {m: last[m].scheduler_ms for m in MODES},
            "extender_ms": last["extender"].extender_ms,
        }
    return summary


def _median_round_ratio(runs: list[Run], baseline_runs: list[Run]) -> float:
    baseline = {run.round: run.pods_per_s for run in baseline_runs}
    return round(float(np.median([run.pods_per_s / baseline[run.round] for run in runs])), 3)


def print_summary(summary: dict[str, Any], client_qps: int) -> None:
    print(
        f"\nkube-scheduler v1.36 throughput (client QPS {client_qps}), pods/s from first to "
        "last binding (median of rounds; each ratio the median of its rounds' ratios)"
    )
    print(
        f"{'nodes':>6} {'no extender':>12} {'extender':>10} {'ratio':>6} "
        f"{'prioritize only':>16} {'ratio':>6} {'protocol floor':>15} {'ratio':>6} "
        f"{'floor, both verbs':>18} {'ratio':>6}"
    )
    for nodes, row in summary.items():
        rates = row["pods_per_s"]
        print(
            f"{nodes:>6} {rates['no extender']:>12.0f} {rates['extender']:>10.0f} "
            f"{row['ratio']:>6.2f}x {rates['prioritize only']:>16.0f} "
            f"{row['ratio_prioritize_only']:>6.2f}x {rates['protocol floor']:>15.0f} "
            f"{row['ratio_floor']:>6.2f}x {rates['floor, both verbs']:>18.0f} "
            f"{row['ratio_floor_both_verbs']:>6.2f}x"
        )
    print("\nwhere the time goes (mean ms per pod; scheduler side, then extender server side)")
    for nodes, row in summary.items():
        print(f"  {nodes} nodes")
        for mode in MODES:
            points = row["scheduler_ms"][mode]
            shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(points.items()) if v >= 0.005)
            print(f"    scheduler, {mode}: {shown}")
        verbs = ", ".join(f"{k} {v:.2f}" for k, v in sorted(row["extender_ms"].items()))
        print(f"    extender (server side): {verbs}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The pods per node count: --pods 1000,2000 pairs with --nodes 500,5000.",
    )
    parser.add_argument("--nodes", default="500,5000", help="node counts (default 500,5000)")
    parser.add_argument("--pods", default="1000,2000", help="pods per node count (1000,2000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per mode (default 2)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per run (default 300)")
    parser.add_argument(
        "--client-qps",
        type=int,
        default=CLIENT_QPS,
        help=f"the scheduler's API client QPS (default {CLIENT_QPS}, as scheduler_perf; "
        "kube-scheduler's own default, 50, caps binding near 50 pods/s whatever it runs)",
    )
    parser.add_argument("--json", type=Path, help="write the runs and summary here")
    args = parser.parse_args(argv)
    try:
        node_counts = [int(n) for n in args.nodes.split(",")]
        pod_counts = [int(n) for n in args.pods.split(",")]
    except ValueError:
        parser.error("--nodes and --pods take comma-separated integers")
    if len(pod_counts) != len(node_counts):
        parser.error(f"--pods has {len(pod_counts)} counts for {len(node_counts)} --nodes")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.client_qps < 1:
        parser.error("--client-qps must be at least 1")
    runs: list[Run] = []
    for nodes, pods in zip(node_counts, pod_counts, strict=True):
        print(f"{nodes} nodes, {pods} pods, {args.rounds} rounds", file=sys.stderr)
        runs += measure(nodes, pods, args.rounds, args.timeout_s, args.client_qps)
    summary = summarise(runs)
    print_summary(summary, args.client_qps)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "settings": {"client_qps": args.client_qps, "rounds": args.rounds},
                    "runs": [asdict(r) for r in runs],
                    "summary": summary,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
