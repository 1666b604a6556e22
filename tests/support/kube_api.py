"""Components against the real control plane (envtest), each as the ServiceAccount it ships with.

- `component_kubeconfig(plane, name)` / `component_client(plane, name)`: a kubeconfig or an
  official-client ApiClient holding a token of ServiceAccount power-aware-scheduler/NAME, so
  the component gets exactly the rights manifests/ grant it (and a 403 for anything else);
  `host=` points the client elsewhere, e.g. at a `FaultProxy` in front of the API server.
- `RequestLog`: every request this process's official clients send, as sent, with the user it
  was sent as (the ServiceAccount of a bearer token, else "admin"): what a test asserts about
  requests (which patches, in which order, how large) without a fake server in between.
- `force_delete_pods(core, namespace)`: pods bound to nodes no kubelet serves never finish a
  graceful deletion; a test's namespace must not be left Terminating.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from envtest import ControlPlane
from tests.support.fault_proxy import kubeconfig_through

COMPONENT_NAMESPACE = "power-aware-scheduler"  # where the manifests put every ServiceAccount


def component_kubeconfig(plane: ControlPlane, name: str) -> Path:
    """A kubeconfig for ServiceAccount power-aware-scheduler/NAME (a fresh TokenRequest)."""
    return plane.service_account_kubeconfig(COMPONENT_NAMESPACE, name)


def component_client(
    plane: ControlPlane, name: str, *, host: str | None = None
) -> kubernetes.client.ApiClient:
    """An ApiClient as ServiceAccount power-aware-scheduler/NAME; `host` replaces the server."""
    kubeconfig = component_kubeconfig(plane, name)
    return plane.api_client(kubeconfig if host is None else kubeconfig_via(kubeconfig, host))


def kubeconfig_via(kubeconfig: Path, server: str) -> Path:
    """A copy of `kubeconfig` whose cluster is at `server`, a `FaultProxy`'s URL (same CA, same
    credentials), written beside it.

    Setting `configuration.host` would not last: the client reloads a token kubeconfig, server
    included, before each request.
    """
    port = urlsplit(server).port
    assert port is not None and server.startswith("https://127.0.0.1:"), server
    path = kubeconfig.with_name(f"{kubeconfig.stem}-via-{port}.kubeconfig")
    return kubeconfig_through(kubeconfig, port, path)


def force_delete_pods(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    for pod in core.list_namespaced_pod(namespace).items:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)


# --------------------------------------------------------------------------------------------
# Requests as sent
# --------------------------------------------------------------------------------------------


def _user_of(headers: dict[str, str] | None) -> str:
    """The ServiceAccount name in a bearer token's `sub` claim; "admin" without a token."""
    authorization = next(
        (v for k, v in (headers or {}).items() if k.lower() == "authorization"), ""
    )
    if not authorization.startswith("Bearer "):
        return "admin"
    try:
        payload = authorization.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return str(claims["sub"]).rsplit(":", 1)[-1]
    except (IndexError, ValueError, KeyError):
        return "unknown"


@dataclass(frozen=True)
class SentRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any  # as the client serialises it (dicts for JSON), None without a body
    user: str  # the ServiceAccount's name, or "admin"

    @property
    def body_bytes(self) -> int:
        return 0 if self.body is None else len(json.dumps(self.body).encode())

    @property
    def watch(self) -> bool:
        return self.query.get("watch", [""])[0] in ("true", "True", "1")


class RequestLog:
    """Records what `ApiClient.call_api` sends, in every client of this process."""

    def __init__(self) -> None:
        self.requests: list[SentRequest] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator[RequestLog]:
        original = kubernetes.client.ApiClient.call_api
        log = self

        def call_api(
            client_self: Any,
            method: str,
            url: str,
            header_params=None,
            body=None,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            parts = urlsplit(url)
            content_type = next(
                (v for k, v in (header_params or {}).items() if k.lower() == "content-type"), ""
            )
            log.requests.append(
                SentRequest(
                    method,
                    parts.path,
                    parse_qs(parts.query, keep_blank_values=True),
                    content_type,
                    body,
                    _user_of(header_params),
                )
            )
            return original(client_self, method, url, header_params, body, *args, **kwargs)

        kubernetes.client.ApiClient.call_api = call_api  # type: ignore[method-assign]
        try:
            yield self
        finally:
            kubernetes.client.ApiClient.call_api = original  # type: ignore[method-assign]

    def by(self, user: str) -> list[SentRequest]:
        return [r for r in self.requests if r.user == user]

    def clear(self) -> None:
        self.requests.clear()
