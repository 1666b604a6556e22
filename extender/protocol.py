"""The kube-scheduler extender v1 wire format: parse requests, build answers kube-scheduler reads.

The Go types (`k8s.io/kube-scheduler/extender/v1`) carry no JSON tags, so the JSON uses Go
field names: a request is `ExtenderArgs {Pod, Nodes, NodeNames}` where `Pod` is a full Pod
object, and exactly one of `NodeNames` (`nodeCacheCapable: true`) or `Nodes` (a NodeList,
`nodeCacheCapable: false`) is set; unset fields arrive as `null`.

Answers:
- filter: `ExtenderFilterResult {NodeNames | Nodes, FailedNodes, [FailedAndUnresolvableNodes],
  Error}`, echoing the passing candidates exactly as they came (kube-scheduler rejects a name
  that was not in its request);
- prioritize: a bare `HostPriorityList` `[{"Host": name, "Score": n}]` where `Score` must be an
  integer literal 0..10 (Go refuses `7.0` and then drops all our scores).

Anything unreadable raises `ProtocolError`, which the service answers with 400 and the message.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import NoReturn

import numpy as np
import orjson

from extender.state import NodeInfo
from livedata.pod_resources import parse_cpu_quantity

MIN_EXTENDER_PRIORITY = 0
MAX_EXTENDER_PRIORITY = 10


class ProtocolError(ValueError):
    """The request body is not an ExtenderArgs kube-scheduler would send; says what and where."""


@dataclass(frozen=True)
class ExtenderArgs:
    """One parsed request. `nodes` are the raw Node objects (kept to echo them back)."""

    pod: dict
    node_names: list[str] | None
    nodes: list[dict] | None
    # Derived by `parse_extender_args` (added to the architecture contract): the candidates'
    # names in request order, and with `nodes`, the NodeInfo read from each object.
    candidate_names: list[str] = field(default_factory=list)
    node_infos: list[NodeInfo] | None = None

    def __post_init__(self) -> None:
        if not self.candidate_names and (self.node_names or self.nodes):
            names = (
                list(self.node_names)
                if self.node_names is not None
                else [_node_name(node, f"Nodes.items[{i}]") for i, node in enumerate(self.nodes)]
            )
            object.__setattr__(self, "candidate_names", names)

    @property
    def candidates(self) -> list[str] | list[NodeInfo]:
        """What scoring takes: node names, or NodeInfos when the nodes came as objects."""
        if self.nodes is not None:
            if self.node_infos is None:
                object.__setattr__(self, "node_infos", _node_infos(self.nodes))
            return self.node_infos
        return self.candidate_names


def parse_extender_args(body: bytes | bytearray | memoryview | str) -> ExtenderArgs:
    """Parse and check one ExtenderArgs JSON body; raises `ProtocolError` saying what is wrong."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"request body is not readable JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ProtocolError(
            f"request body must be a JSON object (ExtenderArgs), got {_json_type(document)}"
        )
    pod = document.get("Pod")
    if pod is None:
        raise ProtocolError("request has no Pod (missing or null)")
    if not isinstance(pod, dict):
        raise ProtocolError(f"Pod must be a JSON object, got {_json_type(pod)}")

    raw_names = document.get("NodeNames")
    raw_nodes = document.get("Nodes")
    if raw_names is not None and raw_nodes is not None:
        raise ProtocolError("both Nodes and NodeNames are set; kube-scheduler sends only one")

    node_names: list[str] | None = None
    nodes: list[dict] | None = None
    node_infos: list[NodeInfo] | None = None
    if raw_names is not None:
        if not isinstance(raw_names, list):
            raise ProtocolError(f"NodeNames must be a list of strings, got {_json_type(raw_names)}")
        # C-level checks first (thousands of names per request): joining fails on anything but
        # strings, and all() on strings fails on an empty one. Find the culprit only on failure.
        try:
            "".join(raw_names)
            names_ok = all(raw_names)
        except TypeError:
            names_ok = False
        if not names_ok:
            for i, name in enumerate(raw_names):
                if not isinstance(name, str) or not name:
                    raise ProtocolError(f"NodeNames[{i}] must be a non-empty string, got {name!r}")
        node_names = raw_names
        names = raw_names
    elif raw_nodes is not None:
        if not isinstance(raw_nodes, dict):
            raise ProtocolError(
                f"Nodes must be a NodeList object with items, got {_json_type(raw_nodes)}"
            )
        items = raw_nodes.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise ProtocolError(f"Nodes.items must be a list, got {_json_type(items)}")
        nodes = items
        node_infos = _node_infos(items)
        names = [info.name for info in node_infos]
    else:
        names = []
    return ExtenderArgs(
        pod=pod,
        node_names=node_names,
        nodes=nodes,
        candidate_names=list(names),
        node_infos=node_infos,
    )


