"""Node-to-node RTTs from Goldpinger's histograms in Prometheus.

Goldpinger (bloomberg/goldpinger) runs as a DaemonSet: every instance calls every other one's
`/ping` over HTTP every refresh interval (30 s by default) and observes the call's duration in

    goldpinger_peers_response_time_s_bucket{goldpinger_instance, call_type, host_ip, pod_ip, le}

where `goldpinger_instance` is the caller's `HOSTNAME` setting (its Helm chart sets it to the
node name; unset, it is the pod name), `host_ip` and `pod_ip` are the callee pod's
`status.hostIP` and `status.podIP`, `call_type` is `ping` for these periodic calls (`check` and
`check_all` are calls a user triggers from its UI), and the buckets are 5, 10, 25, 50, 100,
250 ms, 0.5, 1, 2.5, 5, 10, 30 s. A failed call is observed too (at its timeout, 300 ms by
default), so a lossy link reads slow, not fast. It times an HTTP round trip, not ICMP: a little
more than `ping` would say.

One instant query per refresh reads the bucket rates over a window, summed per caller and
callee (a pod restart leaves an old `pod_ip` series whose rate goes to zero):

    sum by (goldpinger_instance, host_ip, pod_ip, le) (
      rate(goldpinger_peers_response_time_s_bucket{call_type="ping"}[5m]))

and each caller-callee histogram gives its quantile here (`histogram_quantile` below, the
algorithm of PromQL's function of that name, so the numbers are those a Grafana panel shows),
or, with `estimate="upper"`, the upper bound of the bucket the quantile falls in: Goldpinger's
buckets are coarse (a median of 22 ms reads anywhere in 10-25 ms), so a limit of 20 ms is only
safe against the bucket's upper bound. A histogram with no calls in the window has no value:
the link is unknown, never 0.

A window holds few calls (ten at Goldpinger's 30 s over 5 minutes), and the median of ten
jittered calls on a link whose typical RTT is just over a limit lands under it in many windows.
With a `confidence`, the quantile read is an upper confidence bound of the one asked for
(`confident_quantile`): the order statistic that is at least the link's true quantile with
that probability, from the binomial law of how many calls fall below it. With ten calls and
0.95 the median's bound is the ninth call (the window's p90); with a thousand, a call just
past the 52nd percentile: more calls, closer to the quantile itself. Rates become counts
through the window's length (what `increase` would give).

Callers and callees become nodes (`NodeResolver`): a caller through its instance name (a node
name, else a pod's name), a callee through `host_ip` (the Node objects' addresses, else the
kubelet-reported `hostIP` of running pods) or else `pod_ip` (a running pod's IP). Series that
map to no node are counted and reported, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from extender.pods import PodIndex
from livedata.prometheus import Series

DEFAULT_METRIC = "goldpinger_peers_response_time_s"
DEFAULT_SELECTOR = 'call_type="ping"'
DEFAULT_WINDOW = "5m"
ESTIMATES = ("interpolate", "upper")
INSTANCE_LABEL = "goldpinger_instance"
HOST_IP_LABEL = "host_ip"
POD_IP_LABEL = "pod_ip"
BUCKET_LABEL = "le"


def bucket_rates_query(metric: str, selector: str, window: str) -> str:
    """The PromQL for every caller-callee histogram's bucket rates over `window`."""
    matchers = f"{{{selector}}}" if selector else ""
    return (
        f"sum by ({INSTANCE_LABEL}, {HOST_IP_LABEL}, {POD_IP_LABEL}, {BUCKET_LABEL}) "
        f"(rate({metric}_bucket{matchers}[{window}]))"
    )


def confident_quantile(quantile: float, observations: float, confidence: float) -> float:
    """The rank (as a fraction of `observations`) whose order statistic is at least the true
    `quantile` with probability `confidence`; `quantile` itself when `confidence` is 0.

    The k-th smallest of n draws is at least the true q-quantile unless k or more draws fall
    below it, so k = (the `confidence` quantile of Binomial(n, q)) + 1. Never past the largest
    draw (a tiny window cannot promise more than its worst call).
    """
    n = round(observations)
    if not confidence > 0 or n < 1:
        return quantile
    k = binomial_quantile(confidence, n, quantile) + 1.0
    return min(k / n, 1.0)


