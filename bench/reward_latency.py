"""What the Reward plugin costs: per request, per snapshot published, and in memory at its caps.

    python -m bench.reward_latency [--nodes 5000] [--workloads 5000] [--pairs 100000]
                                   [--pods 100000] [--requests 2000]

In process, no HTTP: a 5,000-node cluster view, a reward model filled to its caps (every node
with evidence, `--workloads` workloads, `--pairs` node x workload pairs, some pods in flight),
and `extender.scoring.assess` answering pods of a workload with evidence on its candidates,
once with the default profile and once with the Reward plugin added as score and filter. The
difference is what the plugin adds to a request (the power curves are left out of both, so the
rest of the request is as cheap as it gets and the plugin's share shows). Printed: per-request
p50/p99 for 500 and 5,000 candidate names; the background work of the source: building a
snapshot after one workload changed (every `publishIntervalS` while pods change), the in-flight
count and the time-based sweep over `--pods` followed pods (every `SWEEP_EVERY_S`); and the
memory of the model at its caps and of the followed pods (tracemalloc).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Sequence

import numpy as np

from bench.support import pods
from extender.profile import DEFAULT_PROFILE, build_profile
from extender.rewards.model import RewardModel
from extender.rewards.outcomes import PodOutcomes
from extender.rewards.source import REWARD_SIGNAL
from extender.scoring import assess
from extender.state import ClusterState, NodeInfo

HASH = "6f8b9c7d54"


def fill_model(
    nodes: Sequence[str], workloads: int, pairs: int, rng: np.random.Generator
) -> RewardModel:
    """A model at its caps: every node, `workloads` workloads, `pairs` pairs of evidence."""
    model = RewardModel(
        half_life_s=21_600.0, max_nodes=len(nodes), max_workloads=workloads, max_pairs=pairs
    )
    per_workload = max(1, pairs // workloads)
    for w in range(workloads):
        for node in rng.choice(nodes, per_workload, replace=False).tolist():
            good, bad = float(rng.integers(0, 20)), float(rng.integers(0, 4))
            model.add(node, f"shop/Deployment/svc-{w:05d}", good=good, bad=bad, at_s=0.0)
    return model


def follow_pods(nodes: Sequence[str], count: int, workloads: int) -> PodOutcomes:
    """`count` running, ready pods as the watch lists them, followed by the outcome tracker."""
    outcomes = PodOutcomes(known_until_s=0.0, max_pods=count)
    bound = pods.bound_pod(pods.deployment_pod_metadata("p", "u", "svc", HASH), "n", at_s=0.0)
    running = pods.running_pod(bound, started_at_s=1.0)
    for i in range(count):
        running["metadata"]["uid"] = f"uid-{i}"
        running["metadata"]["labels"]["app"] = f"svc-{i % workloads:05d}"
        running["spec"]["nodeName"] = nodes[i % len(nodes)]
        outcomes.event("ADDED", running, 2.0)
    return outcomes


def pod(workload: int) -> dict:
    name = f"svc-{workload:05d}"
    return {
        "metadata": {
            "name": f"{name}-{HASH}-abcde",
            "namespace": "shop",
            "uid": "bench",
            "labels": {"app": name, "pod-template-hash": HASH},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": f"{name}-{HASH}", "controller": True}
            ],
        },
        "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "500m"}}}]},
    }


def time_requests(
    state: ClusterState, profile: object, names: list[str], pods: list[dict], count: int
) -> np.ndarray:
    """Seconds per `assess` (filter + score), `count` pods of varying workloads."""
    durations = np.empty(count)
    view = state.view(1.0)
    for i in range(count):
        started = time.perf_counter()
        assessment = assess(
            view,
            None,
            names,
            0.5,
            profile,
            now_s=1.0,
            telemetry_ttl_s=None,
            pod=pods[i % len(pods)],
        )
        assessment.host_scores()
        durations[i] = time.perf_counter() - started
    return durations


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reward_latency",
        description="Per-request, per-snapshot and memory cost of the Reward plugin at its caps.",
    )
    parser.add_argument("--nodes", type=int, default=5000, help="cluster nodes (default 5000)")
    parser.add_argument("--workloads", type=int, default=5000, help="workloads with evidence")
    parser.add_argument("--pairs", type=int, default=100_000, help="node x workload pairs")
    parser.add_argument("--pods", type=int, default=100_000, help="pods the source follows")
    parser.add_argument("--requests", type=int, default=2000, help="requests per scenario")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(19)
    nodes = [f"node-{i:05d}" for i in range(args.nodes)]

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    model = fill_model(nodes, args.workloads, args.pairs, rng)
    in_flight = {(nodes[i], f"shop/Deployment/svc-{i % args.workloads:05d}"): 1 for i in range(500)}
    after = tracemalloc.take_snapshot()
    model_bytes = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    tracemalloc.stop()

    started = time.perf_counter()
    snapshot = model.snapshot(0.0, in_flight)
    first_s = time.perf_counter() - started
    publish_s = []
    for i in range(5):  # what the source does while pods change: one workload new each time
        model.add(nodes[i], "shop/Deployment/svc-00000", good=0.0, bad=1.0, at_s=float(i))
        started = time.perf_counter()
        snapshot = model.snapshot(float(i), in_flight)
        publish_s.append(time.perf_counter() - started)

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    followed = follow_pods(nodes, args.pods, args.workloads)
    after = tracemalloc.take_snapshot()
    pods_bytes = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    tracemalloc.stop()
    started = time.perf_counter()
    followed.in_flight()
    in_flight_s = time.perf_counter() - started
    started = time.perf_counter()
    followed.sweep(30.0)
    sweep_s = time.perf_counter() - started

    state = ClusterState()
    state.replace_nodes(NodeInfo(name, 32.0) for name in nodes)
    state.set_signal(REWARD_SIGNAL, snapshot)
    with_reward = build_profile(
        {
            "plugins": {
                "filter": {"enabled": [{"name": "Reward"}]},
                "score": {"enabled": [{"name": "Reward", "weight": 0.2}]},
            }
        }
    )
    request_pods = [pod(w) for w in rng.integers(0, args.workloads, 64).tolist()]
    print(
        f"model at its caps: {model.nodes} nodes, {model.workloads} workloads, {model.pairs} "
        f"pairs: {model_bytes / 2**20:.1f} MiB; first snapshot {1000 * first_s:.0f} ms, then "
        f"{1000 * float(np.median(publish_s)):.1f} ms per snapshot after a change (median of 5)"
    )
    print(
        f"{followed.tracked_pods} followed pods: {pods_bytes / 2**20:.1f} MiB; in-flight count "
        f"{1000 * in_flight_s:.0f} ms, time-based sweep {1000 * sweep_s:.0f} ms"
    )
    print(f"{'candidates':>10} {'profile':<24} {'p50 us':>8} {'p99 us':>8}")
    for count in (500, len(nodes)):
        names = nodes[:count]
        figures = {}
        for label, profile in (("default", DEFAULT_PROFILE), ("default + Reward", with_reward)):
            time_requests(state, profile, names, request_pods, 50)  # warm the per-list caches
            runs = time_requests(state, profile, names, request_pods, args.requests)
            figures[label] = np.percentile(runs, [50, 99]) * 1e6
            print(f"{count:>10} {label:<24} {figures[label][0]:>8.0f} {figures[label][1]:>8.0f}")
        added = figures["default + Reward"] - figures["default"]
        print(f"{count:>10} {'added by Reward':<24} {added[0]:>8.0f} {added[1]:>8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
