"""A real Kubernetes control plane on loopback for tests and benches (like envtest).

`ControlPlane` runs etcd, kube-apiserver (RBAC on, a PKI made at start), kube-controller-manager
(every controller) and kube-scheduler, from the binaries in the directory `KUBEBUILDER_ASSETS`
names (`assets.find_assets`). Only the kubelet is stood in for: `NodeAgent` registers Nodes,
keeps their Lease and Ready condition fresh, runs bound pods and ties a node's life to its BMC,
as KWOK does.
"""

from envtest.assets import AssetsMissing, find_assets
from envtest.control_plane import ControlPlane, ControlPlaneError
from envtest.node_agent import NodeAgent

__all__ = [
    "AssetsMissing",
    "ControlPlane",
    "ControlPlaneError",
    "NodeAgent",
    "find_assets",
]
