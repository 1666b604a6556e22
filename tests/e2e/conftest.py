"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from envtest import ControlPlane
from tests.support.power_cluster import PowerCluster
from tests.support.power_e2e import power_cluster


@pytest.fixture
def cluster(control_plane: ControlPlane, namespace: str) -> Iterator[PowerCluster]:
    """This test's nodes and workloads (`PowerCluster`); the node power controllers' Lease
    deleted after."""
    with power_cluster(control_plane, namespace) as created:
        yield created
