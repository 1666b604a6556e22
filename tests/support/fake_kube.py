"""A small fake Kubernetes API server, serving only faults a real API server cannot make.

Tests of the Kubernetes-facing code run against the real control plane (envtest/,
tests/conftest.py), each component as its own ServiceAccount; connection faults (streams cut
mid-flight, stalls, refused connections) come from `tests.support.fault_proxy` in front of it.
This fake exists for what a real server, shared by the session's tests, cannot be made to do on
demand: answer every request with HTTP 500 for a while (`failing`), cut every watch at one
exact moment (`drop_watches`), and forget the watch history at once so that resuming a watch
answers 410 Gone (`expire_watches`). Nothing else belongs here; a test that needs more of the
API belongs on the real control plane.

It serves what a controller's informers and writes need of core/v1 Nodes, Pods and Namespaces
and policy/v1 PodDisruptionBudgets, as kube-apiserver answers them: GET of one object, lists
(cluster-wide or in a namespace; no selectors, no pagination), watch streams (chunked, one JSON
event per line, starting after a resourceVersion, with bookmarks and timeouts), and PATCH as a
JSON merge patch (strategic merge patches too: lists are replaced, not merged by key), errors
as `Status` objects. There is no authentication, RBAC, validation or controller. Tests set
objects up from Python (`create`) and read them back (`get`, `objects`).
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes.client

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    plural: str
    kind: str
    namespaced: bool
    group: str = ""  # "" = the core group, served under /api/v1

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"


RESOURCES: dict[str, ResourceType] = {
    rt.plural: rt
    for rt in (
        ResourceType("nodes", "Node", False),
        ResourceType("namespaces", "Namespace", False),
        ResourceType("pods", "Pod", True),
        ResourceType("poddisruptionbudgets", "PodDisruptionBudget", True, group="policy"),
    )
}


class ApiError(Exception):
    """An API failure carried to the HTTP layer as a `Status` object, as kube-apiserver's."""

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


def not_found(plural: str, name: str) -> ApiError:
    resource = RESOURCES.get(plural)
    qualified = f"{plural}.{resource.group}" if resource and resource.group else plural
    details = {"name": name, **({"group": resource.group} if resource and resource.group else {})}
    return ApiError(404, "NotFound", f'{qualified} "{name}" not found', {**details, "kind": plural})


def no_such_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


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


@dataclass(frozen=True)
class _Change:
    resource_version: int
    plural: str
    namespace: str
    kind: str  # ADDED, MODIFIED
    new: JsonObject


def _with_type(resource: ResourceType, obj: JsonObject) -> JsonObject:
    return {"kind": resource.kind, "apiVersion": resource.api_version, **obj}


