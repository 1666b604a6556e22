"""The controller's Kubernetes calls: cached reads by list + watch, and the few writes it makes.

Reads. `Informer` keeps one resource (Nodes, Pods, PodDisruptionBudgets) in memory the way
client-go's reflector does (`livedata.list_watch.ListWatchLoop`, the extender's watch loop
too): list, then watch from the list's resourceVersion with a server-side timeout, resume
where the watch ended, relist on 410 Gone, and retry everything else (refused connections,
dropped streams, 5xx) with exponential backoff. A round reads the
cached objects, so the API server sees one watch per resource, not a list per round. Objects
the controller writes are put into the cache from the write's answer (`observe`), so the next
round sees its own changes even before the watch event arrives.

Writes (`KubeOps`), each bounded by a timeout:

- `record_power_state`: one merge patch of the node's annotations (`power-state`, `-since`,
  `-reason`) and, with it, `spec.unschedulable` (cordon / uncordon);
- `evict`: the Eviction API, so PodDisruptionBudgets are respected; a 429 (a budget allows no
  disruption now) is an `EvictionRefused` carrying the server's message and causes;
- `pods_on_node`: a fresh list of the pods bound to one node, read just before a node is
  powered off, so a pod that arrived since the cache was filled can never be powered off;
- `read_namespace`: the controller's namespace, for the kill switch;
- `pod_events`: the Events about pods, read when a round starts with no memory of which
  nodes were unneeded (see `views.unneeded_evidence_s`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from livedata.labels import (
    POWER_STATE_ANNOTATION,
    POWER_STATE_REASON_ANNOTATION,
    POWER_STATE_SINCE_ANNOTATION,
)
from livedata.list_watch import ListWatchLoop, LoopStatus

log = logging.getLogger(__package__)

JsonObject = dict[str, Any]
HTTP_NOT_FOUND = 404
HTTP_TOO_MANY_REQUESTS = 429
HTTP_SERVER_ERROR = 500
MAX_REASON_CHARS = 1000  # an annotation value stays readable in `kubectl describe node`


def rfc3339(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def object_key(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata.get('name')}" if namespace else str(metadata.get("name"))


def _newer_or_equal(candidate: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    """Whether `candidate` is at least as new as `current` (resourceVersions as etcd numbers)."""
    if current is None:
        return True
    try:
        new = int((candidate.get("metadata") or {}).get("resourceVersion") or 0)
        old = int((current.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return True
    return new >= old


class Informer:
    """One resource's objects, kept current by list + watch in a daemon thread
    (`livedata.list_watch.ListWatchLoop`)."""

    def __init__(
        self,
        name: str,
        list_func: Callable[..., Any],
        *,
        clock: Callable[[], float] = time.time,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        watch_timeout_s: int = 300,
        list_timeout_s: float = 60.0,
    ) -> None:
        self.name = name
        self._store: dict[str, JsonObject] = {}
        self._lock = threading.Lock()
        self._loop = ListWatchLoop(
            name=name,
            list_func=list_func,
            list_kwargs={},
            on_list=self._listed,
            on_event=self._apply,
            clock=clock,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            watch_timeout_s=watch_timeout_s,
            list_timeout_s=list_timeout_s,
        )

    # ---- what readers use -------------------------------------------------------------------

    def items(self) -> list[JsonObject]:
        """The cached objects (do not change them)."""
        with self._lock:
            return list(self._store.values())

    def observe(self, obj: JsonObject) -> None:
        """Put an object the controller just wrote (the API's answer) into the cache."""
        key = object_key(obj)
        with self._lock:
            if _newer_or_equal(obj, self._store.get(key)):
                self._store[key] = obj

    @property
    def synced(self) -> bool:
        return self._loop.status.synced

    @property
    def status(self) -> LoopStatus:
        return self._loop.status

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    # ---- the loop's callbacks ---------------------------------------------------------------

    def _listed(self, items: list[JsonObject]) -> None:
        store = {object_key(obj): obj for obj in items}
        with self._lock:
            self._store = store

    def _apply(self, kind: str, obj: JsonObject) -> None:
        key = object_key(obj)
        with self._lock:
            if kind == "DELETED":
                self._store.pop(key, None)
            else:
                self._store[key] = obj


class EvictionRefused(Exception):
    """The Eviction API answered 429: a PodDisruptionBudget allows no disruption now."""

    def __init__(self, pod: str, message: str, causes: list[str]) -> None:
        self.pod = pod
        self.causes = causes
        super().__init__(
            f"eviction of {pod} refused: {message}" + "".join(f"; {c}" for c in causes)
        )


def api_unavailable(error: BaseException) -> str | None:
    """What went wrong in words when `error` is the API server being unreachable or overloaded
    (an expected, passing failure to retry with backoff), else None.

    Expected: connection failures and timeouts (urllib3's `MaxRetryError`, `ProtocolError`,
    `NewConnectionError` and timeout errors are `urllib3.exceptions.HTTPError`s, not
    `OSError`s; plain socket errors are `OSError`s), 5xx answers and 429 Too Many Requests
    (client-go retries the same). Any other API answer (403, 404, 409...) is the server
    refusing this request, and anything else is a bug.
    """
    if isinstance(error, ApiException):
        status = error.status or 0
        if status == 0 or status >= HTTP_SERVER_ERROR or status == HTTP_TOO_MANY_REQUESTS:
            return describe_api_error(error)
        return None
    if isinstance(error, urllib3.exceptions.HTTPError | OSError):
        return _root_cause(error)
    return None


def _root_cause(error: BaseException) -> str:
    """The innermost cause of a urllib3 or socket error, short: "connection refused",
    "read timed out. (read timeout=5)"."""
    seen = {id(error)}
    while True:
        inner = getattr(error, "reason", None)
        if not isinstance(inner, BaseException):
            inner = error.__cause__ or error.__context__
        if inner is None or id(inner) in seen:
            break
        seen.add(id(inner))
        error = inner
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    text = " ".join(str(error).split())
    # urllib3 prefixes its messages with the pool ("HTTPConnectionPool(host=..., port=...): ").
    head, _, tail = text.partition("): ")
    return (tail if "ConnectionPool(" in head or "Connection(" in head else text) or repr(error)


def describe_api_error(error: ApiException) -> str:
    """HTTP status and the server's own message, in one line."""
    message = ""
    try:
        status = json.loads(error.body or "")
        message = status.get("message", "") if isinstance(status, dict) else ""
    except (TypeError, ValueError):
        message = ""
    return f"HTTP {error.status} {error.reason}" + (f": {message}" if message else "")


class KubeOps:
    """The controller's writes and fresh reads, each with a timeout."""

    def __init__(self, api_client: client.ApiClient, *, timeout_s: float = 10.0) -> None:
        self.core = client.CoreV1Api(api_client)
        self.timeout_s = timeout_s

    def record_power_state(
        self,
        node: str,
        state: str,
        since_s: float,
        reason: str,
        *,
        unschedulable: bool | None,
    ) -> JsonObject:
        """Annotate the node's power state (and cordon/uncordon it); the node as now stored."""
        patch: JsonObject = {
            "metadata": {
                "annotations": {
                    POWER_STATE_ANNOTATION: state,
                    POWER_STATE_SINCE_ANNOTATION: rfc3339(since_s),
                    POWER_STATE_REASON_ANNOTATION: reason[:MAX_REASON_CHARS],
                }
            }
        }
        if unschedulable is not None:
            patch["spec"] = {"unschedulable": unschedulable}
        response = self.core.patch_node(
            node, patch, _preload_content=False, _request_timeout=self.timeout_s
        )
        return json.loads(response.data)

    def record_reason(self, node: str, reason: str) -> JsonObject:
        """Only the reason annotation (a failure that changes no state)."""
        patch = {
            "metadata": {"annotations": {POWER_STATE_REASON_ANNOTATION: reason[:MAX_REASON_CHARS]}}
        }
        response = self.core.patch_node(
            node, patch, _preload_content=False, _request_timeout=self.timeout_s
        )
        return json.loads(response.data)

    def evict(self, pod: Mapping[str, Any], max_grace_s: int | None) -> None:
        """Evict through the Eviction API; gone already is fine; 429 -> EvictionRefused."""
        metadata = pod.get("metadata") or {}
        name, namespace = metadata.get("name"), metadata.get("namespace")
        body: JsonObject = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        if max_grace_s is not None:
            grace = max_grace_s if grace is None else min(grace, max_grace_s)
            body["deleteOptions"] = {"gracePeriodSeconds": grace}
        try:
            # The server answers a Status, not an Eviction: take the raw answer.
            self.core.create_namespaced_pod_eviction(
                name, namespace, body, _preload_content=False, _request_timeout=self.timeout_s
            )
        except ApiException as error:
            if error.status == HTTP_NOT_FOUND:
                return
            if error.status == HTTP_TOO_MANY_REQUESTS:
                status = _status_body(error)
                causes = [
                    c.get("message", "")
                    for c in (status.get("details") or {}).get("causes") or []
                    if c.get("message")
                ]
                raise EvictionRefused(
                    f"{namespace}/{name}", status.get("message", "HTTP 429"), causes
                ) from None
            raise

    def pods_on_node(self, node: str) -> list[JsonObject]:
        response = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}",
            _preload_content=False,
            _request_timeout=self.timeout_s,
        )
        return json.loads(response.data).get("items") or []

    def pod_events(self) -> list[JsonObject]:
        """Every Event about a pod, in all namespaces (evidence for `views.unneeded_evidence_s`)."""
        response = self.core.list_event_for_all_namespaces(
            field_selector="involvedObject.kind=Pod",
            _preload_content=False,
            _request_timeout=self.timeout_s,
        )
        return json.loads(response.data).get("items") or []

    def read_namespace(self, name: str) -> JsonObject:
        response = self.core.read_namespace(
            name, _preload_content=False, _request_timeout=self.timeout_s
        )
        return json.loads(response.data)


def _status_body(error: ApiException) -> JsonObject:
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}
