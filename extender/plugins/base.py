"""The plugin interface: what a filter or score source implements, over arrays.

Shaped like kube-scheduler's framework (Filter and Score extension points, one plugin may
implement both), but vectorised: a plugin sees every candidate of the pod at once, as arrays
aligned to `cycle.names`, because a 5,000-node request must cost well under a millisecond.

A plugin is a class with

- `name`: the name the configuration uses (`PowerIncrease`, `EnergyLevel`, ...);
- `Args`: a frozen dataclass of its typed arguments, defaults included (`NoArgs` when none);
  the configuration's `pluginConfig[].args` (camelCase keys) become one instance;
- `node_attributes`: the `NodeAttribute`s it derives from node labels and annotations; the
  state computes them once per node change and logs their `check` when a node is written;

and at least one of

- `filter(cycle) -> FilterVerdict`: the candidates that fail, each with a reason;
- `score(cycle) -> np.ndarray`: the plugin's raw measure per candidate (NaN: cannot tell), and
  `normalise(raw, cycle) -> np.ndarray`: 0..10 points, higher is better. The combiner
  (`extender.scoring`) weighs the points of every score plugin into kube-scheduler's 0..10;

plus, for `/explain`, `explain(cycle) -> {field: per-candidate values}`.

Plugins are pure: no I/O, no logging, no waiting on the request path. What they need from the
outside world (telemetry, intensities, RTTs) a background source puts into the state first: a
plugin that needs one returns it from `background(context)` (built from its own arguments, so
its configuration stays in one place), the runtime starts and stops it, and the source
publishes immutable snapshots with `state.set_signal(name, snapshot)` that the plugin reads
per request with `cycle.view.signal(name)`. `status()` adds the plugin's own lines to
`/status` (for example how fresh its data is), and `node_metrics(view)` the metric families it
reports per node at scrape time on `/metrics` (for the Grafana dashboard: one series per node
at most, prefix `power_aware_extender_node_`), computed from the state, never on the request
path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from extender.state import ClusterState, ClusterView, NodeAttribute

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from extender.cycle import Cycle

MAX_POINTS = 10.0


@dataclass(frozen=True)
class NoArgs:
    """Arguments of a plugin that takes none."""


@dataclass(frozen=True)
class FilterVerdict:
    """The candidates a filter fails: position -> reason.

    `unresolvable` are the positions that evicting pods cannot fix (kube-scheduler then does
    not try preemption there: `FailedAndUnresolvableNodes`).
    """

    failed: Mapping[int, str]
    unresolvable: frozenset[int] = frozenset()

    def passing(self, count: int) -> np.ndarray:
        """The passing mask over `count` candidates."""
        mask = np.ones(count, dtype=bool)
        if self.failed:
            mask[list(self.failed)] = False
        return mask


PASS_ALL = FilterVerdict({})


class LiveSource(Protocol):
    """A background thread feeding the state (Prometheus poller, watches, a plugin's source)."""

    def start(self) -> None: ...

    def stop(self, timeout_s: float = 5.0) -> None: ...


@dataclass(frozen=True)
class SourceContext:
    """What a plugin's background sources may use; the runtime builds it once.

    `mode` is `demo`, `snapshot` or `live`; `prometheus_url` and `kube_api` (a `kubernetes`
    ApiClient) are set in live mode only. `registry` is the service's `/metrics` registry, for
    a source's own metrics (prefix `power_aware_extender_`). `pod_watch` (live mode) is the
    Kubernetes pod watch: `pod_watch.add_pod_listener(listener)` hands a source every pod list
    and event it sees (`extender.sources.kube_watch.PodListener`).
    """

    state: ClusterState
    clock: Callable[[], float]
    mode: str
    prometheus_url: str | None = None
    kube_api: Any = None
    registry: Any = None
    pod_watch: Any = None


class Plugin:
    """Base of every filter and score plugin; see the module docstring."""

    name: ClassVar[str] = ""
    Args: ClassVar[type] = NoArgs
    node_attributes: ClassVar[tuple[NodeAttribute, ...]] = ()

    def __init__(self, args: Any = None) -> None:
        self.args = self.Args() if args is None else args

    @classmethod
    def implements(cls, extension_point: str) -> bool:
        """Whether the class overrides `filter` or `score`."""
        method = {"filter": "filter", "score": "score"}[extension_point]
        return getattr(cls, method) is not getattr(Plugin, method)

    def filter(self, cycle: Cycle) -> FilterVerdict:
        raise NotImplementedError(f"{self.name} has no filter")

    def score(self, cycle: Cycle) -> np.ndarray:
        raise NotImplementedError(f"{self.name} has no score")

    def normalise(self, raw: np.ndarray, cycle: Cycle) -> np.ndarray:
        """Points 0..10 from `score`'s raw values; by default the raw values are points."""
        return clip_points(raw)

    def explain(self, cycle: Cycle) -> Mapping[str, Sequence[object]]:
        """Fields this plugin adds to each candidate's `/explain` record (columns)."""
        return {}

    def background(self, context: SourceContext) -> Sequence[LiveSource]:
        """The background sources this plugin's data comes from (started by the runtime)."""
        return ()

    def status(self) -> Mapping[str, Any] | None:
        """The plugin's lines in `/status` (None: nothing to say)."""
        return None

    def node_metrics(self, view: ClusterView) -> Iterable[Metric]:
        """Metric families about the nodes in `view`, built when `/metrics` is scraped."""
        return ()


def clip_points(raw: np.ndarray) -> np.ndarray:
    """Raw values that are already points: clipped to 0..10, NaN (cannot tell) as 0."""
    points = np.minimum(np.maximum(raw, 0.0), MAX_POINTS)  # NaN stays NaN here
    missing = np.isnan(points)
    if missing.any():
        points[missing] = 0.0
    return points


def cost_ratio_points(cost: np.ndarray, *, points_per_doubling: float, floor: float) -> np.ndarray:
    """Points from a cost where lower is better, relative to the cheapest candidate.

        points = clip(10 - points_per_doubling * log2(cost / cost_min), 0, 10)

    so the cheapest scores 10 and each doubling of the cost against it loses
    `points_per_doubling`. NaN costs (cannot tell) score 0, so a missing input never looks
    best; costs below `floor` count as `floor`, which keeps the ratio finite at 0. A ratio, not
    min-max over the candidates: min-max sets the scale by the most expensive node, so one
    inefficient node would squeeze every reasonable candidate into the top point or two.
    """
    valid = np.isfinite(cost)
    valid_count = int(np.count_nonzero(valid))
    if valid_count == 0:
        return np.zeros(cost.shape, dtype=np.float64)
    every_node = valid_count == len(cost)
    values = cost if every_node else cost[valid]
    floored = np.maximum(values, floor)
    doublings = np.log2(floored / floored.min())
    ranked = MAX_POINTS - points_per_doubling * doublings
    np.minimum(np.maximum(ranked, 0.0, out=ranked), MAX_POINTS, out=ranked)
    if every_node:
        return ranked
    points = np.zeros(cost.shape, dtype=np.float64)
    points[valid] = ranked
    return points


def finite_or_none(values: np.ndarray) -> list[float | None]:
    """JSON-ready floats: NaN and infinities as None."""
    return [v if math.isfinite(v) else None for v in np.asarray(values, dtype=np.float64).tolist()]
