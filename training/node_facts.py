"""What a cluster can tell about a node's hardware, and which server generation that makes it.

The shape prior (`training.shape_prior`) learns from servers of two periods whose power curves
differ (SPECpower_ssj2008 results of 2007-2016 and of 2017-2025: on the later ones idle is a
smaller share of peak and turbo makes the upper deciles steep). A node's telemetry rarely shows
its whole curve, so what the cluster knows about the hardware helps choose which servers it
should look like. These facts are optional columns of the metrics table (contract 1, see
`livedata.metrics_table.FACT_COLUMNS`), constant per node:

| column | unit | where it comes from |
| --- | --- | --- |
| `cpu_model` | text | node_exporter's `node_cpu_info{model_name}`, or NFD's labels (below) |
| `cpu_cores` | count | physical cores, all sockets (`node_cpu_info`: distinct package, core) |
| `cpu_sockets` | count | distinct `package` of `node_cpu_info` |
| `bmc_max_power_w` | watts | the highest input power the BMC has reported (a floor for full load) |
| `psu_rating_w` | watts | nameplate or power-supply rating (a ceiling for any load) |

Node Feature Discovery labels a node `feature.node.kubernetes.io/cpu-model.vendor_id`,
`.family` and `.id` (CPUID), not a name: `nfd_cpu_model` writes them `GenuineIntel family 6
model 143`, which `generation` reads as well.

`NodeFacts.from_rows` reads them from a node's rows (empty cells: unknown), `generation` tells
`old` or `modern` from the CPU model (None: cannot tell, and the prior then uses every server).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from livedata.metrics_table import (
    BMC_MAX_POWER_W,
    CPU_CORES,
    CPU_MODEL,
    CPU_SOCKETS,
    FACT_COLUMNS,
    PSU_RATING_W,
)

GENERATIONS = ("old", "modern")
# Words that do not tell one processor model from another (brands, tiers, filler).
_FILLER_WORDS = frozenset({"xeon", "cpu", "processor", "platinum", "gold", "silver", "bronze"})
# node_exporter reads the kernel's model name, which for EPYC ends in the core count
# (`AMD EPYC 7763 64-Core Processor`) where SPECpower's results do not.
_CORE_COUNT_WORD = re.compile(r"\d+-core")
# Intel family 6 model numbers (CPUID) of server parts from Skylake-SP (2017) on, and of the
# Xeon E-2100 and later workstation parts; lower numbers are Nehalem to Broadwell (2008-2016).
_INTEL_MODERN_FROM_MODEL = 85
_INTEL_OLD_MODELS_ABOVE = frozenset({94})  # Skylake client (Xeon E3 v5, 2015)
# AMD CPUID families: 0x10 and 0x15 are Opterons, 0x17 (Zen) and later EPYC.
_AMD_MODERN_FROM_FAMILY = 23
_CPUID = re.compile(r"(genuineintel|authenticamd)\s+family\s+(\d+)\s+model\s+(\d+)")
_MODERN_NAMES = re.compile(
    r"epyc|platinum|gold|silver|bronze|ampere|altra|neoverse|graviton|"
    r"xeon\s+(\d{4}[a-z]?\b|max|w-)|\be-2\d{3}|\bd-2\d{3}|\bd-1[5-9]\d{2}"
)
_OLD_NAMES = re.compile(
    r"opteron|\b[ex][357]-\d{4}|\b[elwx]\d{4}\b|\b[xelw]5\d{3}|core\s*2|pentium|"
    r"xeon\s+processor\s+\d{4}\b"  # the Xeon 3040 and 7020 of 2006
)


def processor_model(processor: str) -> str:
    """A processor name without brands, clock speeds or turbo notes, so that one model is one
    name: `Intel(R) Xeon(R) CPU E5472`, `Intel Xeon E5472 3.0 GHz (Turbo ...)` -> `intel e5472`;
    `Intel Xeon Platinum 8180 @2.50GHz` -> `intel 8180`; `2.6 GHz AMD Opteron 2435` ->
    `amd opteron 2435`; `AMD EPYC 7763 64-Core Processor` -> `amd epyc 7763`."""
    name = processor.lower().replace("(r)", "").replace("(tm)", "").replace("®", "")
    name = name.split("(")[0]
    name = re.sub(r"@?\s*[\d.]+\s*ghz", "", name)
    name = name.replace(",", " ").replace("@", " ")
    return " ".join(
        w for w in name.split() if w not in _FILLER_WORDS and not _CORE_COUNT_WORD.fullmatch(w)
    )


def generation(cpu_model: str | None) -> str | None:
    """`old` (servers up to 2016), `modern` (2017 on) or None, from a CPU model name as
    node_exporter reports it or a CPUID triple as Node Feature Discovery labels it."""
    if not cpu_model or not isinstance(cpu_model, str):
        return None
    name = cpu_model.lower().replace("(r)", "").replace("(tm)", "").replace("®", "")
    cpuid = _CPUID.search(name)
    if cpuid:
        vendor, family, model = cpuid.group(1), int(cpuid.group(2)), int(cpuid.group(3))
        if vendor == "authenticamd":
            return "modern" if family >= _AMD_MODERN_FROM_FAMILY else "old"
        if family != 6:
            return None
        modern = model >= _INTEL_MODERN_FROM_MODEL and model not in _INTEL_OLD_MODELS_ABOVE
        return "modern" if modern else "old"
    if _MODERN_NAMES.search(name):
        return "modern"
    if _OLD_NAMES.search(name):
        return "old"
    return None


def nfd_cpu_model(labels: Mapping[str, str]) -> str | None:
    """Node Feature Discovery's cpu-model labels -> `GenuineIntel family 6 model 143`."""
    prefix = "feature.node.kubernetes.io/cpu-model."
    vendor, family, model = (labels.get(prefix + key) for key in ("vendor_id", "family", "id"))
    if not (vendor and family and model):
        return None
    vendor = {"intel": "GenuineIntel", "amd": "AuthenticAMD"}.get(vendor.lower(), vendor)
    return f"{vendor} family {family} model {model}"


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


@dataclass(frozen=True)
class NodeFacts:
    """One node's hardware facts; None where the cluster did not tell."""

    cpu_model: str | None = None
    cpu_cores: float | None = None
    cpu_sockets: float | None = None
    bmc_max_power_w: float | None = None
    psu_rating_w: float | None = None

    @property
    def generation(self) -> str | None:
        return generation(self.cpu_model)

    @property
    def known(self) -> bool:
        return any(value is not None for value in self.__dict__.values())

    @classmethod
    def from_rows(cls, rows: pd.DataFrame) -> NodeFacts:
        """The facts of one node's rows: each column's last non-empty value (absent: None)."""
        values: dict[str, object] = {}
        for column in FACT_COLUMNS:
            if column in rows.columns:
                known = rows[column].dropna()
                values[column] = known.iloc[-1] if len(known) else None
        model = values.get(CPU_MODEL)
        return cls(
            cpu_model=(str(model).strip() or None) if model is not None else None,
            cpu_cores=_number(values.get(CPU_CORES)),
            cpu_sockets=_number(values.get(CPU_SOCKETS)),
            bmc_max_power_w=_number(values.get(BMC_MAX_POWER_W)),
            psu_rating_w=_number(values.get(PSU_RATING_W)),
        )

    def as_dict(self) -> dict[str, object]:
        """For reports: the known facts and the generation they make."""
        known = {k: v for k, v in self.__dict__.items() if v is not None}
        return {**known, "generation": self.generation} if known else {}
