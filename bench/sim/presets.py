"""Every bench preset, registered (import this module to fill `bench.sim.scenario.PRESETS`).

Contract 5 names the presets `default` (today's 16-node cluster), `multizone` (carbon),
`edge` (delay) and `faults` (rewards). A preset that needs a world of its own lives in its own
module under `bench/sim/` and registers itself there; this module imports each one.
"""

from __future__ import annotations

from bench.sim import faults as _faults  # noqa: F401  (the faults preset, power-aware+rewards)
from bench.sim import power_policies as _power_policies  # noqa: F401  (registers its policies)
from bench.sim.scenario import CORES, Preset, register_preset

DEFAULT = register_preset(
    Preset(
        name="default",
        description=(
            f"16 heterogeneous nodes (SPECpower curves of the --fleet's servers, {CORES} cores, "
            "a quarter on batteries and solar), a daily pattern with bursts, 45 % of the CPU "
            "requested; every node on, except under the policies with power management"
        ),
        policies=(
            "default",
            "random",
            "power-aware",
            "power-aware+battery",
            "oracle",
            "default+autoscaler",
            "power-aware+power-management",
        ),
    )
)

# Presets with a world of their own register themselves in their modules (one line each).
from bench.sim import carbon as _carbon  # noqa: E402, F401  (multizone, power-aware+carbon)
from bench.sim import edge as _edge  # noqa: E402, F401  (edge: sites, RTTs, delay limits)
