"""Read, validate and clean a contract-1 metrics table (the input of `training.fit`).

Work in progress: the contract's column names live here so every module shares one copy.
"""

from __future__ import annotations

CONTRACT_COLUMNS: tuple[str, ...] = (
    "node",
    "timestamp",
    "cpu_util",
    "ambient_temp_c",
    "cpu1_temp_c",
    "cpu2_temp_c",
    "power_w",
)
FEATURES: tuple[str, ...] = ("cpu_util", "ambient_temp_c", "cpu1_temp_c", "cpu2_temp_c")


class MetricsInputError(ValueError):
    """Bad metrics input; the message names the file, line and field at fault."""
