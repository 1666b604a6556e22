"""Contract 1: the collected-metrics table (the input of training), its column names defined once.

One row per node per sample:

| column | unit | meaning |
| --- | --- | --- |
| `node` | string | Kubernetes node name |
| `timestamp` | RFC 3339 or Unix seconds | sample time |
| `cpu_util` | fraction 0..1 | node CPU busy share (1 - idle), all cores |
| `ambient_temp_c` | degrees C | inlet/ambient temperature from the BMC |
| `cpu1_temp_c` | degrees C | CPU socket 1 temperature from the BMC |
| `cpu2_temp_c` | degrees C | CPU socket 2 temperature; may be empty on one-socket nodes |
| `power_w` | watts | node input power (IPMI DCMI reading) |

Optional node facts, constant per node, may follow (`FACT_COLUMNS`; a table without them, or
with empty cells, still trains; what each is and where it comes from: `training.node_facts`):

| column | unit | meaning |
| --- | --- | --- |
| `cpu_model` | text | CPU model name (node_exporter `node_cpu_info`, or NFD's labels) |
| `cpu_cores` | count | physical cores, all sockets |
| `cpu_sockets` | count | CPU sockets |
| `bmc_max_power_w` | watts | highest input power the BMC has reported |
| `psu_rating_w` | watts | nameplate or power-supply rating |

Training reads and writes these tables, the collector builds them from Prometheus, the
extender's telemetry carries the same names per node, and a model bundle lists `FEATURES` as
its inputs: all of them spell the names through this module, so they cannot drift apart.
Plain names only, no pandas: the extender imports this.
"""

from __future__ import annotations

NODE = "node"
TIMESTAMP = "timestamp"
CPU_UTIL = "cpu_util"  # also the feature a power curve P(u) runs along
AMBIENT_TEMP_C = "ambient_temp_c"
CPU1_TEMP_C = "cpu1_temp_c"
CPU2_TEMP_C = "cpu2_temp_c"
POWER_W = "power_w"

CONTRACT_COLUMNS: tuple[str, ...] = (
    NODE,
    TIMESTAMP,
    CPU_UTIL,
    AMBIENT_TEMP_C,
    CPU1_TEMP_C,
    CPU2_TEMP_C,
    POWER_W,
)
# The model inputs, in the order a bundle's `features` lists them by default.
FEATURES: tuple[str, ...] = (CPU_UTIL, AMBIENT_TEMP_C, CPU1_TEMP_C, CPU2_TEMP_C)
# What a sample measures: every column but `node` and `timestamp`.
VALUE_COLUMNS: tuple[str, ...] = (*FEATURES, POWER_W)
TEMPERATURE_COLUMNS: tuple[str, ...] = (AMBIENT_TEMP_C, CPU1_TEMP_C, CPU2_TEMP_C)
CPU_TEMPERATURE_COLUMNS: tuple[str, ...] = (CPU1_TEMP_C, CPU2_TEMP_C)
OPTIONAL_COLUMNS: tuple[str, ...] = (CPU2_TEMP_C,)  # empty on one-socket nodes

# Optional node facts (see the module docstring): the shape prior's hints about the hardware.
CPU_MODEL = "cpu_model"
CPU_CORES = "cpu_cores"
CPU_SOCKETS = "cpu_sockets"
BMC_MAX_POWER_W = "bmc_max_power_w"
PSU_RATING_W = "psu_rating_w"
FACT_COLUMNS: tuple[str, ...] = (CPU_MODEL, CPU_CORES, CPU_SOCKETS, BMC_MAX_POWER_W, PSU_RATING_W)
NUMERIC_FACT_COLUMNS: tuple[str, ...] = FACT_COLUMNS[1:]
