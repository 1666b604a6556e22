"""What the Carbon plugin adds to one request: the default profile against default + Carbon.

    python -m bench.carbon_overhead [--nodes 500,5000] [--zones 10] [--repeats 2000]

In process (no HTTP: `bench.extender_latency` measures that floor), on the shipped model bundle
(its fleet model serves every node name): N nodes dealt over Z zones, fresh telemetry, a carbon
snapshot with each zone's value and a 24-hour hourly forecast, and the same candidate list
request after request, as kube-scheduler sends it. Three requests are timed, each building its
scheduling cycle from scratch (`extender.scoring.assess`): the default profile; default +
Carbon (score and filter) for an ordinary pod; and for a pod with `defer-until` 6h, whose filter
looks for a cleaner window (and holds it). Prints p50 and p99 per request in microseconds, and
the ratios against the default profile measured in the same run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import numpy as np

from extender.config import DEFAULT_BUNDLE_DIR
from extender.plugins.carbon import CARBON_SIGNAL
from extender.profile import DEFAULT_PROFILE, Profile, build_profile
from extender.scoring import assess
from extender.state import ClusterState, NodeInfo
from livedata.carbon import AVERAGE, IntensityPoint, IntensityReading
from livedata.carbon_source import build_snapshot
from livedata.labels import DEFER_UNTIL_ANNOTATION, REGION_LABEL
from predictor.curves import CurveBuilder
from predictor.model import Predictor

NOW_S = 1_714_557_600.0  # 2024-05-01T10:00:00Z
HOUR_S = 3600.0


def carbon_profile() -> Profile:
    return build_profile(
        {
            "plugins": {
                "filter": {"enabled": [{"name": "Carbon"}]},
                "score": {
                    "enabled": [
                        {"name": "PowerIncrease", "weight": 0.4},
                        {"name": "Carbon", "weight": 0.2},
                    ]
                },
            }
        }
    )


def pod(deferrable: bool) -> dict:
    metadata: dict = {
        "name": "p",
        "namespace": "default",
        "creationTimestamp": datetime.fromtimestamp(NOW_S - 60, UTC).isoformat(),
    }
    if deferrable:
        metadata["annotations"] = {DEFER_UNTIL_ANNOTATION: "6h"}
    return {"metadata": metadata, "spec": {"containers": [{"name": "c"}]}}


def cluster(nodes: int, zones: int, profile: Profile, predictor: Predictor) -> tuple:
    rng = np.random.default_rng(1)
    state = ClusterState(node_attributes=profile.node_attributes)
    names = [f"node-{i:05d}" for i in range(nodes)]
    state.replace_nodes(
        NodeInfo(name, 32.0, {REGION_LABEL: f"zone-{i % zones}"}) for i, name in enumerate(names)
    )
    state.set_telemetry_many(
        (name, {"cpu_util": float(u), "ambient_temp_c": 22.0, "cpu1_temp_c": 50.0}, NOW_S - 5)
        for name, u in zip(names, rng.uniform(0.05, 0.8, nodes), strict=True)
    )
    hour_start = NOW_S - NOW_S % HOUR_S
    readings = []
    for z in range(zones):
        mean = 50.0 * 14 ** (z / max(zones - 1, 1))
        # A midday dip the filter can find: hours 2-4 ahead are 60 % cleaner.
        values = [mean * (0.4 if 2 <= k <= 4 else 1.0) for k in range(24)]
        points = tuple(
            IntensityPoint(hour_start + k * HOUR_S, hour_start + (k + 1) * HOUR_S, v)
            for k, v in enumerate(values)
        )
        readings.append(
            IntensityReading(f"zone-{z}", AVERAGE, "bench", mean, NOW_S - 600, points, NOW_S - 600)
        )
    state.set_signal(
        CARBON_SIGNAL,
        build_snapshot(
            readings, [], published_at_s=NOW_S, max_age_s=2 * HOUR_S, forecast_max_age_s=2 * HOUR_S
        ),
    )
    _, snapshot = state.telemetry_snapshot()
    curves = CurveBuilder().build(predictor, {n: v for n, (v, _) in snapshot.items()}, None)
    return state, curves, names


def percentiles_us(call: Callable[[], object], repeats: int) -> tuple[float, float]:
    for _ in range(min(50, repeats)):
        call()
    times = np.empty(repeats)
    for i in range(repeats):
        started = time.perf_counter_ns()
        call()
        times[i] = time.perf_counter_ns() - started
    return float(np.percentile(times, 50)) / 1e3, float(np.percentile(times, 99)) / 1e3


def measure(nodes: int, zones: int, repeats: int, predictor: Predictor) -> dict[str, tuple]:
    carbon = carbon_profile()
    state, curves, names = cluster(nodes, zones, carbon, predictor)
    view = state.view(NOW_S)

    def request(profile: Profile, the_pod: dict) -> Callable[[], object]:
        def one() -> object:
            result = assess(
                view, curves, names, 1.0, profile, now_s=NOW_S, telemetry_ttl_s=None, pod=the_pod
            )
            return result.score, result.failed

        return one

    held = request(carbon, pod(True))()[1]
    assert len(held) == nodes, "the deferrable pod should be held in this bench's forecast"
    return {
        "default profile": percentiles_us(request(DEFAULT_PROFILE, pod(False)), repeats),
        "default + Carbon": percentiles_us(request(carbon, pod(False)), repeats),
        "default + Carbon, deferrable pod (held)": percentiles_us(
            request(carbon, pod(True)), repeats
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.carbon_overhead", description=__doc__)
    parser.add_argument("--nodes", default="500,5000", help="candidate counts (500,5000)")
    parser.add_argument("--zones", type=int, default=10, help="grid zones (10)")
    parser.add_argument("--repeats", type=int, default=2000, help="timed requests each (2000)")
    args = parser.parse_args(argv)
    predictor = Predictor.load(DEFAULT_BUNDLE_DIR)
    print(f"{'candidates':>10} {'request':<42} {'p50 us':>8} {'p99 us':>8} {'p50 vs default':>15}")
    for nodes in (int(n) for n in args.nodes.split(",")):
        figures = measure(nodes, args.zones, args.repeats, predictor)
        base = figures["default profile"][0]
        for name, (p50, p99) in figures.items():
            print(f"{nodes:>10} {name:<42} {p50:>8.0f} {p99:>8.0f} {p50 / base:>14.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
