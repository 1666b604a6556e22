"""The pod trace every policy places: a generator with a daily pattern and bursts, or a CSV.

A trace is a table of pods, sorted by arrival:

    column          unit / form                         required
    name            text, unique                        no (pod-000001, ... by row)
    arrival_s       seconds since the simulation start  yes, >= 0
    cpu_request     cores or a Kubernetes quantity      yes, > 0 ("0.5", "500m", "2")
    duration_s      seconds of work at full speed       yes, > 0
    memory_mib      MiB requested                       no (0 = none: 200 MiB for scoring)
    usage_ratio     CPU used / CPU requested            no (1.0); > 1 for burstable pods
    owner           the pod's Deployment/ReplicaSet     no (empty: none, as a Job or bare pod)

`duration_s` is work, not wall time: on an overcommitted node (pods using more CPU than it
has) every pod there runs slower and finishes later, which the simulator reports as slowdown.

The generator draws arrivals as a Poisson process whose rate follows a daily cosine (peak
in the afternoon) plus a few bursts, with request sizes from a discrete menu and log-normal
durations, and sets the mean rate by Little's law so that the mean requested CPU is
`load` x the cluster's allocatable CPU.

Most pods in a real cluster are replicas owned by a Deployment's ReplicaSet, and
kube-scheduler spreads those by default (`bench.sim.kube_default`). The generator gives
`OWNED_SHARE` of the pods an owner: one of `DEPLOYMENTS_PER_SIZE` Deployments of the pod's
request size (replicas of one Deployment request the same), the first ones more popular
(weights 1, 1/2, 1/3, ...); the rest are Jobs or bare pods, which are not spread. Both are
assumptions, not measured figures. Owners are drawn from their own random stream, so the
arrivals, sizes and durations of a seed are the same with and without them.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from livedata.pod_resources import parse_cpu_quantity

REQUIRED_COLUMNS = ("arrival_s", "cpu_request", "duration_s")
OPTIONAL_COLUMNS = ("name", "memory_mib", "usage_ratio", "owner")
MIB = 1024 * 1024

# Request menu (cores) and how often each size appears: mostly small services, a few big jobs.
CPU_MENU_CORES = np.array([0.1, 0.25, 0.5, 1.0, 2.0, 4.0])
CPU_MENU_WEIGHTS = np.array([0.15, 0.2, 0.25, 0.2, 0.12, 0.08])
DURATION_MEDIAN_S = 600.0
DURATION_SIGMA = 1.0  # log-normal: mean = median * exp(sigma^2 / 2) ~ 1.65 x median
DURATION_MAX_S = 4 * 3600.0
PEAK_HOUR = 14.0
BURSTS_PER_DAY = 6
BURST_RATE_FACTOR = 3.0
BURST_DURATION_S = (300.0, 900.0)
OWNED_SHARE = 0.8  # pods owned by a Deployment's ReplicaSet (the rest: Jobs, bare pods)
DEPLOYMENTS_PER_SIZE = 4
NO_OWNER = -1


class TraceError(ValueError):
    """A trace file that cannot be used; the message names the file, line and field."""


@dataclass(frozen=True)
class Trace:
    """Pods in arrival order; every array has one entry per pod."""

    names: list[str]
    arrival_s: np.ndarray
    cpu_m: np.ndarray  # int64 millicores requested
    memory_bytes: np.ndarray  # int64 bytes requested (0 = none)
    duration_s: np.ndarray  # work at full speed
    usage_ratio: np.ndarray  # CPU actually used / requested
    # Seconds each pod may wait for a node before it counts as unplaced (None: the simulator's
    # max_pending_s for every pod); deferrable pods wait longer.
    max_wait_s: np.ndarray | None = None
    # Owner (Deployment/ReplicaSet) index per pod, NO_OWNER for none; None: no pod has one.
    owner: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.names)

    @property
    def owners(self) -> np.ndarray:
        """The owner index of every pod (NO_OWNER where none)."""
        if self.owner is None:
            return np.full(len(self.names), NO_OWNER, dtype=np.int64)
        return self.owner

    @property
    def end_s(self) -> float:
        return float(self.arrival_s.max()) if len(self) else 0.0


def _sorted_trace(
    names: list[str],
    arrival_s: np.ndarray,
    cpu_m: np.ndarray,
    memory_bytes: np.ndarray,
    duration_s: np.ndarray,
    usage_ratio: np.ndarray,
    owner: np.ndarray | None = None,
) -> Trace:
    order = np.argsort(arrival_s, kind="stable")
    return Trace(
        names=[names[i] for i in order],
        arrival_s=arrival_s[order],
        cpu_m=cpu_m[order].astype(np.int64),
        memory_bytes=memory_bytes[order].astype(np.int64),
        duration_s=duration_s[order],
        usage_ratio=usage_ratio[order],
        owner=None if owner is None else owner[order].astype(np.int64),
    )


def generate_trace(
    total_cpu_cores: float,
    hours: float,
    load: float,
    seed: int,
    *,
    daily_amplitude: float = 0.33,
    usage_ratio_range: tuple[float, float] = (0.5, 1.1),
    burst_starts_s: tuple[float, ...] | None = None,
) -> Trace:
    """A synthetic trace whose requested CPU averages `load` x `total_cpu_cores`.

    The rate swings by +- `daily_amplitude` around its mean over the day (0.33 with load 0.45
    gives ~30 % at night and ~60 % in the afternoon), plus `BURSTS_PER_DAY` bursts at 3x, at
    random times or, with `burst_starts_s`, at those (each lasting the middle of
    `BURST_DURATION_S`; the random stream is drawn as without them).
    """
    if not 0 < load < 1:
        raise ValueError(f"load must be between 0 and 1, got {load}")
    rng = np.random.default_rng([seed, 2])
    mean_cpu = float(CPU_MENU_CORES @ (CPU_MENU_WEIGHTS / CPU_MENU_WEIGHTS.sum()))
    mean_duration_s = DURATION_MEDIAN_S * math.exp(DURATION_SIGMA**2 / 2)
    # Little's law: pods in the system = rate x mean time in system.
    mean_rate_per_s = load * total_cpu_cores / (mean_cpu * mean_duration_s)

    horizon_s = hours * 3600.0
    n_bursts = rng.poisson(BURSTS_PER_DAY * hours / 24.0)
    burst_start_s = rng.uniform(0.0, horizon_s, n_bursts)
    burst_end_s = burst_start_s + rng.uniform(*BURST_DURATION_S, n_bursts)
    if burst_starts_s is not None:
        burst_start_s = np.asarray(burst_starts_s, dtype=float)
        burst_end_s = burst_start_s + sum(BURST_DURATION_S) / 2.0

    def rate_per_s(t_s: np.ndarray) -> np.ndarray:
        hour = (t_s / 3600.0) % 24.0
        daily = 1.0 + daily_amplitude * np.cos(2 * np.pi * (hour - PEAK_HOUR) / 24.0)
        in_burst = ((t_s[:, None] >= burst_start_s) & (t_s[:, None] < burst_end_s)).any(axis=1)
        return mean_rate_per_s * daily * np.where(in_burst, BURST_RATE_FACTOR, 1.0)

    # Thinning (Lewis-Shedler): candidates at the maximal rate, each kept with rate(t)/max.
    max_rate = mean_rate_per_s * (1.0 + daily_amplitude) * BURST_RATE_FACTOR
    n_candidates = rng.poisson(max_rate * horizon_s)
    candidates_s = np.sort(rng.uniform(0.0, horizon_s, n_candidates))
    kept = rng.random(n_candidates) < rate_per_s(candidates_s) / max_rate
    arrival_s = candidates_s[kept]
    n_pods = arrival_s.size

    cpu_cores = rng.choice(CPU_MENU_CORES, n_pods, p=CPU_MENU_WEIGHTS / CPU_MENU_WEIGHTS.sum())
    memory_mib = np.round(cpu_cores * rng.uniform(512.0, 4096.0, n_pods))
    duration_s = np.minimum(
        rng.lognormal(math.log(DURATION_MEDIAN_S), DURATION_SIGMA, n_pods), DURATION_MAX_S
    )
    usage_ratio = rng.uniform(*usage_ratio_range, n_pods)
    names = [f"pod-{i:06d}" for i in range(1, n_pods + 1)]
    return _sorted_trace(
        names,
        arrival_s,
        np.round(cpu_cores * 1000.0),
        memory_mib * MIB,
        duration_s,
        usage_ratio,
        deployment_owners(cpu_cores, seed),
    )


def deployment_owners(cpu_cores: np.ndarray, seed: int) -> np.ndarray:
    """An owner per pod (see the module docstring): a Deployment of its size, or NO_OWNER.

    Owner index = size index x DEPLOYMENTS_PER_SIZE + the Deployment's rank within its size.
    """
    rng = np.random.default_rng([seed, 7])
    size_index = np.searchsorted(CPU_MENU_CORES, cpu_cores)
    popularity = 1.0 / np.arange(1, DEPLOYMENTS_PER_SIZE + 1)
    rank = rng.choice(DEPLOYMENTS_PER_SIZE, cpu_cores.size, p=popularity / popularity.sum())
    owned = rng.random(cpu_cores.size) < OWNED_SHARE
    return np.where(owned, size_index * DEPLOYMENTS_PER_SIZE + rank, NO_OWNER).astype(np.int64)


def load_trace_csv(path: Path) -> Trace:
    """Read a trace CSV (columns in the module docstring); TraceError names file, line, field."""
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror}") from exc
    with handle:
        reader = csv.DictReader(handle)
        header = [name.strip() for name in reader.fieldnames or []]
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise TraceError(
                f"{path}, line 1: missing column(s) {', '.join(missing)} "
                f"(need {', '.join(REQUIRED_COLUMNS)}; optional {', '.join(OPTIONAL_COLUMNS)})"
            )
        reader.fieldnames = header
        names: list[str] = []
        rows: list[tuple[float, float, float, float, float]] = []
        owners: list[int] = []
        owner_index: dict[str, int] = {}  # owner name -> index, in order of appearance
        seen: dict[str, int] = {}
        for row in reader:
            line = reader.line_num
            rows.append(_parse_row(row, path, line))
            name = (row.get("name") or "").strip() or f"pod-{len(rows):06d}"
            if name in seen:
                raise TraceError(
                    f"{path}, line {line}, field name: pod {name!r} already on line {seen[name]}"
                )
            seen[name] = line
            names.append(name)
            owner = (row.get("owner") or "").strip()
            owners.append(owner_index.setdefault(owner, len(owner_index)) if owner else NO_OWNER)
    if not rows:
        raise TraceError(f"{path}: no pods (only a header)")
    table = np.array(rows, dtype=np.float64)
    return _sorted_trace(
        names,
        table[:, 0],
        table[:, 1],
        table[:, 3],
        table[:, 2],
        table[:, 4],
        np.array(owners, dtype=np.int64) if owner_index else None,
    )


def _parse_row(row: dict, path: Path, line: int) -> tuple[float, float, float, float, float]:
    def fail(field: str, problem: str) -> TraceError:
        return TraceError(f"{path}, line {line}, field {field}: {problem}")

    def number(field: str, default: float | None, minimum: float, inclusive: bool) -> float:
        raw = (row.get(field) or "").strip()
        if not raw:
            if default is None:
                raise fail(field, "empty (required)")
            return default
        try:
            value = float(raw)
        except ValueError:
            raise fail(field, f"{raw!r} is not a number") from None
        too_small = value < minimum if inclusive else value <= minimum
        if not math.isfinite(value) or too_small:
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise fail(field, f"{raw!r} must be a finite number {bound}")
        return value

    arrival_s = number("arrival_s", None, 0.0, inclusive=True)
    raw_cpu = (row.get("cpu_request") or "").strip()
    if not raw_cpu:
        raise fail("cpu_request", "empty (required)")
    try:
        cpu_cores = parse_cpu_quantity(raw_cpu)
    except ValueError:
        raise fail(
            "cpu_request", f"{raw_cpu!r} is not a CPU quantity (cores or e.g. 500m)"
        ) from None
    if cpu_cores <= 0:
        raise fail("cpu_request", f"{raw_cpu!r} must be more than 0")
    duration_s = number("duration_s", None, 0.0, inclusive=False)
    memory_mib = number("memory_mib", 0.0, 0.0, inclusive=True)
    usage_ratio = number("usage_ratio", 1.0, 0.0, inclusive=True)
    return arrival_s, round(cpu_cores * 1000.0), duration_s, round(memory_mib * MIB), usage_ratio
