"""Learned rewards saved to a ConfigMap, so that they survive a restart of the extender.

The evidence (`RewardModel.to_document`, decayed to the save time) is gzipped JSON in the
ConfigMap's `binaryData` under `rewards.json.gz`, with a one-line readable `summary` in `data`.
Saving is periodic and off the request path; loading happens once, at start. Counts are stored
with their save time and keep decaying from it, so a restart an hour later loads them an hour
faded.

**Identity and reset.** The ConfigMap's `metadata.uid` is the identity of what was learned.
Each save first reads the ConfigMap: if the one this process loaded or created is gone (an
operator deleted it: `kubectl delete configmap`), or was replaced by another one (a new uid),
the save reports `RESET` and writes nothing; the source then forgets its evidence and starts
anew. So deleting the ConfigMap resets every replica within one save interval, and a replica
shutting down cannot write an old model back after a reset. Two replicas of the extender write
the same ConfigMap: they watch the same pods and learn the same evidence, so the last write
winning loses nothing of note; a write that loses a race (409 Conflict) is retried at the next
interval.

Thin on purpose: the official `kubernetes` client; the caller gives the `ApiClient`.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DATA_KEY = "rewards.json.gz"
SUMMARY_KEY = "summary"
# A ConfigMap holds at most 1 MiB (data and binaryData together); leave room for metadata.
MAX_PAYLOAD_BYTES = 900 * 1024
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
FALLBACK_NAMESPACE = "default"
REQUEST_TIMEOUT_S = (5.0, 15.0)  # connect, read
LABELS = {
    "app.kubernetes.io/name": "power-extender",
    "app.kubernetes.io/part-of": "power-aware-scheduler",
    "app.kubernetes.io/component": "rewards",
}


class StoreError(RuntimeError):
    """The ConfigMap could not be read or written; the message says which and why."""


class SaveResult(StrEnum):
    SAVED = "saved"
    RESET = "reset"  # the ConfigMap we knew is gone or replaced: forget, do not write
    CONFLICT = "conflict"  # another writer was faster: try again next time


@dataclass(frozen=True)
class Loaded:
    document: dict[str, Any] | None  # None: no ConfigMap yet
    uid: str | None


def default_namespace() -> str:
    """Where the extender runs: $POD_NAMESPACE, the service account's namespace, else default."""
    from_env = os.environ.get("POD_NAMESPACE", "").strip()
    if from_env:
        return from_env
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or FALLBACK_NAMESPACE
    except OSError:
        return FALLBACK_NAMESPACE


def encode_document(document: dict[str, Any]) -> bytes:
    """Gzipped compact JSON (mtime 0: the same evidence gives the same bytes)."""
    raw = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    return gzip.compress(raw, compresslevel=6, mtime=0)


def decode_document(payload: bytes, where: str) -> dict[str, Any]:
    try:
        document = json.loads(gzip.decompress(payload))
    except (OSError, EOFError, ValueError) as exc:
        raise StoreError(f"{where}: {DATA_KEY} is not gzipped JSON: {exc}") from None
    if not isinstance(document, dict):
        raise StoreError(f"{where}: {DATA_KEY} holds {type(document).__name__}, not an object")
    return document


class ConfigMapStore:
    """Reads and writes one ConfigMap (`namespace/name`) through the official client."""

    def __init__(self, api_client: Any, namespace: str, name: str) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.name = name
        self._api = client.CoreV1Api(api_client)
        self._uid: str | None = None  # the ConfigMap this process loaded or wrote

    @property
    def where(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def load(self) -> Loaded:
        """The saved document (None when there is no ConfigMap yet); StoreError otherwise."""
        current = self._read()
        if current is None:
            return Loaded(None, None)
        self._uid = current.metadata.uid
        binary = current.binary_data or {}
        if DATA_KEY not in binary:
            raise StoreError(f"{self.where}: no {DATA_KEY} key (not written by the extender?)")
        try:
            payload = base64.b64decode(binary[DATA_KEY], validate=True)
        except ValueError as exc:
            raise StoreError(f"{self.where}: {DATA_KEY} is not base64: {exc}") from None
        return Loaded(decode_document(payload, self.where), self._uid)

    def save(self, payload: bytes, summary: str) -> SaveResult:
        """Write `payload` (an encoded document) unless the ConfigMap was reset meanwhile."""
        from kubernetes.client.rest import ApiException

        if len(payload) > MAX_PAYLOAD_BYTES:
            raise StoreError(
                f"{self.where}: {len(payload)} bytes of rewards exceed {MAX_PAYLOAD_BYTES} "
                "(a ConfigMap holds 1 MiB)"
            )
        current = self._read()
        if self._uid is not None and (current is None or current.metadata.uid != self._uid):
            return SaveResult.RESET
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": LABELS},
            "data": {SUMMARY_KEY: summary},
            "binaryData": {DATA_KEY: base64.b64encode(payload).decode()},
        }
        try:
            if current is None:
                written = self._api.create_namespaced_config_map(
                    self.namespace, body, _request_timeout=REQUEST_TIMEOUT_S
                )
            else:
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                written = self._api.replace_namespaced_config_map(
                    self.name, self.namespace, body, _request_timeout=REQUEST_TIMEOUT_S
                )
        except ApiException as exc:
            if exc.status == 409:
                return SaveResult.CONFLICT
            raise StoreError(_describe(exc, f"writing {self.where}")) from None
        except Exception as exc:  # connection refused, timeouts
            raise StoreError(f"writing {self.where}: {type(exc).__name__}: {exc}") from None
        self._uid = written.metadata.uid
        return SaveResult.SAVED

    def forget_identity(self) -> None:
        """After a reset: the next save creates (or adopts) a ConfigMap afresh."""
        self._uid = None

    def _read(self) -> Any:
        from kubernetes.client.rest import ApiException

        try:
            return self._api.read_namespaced_config_map(
                self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise StoreError(_describe(exc, f"reading {self.where}")) from None
        except Exception as exc:
            raise StoreError(f"reading {self.where}: {type(exc).__name__}: {exc}") from None


def _describe(exc: Any, what: str) -> str:
    from livedata.kube_client import describe_api_error

    return describe_api_error(exc, what, rbac_manifest="manifests/base/extender.yaml")
