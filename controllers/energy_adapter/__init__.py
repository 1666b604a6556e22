"""Energy adapter: each node's stored energy (Prometheus) -> its `energy-status` label.

The extender scores nodes by the label `energy-status` (contract 4, bands in
`livedata.labels`): `well-powered` (75-100 % stored energy), `vulnerable` (40-75),
`low-powered` (15-40), `powerless` (0-15); powerless nodes fail the filter. This process keeps
that label true. Every `--interval` it reads each node's battery level from Prometheus
(node_exporter's `node_power_supply_capacity` by default), maps it to a level and patches the
node only when the label must change.

A battery hovering at a boundary would make the label flap with every reading, and with it the
placement of new pods and the offloading of running ones. So a node leaves its level only when
the reading has moved past the level's boundary by the hysteresis margin: with 3 % a
`vulnerable` node stays so from 37 % up to (not including) 78 %.

The label is the adapter's memory: each pass reads the current labels from the API, so a
restart (or a second replica) neither forgets a level nor repeats a patch.

Offloading: a `powerless` node also gets the taint `power-aware-scheduler/powerless:NoSchedule`
(removed when it recovers). New pods of every scheduler stay off it, and the Kubernetes
descheduler's RemovePodsViolatingNodeTaints moves running pods that do not tolerate it away
through the Eviction API (manifests/base/descheduler.yaml, docs/operations.md). The adapter never
evicts or deletes anything itself.

The package, in the order a pass runs:

- `readings`: Prometheus instant query -> stored-energy percent per node;
- `policy` (pure): levels with hysteresis, the taint, the merge patch for a node;
- `adapter`: one pass (read, decide, patch), the loop, health state;
- `metrics` and `health`: the process's Prometheus metrics and its /healthz /readyz /metrics;
- `cli` (`python -m controllers.energy_adapter`): flags -> settings -> passes.

The names below are the package's API (what the tests and an embedding program use).
"""

from controllers.energy_adapter.adapter import (
    AdapterSettings,
    EnergyAdapter,
    LabelChange,
    PassResult,
    one_line_error,
)
from controllers.energy_adapter.cli import build_parser, main, settings_from_args
from controllers.energy_adapter.health import serve_health
from controllers.energy_adapter.metrics import AdapterMetrics
from controllers.energy_adapter.policy import (
    DEFAULT_HYSTERESIS_PCT,
    MAX_HYSTERESIS_PCT,
    MERGE_PATCH,
    POWERLESS_TAINT_EFFECT,
    POWERLESS_TAINT_KEY,
    NodeEnergy,
    level_for,
    next_level,
    plan_node_patch,
)
from controllers.energy_adapter.readings import (
    DEFAULT_QUERY,
    BatteryReadings,
    battery_by_node,
    read_batteries,
)

# What a pass raises when Prometheus fails (besides the API's ApiException and OSError).
from livedata.prometheus import CollectError

__all__ = [
    "DEFAULT_HYSTERESIS_PCT",
    "DEFAULT_QUERY",
    "MAX_HYSTERESIS_PCT",
    "MERGE_PATCH",
    "POWERLESS_TAINT_EFFECT",
    "POWERLESS_TAINT_KEY",
    "AdapterMetrics",
    "AdapterSettings",
    "BatteryReadings",
    "CollectError",
    "EnergyAdapter",
    "LabelChange",
    "NodeEnergy",
    "PassResult",
    "battery_by_node",
    "build_parser",
    "level_for",
    "main",
    "next_level",
    "one_line_error",
    "plan_node_patch",
    "read_batteries",
    "serve_health",
    "settings_from_args",
]
