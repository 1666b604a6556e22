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
