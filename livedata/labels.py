"""Contract 4: the node and pod labels and annotations users set or read, defined once.

The extender's plugins, the energy adapter, the node power controller and the simulation all
read these names from here, so a key or a band boundary cannot drift between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# ---- energy level (the serverless seed's bands) ----------------------------------------------

ENERGY_LABEL = "energy-status"


@dataclass(frozen=True)
class EnergyBand:
    """An `energy-status` label value and the stored-energy band it stands for.

    A stored-energy percentage `pct` is in the band when `low_pct <= pct < high_pct`; 100 % is
    in the top band.
    """

    name: str
    low_pct: float
    high_pct: float


# Lowest first. A reading exactly on a boundary belongs to the upper band (75 % is well-powered).
ENERGY_BANDS: tuple[EnergyBand, ...] = (
    EnergyBand("powerless", 0.0, 15.0),
    EnergyBand("low-powered", 15.0, 40.0),
    EnergyBand("vulnerable", 40.0, 75.0),
    EnergyBand("well-powered", 75.0, 100.0),
)
ENERGY_BAND_BY_NAME: Mapping[str, EnergyBand] = {band.name: band for band in ENERGY_BANDS}
POWERLESS = "powerless"
LOW_POWERED = "low-powered"
VULNERABLE = "vulnerable"
WELL_POWERED = "well-powered"
# A node on grid power, said explicitly: the same as no `energy-status` label at all. It is the
# word the extender's /explain uses for such nodes, so an operator can write it back as a label.
GRID = "grid"
# Every value the label may take, best first (no label means GRID).
ENERGY_LABEL_VALUES: tuple[str, ...] = (GRID, *(band.name for band in reversed(ENERGY_BANDS)))


def energy_band_for(stored_pct: float) -> EnergyBand:
    """The band of a stored-energy percentage (0..100), without hysteresis."""
    if not 0.0 <= stored_pct <= 100.0:
        raise ValueError(f"stored energy must be 0..100 %, got {stored_pct!r}")
    for band in reversed(ENERGY_BANDS):
        if stored_pct >= band.low_pct:
            return band
    return ENERGY_BANDS[0]


# ---- power cap --------------------------------------------------------------------------------

# Node annotation: nodes predicted above this many watts after placement fail the filter.
MAX_POWER_ANNOTATION = "power-aware-scheduler/max-power-w"

# ---- eviction (cluster-autoscaler's meaning) ---------------------------------------------------

SAFE_TO_EVICT_ANNOTATION = "cluster-autoscaler.kubernetes.io/safe-to-evict"
# Pod annotation kubelet puts on the API mirror of a static pod: it goes with its node.
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"

# ---- node power management (the node power controller, controllers.node_power) ---------------

# Node annotation the controller writes: the node's power state and since when (RFC 3339).
POWER_STATE_ANNOTATION = "power-aware-scheduler/power-state"
POWER_STATE_SINCE_ANNOTATION = "power-aware-scheduler/power-state-since"
# Why the last power action happened or failed, in words (for `kubectl describe node`).
POWER_STATE_REASON_ANNOTATION = "power-aware-scheduler/power-state-reason"
POWER_ON = "on"
POWER_DRAINING = "draining"
POWER_OFF = "off"
POWER_WAKING = "waking"
POWER_STATES = (POWER_ON, POWER_DRAINING, POWER_OFF, POWER_WAKING)
# Node label an operator sets to let the controller power the node off ("enabled").
POWER_MANAGEMENT_LABEL = "power-aware-scheduler/power-management"
POWER_MANAGEMENT_ENABLED = "enabled"
# Node label (or annotation) choosing the power driver: redfish, ipmi or dry-run.
POWER_DRIVER_LABEL = "power-aware-scheduler/power-driver"
POWER_DRIVER_REDFISH = "redfish"
POWER_DRIVER_IPMI = "ipmi"
POWER_DRIVER_DRY_RUN = "dry-run"
POWER_DRIVERS = (POWER_DRIVER_REDFISH, POWER_DRIVER_IPMI, POWER_DRIVER_DRY_RUN)
# Kill switch, on a node or on the controller's namespace: "true" stops every power action.
POWER_MANAGEMENT_DISABLED_ANNOTATION = "power-aware-scheduler/power-management-disabled"
# cluster-autoscaler's opt-out, honoured too: a node with it set to "true" is never powered off.
SCALE_DOWN_DISABLED_ANNOTATION = "cluster-autoscaler.kubernetes.io/scale-down-disabled"

# ---- placement constraints and preferences -----------------------------------------------------

# Pod annotation: a deadline (RFC 3339 or a duration) up to which the pod may wait for cleaner
# power (the Carbon plugin's deferral).
DEFER_UNTIL_ANNOTATION = "power-aware-scheduler/defer-until"
# Pod label prefix of the edge seed's delay constraints: `delay_<from>: "<ms>"`.
DELAY_LABEL_PREFIX = "delay_"
# Node label of the edge seed's cloud nodes (value "cloud").
ROLE_LABEL = "kubernetes.io/role"
CLOUD_ROLE = "cloud"
# Node label naming the grid zone for carbon intensity (configurable in the Carbon plugin).
REGION_LABEL = "topology.kubernetes.io/region"
ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"

# ---- carbon intensity (the Carbon plugin) ------------------------------------------------------

# Node label naming the node's grid zone for carbon intensity explicitly; wins over the zone
# label the Carbon plugin is configured with (REGION_LABEL by default).
CARBON_ZONE_LABEL = "power-aware-scheduler/carbon-zone"
# Node annotation: the carbon intensity of the node's own supply in g/kWh (a node on its own
# solar), overriding its zone's. Without CARBON_INTENSITY_AT_ANNOTATION it is a standing
# declaration; with it (RFC 3339, written by whatever updates the value) it ages and expires.
CARBON_INTENSITY_ANNOTATION = "power-aware-scheduler/carbon-intensity-g-per-kwh"
CARBON_INTENSITY_AT_ANNOTATION = "power-aware-scheduler/carbon-intensity-at"
# Node annotation (RFC 3339): the Reward plugin forgets what the node taught it before this time
# (after a repair); outcomes dated earlier are ignored from then on.
REWARD_RESET_AT_ANNOTATION = "power-aware-scheduler/reward-reset-at"
# Every node's filter reason, when the Carbon plugin holds a deferrable pod for a cleaner
# window, starts with this; kube-scheduler copies it into the pod's PodScheduled condition
# message ("0/16 nodes are available: 16 power-aware-scheduler/carbon-hold: ..."). Tools that
# wake or add nodes for unschedulable pods match it to leave held pods alone
# (`livedata.deferral.is_carbon_hold`).
CARBON_HOLD_REASON = "power-aware-scheduler/carbon-hold"
