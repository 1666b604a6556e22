"""A small fake Kubernetes API server, for what a real API server cannot be made to do on demand.

Tests of the Kubernetes-facing code run against the real control plane (envtest/,
tests/conftest.py), each component as its own ServiceAccount; connection faults (streams cut
mid-flight, stalls, refused connections) come from `tests.support.fault_proxy` in front of it.
This fake serves the faults a real server does not make on demand: every request answering
500 for a while (`failing`, `fail_next`), every watch cut at one exact moment
(`drop_watches`), the watch history forgotten at once so that resuming answers 410 Gone
(`expire_watches`), and a log of every request as it reached the server (`requests`). Tests
not yet moved to envtest still use it too; new tests should not.

It answers as a real kube-apiserver does for the resources those tests use (core/v1 Nodes,
Pods, Namespaces and ConfigMaps, Leases of coordination.k8s.io/v1, PodDisruptionBudgets of
policy/v1): the same paths, the same JSON (objects, lists, `Status` errors with the real
reasons and messages), the same watch streams (chunked, one JSON event per line, starting after
a resourceVersion), the same optimistic concurrency (a stale resourceVersion is 409 Conflict)
and the Eviction subresource's PodDisruptionBudget checks (pkg/registry/core/pod/storage/
eviction.go: 429 TooManyRequests with a DisruptionBudget cause when the budget allows no
disruption, 500 when several budgets match, no check for pods that are Pending, finished or
already being deleted, and an allowed eviction takes one disruption from the budget's status).

Where it differs from a real server, on purpose: deletion is immediate (no graceful
termination or finalizers), strategic merge patches are applied as JSON merge patches (lists
are replaced, not merged by key), list pagination (`limit`/`continue`) is ignored, there is no
authentication or RBAC, no size limits, and no controller runs (a PodDisruptionBudget's status
is whatever the test sets). A test that depends on any of these belongs on envtest.

Objects can be changed from Python (`create`, `replace`, `patch`, `delete`, `bind_pod`), which
notifies open watches like any API write.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes.client
from requests.structures import CaseInsensitiveDict

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    plural: str
    kind: str
    namespaced: bool
    # Field selectors the real server supports for this resource (others answer 400).
    fields: tuple[str, ...] = ("metadata.name", "metadata.namespace")
    group: str = ""  # "" = the core group, served under /api/v1
    # Times the real server parses as metav1.MicroTime (exactly six fractional digits).
    micro_times: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"

    @property
    def qualified(self) -> str:
        """The name in messages: `configmaps`, `leases.coordination.k8s.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES: dict[str, ResourceType] = {
    rt.plural: rt
    for rt in (
        ResourceType("nodes", "Node", False, ("metadata.name", "spec.unschedulable")),
        ResourceType("namespaces", "Namespace", False, ("metadata.name", "status.phase")),
        ResourceType(
            "pods",
            "Pod",
            True,
            (
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.schedulerName",
                "spec.restartPolicy",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ),
        ),
        ResourceType("configmaps", "ConfigMap", True),
        ResourceType(
            "leases",
            "Lease",
            True,
            group="coordination.k8s.io",
            micro_times=("spec.acquireTime", "spec.renewTime"),
        ),
        ResourceType("poddisruptionbudgets", "PodDisruptionBudget", True, group="policy"),
    )
}

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# --------------------------------------------------------------------------------------------
# Status objects, shaped exactly as kube-apiserver's metav1.Status
# --------------------------------------------------------------------------------------------


class ApiError(Exception):
    """An API failure carried to the HTTP layer as a `Status` object."""

    def __init__(self, code: int, reason: str, message: str, details: JsonObject | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> JsonObject:
        body: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(plural: str, name: str) -> JsonObject:
    """StatusDetails of an object error: name, group (when not core) and resource."""
    resource = RESOURCES.get(plural)
    group = resource.group if resource is not None else ""
    return {"name": name, **({"group": group} if group else {}), "kind": plural}


def _qualified(plural: str) -> str:
    resource = RESOURCES.get(plural)
    return resource.qualified if resource is not None else plural


def not_found(plural: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{_qualified(plural)} "{name}" not found', _details(plural, name)
    )


def already_exists(plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(plural)} "{name}" already exists',
        _details(plural, name),
    )


def conflict(plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(plural)} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        _details(plural, name),
    )


def too_many_requests(message: str, cause: str, retry_after_s: int = 0) -> ApiError:
    """errors.NewTooManyRequests with one DisruptionBudget cause, as the eviction REST sends it."""
    details: JsonObject = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    if retry_after_s:
        details["retryAfterSeconds"] = retry_after_s
    return ApiError(429, "TooManyRequests", message, details)


def invalid(kind: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid; causes are (reason, field, message) as field.ErrorList renders them."""
    rendered = ", ".join(f"{f}: {m}" for _, f, m in causes)
    if len(causes) > 1:
        rendered = f"[{rendered}]"
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {rendered}',
        {
            "name": name,
            "kind": kind,
            "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def internal_error(message: str) -> ApiError:
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


def too_old(requested_rv: int, oldest_rv: int) -> ApiError:
    return ApiError(410, "Expired", f"too old resource version: {requested_rv} ({oldest_rv})")


def success_status(plural: str, name: str, uid: str) -> JsonObject:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "kind": plural, "uid": uid},
    }


# --------------------------------------------------------------------------------------------
# Selectors and patches
# --------------------------------------------------------------------------------------------


def _split_top_level(text: str) -> list[str]:
    """Split a selector on commas that are not inside `in (a,b)` parentheses."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


_SET_REQUIREMENT = re.compile(r"^(\S+)\s+(in|notin)\s+\((.*)\)$")


def label_selector_matcher(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """Compile a label selector (=, ==, !=, in, notin, exists, !exists) into a predicate."""
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for requirement in _split_top_level(selector):
        set_match = _SET_REQUIREMENT.match(requirement)
        if set_match:
            key, op, values_text = set_match.groups()
            values = {v.strip() for v in values_text.split(",") if v.strip()}
            if op == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif "!=" in requirement:
            key, value = (s.strip() for s in requirement.split("!=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in requirement:
            key, value = (s.strip() for s in re.split("==?", requirement, maxsplit=1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif requirement.startswith("!"):
            absent_key = requirement[1:].strip()
            tests.append(lambda labels, k=absent_key: k not in labels)
        elif re.fullmatch(r"[-A-Za-z0-9_./]+", requirement):
            tests.append(lambda labels, k=requirement: k in labels)
        else:
            raise bad_request(f"unable to parse requirement: {requirement!r}")
    return lambda labels: all(test(labels) for test in tests)


def _field_value(obj: JsonObject, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_selector_matcher(selector: str, resource: ResourceType) -> Callable[[JsonObject], bool]:
    tests: list[Callable[[JsonObject], bool]] = []
    for requirement in _split_top_level(selector):
        negate = "!=" in requirement
        key, value = (s.strip() for s in re.split("!=|==?", requirement, maxsplit=1))
        if key not in resource.fields:
            raise bad_request(f"field label not supported: {key}")
        if negate:
            tests.append(lambda obj, k=key, v=value: _field_value(obj, k) != v)
        else:
            tests.append(lambda obj, k=key, v=value: _field_value(obj, k) == v)
    return lambda obj: all(test(obj) for test in tests)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer_parts(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise bad_request(f"invalid JSON pointer {pointer!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def json_patch(target: JsonObject, operations: Any) -> JsonObject:
    """RFC 6902 JSON patch (add, remove, replace, test)."""
    if not isinstance(operations, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    document = copy.deepcopy(target)
    for operation in operations:
        op, parts = operation.get("op"), _pointer_parts(operation.get("path", ""))
        if not parts:
            raise ApiError(422, "Invalid", "the root of a JSON patch cannot be changed")
        parent: Any = document
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.get(part)
            if parent is None:
                raise ApiError(422, "Invalid", f"doc is missing path: {operation['path']!r}")
        last = parts[-1]
        if op == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != operation.get("value"):
                raise ApiError(422, "Invalid", f"testing value {operation['path']} failed")
        elif op in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if op == "add":
                    parent.insert(index, operation["value"])
                else:
                    parent[index] = operation["value"]
            else:
                if op == "replace" and last not in parent:
                    raise ApiError(
                        422,
                        "Invalid",
                        f"replace operation does not apply: doc is missing key: "
                        f"{operation['path']}",
                    )
                parent[last] = operation["value"]
        elif op == "remove":
            try:
                del parent[int(last) if isinstance(parent, list) else last]
            except (KeyError, IndexError):
                raise ApiError(
                    422,
                    "Invalid",
                    f"remove operation does not apply: doc is missing path: {operation['path']}",
                ) from None
        else:
            raise bad_request(f"unsupported JSON patch operation {op!r}")
    return document


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]  # case-insensitive, as HTTP header names are
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True)
class _Change:
    resource_version: int
    plural: str
    namespace: str
    kind: str  # ADDED, MODIFIED, DELETED
    new: JsonObject | None
    old: JsonObject | None


@dataclass
class _WatchFilter:
    resource: ResourceType
    namespace: str | None
    labels: Callable[[Mapping[str, str]], bool] = field(default=lambda _labels: True)
    fields: Callable[[JsonObject], bool] = field(default=lambda _obj: True)

    def matches(self, obj: JsonObject | None, namespace: str) -> bool:
        if obj is None or (self.namespace is not None and namespace != self.namespace):
            return False
        return self.labels(obj["metadata"].get("labels") or {}) and self.fields(obj)


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _at_version(obj: JsonObject | None, resource_version: int) -> JsonObject:
    assert obj is not None
    copied = copy.deepcopy(obj)
    copied["metadata"]["resourceVersion"] = str(resource_version)
    return copied


def _with_type(resource: ResourceType, obj: JsonObject) -> JsonObject:
    return {"kind": resource.kind, "apiVersion": resource.api_version, **obj}


# metav1.MicroTime's wire form (RFC3339Micro): exactly six fractional digits.
_MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")


def _check_micro_times(resource: ResourceType, obj: JsonObject) -> None:
    """400 for a MicroTime field the real server's JSON decoder would not parse."""
    for path in resource.micro_times:
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None or (isinstance(value, str) and _MICRO_TIME.match(value)):
            continue
        raise bad_request(
            f'{resource.kind} in version "v1" cannot be handled as a {resource.kind}: parsing '
            f'time "{value}" as "2006-01-02T15:04:05.000000Z07:00": cannot parse '
            f'"{str(value)[19:]}" as ".000000"'
        )


def selector_object_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelectorAsSelector(selector).Matches(labels); an empty selector matches all."""
    if not isinstance(selector, dict):
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = set(expression.get("values") or [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def _selector_is_empty(selector: Any) -> bool:
    return not isinstance(selector, dict) or not (
        selector.get("matchLabels") or selector.get("matchExpressions")
    )


def _pod_is_ready(pod: JsonObject) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


class FakeKube:
    """The fake API server: start it, point the official client at `url`, stop it."""

    def __init__(
        self,
        *,
        history_limit: int = 10_000,
        namespaces: Iterable[str] = DEFAULT_NAMESPACES,
    ) -> None:
        self._lock = threading.Condition()
        self._objects: dict[tuple[str, str, str], JsonObject] = {}
        self._changes: list[_Change] = []
        self._history_limit = history_limit
        self._resource_version = 0
        # Watches starting before this resourceVersion answer 410 Gone.
        self._oldest_watchable_rv = 0
        self._watch_generation = 0
        self._stopping = False
        self._fail_remaining = 0
        self._fail_status = 500
        self.failing = False  # while True, every request answers 500
        self._requests: list[RecordedRequest] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._clients: list[kubernetes.client.ApiClient] = []
        for name in namespaces:
            self.create("namespaces", {"metadata": {"name": name}})

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> FakeKube:
        handler = type("_BoundHandler", (_Handler,), {"kube": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fake-kube", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        for api_client in self._clients:
            api_client.close()
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "FakeKube.start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def configuration(self) -> kubernetes.client.Configuration:
        return kubernetes.client.Configuration(host=self.url)

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new client for this server; closed by `stop()`."""
        api_client = kubernetes.client.ApiClient(self.configuration())
        self._clients.append(api_client)
        return api_client

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file pointing at this server (for `--kubeconfig` in end-to-end tests)."""
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(kubeconfig, indent=2))  # JSON is valid YAML
        return path

    def core_v1(self) -> kubernetes.client.CoreV1Api:
        """The official CoreV1Api pointed at this server."""
        return kubernetes.client.CoreV1Api(self.api_client())

    # ---- test hooks -----------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def fail_next(self, count: int, status: int = 500) -> None:
        """The next `count` requests answer `status` (an InternalError Status by default)."""
        with self._lock:
            self._fail_remaining = count
            self._fail_status = status

    def drop_watches(self) -> None:
        """Cut every open watch stream mid-flight, as a dying apiserver or proxy would."""
        with self._lock:
            self._watch_generation += 1
            self._lock.notify_all()

    def expire_watches(self) -> None:
        """Forget the change history and cut open watches: resuming them answers 410 Gone.

        A fresh list still returns a resourceVersion a new watch can start from.
        """
        with self._lock:
            self._resource_version += 1
            self._oldest_watchable_rv = self._resource_version
            self._changes.clear()
            self._watch_generation += 1
            self._lock.notify_all()

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._resource_version

    # ---- direct object access (also used by the HTTP handlers) ----------------------------

    def get(self, plural: str, name: str, namespace: str | None = None) -> JsonObject | None:
        resource = RESOURCES[plural]
        with self._lock:
            obj = self._objects.get((plural, self._ns(resource, namespace), name))
            return _with_type(resource, copy.deepcopy(obj)) if obj is not None else None

    def objects(self, plural: str, namespace: str | None = None) -> list[JsonObject]:
        resource = RESOURCES[plural]
        with self._lock:
            return [
                _with_type(resource, copy.deepcopy(obj))
                for (p, ns, _), obj in sorted(self._objects.items())
                if p == plural and (namespace is None or ns == namespace)
            ]

    def create(self, plural: str, obj: JsonObject, namespace: str | None = None) -> JsonObject:
        resource = RESOURCES[plural]
        obj = copy.deepcopy(obj)
        metadata = obj.setdefault("metadata", {})
        if namespace is None and resource.namespaced:
            namespace = metadata.get("namespace") or "default"
        ns = self._ns(resource, namespace)
        if resource.namespaced:
            if metadata.get("namespace") not in (None, "", ns):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            metadata["namespace"] = ns
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        name = metadata.get("name") or ""
        self._validate(resource, obj)
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        metadata.pop("resourceVersion", None)
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = _now_rfc3339()
        if plural == "poddisruptionbudgets":
            metadata["generation"] = 1  # the registry counts spec changes
        if plural == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        if plural == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj.setdefault("status", {}).setdefault("phase", "Active")
        with self._lock:
            if resource.namespaced and ("namespaces", "", ns) not in self._objects:
                raise not_found("namespaces", ns)
            key = (plural, ns, name)
            if key in self._objects:
                raise already_exists(plural, name)
            self._commit(resource, key, "ADDED", obj, None)
            return _with_type(resource, copy.deepcopy(obj))

    def replace(
        self,
        plural: str,
        name: str,
        obj: JsonObject,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> JsonObject:
        """PUT semantics: 404 if missing, 409 Conflict if metadata.resourceVersion is stale."""
        resource = RESOURCES[plural]
        ns = self._ns(resource, namespace)
        body_name = (obj.get("metadata") or {}).get("name")
        if body_name not in (None, name):
            raise bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        with self._lock:
            current = self._objects.get((plural, ns, name))
            if current is None:
                raise not_found(plural, name)
            wanted_rv = (obj.get("metadata") or {}).get("resourceVersion")
            if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
                raise conflict(plural, name)
            updated = copy.deepcopy(obj)
            if subresource == "status":
                updated = {**copy.deepcopy(current), "status": updated.get("status")}
            return self._update(resource, (plural, ns, name), current, updated)

    def patch(
        self,
        plural: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        content_type: str = "application/merge-patch+json",
        subresource: str | None = None,
    ) -> JsonObject:
        resource = RESOURCES[plural]
        ns = self._ns(resource, namespace)
        with self._lock:
            current = self._objects.get((plural, ns, name))
            if current is None:
                raise not_found(plural, name)
            base = _with_type(resource, copy.deepcopy(current))
            if content_type == "application/json-patch+json":
                updated = json_patch(base, patch)
            elif content_type in (
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ):
                if not isinstance(patch, dict):
                    raise bad_request("the body of a merge patch must be a JSON object")
                wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
                if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
                    raise conflict(plural, name)
                updated = merge_patch(base, patch)
            else:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown "
                    f"format - accepted media types include: application/json-patch+json, "
                    f"application/merge-patch+json, application/strategic-merge-patch+json "
                    f"(got {content_type})",
                )
            if subresource == "status":
                updated = {**copy.deepcopy(current), "status": updated.get("status")}
            return self._update(resource, (plural, ns, name), current, updated)

    def bind_pod(self, name: str, node: str, namespace: str | None = None) -> JsonObject:
        """What kube-scheduler's Binding does: set spec.nodeName and the PodScheduled condition.

        A pod already assigned to a node answers 409 Conflict, as the real registry does.
        """
        resource = RESOURCES["pods"]
        ns = self._ns(resource, namespace)
        if not node:
            raise invalid(
                "Binding", name, [("FieldValueRequired", "target.name", "Required value")]
            )
        with self._lock:
            current = self._objects.get(("pods", ns, name))
            if current is None:
                raise not_found("pods", name)
            assigned = (current.get("spec") or {}).get("nodeName")
            if assigned:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is '
                    f'already assigned to node "{assigned}"',
                    {"name": name, "kind": "pods/binding"},
                )
            updated = copy.deepcopy(current)
            updated.setdefault("spec", {})["nodeName"] = node
            status = updated.setdefault("status", {})
            conditions = [
                c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"
            ]
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": _now_rfc3339(),
                }
            )
            status["conditions"] = conditions
            return self._update(resource, ("pods", ns, name), current, updated)

    def evict(self, name: str, namespace: str | None, eviction: JsonObject) -> JsonObject:
        """POST pods/NAME/eviction: delete the pod unless its PodDisruptionBudget forbids it.

        As the real registry: a pod that is Pending, finished or already being deleted goes
        without a budget check; otherwise the one budget whose selector matches the pod's
        labels must allow a disruption (429 TooManyRequests when it does not, or when its
        status does not reflect its newest spec yet), and the eviction takes one from its
        `status.disruptionsAllowed`. Several matching budgets are a 500. An unready pod costs
        the budget nothing while the budget is met. Answers the Success Status.
        """
        body_name = (eviction.get("metadata") or {}).get("name")
        if body_name != name:
            raise bad_request("name in URL does not match name in Eviction object")
        resource = RESOURCES["pods"]
        ns = self._ns(resource, namespace)
        with self._lock:
            pod = self._objects.get(("pods", ns, name))
            if pod is None:
                raise not_found("pods", name)
            phase = (pod.get("status") or {}).get("phase")
            if phase not in ("Succeeded", "Failed", "Pending") and not pod["metadata"].get(
                "deletionTimestamp"
            ):
                labels = pod["metadata"].get("labels") or {}
                budgets = [
                    key
                    for key, budget in sorted(self._objects.items())
                    if key[0] == "poddisruptionbudgets"
                    and key[1] == ns
                    # A budget with an empty selector matches nothing here (eviction.go).
                    and not _selector_is_empty((budget.get("spec") or {}).get("selector"))
                    and selector_object_matches(budget["spec"]["selector"], labels)
                ]
                if len(budgets) > 1:
                    raise internal_error(
                        "This pod has more than one PodDisruptionBudget, which the eviction "
                        "subresource does not support."
                    )
                if budgets:
                    self._take_disruption(budgets[0], pod)
            self._commit(resource, ("pods", ns, name), "DELETED", None, pod)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }

    def _take_disruption(self, key: tuple[str, str, str], pod: JsonObject) -> None:
        """checkAndDecrement of the eviction registry. Lock held."""
        budget = self._objects[key]
        name = budget["metadata"]["name"]
        spec, status = budget.get("spec") or {}, budget.get("status") or {}
        desired, current = status.get("desiredHealthy", 0), status.get("currentHealthy", 0)
        if not _pod_is_ready(pod) and (
            spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
            or (current >= desired and desired > 0)
        ):
            return
        refusal = "Cannot evict pod as it would violate the pod's disruption budget."
        if status.get("observedGeneration", 0) < budget["metadata"].get("generation", 1):
            raise too_many_requests(
                refusal, f"The disruption budget {name} is still being processed by the server.", 10
            )
        allowed = status.get("disruptionsAllowed", 0)
        if allowed < 0:
            raise ApiError(
                403,
                "Forbidden",
                f'poddisruptionbudgets.policy "{name}" is forbidden: pdb disruptions allowed is '
                "negative",
                _details("poddisruptionbudgets", name),
            )
        if allowed == 0:
            raise too_many_requests(
                refusal,
                f"The disruption budget {name} needs {desired} healthy pods and has {current} "
                "currently",
            )
        updated = copy.deepcopy(budget)
        new_status = updated.setdefault("status", {})
        new_status["disruptionsAllowed"] = allowed - 1
        new_status.setdefault("disruptedPods", {})[pod["metadata"]["name"]] = _now_rfc3339()
        self._commit(RESOURCES["poddisruptionbudgets"], key, "MODIFIED", updated, budget)

    def delete(self, plural: str, name: str, namespace: str | None = None) -> JsonObject:
        """Immediate deletion; answers the object (pods, namespaces) or a Success Status."""
        resource = RESOURCES[plural]
        ns = self._ns(resource, namespace)
        with self._lock:
            key = (plural, ns, name)
            current = self._objects.get(key)
            if current is None:
                raise not_found(plural, name)
            self._commit(resource, key, "DELETED", None, current)
            if plural in ("pods", "namespaces"):
                return _with_type(resource, copy.deepcopy(current))
            return success_status(plural, name, current["metadata"]["uid"])

    # ---- internals ------------------------------------------------------------------------

    @staticmethod
    def _ns(resource: ResourceType, namespace: str | None) -> str:
        return (namespace or "default") if resource.namespaced else ""

    def _update(
        self,
        resource: ResourceType,
        key: tuple[str, str, str],
        current: JsonObject,
        updated: JsonObject,
    ) -> JsonObject:
        updated.pop("kind", None)
        updated.pop("apiVersion", None)
        metadata = updated.setdefault("metadata", {})
        # Identity and bookkeeping fields are the server's, whatever the client sent.
        for immutable in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "resourceVersion",
            "generation",
        ):
            if immutable in current["metadata"]:
                metadata[immutable] = current["metadata"][immutable]
            else:
                metadata.pop(immutable, None)
        if "generation" in metadata and updated.get("spec") != current.get("spec"):
            metadata["generation"] += 1
        self._validate(resource, updated)
        if updated == current:
            # A no-op write keeps its resourceVersion and wakes no watch, as the real one.
            return _with_type(resource, copy.deepcopy(current))
        self._commit(resource, key, "MODIFIED", updated, current)
        return _with_type(resource, copy.deepcopy(updated))

    def _commit(
        self,
        resource: ResourceType,
        key: tuple[str, str, str],
        kind: str,
        new: JsonObject | None,
        old: JsonObject | None,
    ) -> None:
        """Store a write under a new resourceVersion and wake the watches. Lock held."""
        self._resource_version += 1
        rv = self._resource_version
        if new is None:
            del self._objects[key]
            old = copy.deepcopy(old)
            assert old is not None
            old["metadata"]["resourceVersion"] = str(rv)
            new_snapshot = None
        else:
            new["metadata"]["resourceVersion"] = str(rv)
            self._objects[key] = new
            new_snapshot = copy.deepcopy(new)
        self._changes.append(_Change(rv, key[0], key[1], kind, new_snapshot, old))
        if len(self._changes) > self._history_limit:
            dropped = self._changes[: len(self._changes) - self._history_limit]
            del self._changes[: len(dropped)]
            self._oldest_watchable_rv = dropped[-1].resource_version
        self._lock.notify_all()

    def _validate(self, resource: ResourceType, obj: JsonObject) -> None:
        _check_micro_times(resource, obj)
        name = obj["metadata"].get("name") or ""
        if not name:
            raise invalid(
                resource.kind,
                "",
                [
                    (
                        "FieldValueRequired",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    )
                ],
            )
        pattern, limit = (
            (_DNS_LABEL, 63) if resource.plural == "namespaces" else (_DNS_SUBDOMAIN, 253)
        )
        if len(name) > limit or not pattern.match(name):
            raise invalid(
                resource.kind,
                name,
                [
                    (
                        "FieldValueInvalid",
                        "metadata.name",
                        f'Invalid value: "{name}": a lowercase RFC 1123 name must consist of '
                        "lower case alphanumeric characters, '-' or '.', and must start and end "
                        "with an alphanumeric character",
                    )
                ],
            )

    def _list(self, flt: _WatchFilter) -> JsonObject:
        with self._lock:
            items = [
                copy.deepcopy(obj)
                for (plural, ns, _), obj in sorted(self._objects.items())
                if plural == flt.resource.plural and flt.matches(obj, ns)
            ]
            return {
                "kind": f"{flt.resource.kind}List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._resource_version)},
                "items": items,
            }

    def _watch(
        self,
        flt: _WatchFilter,
        start_rv: str | None,
        timeout_s: float | None,
        bookmarks: bool,
        send: Callable[[JsonObject], None],
        generation: int,
    ) -> bool:
        """Stream events to `send` until timeout, stop or drop. False if the stream was cut.

        `generation` is the watch generation when the request arrived (see `_record`).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            if start_rv in (None, "", "0"):
                # "Get state and start at most recent": synthetic ADDED for what exists.
                initial = [
                    {"type": "ADDED", "object": _with_type(flt.resource, copy.deepcopy(obj))}
                    for (plural, ns, _), obj in sorted(self._objects.items())
                    if plural == flt.resource.plural and flt.matches(obj, ns)
                ]
                cursor = self._resource_version
            else:
                try:
                    cursor = int(start_rv)
                except ValueError:
                    raise bad_request(f'invalid resource version "{start_rv}"') from None
                if cursor < self._oldest_watchable_rv:
                    error = too_old(cursor, self._oldest_watchable_rv + 1).status()
                    initial = [{"type": "ERROR", "object": error}]
                    cursor = -1
                else:
                    initial = []
        for event in initial:
            send(event)
        if cursor < 0:
            return True
        timed_out = False
        while not timed_out:
            pending: list[_Change] = []
            with self._lock:
                while True:
                    if self._stopping:
                        return True
                    if self._watch_generation != generation:
                        return False
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        timed_out = True
                        break
                    start = bisect.bisect_right([c.resource_version for c in self._changes], cursor)
                    pending = self._changes[start:]
                    if pending:
                        break
                    self._lock.wait(timeout=1.0 if remaining is None else min(remaining, 1.0))
            for change in pending:
                cursor = change.resource_version
                if change.plural != flt.resource.plural:
                    continue
                was_in = flt.matches(change.old, change.namespace)
                is_in = flt.matches(change.new, change.namespace)
                if is_in and not was_in:
                    event_type, obj = "ADDED", change.new
                elif is_in and was_in:
                    event_type, obj = change.kind, change.new
                elif was_in:
                    # Deleted, or changed so that it left the selection: as the real watch
                    # cache does, the *previous* content, at the event's resourceVersion.
                    event_type, obj = "DELETED", _at_version(change.old, change.resource_version)
                else:
                    continue
                assert obj is not None
                send({"type": event_type, "object": _with_type(flt.resource, obj)})
        if bookmarks:
            bookmark = {"resourceVersion": str(cursor)}
            send(
                {
                    "type": "BOOKMARK",
                    "object": {"kind": flt.resource.kind, "apiVersion": "v1", "metadata": bookmark},
                }
            )
        return True

    def _record(self, request: RecordedRequest) -> tuple[int | None, int]:
        """Record a request: (the injected failure status if one is due, the watch generation).

        The generation is taken here so that `drop_watches()` cuts every watch whose request
        arrived before it, even one whose stream has not started yet.
        """
        with self._lock:
            self._requests.append(request)
            generation = self._watch_generation
            if self.failing:
                return 500, generation
            if self._fail_remaining > 0:
                self._fail_remaining -= 1
                return self._fail_status, generation
            return None, generation


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    kube: FakeKube
    _generation = 0  # watch generation when the current request arrived
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver"

    def log_message(self, format: str, *args: Any) -> None:  # quiet in tests
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ---- plumbing -------------------------------------------------------------------------

    def _send_json(self, code: int, body: Any) -> None:
        payload = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _send_error(self, error: ApiError) -> None:
        self._send_json(error.code, error.status())

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _handle(self, method: str) -> None:
        parsed = urlsplit(self.path)
        query = parse_qs(parsed.query, keep_blank_values=True)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = CaseInsensitiveDict(self.headers.items())
        request = RecordedRequest(method, parsed.path, query, headers, body)
        injected, self._generation = self.kube._record(request)
        try:
            if injected is not None:
                raise ApiError(
                    injected,
                    "InternalError" if injected == 500 else "ServiceUnavailable",
                    "Internal error occurred: injected fault",
                    {"causes": [{"message": "injected fault"}]},
                )
            self._route(method, parsed.path, query, body)
        except ApiError as error:
            self._send_error(error)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> None:
        parts = [p for p in path.split("/") if p]
        group = ""
        if parts[:2] == ["api", "v1"] and len(parts) >= 3:
            rest = parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis" and parts[2] == "v1":
            group, rest = parts[1], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        plural, name = rest[0], (rest[1] if len(rest) > 1 else None)
        subresource = rest[2] if len(rest) > 2 else None
        resource = RESOURCES.get(plural)
        if resource is None or resource.group != group:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if len(rest) > 3 or (namespace is not None and not resource.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if not resource.namespaced and namespace is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})

        def one(key: str) -> str | None:
            values = query.get(key)
            return values[-1] if values else None

        if name is None:
            flt = _WatchFilter(resource, namespace)
            if one("labelSelector"):
                flt.labels = label_selector_matcher(one("labelSelector") or "")
            if one("fieldSelector"):
                flt.fields = field_selector_matcher(one("fieldSelector") or "", resource)
            if method == "GET" and one("watch") in ("true", "1"):
                timeout = one("timeoutSeconds")
                self._stream_watch(
                    flt,
                    one("resourceVersion"),
                    float(timeout) if timeout else None,
                    one("allowWatchBookmarks") == "true",
                )
            elif method == "GET":
                self._send_json(200, self.kube._list(flt))
            elif method == "POST" and (namespace is not None or not resource.namespaced):
                obj = self._body_object(body, resource)
                self._send_json(201, self.kube.create(plural, obj, namespace))
            else:
                raise ApiError(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                    {},
                )
            return

        if subresource in ("eviction", "binding") and plural == "pods" and method == "POST":
            if subresource == "eviction":
                self._send_json(
                    201, self.kube.evict(name, namespace, self._body_object(body, resource))
                )
                return
            target = (self._body_object(body, resource).get("target") or {}).get("name")
            self.kube.bind_pod(name, target or "", namespace)
            self._send_json(
                201,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "code": 201,
                },
            )
            return
        if subresource not in (None, "status"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if method == "GET":
            obj = self.kube.get(plural, name, namespace)
            if obj is None:
                raise not_found(plural, name)
            self._send_json(200, obj)
        elif method == "PUT":
            obj = self._body_object(body, resource)
            self._send_json(
                200, self.kube.replace(plural, name, obj, namespace, subresource=subresource)
            )
        elif method == "PATCH":
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            patch = self._body_json(body, resource)
            self._send_json(
                200,
                self.kube.patch(
                    plural,
                    name,
                    patch,
                    namespace,
                    content_type=content_type,
                    subresource=subresource,
                ),
            )
        elif method == "DELETE" and subresource is None:
            self._send_json(200, self.kube.delete(plural, name, namespace))
        else:
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
                {},
            )

    @staticmethod
    def _body_json(body: bytes, resource: ResourceType) -> Any:
        try:
            return json.loads(body)
        except ValueError as error:
            raise bad_request(
                f'{resource.kind} in version "v1" cannot be handled as a {resource.kind}: {error}'
            ) from None

    def _body_object(self, body: bytes, resource: ResourceType) -> JsonObject:
        obj = self._body_json(body, resource)
        if not isinstance(obj, dict):
            raise bad_request(
                f'{resource.kind} in version "v1" cannot be handled as a {resource.kind}: '
                "expected a JSON object"
            )
        return obj

    def _stream_watch(
        self,
        flt: _WatchFilter,
        start_rv: str | None,
        timeout_s: float | None,
        bookmarks: bool,
    ) -> None:
        if start_rv not in (None, "", "0") and not start_rv.isdigit():
            raise bad_request(f'invalid resource version "{start_rv}"')
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

        def send(event: JsonObject) -> None:
            self._write_chunk(json.dumps(event, separators=(",", ":")).encode() + b"\n")

        ended_cleanly = self.kube._watch(
            flt, start_rv, timeout_s, bookmarks, send, self._generation
        )
        if ended_cleanly:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        else:
            # Cut the stream without the terminating chunk: the client sees a broken connection.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
