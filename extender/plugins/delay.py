"""Delay (filter, optional score): honour `delay_<from>: "<ms>"` pod labels from measured RTTs.

The edge seed's constraint (contract 4): a pod labelled `delay_edge-1: "25"` may only run where
the round trip to `edge-1` is at most 25 ms. `<from>` is

- a node name (or a place the RTT file names, such as a cell tower), else
- a name prefix: the nodes running pods whose names start with `<from>` (in the pod's own
  namespace unless `sourcePodsInAllNamespaces`). As with pod affinity, being near *any* of them
  is enough (`sourcePodsMatch: any`); `all` asks to be near every one.

Every candidate whose RTT to `<from>` exceeds the limit fails, with a reason naming the
constraint, the RTT and how old the measurement is; several labels must all hold. A link
nobody measured, or measured longer ago than `maxAgeS`, is unknown: the node fails (saying so)
unless `unknownPasses`. A label value that is not a number of milliseconds, or a `<from>` that
names nothing, fails every candidate with a reason: a constraint is never dropped silently.
Failures are unresolvable (evicting pods does not shorten a network path). A node's RTT to
itself is 0, so `<from>` itself always qualifies.

The RTTs come from the plugin's background source (`extender.sources.rtt`: Goldpinger through
Prometheus, and/or a static file), published as an `extender.rtt.RttMatrix`; pod placements
from the Kubernetes watch (`extender.pods.PodIndex`). The request path reads both from the
view: a few dictionary lookups and one row gather per `<from>` node, candidates' positions in
the matrix cached per candidate list.

The optional score prefers lower RTT among the nodes that pass: per constraint the share of
the limit used (`rtt / limit`), the worst one counting, and points `10 * (1 - share)`. Its
weight is 0 in the shipped profile, so power decides among feasible nodes; pods without
constraints score 0 everywhere (no preference). `/explain` adds `delay`: per constraint the
limit, the RTT, its age, the node it was measured to, and whether it holds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from extender.plugins.base import (
    MAX_POINTS,
    FilterVerdict,
    LiveSource,
    Plugin,
    SourceContext,
)
from extender.pods import PODS_SIGNAL, PodIndex
from extender.rtt import RTT_SIGNAL, RttMatrix
from extender.sources.goldpinger import DEFAULT_METRIC, DEFAULT_SELECTOR, ESTIMATES
from livedata.collect_config import CollectConfigError, parse_duration_s
from livedata.labels import DELAY_LABEL_PREFIX

if TYPE_CHECKING:
    from extender.cycle import Cycle
    from extender.sources.rtt import RttSource

MATCHES = ("any", "all")
_PLAIN_NUMBER = re.compile(r"\d+(\.\d+)?")


@dataclass(frozen=True)
class DelayArgs:
    # A static RTT file (YAML matrix or links, extender.sources.rtt_file); "" = none.
    rtt_file: str = ""
    # Read Goldpinger's histograms from Prometheus (live mode only).
    goldpinger: bool = True
    goldpinger_metric: str = DEFAULT_METRIC
    goldpinger_selector: str = DEFAULT_SELECTOR
    # The quantile of each link's histogram over the window: 0.5 (median), 0.9 (p90)...
    quantile: float = 0.5
    window: str = "5m"
    # "upper": the bound of the bucket the quantile falls in (never below the true quantile);
    # "interpolate": linear within that bucket, as PromQL's histogram_quantile.
    bucket_estimate: str = "upper"
    # Read an upper confidence bound of the quantile, given how many calls the window holds
    # (extender.sources.goldpinger.confident_quantile): a link is within a limit only when its
    # calls say so with this confidence. 0: the quantile itself.
    confidence: float = 0.95
    refresh_interval_s: float = 30.0
    # A measured RTT older than this is unknown (static file values never expire).
    max_age_s: float = 300.0
    prometheus_timeout_s: float = 10.0
    # Whether a candidate whose RTT is unknown passes (by default it fails, with a reason).
    unknown_passes: bool = False
    source_pods_in_all_namespaces: bool = False
    source_pods_match: str = "any"

    def __post_init__(self) -> None:
        if not 0 < self.quantile < 1:
            raise ValueError(f"quantile must be between 0 and 1 (0.5, 0.9), got {self.quantile!r}")
        try:
            if not parse_duration_s(self.window) > 0:
                raise CollectConfigError("zero")
        except CollectConfigError:
            raise ValueError(
                f"window must be a Prometheus duration such as 5m, got {self.window!r}"
            ) from None
        if not 0 <= self.confidence < 1:
            raise ValueError(
                f"confidence must be in [0, 1) (0.95; 0 reads the quantile itself), "
                f"got {self.confidence!r}"
            )
        if self.bucket_estimate not in ESTIMATES:
            raise ValueError(
                f"bucketEstimate must be one of {', '.join(ESTIMATES)}, "
                f"got {self.bucket_estimate!r}"
            )
        if self.source_pods_match not in MATCHES:
            raise ValueError(
                f"sourcePodsMatch must be one of {', '.join(MATCHES)}, "
                f"got {self.source_pods_match!r}"
            )
        for key, value in (
            ("refreshIntervalS", self.refresh_interval_s),
            ("maxAgeS", self.max_age_s),
            ("prometheusTimeoutS", self.prometheus_timeout_s),
        ):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{key} must be a positive number of seconds, got {value!r}")


# ---- the pod's constraints ----------------------------------------------------------------------


@dataclass(frozen=True)
class DelayConstraint:
    """One `delay_<from>` label: where from, how many ms at most, or what is wrong with it."""

    label: str
    origin: str
    limit_ms: float  # NaN when `problem` is set
    problem: str | None = None

    @property
    def describe(self) -> str:
        if self.problem is not None:
            return self.label
        return f"{self.label} <= {self.limit_ms:g} ms"


def delay_constraints(pod: Mapping[str, Any] | None) -> list[DelayConstraint]:
    """The pod's `delay_<from>` labels, in label order; malformed ones carry their problem."""
    if not pod:
        return []
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not isinstance(labels, Mapping):
        return []
    found = []
    for key, value in labels.items():
        if isinstance(key, str) and key.startswith(DELAY_LABEL_PREFIX):
            found.append(_constraint(key, value))
    return found


