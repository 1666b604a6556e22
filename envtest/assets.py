"""Where the control plane's binaries are: envtest's KUBEBUILDER_ASSETS convention, extended.

controller-runtime's envtest reads etcd, kube-apiserver and kubectl from the directory
`KUBEBUILDER_ASSETS` names (`setup-envtest use -p path` prints one). We need two more from the
same Kubernetes release, kube-controller-manager and kube-scheduler, and look for them there too.
Without the variable the directory is `.kube-assets/` in the repository, which
`scripts/ensure-kube-assets` fills from `../shared/k8s`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASSETS_ENV = "KUBEBUILDER_ASSETS"
DEFAULT_ASSETS_DIR = REPO / ".kube-assets"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


class AssetsMissing(RuntimeError):
    """The binaries are not where we looked; the message says how to get them."""


@dataclass(frozen=True)
class Assets:
    directory: Path

    def binary(self, name: str) -> Path:
        return self.directory / name

    @property
    def kubectl(self) -> Path:
        return self.binary("kubectl")


def assets_dir() -> Path:
    configured = os.environ.get(ASSETS_ENV)
    return Path(configured).resolve() if configured else DEFAULT_ASSETS_DIR


def find_assets() -> Assets:
    """The assets directory, with every binary present and executable, or `AssetsMissing`."""
    directory = assets_dir()
    missing = [
        name
        for name in BINARIES
        if not (directory / name).is_file() or not os.access(directory / name, os.X_OK)
    ]
    if missing:
        source = f"${ASSETS_ENV}" if os.environ.get(ASSETS_ENV) else "the default"
        raise AssetsMissing(
            f"{directory} ({source}) lacks {', '.join(missing)}: run scripts/ensure-kube-assets "
            "(unpacks ../shared/k8s, installs Debian's etcd-server), or point "
            f"{ASSETS_ENV} at a directory holding {', '.join(BINARIES)} "
            "(setup-envtest gives etcd, kube-apiserver and kubectl; the Kubernetes server "
            "release's server/bin/ the rest)"
        )
    return Assets(directory)