def node_info_from_object(node: Mapping, where: str = "node") -> NodeInfo:
    """NodeInfo from a full Kubernetes Node object (allocatable CPU, labels, annotations)."""
    info = _readable_node_info(node)
    if info is None:
        _raise_bad_node(node, where)
    return info


def _readable_node_info(node: object) -> NodeInfo | None:
    """The NodeInfo, or None when anything is off; builds no message (runs for every node)."""
    try:
        metadata = node["metadata"]  # type: ignore[index]
        name = metadata["name"]
        labels = metadata.get("labels") or {}
        annotations = metadata.get("annotations") or {}
        allocatable_cpu = parse_cpu_quantity(node["status"]["allocatable"]["cpu"])  # type: ignore[index]
    except (KeyError, TypeError, AttributeError, ValueError):
        return None
    if (
        isinstance(name, str)
        and name
        and isinstance(labels, Mapping)
        and isinstance(annotations, Mapping)
    ):
        return NodeInfo(name, allocatable_cpu, labels, annotations)
    return None


def _raise_bad_node(node: object, where: str) -> NoReturn:
    """Say precisely what is wrong with a node object that the happy path refused."""
    name = _node_name(node, where)
    where = f"{where} ({name})"
    metadata = node["metadata"]  # type: ignore[index]
    _optional_object(metadata.get("labels"), f"{where}: metadata.labels")
    _optional_object(metadata.get("annotations"), f"{where}: metadata.annotations")
    status = _optional_object(node.get("status"), f"{where}: status")  # type: ignore[union-attr]
    allocatable = _optional_object(status.get("allocatable"), f"{where}: status.allocatable")
    cpu = allocatable.get("cpu")
    if cpu is None:
        raise ProtocolError(f"{where}: status.allocatable.cpu is missing")
    try:
        parse_cpu_quantity(cpu)
    except ValueError as exc:
        raise ProtocolError(f"{where}: status.allocatable.cpu: {exc}") from None
    raise ProtocolError(f"{where}: not a readable Node object")


def filter_result(
    args: ExtenderArgs, failed: Mapping[str, str], unresolvable: Collection[str] = ()
) -> dict:
    """ExtenderFilterResult: candidates not in `failed` pass, echoed in the request's form.

    Only names from the request appear, in any list; with neither NodeNames nor Nodes in the
    request there is nothing to pass and the answer is empty. Failed names also listed in
    `unresolvable` are repeated in `FailedAndUnresolvableNodes` (which takes precedence in
    kube-scheduler since v1.21: preemption skips them); the field is left out when empty.
    """
    if failed:
        requested = set(args.candidate_names)
        failed_nodes = {name: str(reason) for name, reason in failed.items() if name in requested}
    else:
        failed_nodes = {}
    if args.nodes is not None:
        passing_nodes = [
            node
            for node, name in zip(args.nodes, args.candidate_names, strict=True)
            if name not in failed_nodes
        ]
        answer: dict = {"Nodes": {"items": passing_nodes}, "FailedNodes": failed_nodes}
    else:
        if failed_nodes:
            passing_names = [name for name in args.candidate_names if name not in failed_nodes]
        else:
            passing_names = list(args.candidate_names)
        answer = {"NodeNames": passing_names, "FailedNodes": failed_nodes}
    unresolvable_nodes = {
        name: reason for name, reason in failed_nodes.items() if name in unresolvable
    }
    if unresolvable_nodes:
        answer["FailedAndUnresolvableNodes"] = unresolvable_nodes
    answer["Error"] = ""
    return answer


def prioritize_result(host_scores: Iterable[tuple[str, int]]) -> list[dict]:
    """HostPriorityList: `[{"Host": name, "Score": int}]`; scores must be ints 0..10."""
    pairs = list(host_scores)
    scores = [score for _, score in pairs]
    # Checked with C-level builtins: this runs for up to thousands of nodes per request.
    if set(map(type, scores)) <= {int} and (
        not scores or MIN_EXTENDER_PRIORITY <= min(scores) <= max(scores) <= MAX_EXTENDER_PRIORITY
    ):
        return [{"Host": host, "Score": score} for host, score in pairs]
    return [{"Host": host, "Score": _checked_score(host, score)} for host, score in pairs]


