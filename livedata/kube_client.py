"""Kubernetes client set-up, shared by training.publish, the extender and the controllers.

Thin on purpose: the official `kubernetes` client, configured from the pod's service account
(`in_cluster`) or a kubeconfig file, and one readable line for an API error.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLIs build their flags here without importing the client (33 MiB)
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException


class KubeConfigError(ValueError):
    """No usable Kubernetes client configuration (kubeconfig or in-cluster)."""


def kube_api_client(
    *, kubeconfig: Path | None = None, in_cluster: bool = False
) -> client.ApiClient:
    """A client from the pod's service account (`in_cluster`) or a kubeconfig file.

    Without either, the kubeconfig kubectl would use ($KUBECONFIG or ~/.kube/config).
    """
    from kubernetes import client, config

    try:
        if in_cluster:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config(
            config_file=str(kubeconfig) if kubeconfig is not None else None
        )
    except (config.ConfigException, OSError) as error:
        source = (
            "in-cluster service account" if in_cluster else (kubeconfig or "default kubeconfig")
        )
        raise KubeConfigError(
            f"cannot configure the Kubernetes client from {source}: {error}"
        ) from None


def add_kube_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    when: str = "",
    in_cluster_default: bool = False,
) -> None:
    """`--kubeconfig FILE` and `--in-cluster`, one or the other, worded alike in every CLI
    (`kube_api_client` takes what they give). `when` prefixes the help where the API is used
    only in one mode (e.g. "with --prometheus: ")."""
    kube = parser.add_mutually_exclusive_group()
    kube.add_argument(
        "--kubeconfig",
        metavar="FILE",
        type=Path,
        default=None,
        help=f"{when}kubeconfig file for the Kubernetes API (default: $KUBECONFIG or "
        "~/.kube/config, as kubectl)",
    )
    kube.add_argument(
        "--in-cluster",
        action="store_true",
        default=in_cluster_default,
        help=f"{when}use the pod's service account for the Kubernetes API",
    )


def describe_api_error(error: ApiException, what: str, *, rbac_manifest: str = "manifests/") -> str:
    """One line: what was refused, the HTTP status and the server's own message.

    `rbac_manifest` names the manifest that grants the caller's rights, for a 403's hint.
    """
    message = ""
    try:
        status = json.loads(error.body or "")
        message = status.get("message", "") if isinstance(status, dict) else ""
    except (ValueError, TypeError):
        message = (error.body or "").strip()[:200] if isinstance(error.body, str) else ""
    hint = {
        413: " (the request body is larger than the API server accepts)",
        422: " (the API server's validation refused it; a ConfigMap holds at most 1 MiB)",
        403: f" (the service account lacks the right; see {rbac_manifest})",
    }.get(error.status or 0, "")
    detail = f": {message}" if message else ""
    return f"{what}: HTTP {error.status} {error.reason}{hint}{detail}"


def describe_unreachable(error: Exception, what: str = "") -> str:
    """One line for a request that got no answer: refused, reset, timed out (`what` first).

    The official client raises urllib3's errors then (`urllib3.exceptions.HTTPError`, not
    `ApiException` nor `OSError`); after its retries, a `MaxRetryError` whose `reason` is the
    last cause.
    """
    cause = getattr(error, "reason", None) or error
    prefix = f"{what}: " if what else ""
    return f"{prefix}Kubernetes API unreachable: {' '.join(str(cause).split())}"


def quiet_client_retries() -> None:
    """Keep urllib3's per-retry warnings out of a command's output: its own one-line error
    says what failed (the retries would repeat it three times over)."""
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
