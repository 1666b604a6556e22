"""CPU requested per node, as the Pod watch publishes it for the plugins (a state signal).

The Consolidation plugin compares a node's requested CPU with its allocatable CPU, as the node
power controller's utilisation threshold does (`controllers.node_power.policy`). The live Pod
watch (`extender.sources.kube_watch`) sums the requests of the running pods per node and
publishes a `NodeRequests` under `REQUESTED_CPU_SIGNAL` (`ClusterState.set_signal`); the
energy simulation publishes the same from its ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The state signal under which the Pod watch publishes `NodeRequests`.
REQUESTED_CPU_SIGNAL = "requested_cpu"
# A static pod's mirror carries this annotation (kubelet's `kubetypes.ConfigMirrorAnnotationKey`).
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class NodeRequests:
    """CPU requested on each node by the pods bound there, DaemonSet and mirror pods left out.

    What the node power controller would have to move to power a node off, and what its
    utilisation threshold compares with allocatable CPU. A node missing from `cores` runs no
    such pod. Immutable: published whole on every change.
    """

    cores: Mapping[str, float]


def is_daemon_pod(pod: Mapping) -> bool:
    """Whether the pod goes with its node: owned by a DaemonSet, or a static pod's mirror."""
    metadata = pod.get("metadata") or {}
    if MIRROR_POD_ANNOTATION in (metadata.get("annotations") or {}):
        return True
    return any(
        isinstance(owner, Mapping) and owner.get("kind") == "DaemonSet"
        for owner in metadata.get("ownerReferences") or ()
    )
