"""Goldpinger's metrics as a real deployment leaves them in Prometheus, for backfilling.

bloomberg/goldpinger (pkg/goldpinger/stats.go) registers

    goldpinger_peers_response_time_s   histogram, buckets .005 .01 .025 .05 .1 .25 .5 1 2.5 5 10 30
        labels: goldpinger_instance, call_type, host_ip, pod_ip

Each instance pings every Goldpinger pod, itself included, every REFRESH_INTERVAL (30 s) with
a jitter of JITTER_FACTOR (5 %), and observes each call's duration under `call_type="ping"`,
`goldpinger_instance` = its HOSTNAME (the Helm chart sets it to `spec.nodeName`), `host_ip` and
`pod_ip` = the called pod's `status.hostIP` and `status.podIP`. A call that fails is observed at
its duration too (about the 300 ms ping timeout). Prometheus, scraping the DaemonSet's pods
through a ServiceMonitor, adds the target labels (`instance` = pod IP:port, `job`, `namespace`,
`pod`, `service`, `container`, `endpoint`).

`goldpinger_openmetrics` writes that as OpenMetrics text for `promtool tsdb create-blocks-from
openmetrics`: one histogram family, each series' buckets, `_count` and `_sum` per scrape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FAMILY = "goldpinger_peers_response_time_s"
HELP = "Histogram of response times from other hosts, when making peer calls"
PORT = 8080
PING_TIMEOUT_S = 0.3


@dataclass(frozen=True)
class GoldpingerPod:
    """One pod of the Goldpinger DaemonSet."""

    name: str
    node: str
    pod_ip: str
    host_ip: str
    namespace: str = "goldpinger"

    def as_object(self) -> dict:
        """The pod as the API server returns it (for the fake Kubernetes API)."""
        return {
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/name": "goldpinger"},
            },
            "spec": {
                "nodeName": self.node,
                "containers": [{"name": "goldpinger-daemon", "image": "goldpinger:3.10.2"}],
            },
            "status": {"phase": "Running", "podIP": self.pod_ip, "hostIP": self.host_ip},
        }


def _label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))


def goldpinger_openmetrics(
    pods: Sequence[GoldpingerPod],
    rtt_ms: Callable[[str, str], float],
    *,
    start_s: float,
    end_s: float,
    scrape_interval_s: float = 15.0,
    ping_interval_s: float = 30.0,
    jitter: float = 0.08,
    loss: Callable[[str, str], float] = lambda a, b: 0.0,
    instance: Callable[[GoldpingerPod], str] = lambda pod: pod.node,
    extra_calls: Sequence[tuple[str, str, str, float]] = (),
    seed: int = 0,
) -> str:
    """The Goldpinger histogram every caller keeps for every callee, scraped from `start_s`.

    `rtt_ms(caller_node, callee_node)` is the link's typical call time; each call takes that
    times a log-normal jitter, or the ping timeout with probability `loss(a, b)`. `instance`
    gives a caller's `goldpinger_instance`: by default its node (the chart's HOSTNAME), or its
    pod name (HOSTNAME unset). `extra_calls` are (caller pod, callee pod, call_type, seconds)
    series of other call types (a user's `check` from the UI), one call per ping interval.
    """
    rng = np.random.default_rng(seed)
    scrapes = np.arange(start_s, end_s + 1e-9, scrape_interval_s)
    bounds = np.array(BUCKETS_S)
    by_name = {pod.name: pod for pod in pods}
    series: list[tuple[GoldpingerPod, GoldpingerPod, str, np.ndarray]] = []
    for caller in pods:
        for callee in pods:
            # Pings start at a random offset and repeat every interval, +- the jitter factor.
            gaps = ping_interval_s * (1.0 + 0.05 * rng.random(len(scrapes) + 2))
            times = start_s - ping_interval_s * rng.random() + np.cumsum(gaps)
            durations = (
                rtt_ms(caller.node, callee.node)
                / 1000.0
                * np.exp(rng.normal(0.0, jitter, times.size))
            )
            lost = rng.random(times.size) < loss(caller.node, callee.node)
            durations = np.where(lost, PING_TIMEOUT_S + 0.002 * rng.random(times.size), durations)
            series.append((caller, callee, "ping", np.stack([times, durations])))
    for caller_name, callee_name, call_type, seconds in extra_calls:
        times = np.arange(start_s, end_s, ping_interval_s) + 1.0
        series.append(
            (
                by_name[caller_name],
                by_name[callee_name],
                call_type,
                np.stack([times, np.full(times.size, seconds)]),
            )
        )

    lines = [f"# HELP {FAMILY} {HELP}\n", f"# TYPE {FAMILY} histogram\n"]
    for caller, callee, call_type, calls in series:
        labels = {
            "goldpinger_instance": instance(caller),
            "call_type": call_type,
            "host_ip": callee.host_ip,
            "pod_ip": callee.pod_ip,
            # Added by Prometheus from the scrape target (a ServiceMonitor on the DaemonSet).
            "instance": f"{caller.pod_ip}:{PORT}",
            "job": "goldpinger",
            "namespace": caller.namespace,
            "pod": caller.name,
            "service": "goldpinger",
            "container": "goldpinger-daemon",
            "endpoint": "http",
        }
        times, durations = calls
        for scrape_s in scrapes:
            done = durations[times <= scrape_s]
            cumulative = [int(np.count_nonzero(done <= bound)) for bound in bounds]
            stamp = f"{scrape_s:.3f}"
            for bound, count in zip(bounds, cumulative, strict=True):
                text = _label_text({**labels, "le": f"{bound:g}"})
                lines.append(f"{FAMILY}_bucket{{{text}}} {count} {stamp}\n")
            text = _label_text({**labels, "le": "+Inf"})
            lines.append(f"{FAMILY}_bucket{{{text}}} {done.size} {stamp}\n")
            lines.append(f"{FAMILY}_count{{{_label_text(labels)}}} {done.size} {stamp}\n")
            total = float(done.sum()) if done.size else 0.0
            lines.append(f"{FAMILY}_sum{{{_label_text(labels)}}} {total!r} {stamp}\n")
    lines.append("# EOF\n")
    return "".join(lines)


def true_quantile_ms(rtt_ms: float, quantile: float, jitter: float) -> float:
    """The quantile of one link's simulated call times (log-normal around `rtt_ms`)."""
    from statistics import NormalDist

    return rtt_ms * math.exp(jitter * NormalDist().inv_cdf(quantile))
