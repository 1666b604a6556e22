"""Every bench preset, registered (import this module to fill `bench.sim.scenario.PRESETS`).

Contract 5 names the presets `default` (today's 16-node cluster), `multizone` (carbon),
`edge` (delay) and `faults` (rewards). A preset that needs a world of its own lives in its own
module under `bench/sim/` and registers itself there; this module imports each one.
"""

from __future__ import annotations

from bench.sim import faults as _faults  # noqa: F401  (the faults preset, power-aware+rewards)
from bench.sim.scenario import Preset, register_preset

DEFAULT = register_preset(
    Preset(
        name="default",
        description=(
            "16 heterogeneous nodes (SPECpower curves, 256 cores, a quarter on batteries and "
            "solar), a daily pattern with bursts, 45 % of the CPU requested; every node on"
        ),
        policies=("default", "random", "power-aware", "power-aware+battery", "oracle"),
    )
)