def prioritize_result_arrays(hosts: Sequence[str], scores: np.ndarray) -> list[dict]:
    """`prioritize_result` for an `Assessment`'s `names` and integer `score` array (faster).

    From the second request with the same `hosts` object on (scoring hands back one tuple per
    candidate list it has cached), the entries come from a table of prebuilt ones, picked by
    array indexing: no per-node Python work. Those entries are shared between answers, so the
    answer is for encoding only: never modify its dicts.
    """
    scores = _checked_scores(hosts, scores)
    table = _answer_tables.get(hosts)
    if table is not None:
        return table.entries.take(table.row_starts + scores).tolist()
    return _plain_entries(hosts, scores)


def _checked_scores(hosts: Sequence[object], scores: np.ndarray) -> np.ndarray:
    scores = np.asarray(scores)
    if len(hosts) != len(scores):
        raise ValueError(f"{len(hosts)} hosts but {len(scores)} scores")
    if scores.dtype.kind not in "iu":
        raise TypeError(f"scores must be integers, got dtype {scores.dtype}")
    if len(scores) and not (
        scores.min() >= MIN_EXTENDER_PRIORITY and scores.max() <= MAX_EXTENDER_PRIORITY
    ):
        raise ValueError(f"scores must be 0..10, got {scores.min()}..{scores.max()}")
    return scores


def _plain_entries(hosts: Sequence[str], scores: np.ndarray) -> list[dict]:
    return [
        {"Host": host, "Score": score} for host, score in zip(hosts, scores.tolist(), strict=True)
    ]


class PrioritizeAnswers:
    """The prioritize answer of any candidates among `hosts`, encoded by array indexing.

    Every (host, score) entry's JSON is built once (11 per host: a few MiB at 5,000 hosts);
    an answer is the entries at `positions * 11 + scores` joined, byte for byte what
    `encode(prioritize_result(...))` writes, with no dict built or encoded per candidate.
    kube-scheduler's candidate lists rarely repeat (it rotates where its search for
    feasible nodes starts), so the entries belong to the node set, not to a list.
    """

    def __init__(self, hosts: Sequence[str], previous: PrioritizeAnswers | None = None) -> None:
        """Entries for `hosts`; those of hosts `previous` has are taken from it, not rebuilt
        (one host added to 5,000 costs about 2 ms, against about 14 ms built afresh)."""
        self.hosts = tuple(hosts)
        self.host_count = len(self.hosts)
        if previous is not None and previous.hosts == self.hosts:
            self._entries: np.ndarray = previous._entries
            return
        table = np.empty((self.host_count, _SCORE_COUNT), dtype=object)
        if previous is None:
            new_rows = range(self.host_count)
        else:
            old_row = {host: i for i, host in enumerate(previous.hosts)}.get
            old_rows = np.fromiter(
                map(old_row, self.hosts, repeat(-1)), dtype=np.intp, count=self.host_count
            )
            known = old_rows >= 0
            table[known] = previous._entries.reshape(-1, _SCORE_COUNT)[old_rows[known]]
            new_rows = np.flatnonzero(~known).tolist()
        entries: list[bytes] = []
        for row in new_rows:
            prefix = b'{"Host":' + orjson.dumps(self.hosts[row]) + b',"Score":'
            entries.extend(prefix + literal for literal in _SCORE_LITERALS)
        built = np.empty(len(entries), dtype=object)
        built[:] = entries
        table[new_rows] = built.reshape(-1, _SCORE_COUNT)
        self._entries = table.reshape(-1)

    def json(self, positions: np.ndarray, scores: np.ndarray) -> bytes:
        """The answer for the hosts at `positions` (indices into `hosts`), in that order."""
        positions = np.asarray(positions)
        scores = _checked_scores(positions, scores)
        if len(positions) and not (positions.min() >= 0 and positions.max() < self.host_count):
            raise ValueError(f"positions must be 0..{self.host_count - 1}")
        picked = self._entries.take(positions * _SCORE_COUNT + scores)
        return b"[" + b",".join(picked.tolist()) + b"]"


