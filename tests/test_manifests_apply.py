"""Every kustomization under manifests/, rendered by real kustomize, applied to a real API server.

`kubectl apply --server-side --dry-run=server -k DIR` (the kubectl and kustomize of
KUBEBUILDER_ASSETS) runs the API server's own defaulting, validation and admission on every
object without persisting it: a field the API does not know, a bad quantity, a selector that
does not match its template, an RBAC rule naming a verb twice all fail here as they would on a
user's first `kubectl apply -k`. Kustomization directories are found by walking manifests/, so
an overlay added later is covered without editing this file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envtest import ControlPlane
from tests.support.manifests import kustomization, kustomization_dirs

REPO = Path(__file__).resolve().parents[1]
# A kustomize Component (manifests/image/) builds nothing on its own: it is applied through the
# kustomizations that include it.
KUSTOMIZATIONS = sorted(
    d for d in kustomization_dirs() if kustomization(d).get("kind") != "Component"
)


def test_kustomizations_are_found() -> None:
    names = {str(d.relative_to(REPO)) for d in KUSTOMIZATIONS}
    assert {"manifests", "manifests/examples", "manifests/large-fleet"} <= names


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda d: str(d.relative_to(REPO)))
def test_kustomization_applies_to_a_real_api_server(
    control_plane: ControlPlane, directory: Path
) -> None:
    rendered = control_plane.kubectl("kustomize", str(directory), check=False)
    assert rendered.returncode == 0, f"kubectl kustomize {directory}: {rendered.stderr}"
    assert rendered.stdout.strip(), f"{directory} renders nothing"
    applied = control_plane.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=manifest-test",
        "-f",
        "-",
        input=rendered.stdout,
        check=False,
    )
    assert applied.returncode == 0, f"{directory}: {applied.stderr}"
    # One line per object ("... serverside-applied (server dry run)"), nothing refused.
    objects = rendered.stdout.count("\nkind: ") + rendered.stdout.startswith("kind: ")
    lines = [line for line in applied.stdout.splitlines() if "(server dry run)" in line]
    assert len(lines) == objects, applied.stdout
