"""Power drivers: how the controller switches a node off and on.

Chosen per node by the label (or annotation) `power-aware-scheduler/power-driver`:
`redfish` (`redfish`, with sushy), `ipmi` (`ipmi`, with pyghmi) or `dry-run` (`dry_run`:
switches nothing); nodes without it get the controller's `--default-driver`. BMC addresses
and credentials come from a mounted Secret (`secret`). `base` holds the interface, the error
kinds and the time bound on every BMC call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controllers.node_power.drivers.base import (
    ERROR_KINDS,
    POWER_STATE_OFF,
    POWER_STATE_ON,
    BmcCredentials,
    DriverError,
    PowerDriver,
    bounded_call,
)
from controllers.node_power.drivers.dry_run import DryRunDriver
from controllers.node_power.drivers.secret import BmcSecret
from livedata.labels import (
    POWER_DRIVER_DRY_RUN,
    POWER_DRIVER_IPMI,
    POWER_DRIVER_LABEL,
    POWER_DRIVER_REDFISH,
    POWER_DRIVERS,
)


def driver_kind(node: Mapping[str, Any], default: str) -> str:
    """The driver a Node object asks for (label first, then annotation), else `default`."""
    metadata = node.get("metadata") or {}
    for where in ("labels", "annotations"):
        value = (metadata.get(where) or {}).get(POWER_DRIVER_LABEL)
        if value:
            return value
    return default


def make_driver(
    kind: str, node: str, secret: BmcSecret, *, timeout_s: float, state: str = POWER_STATE_ON
) -> PowerDriver:
    """A driver of `kind` for `node`; DriverError("config") for an unknown kind or no Secret."""
    if kind == POWER_DRIVER_DRY_RUN:
        return DryRunDriver(None, node, state)
    if kind == POWER_DRIVER_REDFISH:
        from controllers.node_power.drivers.redfish import RedfishDriver

        return RedfishDriver(secret.credentials_for(node), node, timeout_s=timeout_s)
    if kind == POWER_DRIVER_IPMI:
        from controllers.node_power.drivers.ipmi import IpmiDriver

        return IpmiDriver(secret.credentials_for(node), node, timeout_s=timeout_s)
    raise DriverError(
        "config",
        f"node {node}: {POWER_DRIVER_LABEL}={kind!r} is not one of {', '.join(POWER_DRIVERS)}",
    )


__all__ = [
    "ERROR_KINDS",
    "POWER_STATE_OFF",
    "POWER_STATE_ON",
    "BmcCredentials",
    "BmcSecret",
    "DriverError",
    "DryRunDriver",
    "PowerDriver",
    "bounded_call",
    "driver_kind",
    "make_driver",
]