class FakeKube:
    """The fake API server: start it, point the official client at `url`, stop it."""

    def __init__(self, *, namespaces: Iterable[str] = ("default", "kube-system")) -> None:
        self._lock = threading.Condition()
        self._objects: dict[tuple[str, str, str], JsonObject] = {}
        self._changes: list[_Change] = []
        self._resource_version = 0
        # Watches starting before this resourceVersion answer 410 Gone.
        self._oldest_watchable_rv = 0
        self._watch_generation = 0
        self._stopping = False
        self.failing = False  # while True, every request answers 500
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

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new client for this server; closed by `stop()`."""
        api_client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=self.url))
        self._clients.append(api_client)
        return api_client

    # ---- the faults -----------------------------------------------------------------------

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

    # ---- objects from Python (also used by the HTTP handlers) -----------------------------

    def get(self, plural: str, name: str, namespace: str | None = None) -> JsonObject | None:
        resource = RESOURCES[plural]
        with self._lock:
            obj = self._objects.get((plural, self._ns(resource, namespace), name))
            return _with_type(resource, copy.deepcopy(obj)) if obj is not None else None

    def objects(self, plural: str) -> list[JsonObject]:
        resource = RESOURCES[plural]
        with self._lock:
            return [
                _with_type(resource, copy.deepcopy(obj))
                for (p, _, _), obj in sorted(self._objects.items())
                if p == plural
            ]

    def create(self, plural: str, obj: JsonObject, namespace: str | None = None) -> JsonObject:
        resource = RESOURCES[plural]
        obj = copy.deepcopy(obj)
        metadata = obj.setdefault("metadata", {})
        ns = self._ns(resource, namespace or metadata.get("namespace"))
        if resource.namespaced:
            metadata["namespace"] = ns
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if plural == "poddisruptionbudgets":
            metadata["generation"] = 1  # the registry counts spec changes
        if plural == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        with self._lock:
            if resource.namespaced and ("namespaces", "", ns) not in self._objects:
                raise not_found("namespaces", ns)
            key = (plural, ns, metadata["name"])
            assert key not in self._objects, f"{plural} {key[1:]} exists"
            self._commit(key, "ADDED", obj)
            return _with_type(resource, copy.deepcopy(obj))

    def patch(self, plural: str, name: str, patch: Any, namespace: str | None = None) -> JsonObject:
        """A JSON merge patch; the server's bookkeeping fields stay the server's."""
        resource = RESOURCES[plural]
        if not isinstance(patch, dict):
            raise bad_request("the body of a merge patch must be a JSON object")
        key = (plural, self._ns(resource, namespace), name)
        with self._lock:
            current = self._objects.get(key)
            if current is None:
                raise not_found(plural, name)
            updated = merge_patch(current, patch)
            metadata = updated.setdefault("metadata", {})
            for owned in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion"):
                if owned in current["metadata"]:
                    metadata[owned] = current["metadata"][owned]
            if updated == current:
                # A no-op write keeps its resourceVersion and wakes no watch, as the real one.
                return _with_type(resource, copy.deepcopy(current))
            self._commit(key, "MODIFIED", updated)
            return _with_type(resource, copy.deepcopy(updated))

    # ---- internals ------------------------------------------------------------------------

    @staticmethod
    def _ns(resource: ResourceType, namespace: str | None) -> str:
        return (namespace or "default") if resource.namespaced else ""

    def _commit(self, key: tuple[str, str, str], kind: str, new: JsonObject) -> None:
        """Store a write under a new resourceVersion and wake the watches. Lock held."""
        self._resource_version += 1
        new["metadata"]["resourceVersion"] = str(self._resource_version)
        self._objects[key] = new
        self._changes.append(
            _Change(self._resource_version, key[0], key[1], kind, copy.deepcopy(new))
        )
        self._lock.notify_all()

    def _list(self, resource: ResourceType, namespace: str | None) -> JsonObject:
        with self._lock:
            items = [
                copy.deepcopy(obj)
                for (plural, ns, _), obj in sorted(self._objects.items())
                if plural == resource.plural and namespace in (None, ns)
            ]
            return {
                "kind": f"{resource.kind}List",
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(self._resource_version)},
                "items": items,
            }

    def _watch(
        self,
        resource: ResourceType,
        namespace: str | None,
        start_rv: str | None,
        timeout_s: float | None,
        bookmarks: bool,
        send: Callable[[JsonObject], None],
        generation: int,
    ) -> bool:
        """Stream events to `send` until timeout, stop or drop. False if the stream was cut.

        `generation` is the watch generation when the request arrived (see `_admit`).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            if start_rv in (None, "", "0"):
                # "Get state and start at most recent": synthetic ADDED for what exists.
                initial = [
                    {"type": "ADDED", "object": _with_type(resource, obj)}
                    for obj in self._list(resource, namespace)["items"]
                ]
                cursor = self._resource_version
            else:
                cursor = int(start_rv or 0)
                if cursor < self._oldest_watchable_rv:
                    message = (
                        f"too old resource version: {cursor} ({self._oldest_watchable_rv + 1})"
                    )
                    initial = [
                        {"type": "ERROR", "object": ApiError(410, "Expired", message).status()}
                    ]
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
                if change.plural == resource.plural and namespace in (None, change.namespace):
                    send({"type": change.kind, "object": _with_type(resource, change.new)})
        if bookmarks:
            bookmark = {"resourceVersion": str(cursor)}
            send(
                {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": resource.kind,
                        "apiVersion": resource.api_version,
                        "metadata": bookmark,
                    },
                }
            )
        return True

    def _admit(self) -> tuple[bool, int]:
        """(whether this request fails with 500, the watch generation as it arrived).

        The generation is taken here so that `drop_watches()` cuts every watch whose request
        arrived before it, even one whose stream has not started yet.
        """
        with self._lock:
            return self.failing, self._watch_generation


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

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _send_json(self, code: int, body: Any) -> None:
        payload = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _handle(self, method: str) -> None:
        parsed = urlsplit(self.path)
        query = parse_qs(parsed.query, keep_blank_values=True)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        failing, self._generation = self.kube._admit()
        try:
            if failing:
                raise ApiError(
                    500,
                    "InternalError",
                    "Internal error occurred: injected fault",
                    {"causes": [{"message": "injected fault"}]},
                )
            self._route(method, parsed.path, query, body)
        except ApiError as error:
            self._send_json(error.code, error.status())
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
            raise no_such_resource()
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        plural, name = rest[0], (rest[1] if len(rest) > 1 else None)
        resource = RESOURCES.get(plural)
        if resource is None or resource.group != group or len(rest) > 2:
            raise no_such_resource()
        if namespace is not None and not resource.namespaced:
            raise no_such_resource()

        def one(key: str) -> str | None:
            values = query.get(key)
            return values[-1] if values else None

        if name is None and method == "GET" and one("watch") in ("true", "1"):
            timeout = one("timeoutSeconds")
            self._stream_watch(
                resource,
                namespace,
                one("resourceVersion"),
                float(timeout) if timeout else None,
                one("allowWatchBookmarks") == "true",
            )
        elif name is None and method == "GET":
            self._send_json(200, self.kube._list(resource, namespace))
        elif name is not None and method == "GET":
            obj = self.kube.get(plural, name, namespace)
            if obj is None:
                raise not_found(plural, name)
            self._send_json(200, obj)
        elif name is not None and method == "PATCH":
            try:
                patch = json.loads(body)
            except ValueError as error:
                raise bad_request(f"{resource.kind}: {error}") from None
            self._send_json(200, self.kube.patch(plural, name, patch, namespace))
        else:
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
                {},
            )

    def _stream_watch(
        self,
        resource: ResourceType,
        namespace: str | None,
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
            data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        ended_cleanly = self.kube._watch(
            resource, namespace, start_rv, timeout_s, bookmarks, send, self._generation
        )
        if ended_cleanly:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        else:
            # Cut the stream without the terminating chunk: the client sees a broken connection.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