def _constraint(key: str, value: object) -> DelayConstraint:
    origin = key[len(DELAY_LABEL_PREFIX) :]
    shown = f'label {key}="{value}"'
    if not origin:
        return DelayConstraint(key, origin, math.nan, f"{shown}: names no node or pod after delay_")
    text = value.strip() if isinstance(value, str) else None
    if text is None or not _PLAIN_NUMBER.fullmatch(text):
        return DelayConstraint(
            key,
            origin,
            math.nan,
            f'{shown}: not a number of milliseconds (write the limit as delay_{origin}: "25")',
        )
    return DelayConstraint(key, origin, float(text))


# ---- evaluation (request path) ------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """The nodes a constraint's `<from>` stands for, and how to say so in a reason."""

    name: str  # `<from>` as the label says it
    nodes: tuple[str, ...]
    pods: int = 0  # how many pods' names start with `<from>` (0: a node or place by name)
    problem: str | None = None  # why it stands for nothing


@dataclass(frozen=True, eq=False)
class ConstraintCheck:
    """One constraint against every candidate; arrays aligned to the cycle's names.

    The deciding RTT is the nearest known origin node's (`sourcePodsMatch: any`) or the
    farthest one's (`all`); `stale_*` keep the last value of an expired link, for the reason.
    """

    constraint: DelayConstraint
    origin: Origin | None
    passes: np.ndarray
    unknown: np.ndarray  # no decision for want of fresh RTTs (fails unless unknownPasses)
    unknown_origins: np.ndarray  # how many origin nodes have no fresh RTT to the candidate
    rtt_ms: np.ndarray  # the deciding known RTT, NaN when none is known
    age_s: np.ndarray
    to_node: np.ndarray  # index into origin.nodes of that RTT, -1 when none
    stale_rtt_ms: np.ndarray  # the last value of an expired link (NaN: none)
    stale_age_s: np.ndarray

    @classmethod
    def failing_all(
        cls, constraint: DelayConstraint, origin: Origin | None, count: int
    ) -> ConstraintCheck:
        """Every candidate fails (a malformed label, an origin that names nothing)."""
        nan, no = np.full(count, np.nan), np.zeros(count, dtype=bool)
        return cls(
            constraint, origin, no, no, np.zeros(count, dtype=np.intp), nan, nan,
            np.full(count, -1, dtype=np.intp), nan, nan,
        )  # fmt: skip

    def node_at(self, i: int) -> str | None:
        k = int(self.to_node[i])
        return self.origin.nodes[k] if k >= 0 and self.origin is not None else None