_SCORE_LITERALS = tuple(
    f"{score}}}".encode() for score in range(MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY + 1)
)


@dataclass(frozen=True, eq=False)
class _AnswerTable:
    """Every possible HostPriority entry of one candidate list: row per host, column per score."""

    hosts: Sequence[str]
    # Flat object array: entry (host i, score s) at i * _SCORE_COUNT + s (scores start at 0).
    entries: np.ndarray
    row_starts: np.ndarray  # i * SCORE_COUNT

    @classmethod
    def build(cls, hosts: Sequence[str]) -> _AnswerTable:
        entries = np.empty((len(hosts), _SCORE_COUNT), dtype=object)
        for score in range(MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY + 1):
            entries[:, score] = [{"Host": host, "Score": score} for host in hosts]
        row_starts = np.arange(len(hosts), dtype=np.intp) * _SCORE_COUNT
        return cls(hosts, entries.reshape(-1), row_starts)


class _AnswerTables:
    """Answer tables for the candidate lists that come back, keyed by the list object itself.

    A table costs 11 small dicts per host (~2 KiB), so a list gets one only when the same
    object is answered a second time, and only the most recent few are kept. Holding the
    object keeps its `id` from being reused while it is a key.
    """

    def __init__(self, max_tables: int, max_seen_once: int) -> None:
        self._max_tables = max_tables
        self._max_seen_once = max_seen_once
        self._tables: dict[int, _AnswerTable] = {}
        self._seen_once: dict[int, Sequence[str]] = {}
        self._lock = threading.Lock()

    def get(self, hosts: Sequence[str]) -> _AnswerTable | None:
        key = id(hosts)
        table = self._tables.get(key)
        if table is not None and table.hosts is hosts:
            return table
        if not isinstance(hosts, tuple) or len(hosts) == 0:
            return None  # a list can change after it was seen; only tuples are remembered
        with self._lock:
            if self._seen_once.get(key) is not hosts:
                _remember(self._seen_once, key, hosts, self._max_seen_once)
                return None
            del self._seen_once[key]
        table = _AnswerTable.build(hosts)
        with self._lock:
            _remember(self._tables, key, table, self._max_tables)
        return table


def _remember(cache: dict, key: object, value: object, max_entries: int) -> None:
    """Insert as the newest entry, dropping the oldest beyond `max_entries` (lock held)."""
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > max_entries:
        del cache[next(iter(cache))]


_SCORE_COUNT = MAX_EXTENDER_PRIORITY - MIN_EXTENDER_PRIORITY + 1
# A 5000-host table is ~10 MiB: four cover the lists kube-scheduler repeats (all nodes, or
# those passing its filters).
_answer_tables = _AnswerTables(max_tables=4, max_seen_once=16)


def _checked_score(host: str, score: object) -> int:
    if isinstance(score, bool):
        raise TypeError(f"score of {host} must be an int, got bool")
    value = operator.index(score)  # refuses floats such as 7.0, which Go rejects
    if not MIN_EXTENDER_PRIORITY <= value <= MAX_EXTENDER_PRIORITY:
        raise ValueError(f"score of {host} must be 0..10, got {value}")
    return int(value)


def encode(answer: object) -> bytes:
    """Serialise an answer (dict or list) to JSON bytes."""
    return orjson.dumps(answer)


def pod_key(pod: Mapping) -> str:
    """`namespace/name` of a pod, for logs; `?` for what is missing."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return "?/?"
    return f"{metadata.get('namespace') or '?'}/{metadata.get('name') or '?'}"


def _node_infos(nodes: Sequence[object]) -> list[NodeInfo]:
    infos = list(map(_readable_node_info, nodes))
    if not all(infos):  # NodeInfo is always truthy; all() stays in C, unlike `None in infos`
        bad = next(i for i, info in enumerate(infos) if info is None)
        _raise_bad_node(nodes[bad], f"Nodes.items[{bad}]")
    return infos  # type: ignore[return-value]


def _node_name(node: object, where: str) -> str:
    if not isinstance(node, Mapping):
        raise ProtocolError(f"{where} must be a Node object, got {_json_type(node)}")
    metadata = node.get("metadata")
    if not isinstance(metadata, Mapping):
        raise ProtocolError(f"{where}: metadata is missing or not an object")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}: metadata.name must be a non-empty string, got {name!r}")
    return name


def _optional_object(value: object, where: str) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ProtocolError(f"{where} must be an object, got {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
