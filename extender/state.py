"""What the extender knows about the cluster: nodes, their telemetry, and pods bound recently.

Sources write here (the Kubernetes watch, the Prometheus poller, the snapshot file, the app
itself when it learns of a binding); the request path reads an immutable `ClusterView` of it.
Writers are cheap (a dict update and a version bump under one lock). The view is rebuilt only
when something changed since the last one, or when a recently bound pod's assumed load expires,
so that a request costs array arithmetic rather than walking dictionaries. Name lookups are
cached with the node layout (below 100 nodes kube-scheduler sends every node that passes its
filters, pod after pod; on larger clusters only as many as it searched for, from a start
that rotates, so lists repeat less), and what the request path derives is remembered where
it stays true: with the view (`ClusterView.remember`), with its telemetry (`telemetry_memo`,
across the views that bindings rebuild) or with its node layout (`layout_memo`).

Recently bound pods matter because node metrics lag: a pod bound a second ago shows no load in
`cpu_util` yet, and an extender that ignores it sends a whole burst of pods to the same node.
Each bound pod adds its CPU demand to its node's assumed load until `assumed_window_s` has
passed since binding (by then the metrics show it) or until the pod is gone.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import operator
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from livedata.metrics_table import CPU_UTIL as CPU_UTIL_FEATURE

if TYPE_CHECKING:
    from predictor.curves import CurveTable

log = logging.getLogger(__name__)

DEFAULT_ASSUMED_WINDOW_S = 120.0
# Candidate lists remembered per node layout: below 100 nodes kube-scheduler repeats the same
# few (all nodes, or the nodes that passed its filters); a 5000-name one costs ~100 KiB.
MAX_CACHED_CANDIDATE_LISTS = 8
_ALLOCATABLE_CPU = operator.attrgetter("allocatable_cpu")
_NAME_SEPARATOR = "\n"  # never in a node name (a DNS subdomain)
MAX_DERIVED_PER_VIEW = 8
T = TypeVar("T")


@dataclass(frozen=True)
class NodeInfo:
    """One node as the scheduler sees it (allocatable CPU in cores, labels, annotations).

    `addresses` are the node's `status.addresses` values (InternalIP, ExternalIP, Hostname),
    for plugins that meet nodes by IP (the Delay plugin maps Goldpinger's `host_ip` through them).
    """

    name: str
    allocatable_cpu: float
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    addresses: tuple[str, ...] = ()


NodeValue = float | int | bool
_MISSING = object()


@dataclass(frozen=True, eq=False)
class NodeAttribute:
    """A per-node value that a plugin derives from a node's labels and annotations.

    The state computes it once per node layout (a node's info changes far less often than pods
    arrive) and once per candidate list, so the request path reads a ready array. `missing` is
    the value for names the state has no node info for (unknown names, telemetry-only nodes).
    `check` says, at the time a node is written, what the plugin will treat as a default (an
    unknown label value, an unreadable annotation): the state logs it once per write. Compared
    by identity: define each attribute once, at module level.
    """

    name: str
    of: Callable[[NodeInfo], NodeValue]
    dtype: type | np.dtype
    missing: NodeValue
    check: Callable[[NodeInfo], str | None] | None = None

    def values(self, nodes: Sequence[NodeInfo]) -> np.ndarray:
        """The attribute of each of `nodes`, as one read-only array."""
        return _frozen(np.fromiter(map(self.of, nodes), self.dtype, len(nodes)))


@dataclass(frozen=True)
class _Telemetry:
    values: Mapping[str, float]
    observed_at_s: float
    cpu_util: float  # values["cpu_util"], NaN when absent: read for every node on each rebuild


def _telemetry_entry(values: Mapping[str, float], observed_at_s: float) -> _Telemetry:
    frozen = MappingProxyType(dict(values))
    return _Telemetry(frozen, float(observed_at_s), float(frozen.get(CPU_UTIL_FEATURE, math.nan)))


@dataclass(frozen=True, eq=False)
class Candidates:
    """One request's candidate names resolved against the node layout; shared and read-only.

    `positions` index the view's arrays (-1 for a name the view does not know). The node-info
    arrays are gathered here once: they change with the node layout only, not with telemetry
    or bindings, so a candidate list the scheduler sends again costs one comparison; so are
    the plugins' node attributes (`node_values`), on first use.

    Candidates built from the request's own Node objects (`nodeCacheCapable: false`) carry
    those objects in `nodes`: allocatable CPU and the node attributes come from them, only
    telemetry and assumed load from the view.
    """

    names: tuple[str, ...]
    joined_names: str  # the names joined by _NAME_SEPARATOR: the cache's full comparison
    positions: np.ndarray
    in_view: np.ndarray
    all_in_view: bool
    has_node_info: np.ndarray
    allocatable_cpu: np.ndarray
    _layout: _NodeArrays | None = field(default=None, repr=False)
    nodes: tuple[NodeInfo, ...] | None = field(default=None, repr=False)
    # Slot 0: (view curve rows, these candidates' rows in them), as in ClusterView.
    _curve_rows: list = field(default_factory=lambda: [(None, None)], repr=False)
    _attributes: dict = field(default_factory=dict, repr=False)

    def gather(self, array: np.ndarray, missing: float | bool | int) -> np.ndarray:
        """`array` (aligned to the view) at the candidates; `missing` where not in the view."""
        return _gather(array, self.positions, self.in_view, self.all_in_view, missing)

    def memo(self, key: Hashable, compute: Callable[[Candidates], Any]) -> Any:
        """`compute(self)`, once per candidate list: for what a plugin derives from node
        attributes alone (e.g. the positions of powerless nodes). `key` must be unique to the
        plugin (a module-level object); the value must be immutable."""
        value = self._attributes.get(key, _MISSING)
        if value is _MISSING:
            value = self._attributes[key] = compute(self)
        return value

    def node_values(self, attribute: NodeAttribute) -> np.ndarray:
        """`attribute` of each candidate (read-only); computed once per candidate list."""
        values = self._attributes.get(attribute)
        if values is not None:
            return values
        if self.nodes is not None:
            values = attribute.values(self.nodes)
        else:
            assert self._layout is not None
            values = _frozen(
                self.gather(self._layout.node_values(attribute), attribute.missing).astype(
                    attribute.dtype, copy=False
                )
            )
        self._attributes[attribute] = values
        return values

    def curve_rows(self, view_rows: np.ndarray) -> np.ndarray:
        """Curve row of each candidate from the view's (`ClusterView.curve_rows`); -1 = none."""
        cached_for, rows = self._curve_rows[0]
        if cached_for is view_rows:
            return rows
        rows = _frozen(self.gather(view_rows, -1))
        self._curve_rows[0] = (view_rows, rows)
        return rows


@dataclass(frozen=True, eq=False)
class _NodeArrays:
    """The part of a view that changes only with the node set (and telemetry-only names).

    Every view built on one layout shares this object, so the name lookups cached here (recent
    candidate lists, curve rows) survive the view rebuilds that telemetry and bindings cause.

    A new layout mostly differs from the one before by a node or two (a label, an annotation
    the controllers wrote): it keeps the previous layout (`_previous`, one generation only)
    and carries what was derived there for the nodes whose info is the same object, so that
    a change costs the request after it about 1 ms at 5,000 nodes rather than about 16.
    """

    names: tuple[str, ...]
    positions: Mapping[str, int]
    has_node_info: np.ndarray
    allocatable_cpu: np.ndarray
    nodes: tuple[NodeInfo, ...]  # the nodes with node info, in view order (they come first)
    # The dict behind `positions` (a read-only proxy): its `get` is a quarter cheaper, on
    # every candidate of every request.
    _lookup: dict = field(default_factory=dict, repr=False)
    # (count, first name, last name) -> Candidates: a cheap key, checked by full comparison.
    _candidates: dict = field(default_factory=dict, repr=False)
    _candidates_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Slot 0 holds one (curve table, rows) pair; one atomic store replaces it.
    _curve_rows: list = field(default_factory=lambda: [(None, None)], repr=False)
    _attributes: dict = field(default_factory=dict, repr=False)
    # key -> (telemetry arrays, value): what is derived from one telemetry.
    _telemetry_derived: dict = field(default_factory=dict, repr=False)
    # key -> value: what is derived from the node set alone (ClusterView.layout_memo).
    _layout_derived: dict = field(default_factory=dict, repr=False)
    # Slot 0: the layout this one replaced, until everything derived there is carried over.
    _previous: list = field(default_factory=lambda: [None], repr=False)

    @functools.cached_property
    def _carried_nodes(self) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """(positions here, positions in the previous layout) of the nodes whose info is the
        same object in both, and the positions of the others (new or changed nodes)."""
        previous = self._previous[0]
        old_nodes = previous.nodes if previous is not None else ()
        old_lookup = previous._lookup if previous is not None else {}
        if previous is not None and previous.names is self.names:  # the same node set
            count = len(self.nodes)
            same = np.fromiter(map(operator.is_, self.nodes, old_nodes), bool, count)
            here = np.flatnonzero(same)
            return here, here, np.flatnonzero(~same).tolist()
        here: list[int] = []
        there: list[int] = []
        changed: list[int] = []
        for i, node in enumerate(self.nodes):
            j = old_lookup.get(node.name, -1)
            if 0 <= j < len(old_nodes) and old_nodes[j] is node:
                here.append(i)
                there.append(j)
            else:
                changed.append(i)
        return np.asarray(here, dtype=np.intp), np.asarray(there, dtype=np.intp), changed

    def _release_previous_when_carried(self) -> None:
        previous = self._previous[0]
        if previous is None:
            return
        # Background sources derive from views too: a dict another thread grows while it is
        # compared raises, and then the previous layout simply stays until the next check.
        with contextlib.suppress(RuntimeError):
            if (
                previous._attributes.keys() <= self._attributes.keys()
                and previous._layout_derived.keys() <= self._layout_derived.keys()
            ):
                self._previous[0] = None

    def memo(self, key: Hashable, compute: Callable[[], T], carry: Callable[[T], T] | None) -> T:
        """See ClusterView.layout_memo."""
        derived = self._layout_derived
        value = derived.get(key, _MISSING)
        if value is _MISSING:
            previous = self._previous[0]
            old = _MISSING if previous is None else previous._layout_derived.get(key, _MISSING)
            value = derived[key] = compute() if carry is None or old is _MISSING else carry(old)
            self._release_previous_when_carried()
        return value

    @functools.cached_property
    def all_candidates(self) -> Candidates:
        """Every node of the layout as a candidate list, in view order."""
        count = len(self.names)
        return Candidates(
            names=self.names,
            joined_names="",
            positions=_frozen(np.arange(count, dtype=np.intp)),
            in_view=_frozen(np.ones(count, dtype=bool)),
            all_in_view=True,
            has_node_info=self.has_node_info,
            allocatable_cpu=self.allocatable_cpu,
            _layout=self,
        )

    def node_values(self, attribute: NodeAttribute) -> np.ndarray:
        """`attribute` of every view node (`missing` for telemetry-only names), cached."""
        values = self._attributes.get(attribute)
        if values is None:
            values = np.full(len(self.names), attribute.missing, dtype=attribute.dtype)
            previous = self._previous[0]
            old = None if previous is None else previous._attributes.get(attribute)
            if old is None:
                values[: len(self.nodes)] = attribute.values(self.nodes)
            else:  # the same node info has the same value: only new and changed nodes are read
                here, there, changed = self._carried_nodes
                values[here] = old[there]
                values[changed] = attribute.values([self.nodes[i] for i in changed])
            values = self._attributes[attribute] = _frozen(values)
            self._release_previous_when_carried()
        return values

    def index_of(self, names: Sequence[str]) -> np.ndarray:
        lookup = self._lookup.get
        return np.fromiter(map(lookup, names, repeat(-1)), dtype=np.intp, count=len(names))

    def candidates(self, names: Sequence[str]) -> Candidates:
        key = (len(names), names[0], names[-1]) if names else (0, "", "")
        # One contiguous string compares as a memcmp; comparing name by name would touch one
        # (cold) string object per candidate. A name containing the separator is never cached.
        joined = _NAME_SEPARATOR.join(names)
        cacheable = joined.count(_NAME_SEPARATOR) == max(len(names) - 1, 0)
        cached = self._candidates.get(key) if cacheable else None
        if cached is not None and cached.joined_names == joined:
            return cached
        names = tuple(names)
        positions = _frozen(self.index_of(names))
        in_view = _frozen(positions >= 0)
        all_in_view = bool(in_view.all())

        def gathered(array: np.ndarray, missing: float | bool | int) -> np.ndarray:
            return _frozen(_gather(array, positions, in_view, all_in_view, missing))

        resolved = Candidates(
            names=names,
            joined_names=joined,
            positions=positions,
            in_view=in_view,
            all_in_view=all_in_view,
            has_node_info=gathered(self.has_node_info, False),
            allocatable_cpu=gathered(self.allocatable_cpu, np.nan),
            _layout=self,
        )
        if not cacheable:
            return resolved
        with self._candidates_lock:
            self._candidates.pop(key, None)
            self._candidates[key] = resolved
            while len(self._candidates) > MAX_CACHED_CANDIDATE_LISTS:
                del self._candidates[next(iter(self._candidates))]
        return resolved

    def curve_rows(self, curves: CurveTable) -> np.ndarray:
        table, rows = self._curve_rows[0]
        if table is curves:
            return rows
        rows = _frozen(np.asarray(curves.index_of(self.names), dtype=np.intp))
        self._curve_rows[0] = (curves, rows)
        return rows


@dataclass(frozen=True)
class _TelemetryArrays:
    cpu_util: np.ndarray
    observed_at_s: np.ndarray


@dataclass(frozen=True)
class _Binding:
    node: str
    cpu_cores: float
    bound_at_s: float


@dataclass(frozen=True, eq=False)
class ClusterView:
    """Immutable snapshot of the cluster for the request path; arrays are aligned to `names`.

    `names` holds the nodes a node source reported (`has_node_info` True) followed by nodes known
    only from telemetry (allocatable NaN, node attributes `missing`). `cpu_util` is NaN and
    `observed_at_s` is -inf for a node without telemetry. `assumed_cpu` (cores) already has
    expired bindings removed as of `built_at_s`; the view stays valid until `valid_until_s`.
    """

    version: int
    built_at_s: float
    valid_until_s: float
    names: tuple[str, ...]
    positions: Mapping[str, int]
    has_node_info: np.ndarray
    allocatable_cpu: np.ndarray
    assumed_cpu: np.ndarray
    cpu_util: np.ndarray
    observed_at_s: np.ndarray
    # Live data beyond nodes and telemetry that background sources publish for plugins
    # (`ClusterState.set_signal`): name -> an immutable snapshot object.
    signals: Mapping[str, object]
    _layout: _NodeArrays = field(repr=False)
    # Results the request path derives from this view alone (scoring's per-candidate-list
    # state), kept with the view so that they go when it goes: key -> (value, keep-alives).
    _derived: dict = field(default_factory=dict, repr=False)

    def recall(self, key: Hashable) -> Any:
        """What `remember` stored under `key` with this view; None when nothing is."""
        entry = self._derived.get(key)
        return None if entry is None else entry[0]

    def remember(self, key: Hashable, value: object, *keep_alive: object) -> None:
        """Remember `value` under `key` with this view (the last few keys only).

        `keep_alive` objects are held as long as the entry, for keys built from their ids.
        """
        derived = self._derived
        if len(derived) >= MAX_DERIVED_PER_VIEW and key not in derived:
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                del derived[next(iter(derived))]
        derived[key] = (value, keep_alive)

    def all_candidates(self) -> Candidates:
        """Every node of the view as a candidate list, in view order (shared by the layout)."""
        return self._layout.all_candidates

    def layout_memo(
        self, key: Hashable, compute: Callable[[], T], *, carry: Callable[[T], T] | None = None
    ) -> T:
        """`compute()`, once per node layout (node set and node info): shared by every view
        until a node comes, goes or changes. `key` must be unique to the caller (a module-level
        object or a class); the value must be immutable. With `carry`, a new layout derives
        its value from the previous layout's (`carry(previous value)`) when there is one."""
        return self._layout.memo(key, compute, carry)

    def telemetry_memo(
        self, key: Hashable, compute: Callable[[], T], *, valid: Callable[[T], bool]
    ) -> T:
        """`compute()`, shared by every view with this view's nodes and telemetry.

        Views are rebuilt after every binding; what depends only on the nodes and their
        telemetry survives those rebuilds here. A value `valid` refuses is computed again and
        replaces it (one value per key; the last few keys are kept).
        """
        derived = self._layout._telemetry_derived
        telemetry = (self.cpu_util, self.observed_at_s)
        entry = derived.get(key)
        if (
            entry is not None
            and entry[0][0] is telemetry[0]
            and entry[0][1] is telemetry[1]
            and valid(entry[1])
        ):
            return entry[1]
        value = compute()
        if len(derived) >= MAX_DERIVED_PER_VIEW and key not in derived:
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                del derived[next(iter(derived))]
        derived[key] = (telemetry, value)
        return value

    def curve_rows(self, curves: CurveTable) -> np.ndarray:
        """Row of each view node in `curves` (-1 = no curve), cached for the latest table.

        The cache belongs to the node layout, not to this view: views are rebuilt after every
        binding, and the request path maps view positions to curve rows through this array
        rather than looking each name up a second time.
        """
        return self._layout.curve_rows(curves)

    def signal(self, name: str) -> Any:
        """The snapshot a background source published under `name`; None when none has."""
        return self.signals.get(name)

    def candidates(self, names: Sequence[str]) -> Candidates:
        """`names` resolved to positions and node info; the last few lists are remembered.

        On a repeated list the remembered `Candidates` comes back, with its own `names` tuple
        (the same object each time: answers can be cached by its identity).
        """
        return self._layout.candidates(names)

    def candidates_from_nodes(self, nodes: Sequence[NodeInfo]) -> Candidates:
        """Candidates from the request's own Node objects (`nodeCacheCapable: false`).

        Positions (for telemetry and assumed load) come from the view; allocatable CPU and the
        node attributes from the objects themselves, which the scheduler just sent.
        """
        resolved = self._layout.candidates([node.name for node in nodes])
        count = len(nodes)
        return Candidates(
            names=resolved.names,
            joined_names=resolved.joined_names,
            positions=resolved.positions,
            in_view=resolved.in_view,
            all_in_view=resolved.all_in_view,
            has_node_info=_frozen(np.ones(count, dtype=bool)),
            allocatable_cpu=_frozen(
                np.fromiter((node.allocatable_cpu for node in nodes), np.float64, count)
            ),
            nodes=tuple(nodes),
        )

    def node_values(self, attribute: NodeAttribute) -> np.ndarray:
        """`attribute` of every view node (`missing` for telemetry-only names), cached."""
        return self._layout.node_values(attribute)

    def index_of(self, names: Sequence[str]) -> np.ndarray:
        """Positions of `names` in this view's arrays; -1 for a name the view does not know."""
        return self._layout.index_of(names)

    def node(self, name: str) -> int:
        """Position of one node, -1 when unknown."""
        return self.positions.get(name, -1)


class ClusterState:
    """Thread-safe store of nodes, telemetry and recent bindings; one lock guards everything."""

    def __init__(
        self,
        assumed_window_s: float = DEFAULT_ASSUMED_WINDOW_S,
        *,
        node_attributes: Sequence[NodeAttribute] = (),
    ) -> None:
        """`node_attributes`: those whose `check` runs (and logs) when a node is written."""
        if not assumed_window_s >= 0 or math.isinf(assumed_window_s):
            raise ValueError(f"assumed_window_s must be finite and >= 0, got {assumed_window_s!r}")
        self._assumed_window_s = float(assumed_window_s)
        self._node_checks = tuple(a.check for a in node_attributes if a.check is not None)
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeInfo] = {}
        self._telemetry: dict[str, _Telemetry] = {}
        # Insertion order is binding order (a re-bound pod is moved to the end), so expired
        # bindings are at the front and purging stops at the first live one.
        self._bindings: dict[str, _Binding] = {}
        self._signals: Mapping[str, object] = MappingProxyType({})
        # _version: anything changed; _layout_version: the node set, a node's info or the set of
        # telemetry-only names changed; _telemetry_version: any telemetry changed. A rebuild
        # reuses the arrays whose versions did not move.
        self._version = 0
        self._layout_version = 0
        self._telemetry_version = 0
        self._view: ClusterView | None = None
        self._node_arrays: tuple[int, _NodeArrays] | None = None
        self._telemetry_arrays: tuple[tuple[str, ...], int, _TelemetryArrays] | None = None

    @property
    def assumed_window_s(self) -> float:
        return self._assumed_window_s

    # ---- writers -------------------------------------------------------------------------

    def replace_nodes(self, nodes: Iterable[NodeInfo]) -> None:
        """Make `nodes` the whole node set (initial list, resync, snapshot file)."""
        new_nodes = {node.name: self._checked(node) for node in nodes}
        with self._lock:
            if new_nodes == self._nodes:
                return
            self._nodes = new_nodes
            self._version += 1
            self._layout_version += 1

    def upsert_node(self, node: NodeInfo) -> None:
        node = self._checked(node)
        with self._lock:
            if self._nodes.get(node.name) == node:
                return
            self._nodes[node.name] = node
            self._version += 1
            self._layout_version += 1

    def remove_node(self, name: str) -> None:
        """Forget a deleted node and its telemetry (autoscaled fleets would otherwise grow)."""
        with self._lock:
            removed_node = self._nodes.pop(name, None)
            removed_telemetry = self._telemetry.pop(name, None)
            if removed_node is None and removed_telemetry is None:
                return
            self._version += 1
            self._layout_version += 1
            if removed_telemetry is not None:
                self._telemetry_version += 1

    def set_telemetry(self, node: str, values: Mapping[str, float], observed_at_s: float) -> None:
        """Record the latest telemetry of `node` (feature name -> value) observed at a time."""
        self.set_telemetry_many([(node, values, observed_at_s)])

    def set_telemetry_many(
        self, readings: Iterable[tuple[str, Mapping[str, float], float]]
    ) -> None:
        """`set_telemetry` for a whole poll round under one lock (added to the contract)."""
        entries = [(node, _telemetry_entry(values, at_s)) for node, values, at_s in readings]
        with self._lock:
            changed = False
            for node, entry in entries:
                previous = self._telemetry.get(node)
                if previous == entry:
                    continue
                if previous is None and node not in self._nodes:
                    self._layout_version += 1  # a new telemetry-only name
                self._telemetry[node] = entry
                changed = True
            if changed:
                self._version += 1
                self._telemetry_version += 1

    def pod_bound(self, node: str, pod_uid: str, cpu_cores: float, bound_at_s: float) -> None:
        """A pod was bound to `node`: assume its CPU there until the window passes.

        Binding the same pod again (a repeated watch event, or a re-bind) replaces the earlier
        entry, so a pod counts once.
        """
        if not math.isfinite(cpu_cores) or cpu_cores < 0:
            raise ValueError(f"pod {pod_uid}: cpu_cores must be finite and >= 0, got {cpu_cores!r}")
        binding = _Binding(node, float(cpu_cores), float(bound_at_s))
        with self._lock:
            if self._bindings.get(pod_uid) == binding:
                return
            self._bindings.pop(pod_uid, None)
            self._bindings[pod_uid] = binding
            self._purge_expired_locked(float(bound_at_s))
            self._version += 1

    def set_signal(self, name: str, value: object) -> None:
        """Publish `value` (an immutable snapshot: carbon intensities, RTTs...) under `name`.

        The next view carries it; plugins read it with `ClusterView.signal(name)`, so one
        request sees one consistent set. Replacing a value with the same object is no change.
        """
        with self._lock:
            if self._signals.get(name) is value:
                return
            self._signals = MappingProxyType({**self._signals, name: value})
            self._version += 1

    def pod_gone(self, pod_uid: str) -> None:
        """The pod was deleted (or finished): its load no longer counts."""
        with self._lock:
            if self._bindings.pop(pod_uid, None) is not None:
                self._version += 1

    # ---- readers -------------------------------------------------------------------------

    def view(self, now_s: float) -> ClusterView:
        """The current snapshot; rebuilt only if something changed or a binding expired."""
        with self._lock:
            cached = self._view
            # A caller whose clock reads slightly behind the builder's still gets the cached view:
            # going back in time can only revive bindings that were already counted as gone.
            if (
                cached is not None
                and cached.version == self._version
                and now_s < cached.valid_until_s
            ):
                return cached
            self._view = self._build_view_locked(now_s)
            return self._view

    def telemetry_snapshot(self) -> tuple[int, dict[str, tuple[Mapping[str, float], float]]]:
        """(version, {node: (values, observed_at_s)}); the version changes with the telemetry."""
        with self._lock:
            return self._telemetry_version, {
                name: (entry.values, entry.observed_at_s) for name, entry in self._telemetry.items()
            }

    def telemetry_version(self) -> int:
        """The telemetry version alone, without copying the snapshot (contract addition)."""
        with self._lock:
            return self._telemetry_version

    def layout_version(self) -> int:
        """The version of the node set and the nodes' info alone (contract addition)."""
        with self._lock:
            return self._layout_version

    def node_cores_snapshot(self) -> tuple[int, dict[str, float]]:
        """(layout version, {node: allocatable CPU in cores}) of the nodes a source reported;
        the version changes with the node set or a node's info (contract addition)."""
        with self._lock:
            return self._layout_version, {
                name: node.allocatable_cpu for name, node in self._nodes.items()
            }

    def node_names(self) -> list[str]:
        with self._lock:
            return list(self._nodes)

    def node_infos(self) -> list[NodeInfo]:
        """Every node's info (for background sources that need more than the view's arrays)."""
        with self._lock:
            return list(self._nodes.values())

    def assumed_pod_count(self) -> int:
        """Bindings currently held (live or not yet purged); for metrics and tests."""
        with self._lock:
            return len(self._bindings)

    # ---- internals -----------------------------------------------------------------------

    def _checked(self, node: NodeInfo) -> NodeInfo:
        """Log once per write what a plugin will silently treat as a default."""
        for check in self._node_checks:
            problem = check(node)
            if problem is not None:
                log.warning("node %s: %s", node.name, problem)
        return node

    def _purge_expired_locked(self, now_s: float) -> None:
        window_s = self._assumed_window_s
        expired = []
        for uid, binding in self._bindings.items():
            if binding.bound_at_s + window_s > now_s:
                break
            expired.append(uid)
        for uid in expired:
            del self._bindings[uid]

    def _build_view_locked(self, now_s: float) -> ClusterView:
        nodes = self._current_node_arrays_locked()
        telemetry = self._current_telemetry_arrays_locked(nodes)
        assumed, valid_until_s = self._assumed_cores_locked(nodes.positions, now_s)
        return ClusterView(
            version=self._version,
            built_at_s=now_s,
            valid_until_s=valid_until_s,
            names=nodes.names,
            positions=nodes.positions,
            has_node_info=nodes.has_node_info,
            allocatable_cpu=nodes.allocatable_cpu,
            assumed_cpu=assumed,
            cpu_util=telemetry.cpu_util,
            observed_at_s=telemetry.observed_at_s,
            signals=self._signals,
            _layout=nodes,
        )

    def _current_node_arrays_locked(self) -> _NodeArrays:
        if self._node_arrays is not None and self._node_arrays[0] == self._layout_version:
            return self._node_arrays[1]
        # Telemetry-only nodes are included so that request node objects (nodeCacheCapable
        # false) find their telemetry even when no node source runs.
        extra = self._telemetry.keys() - self._nodes.keys()
        telemetry_only = [name for name in self._telemetry if name in extra] if extra else []
        names = (*self._nodes, *telemetry_only)
        count = len(names)
        previous = self._node_arrays[1] if self._node_arrays is not None else None
        if (
            previous is not None
            and len(previous.nodes) == len(self._nodes)
            and previous.names == names
        ):
            # The same names in the same order, as many with node info (a node's info
            # changed): the lookups and has_node_info stay; the telemetry arrays, aligned to
            # the names, stay too.
            names, lookup, positions = previous.names, previous._lookup, previous.positions
            has_node_info = previous.has_node_info
            curve_rows = previous._curve_rows[0]
        else:
            lookup = {name: i for i, name in enumerate(names)}
            positions = MappingProxyType(lookup)
            has_node_info = np.zeros(count, dtype=bool)
            has_node_info[: len(self._nodes)] = True
            has_node_info = _frozen(has_node_info)
            curve_rows = (None, None)
        nodes = tuple(self._nodes.values())
        allocatable = np.full(count, np.nan, dtype=np.float64)
        allocatable[: len(nodes)] = np.fromiter(
            map(_ALLOCATABLE_CPU, nodes), np.float64, len(nodes)
        )
        if previous is not None:
            previous._previous[0] = None  # one generation back, never a chain
        arrays = _NodeArrays(
            names=names,
            positions=positions,
            has_node_info=has_node_info,
            allocatable_cpu=_frozen(allocatable),
            nodes=nodes,
            _lookup=lookup,
            _curve_rows=[curve_rows],
            _previous=[previous],
        )
        self._node_arrays = (self._layout_version, arrays)
        return arrays

    def _current_telemetry_arrays_locked(self, nodes: _NodeArrays) -> _TelemetryArrays:
        # Keyed by the names tuple's identity: a layout with the same names keeps the arrays.
        key = (nodes.names, self._telemetry_version)
        cached = self._telemetry_arrays
        if cached is not None and cached[0] is key[0] and cached[1] == key[1]:
            return cached[2]
        count = len(nodes.names)
        entries = list(map(self._telemetry.get, nodes.names))
        util = np.fromiter(
            (math.nan if e is None else e.cpu_util for e in entries), np.float64, count
        )
        observed = np.fromiter(
            (-math.inf if e is None else e.observed_at_s for e in entries), np.float64, count
        )
        arrays = _TelemetryArrays(cpu_util=_frozen(util), observed_at_s=_frozen(observed))
        self._telemetry_arrays = (*key, arrays)
        return arrays

    def _assumed_cores_locked(
        self, positions: Mapping[str, int], now_s: float
    ) -> tuple[np.ndarray, float]:
        """Assumed cores per view node as of `now_s`, and when the first binding expires."""
        window_s = self._assumed_window_s
        self._purge_expired_locked(now_s)
        assumed = np.zeros(len(positions), dtype=np.float64)
        valid_until_s = math.inf
        # Bindings may arrive out of order, so the purge can leave some expired ones behind
        # the first live one: the expiry test here is per binding.
        for binding in self._bindings.values():
            expires_at_s = binding.bound_at_s + window_s
            if expires_at_s <= now_s:
                continue
            position = positions.get(binding.node)
            if position is None:
                continue
            assumed[position] += binding.cpu_cores
            valid_until_s = min(valid_until_s, expires_at_s)
        return _frozen(assumed), valid_until_s


def _gather(
    array: np.ndarray,
    positions: np.ndarray,
    in_view: np.ndarray,
    all_in_view: bool,
    missing: float | bool | int,
) -> np.ndarray:
    if all_in_view:
        return array.take(positions)
    if len(array) == 0:
        return np.full(positions.shape, missing, dtype=array.dtype)
    return np.where(in_view, array.take(positions), missing).astype(array.dtype)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array