# Terms of the binomial law more than this many standard deviations from its mean add less
# than 1e-30 to the sum: the quantile is found among the others.
_BINOMIAL_SPAN_SD = 12.0


def binomial_quantile(probability: float, n: int, p: float) -> int:
    """The smallest k with P(X <= k) >= `probability` for X ~ Binomial(n, p) (what
    scipy.stats.binom.ppf gives; summed here, so the service does not import scipy.stats for
    one function: that import alone costs about 60 MiB of memory)."""
    if p <= 0.0:
        return 0
    if p >= 1.0 or probability >= 1.0:
        return n
    sd = math.sqrt(n * p * (1.0 - p))
    low = max(0, math.floor(n * p - _BINOMIAL_SPAN_SD * sd - 1))
    high = min(n, math.ceil(n * p + _BINOMIAL_SPAN_SD * sd + 1))
    log_p, log_q = math.log(p), math.log1p(-p)
    log_n_factorial = math.lgamma(n + 1)
    cumulative = 0.0
    for k in range(low, high + 1):
        log_pmf = (
            log_n_factorial - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * log_p + (n - k) * log_q
        )  # fmt: skip
        cumulative += math.exp(log_pmf)
        # A relative tolerance, as scipy's ppf allows: a sum of floats lands a hair short.
        if cumulative >= probability * (1.0 - 1e-10):
            return k
    return high


def histogram_quantile(
    quantile: float,
    upper_bounds: np.ndarray,
    counts: np.ndarray,
    *,
    estimate: str,
    confidence: float = 0.0,
) -> float:
    """The `quantile` of a cumulative histogram, as PromQL's histogram_quantile computes it.

    `upper_bounds` ascending with +Inf last, `counts` cumulative (rates will do without a
    `confidence`; with one they must be counts of calls). NaN without observations or a +Inf
    bucket. "interpolate": linear within the bucket the rank falls in (the first bucket starts
    at 0); a rank in the +Inf bucket gives the highest finite bound. "upper": the upper bound of
    that bucket (+Inf beyond the highest finite one). With `confidence`, the quantile read is
    `confident_quantile`'s upper bound of `quantile`.
    """
    if upper_bounds.size < 2 or not math.isinf(upper_bounds[-1]):
        return math.nan
    # Rates of cumulative counters can dip by float error: make them monotonic, as PromQL does.
    counts = np.maximum.accumulate(np.nan_to_num(counts, nan=0.0))
    observations = float(counts[-1])
    if not observations > 0:
        return math.nan
    rank = confident_quantile(quantile, observations, confidence) * observations
    bucket = int(np.searchsorted(counts, rank, side="left"))
    if bucket >= upper_bounds.size - 1:
        return float(upper_bounds[-2]) if estimate == "interpolate" else math.inf
    bucket_end = float(upper_bounds[bucket])
    if estimate == "upper" or (bucket == 0 and bucket_end <= 0):
        return bucket_end
    bucket_start, in_bucket = 0.0, float(counts[bucket])
    if bucket > 0:
        bucket_start = float(upper_bounds[bucket - 1])
        in_bucket -= float(counts[bucket - 1])
        rank -= float(counts[bucket - 1])
    if in_bucket <= 0:
        return bucket_end
    return bucket_start + (bucket_end - bucket_start) * (rank / in_bucket)


@dataclass(frozen=True)
class PeerRtt:
    """One caller-callee RTT as Goldpinger labels it (seconds)."""

    instance: str
    host_ip: str
    pod_ip: str
    rtt_s: float