class DelayPlugin(Plugin):
    name = "Delay"
    Args = DelayArgs

    def __init__(self, args: Any = None) -> None:
        super().__init__(args)
        self.source: RttSource | None = None
        self._last: tuple[object, list[ConstraintCheck]] | None = None

    # ---- background ---------------------------------------------------------------------

    def background(self, context: SourceContext) -> Sequence[LiveSource]:
        from extender.sources.rtt import RttSource, RttSourceSettings

        args = self.args
        settings = RttSourceSettings(
            refresh_interval_s=args.refresh_interval_s,
            max_age_s=args.max_age_s,
            rtt_file=Path(args.rtt_file) if args.rtt_file else None,
            goldpinger=args.goldpinger,
            metric=args.goldpinger_metric,
            selector=args.goldpinger_selector,
            window=args.window,
            quantile=args.quantile,
            estimate=args.bucket_estimate,
            confidence=args.confidence,
            timeout_s=args.prometheus_timeout_s,
        )
        self.source = RttSource(
            settings,
            context.state,
            prometheus_url=context.prometheus_url if context.mode == "live" else None,
            clock=context.clock,
            registry=context.registry,
        )
        return [self.source]

    def status(self) -> Mapping[str, Any] | None:
        return self.source.status() if self.source is not None else None

    # ---- filter and score ---------------------------------------------------------------

    def filter(self, cycle: Cycle) -> FilterVerdict:
        checks = self._checks(cycle)
        if not checks:
            return FilterVerdict({})
        failed: dict[int, str] = {}
        for check in checks:
            failing = ~check.passes
            if failed:
                failing[list(failed)] = False  # a node's reason is its first failed constraint
            positions = np.flatnonzero(failing).tolist()
            if positions:
                failed.update(zip(positions, self._reasons(check, positions), strict=True))
        return FilterVerdict(failed, frozenset(failed))

    def score(self, cycle: Cycle) -> np.ndarray:
        checks = self._checks(cycle)
        share = np.full(len(cycle), np.nan)
        if not checks:
            return share
        share[:] = 0.0
        for check in checks:
            limit_ms = check.constraint.limit_ms
            with np.errstate(invalid="ignore", divide="ignore"):
                used = np.where(
                    limit_ms > 0, check.rtt_ms / limit_ms, np.where(check.rtt_ms > 0, np.inf, 0.0)
                )
            used[check.unknown | np.isnan(check.rtt_ms)] = np.nan
            share = np.maximum(share, used)  # the tightest constraint; NaN (unknown) wins
        return share

    def normalise(self, raw: np.ndarray, cycle: Cycle) -> np.ndarray:
        points = MAX_POINTS * (1.0 - raw)
        return np.clip(np.nan_to_num(points, nan=0.0, neginf=0.0), 0.0, MAX_POINTS)

    def explain(self, cycle: Cycle) -> Mapping[str, Sequence[object]]:
        checks = self._checks(cycle)
        if not checks:
            return {}
        records: list[dict[str, object]] = [{} for _ in range(len(cycle))]
        for check in checks:
            constraint = check.constraint
            broken = (
                constraint.problem is not None
                or check.origin is None
                or (check.origin.problem is not None)
            )
            for i, record in enumerate(records):
                if broken:
                    record[constraint.label] = {"passes": False, "problem": self._reason(check, i)}
                    continue
                known = not check.unknown[i]
                rtt = float(check.rtt_ms[i] if known else check.stale_rtt_ms[i])
                age = float(check.age_s[i] if known else check.stale_age_s[i])
                record[constraint.label] = {
                    "limit_ms": constraint.limit_ms,
                    "rtt_ms": round(rtt, 3) if math.isfinite(rtt) else None,
                    "age_s": round(age, 1) if math.isfinite(age) else None,
                    "to": check.node_at(i),
                    "known": known,
                    "passes": bool(check.passes[i]),
                }
        return {"delay": records}

    # ---- the work, once per cycle ---------------------------------------------------------

    def _checks(self, cycle: Cycle) -> list[ConstraintCheck]:
        last = self._last
        if last is not None and last[0] is cycle:
            return last[1]
        constraints = delay_constraints(cycle.pod)
        checks = [self._check(cycle, constraint) for constraint in constraints]
        # Filter, score and explain of one request share the work (one cycle at a time).
        self._last = (cycle, checks)
        return checks

    def _check(self, cycle: Cycle, constraint: DelayConstraint) -> ConstraintCheck:
        count = len(cycle)
        if constraint.problem is not None:
            return ConstraintCheck.failing_all(constraint, None, count)
        origin = self._origin(cycle, constraint.origin)
        if origin.problem is not None:
            return ConstraintCheck.failing_all(constraint, origin, count)
        matrix = cycle.view.signal(RTT_SIGNAL)
        matrix = matrix if isinstance(matrix, RttMatrix) else None
        targets = matrix.index_of(cycle.names) if matrix is not None else None
        nearest = self.args.source_pods_match == "any"
        limit_ms = constraint.limit_ms

        best_rtt = np.full(count, np.nan)
        best_age = np.full(count, np.nan)
        best_node = np.full(count, -1, dtype=np.intp)
        stale_rtt = np.full(count, np.nan)
        stale_age = np.full(count, np.nan)
        within_any = np.zeros(count, dtype=bool)
        beyond_any = np.zeros(count, dtype=bool)
        unknown_origins = np.zeros(count, dtype=np.intp)
        for k, node in enumerate(origin.nodes):
            rtt, age, known = self._links(cycle, matrix, targets, node)
            within = known & (rtt <= limit_ms)
            within_any |= within
            beyond_any |= known & ~within
            unknown_origins += ~known
            with np.errstate(invalid="ignore"):
                closer = (rtt < best_rtt) if nearest else (rtt > best_rtt)
            better = known & (np.isnan(best_rtt) | closer)
            best_rtt[better], best_age[better], best_node[better] = rtt[better], age[better], k
            expired = ~known & ~np.isnan(rtt) & np.isnan(stale_rtt)
            stale_rtt[expired], stale_age[expired] = rtt[expired], age[expired]

        all_known = unknown_origins == 0
        if nearest:  # near any one of them is enough
            passes = within_any
            unknown = ~within_any & ~all_known
        else:  # near every one of them
            passes = all_known & ~beyond_any
            unknown = ~all_known & ~beyond_any
        if self.args.unknown_passes:
            passes = passes | unknown
        return ConstraintCheck(
            constraint, origin, passes, unknown, unknown_origins, best_rtt, best_age,
            best_node, stale_rtt, stale_age,
        )  # fmt: skip

    @staticmethod
    def _links(
        cycle: Cycle, matrix: RttMatrix | None, targets: np.ndarray | None, node: str
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rtt, age, known) from `node` to every candidate; the node itself at 0."""
        count = len(cycle)
        if matrix is not None and targets is not None:
            values = matrix.links_from(node, targets, cycle.now_s)
            rtt, age, known = values.rtt_ms, values.age_s, values.known
        else:
            rtt, age, known = np.full(count, np.nan), np.full(count, np.nan), np.zeros(count, bool)
        if matrix is None or node not in matrix.positions:
            # Not in the matrix: the node itself is still at 0 from itself.
            position = cycle.view.node(node)
            if position >= 0:
                itself = cycle.candidates.positions == position
                if itself.any():
                    rtt, age, known = rtt.copy(), age.copy(), known.copy()
                    rtt[itself], age[itself], known[itself] = 0.0, 0.0, True
        return rtt, age, known

    def _origin(self, cycle: Cycle, origin: str) -> Origin:
        matrix = cycle.view.signal(RTT_SIGNAL)
        if cycle.view.node(origin) >= 0 or (
            isinstance(matrix, RttMatrix) and origin in matrix.positions
        ):
            return Origin(origin, (origin,))
        pods = cycle.view.signal(PODS_SIGNAL)
        namespace = None
        if not self.args.source_pods_in_all_namespaces:
            namespace = ((cycle.pod or {}).get("metadata") or {}).get("namespace") or "default"
        where = "in any namespace" if namespace is None else f"in namespace {namespace}"
        if not isinstance(pods, PodIndex):
            return Origin(
                origin,
                (),
                problem=f"no node named {origin}, and no pod information to find pods named "
                f"{origin}* (pods are known in live mode only)",
            )
        matching = pods.with_prefix(origin, namespace)
        nodes = tuple(sorted({pod.node for pod in matching}))
        if not nodes:
            return Origin(
                origin,
                (),
                problem=f"no node named {origin} and no running pod named {origin}* {where}",
            )
        return Origin(origin, nodes, pods=len(matching))

    def _reasons(self, check: ConstraintCheck, positions: list[int]) -> list[str]:
        """`_reason` for many candidates; the common case (a node origin whose RTT is known and
        too long) is formatted in one pass, since a constrained pod can fail thousands of nodes.
        """
        constraint, origin = check.constraint, check.origin
        if constraint.problem is not None or origin is None or origin.problem is not None:
            return [self._reason(check, positions[0])] * len(positions)
        index = np.asarray(positions, dtype=np.intp)
        if origin.pods or check.unknown[index].any():
            return [self._reason(check, i) for i in positions]
        head, name = constraint.describe, origin.name
        return [
            f"{head}: RTT to {name} is {rtt:.1f} ms (measured {age:.0f} s ago)"
            for rtt, age in zip(
                check.rtt_ms[index].tolist(), check.age_s[index].tolist(), strict=True
            )
        ]

    def _reason(self, check: ConstraintCheck, i: int) -> str:
        """Why candidate `i` fails this constraint, in the words kube-scheduler will show."""
        constraint = check.constraint
        if constraint.problem is not None:
            return constraint.problem
        origin = check.origin
        assert origin is not None
        head = constraint.describe
        if origin.problem is not None:
            return f"{head}: {origin.problem}"
        rtt, age = float(check.rtt_ms[i]), float(check.age_s[i])
        node = check.node_at(i)
        which = "nearest" if self.args.source_pods_match == "any" else "farthest"
        if not check.unknown[i]:
            where = node
            if origin.pods:
                plural = "s" if origin.pods != 1 else ""
                where = f"{node}, the {which} node running pods {origin.name}* "
                where += f"({origin.pods} pod{plural})"
            return f"{head}: RTT to {where} is {rtt:.1f} ms (measured {age:.0f} s ago)"
        stale_rtt, stale_age = float(check.stale_rtt_ms[i]), float(check.stale_age_s[i])
        if math.isnan(stale_rtt):
            why = "never measured"
        else:
            why = (
                f"last {stale_rtt:.1f} ms, measured {stale_age:.0f} s ago, more than maxAgeS "
                f"{self.args.max_age_s:g} s"
            )
        if not origin.pods and len(origin.nodes) == 1:
            return f"{head}: RTT to {origin.name} unknown ({why})"
        missing = int(check.unknown_origins[i])
        text = (
            f"{head}: RTT unknown to {missing} of the {len(origin.nodes)} nodes running pods "
            f"{origin.name}* ({why})"
        )
        if node is not None:
            text += f"; the {which} known one, {node}, is {rtt:.1f} ms away"
        return text