def peer_quantiles(
    series: Iterable[Series],
    quantile: float,
    *,
    estimate: str = "interpolate",
    confidence: float = 0.0,
    window_s: float = 0.0,
) -> list[PeerRtt]:
    """Each caller-callee histogram's quantile from its bucket series; NaN ones left out.

    The series are rates over `window_s`; with a `confidence` they are turned into counts of
    calls (rate x window) for its bound."""
    buckets: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for item in series:
        labels = item.labels
        try:
            bound = float(labels.get(BUCKET_LABEL, "nan"))
        except ValueError:
            continue
        if math.isnan(bound) or item.values.size == 0:
            continue
        key = (
            labels.get(INSTANCE_LABEL, ""),
            labels.get(HOST_IP_LABEL, ""),
            labels.get(POD_IP_LABEL, ""),
        )
        buckets.setdefault(key, []).append((bound, float(item.values[-1])))
    peers = []
    for (instance, host_ip, pod_ip), pairs in buckets.items():
        pairs.sort()
        bounds = np.array([bound for bound, _ in pairs])
        counts = np.array([count for _, count in pairs])
        if confidence > 0:
            counts = counts * window_s
        rtt_s = histogram_quantile(
            quantile, bounds, counts, estimate=estimate, confidence=confidence
        )
        if not math.isnan(rtt_s):
            peers.append(PeerRtt(instance, host_ip, pod_ip, rtt_s))
    return peers


@dataclass(frozen=True)
class NodeResolver:
    """Goldpinger's names and IPs -> node names, from the Node objects and running pods."""

    nodes: frozenset[str]
    node_by_address: Mapping[str, str]
    pods: PodIndex

    @classmethod
    def of(cls, nodes: Mapping[str, Sequence[str]], pods: PodIndex) -> NodeResolver:
        """`nodes`: node name -> its addresses (`NodeInfo.addresses`)."""
        by_address = {address: name for name, addresses in nodes.items() for address in addresses}
        return cls(frozenset(nodes), by_address, pods)

    def caller(self, instance: str) -> str | None:
        """The node of a Goldpinger instance: its name is a node's, or a running pod's."""
        if instance in self.nodes:
            return instance
        hosts = {pod.node for pod in self.pods.named(instance)}
        return hosts.pop() if len(hosts) == 1 else None

    def callee(self, host_ip: str, pod_ip: str) -> str | None:
        """The node of a called pod: through its host IP, else its pod IP."""
        if host_ip:
            node = self.node_by_address.get(host_ip) or self.pods.node_by_host_ip.get(host_ip)
            if node is not None:
                return node
        if pod_ip:
            return self.node_by_address.get(pod_ip) or self.pods.node_by_pod_ip.get(pod_ip)
        return None


@dataclass
class MappedPeers:
    """Node-to-node RTTs (ms) from one read, and what could not be mapped."""

    rtt_ms: dict[tuple[str, str], float] = field(default_factory=dict)
    unmapped: list[PeerRtt] = field(default_factory=list)
    self_links: int = 0


def map_peers(peers: Iterable[PeerRtt], resolver: NodeResolver) -> MappedPeers:
    """Goldpinger peers as directed node links; several series for one link: the largest."""
    mapped = MappedPeers()
    for peer in peers:
        source = resolver.caller(peer.instance)
        target = resolver.callee(peer.host_ip, peer.pod_ip)
        if source is None or target is None:
            mapped.unmapped.append(peer)
            continue
        if source == target:
            mapped.self_links += 1  # an instance calling itself: the HTTP overhead, not a link
            continue
        rtt_ms = 1000.0 * peer.rtt_s
        key = (source, target)
        if rtt_ms > mapped.rtt_ms.get(key, -1.0):
            mapped.rtt_ms[key] = rtt_ms
    return mapped


def describe_unmapped(peer: PeerRtt, resolver: NodeResolver) -> str:
    """Why one series maps to no node, in words for a log line."""
    problems = []
    if resolver.caller(peer.instance) is None:
        problems.append("the instance is neither a node nor a running pod's name")
    if resolver.callee(peer.host_ip, peer.pod_ip) is None:
        problems.append("its IPs match no node address and no running pod")
    return (
        f"{INSTANCE_LABEL}={peer.instance!r} -> {HOST_IP_LABEL}={peer.host_ip!r} "
        f"{POD_IP_LABEL}={peer.pod_ip!r}: {' and '.join(problems)}"
    )
