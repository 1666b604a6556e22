"""Synthetic heterogeneous fleet in contract-1 form (`python -m training.synth`).

Training, the benchmarks and the shipped default bundle need a fleet's worth of metrics that
behaves like real BMC telemetry, without a cluster. This module owns that: it turns a seed into
a table with the contract-1 columns (see `livedata.metrics_table.CONTRACT_COLUMNS`).

What makes it look real, and why each part is there:

- Power curves are real server curves: every node draws one of the SPECpower_ssj2008 results
  condensed in `training/data/specpower_shapes.csv` (2007-2016) and
  `specpower_modern_shapes.csv` (2017-2025) (the command line draws from both, code from the
  periods it asks for, `FLEET_PERIODS` by default), then a scale and small perturbations of its idle
  share and curvature, so the fleet is heterogeneous the way data centres are. Each row also
  carries the node's hardware facts (contract 1's optional columns, `training.node_facts`):
  the processor and core count of the server its curve comes from, its sockets, the highest
  power its BMC reported in the period, and a power-supply rating sized above its peak.
- Utilisation, by default (`--sampling even`), has a daily pattern, slow drift, bursts and idle
  periods, so the whole 0..1 range is visited. Real fleets are often less kind, and models must
  cope: `levels` holds load at 0, 20, ..., 100 % for hours with nothing between, `mostly-idle`
  idles for hours with short peaks, `lowload` never goes above 50 % (`SAMPLINGS`).
- CPU temperatures follow load and a daily ambient cycle through a first-order thermal lag, and
  fans and leakage add a fraction of a watt per degree above ~50 C. With `--temperature tight`
  (default) CPU temperature follows load closely, as on most servers, so it is nearly collinear
  with utilisation; `loose` has slower heat sinks and a slow wander that load does not explain.
- BMC artefacts: ~1-2 W measurement noise, readings quantised to whole watts or 5 W steps,
  ~1-2 % of samples missing, short sensor dropouts (empty temperatures), and one-socket nodes
  whose `cpu2_temp_c` is always empty.

Everything is vectorised over nodes and time and deterministic for a seed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from livedata.metrics_table import (
    AMBIENT_TEMP_C,
    BMC_MAX_POWER_W,
    CONTRACT_COLUMNS,
    CPU1_TEMP_C,
    CPU2_TEMP_C,
    CPU_CORES,
    CPU_MODEL,
    CPU_SOCKETS,
    CPU_UTIL,
    FACT_COLUMNS,
    NODE,
    POWER_W,
    PSU_RATING_W,
    TIMESTAMP,
)
from training.dataset import write_metrics
from training.shape_prior import SHAPES_FILES, SHARE_COLUMNS, load_shapes_table

log = logging.getLogger("training.synth")

START = pd.Timestamp("2026-01-05T00:00:00Z")  # a Monday; fixed so output depends on the seed only

AMBIENT_MEAN_C = 22.5
AMBIENT_DAILY_SWING_C = 4.5  # mean +- swing: 18..27 C before the per-node offset
AMBIENT_PEAK_HOUR = 15.0
FAN_THRESHOLD_C = 50.0  # fans and leakage start adding power above this CPU temperature
# How load spreads over time (`--sampling`): `even` visits the whole range (a daily pattern,
# drift, bursts, idle periods); `levels` holds 0, 20, ..., 100 % for hours at a time;
# `mostly-idle` idles for hours with short peaks; `lowload` never goes above 50 %.
SAMPLINGS = ("even", "levels", "mostly-idle", "lowload")
HELD_LEVELS = np.linspace(0.0, 1.0, 6)
# How closely CPU temperature follows load (`--temperature`): `tight` (heat sinks settle in
# 1-4 min) or `loose` (5-15 min, plus a slow wander of a few degrees that load does not explain).
TEMPERATURE_MODES = ("tight", "loose")
ABSURD_STEP_COUNT = 50_000_000  # refuse sizes that would not fit in memory anyway


# Which SPECpower samples a fleet draws its servers from (`training.shape_prior.SHAPES_FILES`):
# in code, by default the 2007-2016 servers, of which the benchmarks measured on a synthetic
# cluster (`bench.energy_sim`) build theirs, so a seed's cluster stays what they measured; the
# command line draws from both (`--periods`).
FLEET_PERIODS: tuple[str, ...] = ("old",)
ALL_PERIODS: tuple[str, ...] = tuple(SHAPES_FILES)


def load_shapes(periods: tuple[str, ...] = FLEET_PERIODS) -> pd.DataFrame:
    """The embedded SPECpower curve shapes of `periods` (one row per real server: 116 of
    2007-2016 for `old`, 126 of 2017-2025 for `modern`)."""
    return load_shapes_table(periods)


@dataclass(frozen=True)
class FleetSpec:
    """Per-node parameters of a synthetic fleet; every array has one entry per node."""

    names: list[str]
    shape_result: np.ndarray  # SPEC result id the node's curve comes from
    curve_share: np.ndarray  # [n, 11] power / max power at 0, 10, ..., 100 % load
    curvature_exp: np.ndarray  # load is warped as u ** exp before the curve lookup
    max_power_w: np.ndarray
    sockets: np.ndarray
    ambient_offset_c: np.ndarray
    idle_rise_c: np.ndarray  # CPU above ambient at idle
    load_rise_c: np.ndarray  # extra CPU rise at full load
    cpu2_offset_c: np.ndarray
    thermal_tau_s: np.ndarray
    fan_w_per_c: np.ndarray
    noise_w: np.ndarray
    quantum_w: np.ndarray  # BMC reading step: 1 W or 5 W
    missing_share: np.ndarray  # share of samples never delivered
    # Hardware facts the fleet reports (contract 1's optional columns); None: not reported
    cpu_model: np.ndarray | None = None  # the processor as SPEC names it
    cores: np.ndarray | None = None
    psu_rating_w: np.ndarray | None = None

    @property
    def idle_share(self) -> np.ndarray:
        return self.curve_share[:, 0]


def node_names(n_nodes: int) -> list[str]:
    """`node-01` .. `node-NN`, zero-padded to the width of n (at least two digits)."""
    width = max(2, len(str(n_nodes)))
    return [f"node-{i:0{width}d}" for i in range(1, n_nodes + 1)]


def fleet_spec(
    n_nodes: int,
    seed: int,
    shapes: pd.DataFrame | None = None,
    periods: tuple[str, ...] = FLEET_PERIODS,
) -> FleetSpec:
    """Draw the per-node parameters (curves from `shapes`, else from the servers of
    `periods`); the same seed always gives the same fleet."""
    if n_nodes < 1:
        raise ValueError(f"n_nodes must be at least 1, got {n_nodes}")
    shapes = load_shapes(periods) if shapes is None else shapes
    rng = np.random.default_rng([seed, 0])
    pick = rng.integers(0, len(shapes), n_nodes)
    base = shapes[list(SHARE_COLUMNS)].to_numpy(dtype=float)[pick]
    sample_idle = shapes["share_000"].to_numpy(dtype=float)

    # Move the idle share by up to +-10 %, kept inside what real servers show, and rescale the
    # dynamic part so the curve still ends at 1 and stays increasing.
    old_idle = base[:, :1]
    new_idle = np.clip(
        old_idle * rng.uniform(0.9, 1.1, (n_nodes, 1)), sample_idle.min(), sample_idle.max()
    )
    curve = new_idle + (base - old_idle) * (1.0 - new_idle) / (1.0 - old_idle)

    max_power_w = shapes["watts_max"].to_numpy(dtype=float)[pick] * rng.uniform(0.85, 1.15, n_nodes)
    five_watt_steps = _five_watt_steps(rng, max_power_w)
    return FleetSpec(
        names=node_names(n_nodes),
        shape_result=shapes["result"].to_numpy()[pick],
        curve_share=curve,
        curvature_exp=rng.uniform(0.85, 1.15, n_nodes),
        max_power_w=max_power_w,
        sockets=shapes["chips"].to_numpy(dtype=int)[pick],
        **_node_physics(rng, n_nodes, five_watt_steps),
        **_hardware_facts(shapes, pick, max_power_w, np.random.default_rng([seed, 4])),
    )


def servers_spec(shapes: pd.DataFrame, seed: int, names: list[str] | None = None) -> FleetSpec:
    """One node per row of `shapes` (the shipped table's columns), its curve exactly as measured.

    No warping or rescaling of the curves, unlike `fleet_spec`: benchmarks that judge a model
    against the measured points use this. Thermal and BMC parameters are drawn as for a fleet.
    """
    rng = np.random.default_rng([seed, 0])
    n_nodes = len(shapes)
    max_power_w = shapes["watts_max"].to_numpy(dtype=float)
    return FleetSpec(
        names=list(names) if names is not None else node_names(n_nodes),
        shape_result=shapes["result"].to_numpy(),
        curve_share=shapes[list(SHARE_COLUMNS)].to_numpy(dtype=float),
        curvature_exp=np.ones(n_nodes),
        max_power_w=max_power_w,
        sockets=shapes["chips"].to_numpy(dtype=int),
        **_node_physics(rng, n_nodes, _five_watt_steps(rng, max_power_w)),
        **_hardware_facts(
            shapes, np.arange(n_nodes), max_power_w, np.random.default_rng([seed, 4])
        ),
    )


# Power-supply ratings servers ship with (watts); a node's is the smallest of these at least
# 1.2-2.5 times its full-load power (vendors size for redundancy and options).
PSU_RATINGS_W = (300, 450, 550, 750, 800, 1100, 1400, 1600, 2000, 2400, 2700, 3200)


def _hardware_facts(
    shapes: pd.DataFrame, pick: np.ndarray, max_power_w: np.ndarray, rng: np.random.Generator
) -> dict[str, np.ndarray | None]:
    """What the fleet reports about each node's hardware: the processor and core count of the
    server its curve comes from (when the table names them), and a power-supply rating."""
    headroom_w = max_power_w * rng.uniform(1.2, 2.5, len(max_power_w))
    ratings = np.array(PSU_RATINGS_W, dtype=float)
    at = np.minimum(np.searchsorted(ratings, headroom_w), len(ratings) - 1)
    return {
        "cpu_model": shapes["processor"].to_numpy(dtype=object)[pick]
        if "processor" in shapes.columns
        else None,
        "cores": shapes["cores"].to_numpy(dtype=float)[pick] if "cores" in shapes.columns else None,
        "psu_rating_w": np.maximum(ratings[at], np.ceil(max_power_w)),
    }


def _five_watt_steps(rng: np.random.Generator, max_power_w: np.ndarray) -> np.ndarray:
    # Small servers read in whole watts: 5 W steps on a 60 W box would swamp the signal.
    return (rng.random(len(max_power_w)) < 0.4) & (max_power_w > 200.0)


def _node_physics(
    rng: np.random.Generator, n_nodes: int, five_watt_steps: np.ndarray
) -> dict[str, np.ndarray]:
    """Thermal, fan and BMC parameters per node (drawn in a fixed order: seeds stay stable)."""
    return {
        "ambient_offset_c": rng.normal(0.0, 1.5, n_nodes),
        "idle_rise_c": rng.uniform(10.0, 20.0, n_nodes),
        "load_rise_c": rng.uniform(28.0, 45.0, n_nodes),
        "cpu2_offset_c": rng.uniform(-3.0, 3.0, n_nodes),
        "thermal_tau_s": rng.uniform(60.0, 240.0, n_nodes),
        "fan_w_per_c": rng.uniform(0.2, 0.6, n_nodes),
        "noise_w": rng.uniform(1.0, 2.0, n_nodes),
        "quantum_w": np.where(five_watt_steps, 5.0, 1.0),
        "missing_share": rng.uniform(0.01, 0.02, n_nodes),
    }


def first_order_lag(
    target: np.ndarray, alpha: np.ndarray, start: np.ndarray, block: int = 64
) -> np.ndarray:
    """y[k] = y[k-1] + alpha * (target[k] - y[k-1]) per row, with y[-1] = start.

    A Python loop over time would cost seconds for long series; instead each block of steps is
    one matrix product with the filter's (lower-triangular) impulse response, so the cost is
    about `n_steps / block` numpy calls whatever the length.
    """
    n_steps = target.shape[1]
    decay = (1.0 - alpha)[:, None, None]  # [n, 1, 1]
    lags = np.arange(block)
    exponent = lags[:, None] - lags[None, :]  # i - j
    kernel = np.where(exponent >= 0, decay ** np.maximum(exponent, 0), 0.0) * alpha[:, None, None]
    carry = decay[:, :, 0] ** (lags[None, :] + 1)  # [n, block]: weight of the previous value
    out = np.empty_like(target, dtype=float)
    previous = np.asarray(start, dtype=float)
    for begin in range(0, n_steps, block):
        chunk = target[:, begin : begin + block]
        width = chunk.shape[1]
        values = np.einsum("nij,nj->ni", kernel[:, :width, :width], chunk)
        values += carry[:, :width] * previous[:, None]
        out[:, begin : begin + width] = values
        previous = values[:, -1]
    return out


def event_runs(
    rng: np.random.Generator,
    shape: tuple[int, int],
    events_per_step: float,
    min_steps: int,
    max_steps: int,
    heights: tuple[float, float] = (1.0, 1.0),
) -> np.ndarray:
    """Sum of random rectangular events (bursts, idle periods, dropouts) on a [n, T] grid.

    Starts are Poisson in time; each event lasts `min_steps..max_steps` steps and adds a height
    drawn from `heights`. Built as a difference array, so it costs O(n * T) whatever the count.
    """
    n_rows, n_steps = shape
    counts = rng.poisson(events_per_step * n_steps, n_rows)
    rows = np.repeat(np.arange(n_rows), counts)
    starts = rng.integers(0, n_steps, rows.size)
    ends = np.minimum(starts + rng.integers(min_steps, max_steps + 1, rows.size), n_steps)
    height = rng.uniform(heights[0], heights[1], rows.size)
    steps = np.zeros((n_rows, n_steps + 1))
    np.add.at(steps, (rows, starts), height)
    np.add.at(steps, (rows, ends), -height)
    return np.cumsum(steps[:, :-1], axis=1)


def _utilisation(
    rng: np.random.Generator, n_nodes: int, hour_of_day: np.ndarray, step_s: float
) -> np.ndarray:
    """Daily pattern + slow drift + bursts, with idle periods; clipped to 0..1."""
    steps_per_hour = 3600.0 / step_s
    n_steps = hour_of_day.size
    base = rng.uniform(0.03, 0.30, (n_nodes, 1))
    daily_amplitude = rng.uniform(0.15, 0.55, (n_nodes, 1))
    peak_hour = rng.uniform(11.0, 17.0, (n_nodes, 1))
    daily = 0.5 + 0.5 * np.cos(2 * np.pi * (hour_of_day[None, :] - peak_hour) / 24.0)

    drift_tau_s = rng.uniform(600.0, 1800.0, n_nodes)
    drift_alpha = 1.0 - np.exp(-step_s / drift_tau_s)
    white = rng.normal(0.0, 1.0, (n_nodes, n_steps))
    # Scale so the drift has a standard deviation of ~0.08 whatever the time constant.
    drift = first_order_lag(white, drift_alpha, np.zeros(n_nodes))
    drift *= 0.08 / np.sqrt(drift_alpha / (2.0 - drift_alpha))[:, None]

    bursts = event_runs(
        rng,
        (n_nodes, n_steps),
        events_per_step=1.0 / (3.0 * steps_per_hour),
        min_steps=max(1, round(5 * 60 / step_s)),
        max_steps=max(1, round(60 * 60 / step_s)),
        heights=(0.3, 0.9),
    )
    util = np.clip(base + daily_amplitude * daily + drift + bursts, 0.0, 1.0)

    idle = event_runs(
        rng,
        (n_nodes, n_steps),
        events_per_step=1.0 / (12.0 * steps_per_hour),
        min_steps=max(1, round(30 * 60 / step_s)),
        max_steps=max(1, round(180 * 60 / step_s)),
    )
    idle_load = rng.uniform(0.0, 0.03, (n_nodes, n_steps))
    return np.where(idle > 0, idle_load, util)


def sampled_utilisation(
    sampling: str,
    rng: np.random.Generator,
    n_nodes: int,
    hour_of_day: np.ndarray,
    step_s: float,
) -> np.ndarray:
    """[n_nodes, T] utilisation in one of the `SAMPLINGS` (see the module docstring)."""
    n_steps = hour_of_day.size
    if sampling == "even":
        return _utilisation(rng, n_nodes, hour_of_day, step_s)
    if sampling == "lowload":
        # the same daily pattern, bursts and idle periods, on a fleet sized for twice its load
        return 0.5 * _utilisation(rng, n_nodes, hour_of_day, step_s)
    steps_per_hour = 3600.0 / step_s
    util = np.empty((n_nodes, n_steps))
    for node in range(n_nodes):
        if sampling == "levels":
            util[node] = _held_levels(rng, n_steps, steps_per_hour)
        elif sampling == "mostly-idle":
            util[node] = _idle_with_peaks(rng, n_steps, steps_per_hour)
        else:
            raise ValueError(f"unknown sampling {sampling!r}; known: {', '.join(SAMPLINGS)}")
    jitter = 0.02 if sampling == "levels" else 0.01
    return np.clip(util + rng.normal(0.0, jitter, util.shape), 0.0, 1.0)


def _held_levels(rng: np.random.Generator, n_steps: int, steps_per_hour: float) -> np.ndarray:
    """Load held for 2-6 h at a time at 0, 20, ..., 100 %, each round visiting every level once
    in a new order (batch windows, load tests, a service's fixed replica counts)."""
    out = np.empty(n_steps)
    at = 0
    while at < n_steps:
        for level in rng.permutation(HELD_LEVELS):
            hold = int(rng.integers(round(2 * steps_per_hour), round(6 * steps_per_hour) + 1))
            out[at : at + max(1, hold)] = level
            at += max(1, hold)
            if at >= n_steps:
                break
    return out


def _idle_with_peaks(rng: np.random.Generator, n_steps: int, steps_per_hour: float) -> np.ndarray:
    """Idle (under 5 %) for 1-4 h, then a 5-30 min peak anywhere from 15 to 100 %, and again."""
    out = np.empty(n_steps)
    at, idle = 0, True
    while at < n_steps:
        if idle:
            length = int(rng.integers(round(steps_per_hour), round(4 * steps_per_hour) + 1))
            level = rng.uniform(0.0, 0.05)
        else:
            length = int(rng.integers(round(steps_per_hour / 12), round(steps_per_hour / 2) + 1))
            level = rng.uniform(0.15, 1.0)
        out[at : at + max(1, length)] = level
        at += max(1, length)
        idle = not idle
    return out


def _curve_power_w(spec: FleetSpec, util: np.ndarray) -> np.ndarray:
    """Piecewise-linear lookup of each node's curve at its (warped) utilisation."""
    position = util ** spec.curvature_exp[:, None] * 10.0
    lower = np.clip(np.floor(position).astype(int), 0, 9)
    frac = position - lower
    low = np.take_along_axis(spec.curve_share, lower, axis=1)
    high = np.take_along_axis(spec.curve_share, lower + 1, axis=1)
    return (low + (high - low) * frac) * spec.max_power_w[:, None]


def synth_fleet(
    n_nodes: int,
    hours: float,
    step_s: float,
    seed: int,
    *,
    sampling: str = "even",
    temperature: str = "tight",
    periods: tuple[str, ...] = FLEET_PERIODS,
) -> pd.DataFrame:
    """Contract-1 metrics for `n_nodes` heterogeneous nodes over `hours`, one sample per `step_s`.

    Columns: node, timestamp (tz-aware UTC), cpu_util, ambient_temp_c, cpu1_temp_c,
    cpu2_temp_c, power_w; sorted by node, then timestamp. Missing samples are absent rows;
    sensor dropouts and one-socket nodes leave temperatures NaN. `sampling` is how load
    spreads over time and `temperature` how closely CPU temperatures follow it
    (`SAMPLINGS`, `TEMPERATURE_MODES`). The curves come from the SPECpower servers of
    `periods` (`FLEET_PERIODS`); the node facts follow the contract columns.
    """
    _check_size(n_nodes, hours, step_s)
    return fleet_telemetry(
        fleet_spec(n_nodes, seed, periods=periods),
        hours,
        step_s,
        seed,
        sampling=sampling,
        temperature=temperature,
    )


def _check_size(n_nodes: int, hours: float, step_s: float) -> int:
    if hours <= 0 or step_s <= 0:
        raise ValueError(f"hours and step_s must be positive, got {hours} and {step_s}")
    n_steps = int(hours * 3600.0 // step_s)
    if n_steps < 1:
        raise ValueError(f"{hours} h at {step_s} s steps holds no sample")
    if n_steps * n_nodes > ABSURD_STEP_COUNT:
        raise ValueError(f"{n_nodes} nodes x {n_steps} samples is more than this generator makes")
    return n_steps


def fleet_telemetry(
    spec: FleetSpec,
    hours: float,
    step_s: float,
    seed: int,
    *,
    sampling: str = "even",
    temperature: str = "tight",
    steady_power_w: Callable[[np.ndarray], np.ndarray] | None = None,
) -> pd.DataFrame:
    """Contract-1 metrics of the nodes of `spec` (see `synth_fleet`).

    By default a node draws its curve (`spec.curve_share`) plus what fans and leakage add above
    50 C. With `steady_power_w` (utilisation [n, T] -> watts [n, T]) that function is the
    nodes' power at *steady-state* temperatures, fans included, as SPECpower measures servers;
    fans then add or save only what the temperature's departure from its steady state at the
    node's mean ambient (ambient swings, thermal lag, wander) makes them. Benchmarks that score
    a model against measured curves use this, so the truth is the measured curve.
    """
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; known: {', '.join(SAMPLINGS)}")
    if temperature not in TEMPERATURE_MODES:
        raise ValueError(
            f"unknown temperature mode {temperature!r}; known: {', '.join(TEMPERATURE_MODES)}"
        )
    n_nodes = len(spec.names)
    n_steps = _check_size(n_nodes, hours, step_s)
    rng = np.random.default_rng([seed, 1])
    elapsed_s = np.arange(n_steps) * step_s
    hour_of_day = (START.hour + elapsed_s / 3600.0) % 24.0

    if sampling == "even":  # the main generator, as before the other samplings existed
        util = _utilisation(rng, n_nodes, hour_of_day, step_s)
    else:
        util = sampled_utilisation(
            sampling, np.random.default_rng([seed, 3]), n_nodes, hour_of_day, step_s
        )

    ambient_c = (
        AMBIENT_MEAN_C
        + AMBIENT_DAILY_SWING_C
        * np.cos(2 * np.pi * (hour_of_day[None, :] - AMBIENT_PEAK_HOUR) / 24.0)
        + spec.ambient_offset_c[:, None]
        + rng.normal(0.0, 0.2, (n_nodes, n_steps))
    )
    thermal_tau_s = spec.thermal_tau_s
    wander_c = 0.0
    if temperature == "loose":
        # Slower heat sinks (300-900 s instead of 60-240 s) and a slow wander of a few degrees
        # that load does not explain (neighbours, fan curves, dust): temperature then says
        # something about power that utilisation does not.
        thermal_tau_s = 300.0 + (spec.thermal_tau_s - 60.0) * (600.0 / 180.0)
        wander_c = _slow_wander_c(np.random.default_rng([seed, 2]), n_nodes, n_steps, step_s)
    thermal_alpha = 1.0 - np.exp(-step_s / thermal_tau_s)
    target1_c, target2_c = steady_state_cpu_temps_c(spec, util, ambient_c)
    cpu1_c = first_order_lag(target1_c + wander_c, thermal_alpha, target1_c[:, 0])
    cpu2_c = first_order_lag(target2_c + wander_c, thermal_alpha, target2_c[:, 0])
    cpu2_c[spec.sockets == 1] = np.nan

    hottest_c = np.fmax(cpu1_c, cpu2_c)
    fan_w = spec.fan_w_per_c[:, None] * np.maximum(hottest_c - FAN_THRESHOLD_C, 0.0)
    if steady_power_w is None:
        power_w = _curve_power_w(spec, util) + fan_w
    else:
        mean_ambient_c = AMBIENT_MEAN_C + spec.ambient_offset_c[:, None]
        steady1_c, steady2_c = steady_state_cpu_temps_c(spec, util, mean_ambient_c)
        steady_hottest_c = np.fmax(
            steady1_c, np.where(spec.sockets[:, None] == 1, np.nan, steady2_c)
        )
        steady_fan_w = spec.fan_w_per_c[:, None] * np.maximum(
            steady_hottest_c - FAN_THRESHOLD_C, 0.0
        )
        power_w = steady_power_w(util) + fan_w - steady_fan_w
    power_w += rng.normal(0.0, 1.0, (n_nodes, n_steps)) * spec.noise_w[:, None]
    quantum = spec.quantum_w[:, None]
    power_w = np.round(power_w / quantum) * quantum

    # BMC temperature sensors report whole degrees; dropouts blank all of a node's sensors.
    ambient_c, cpu1_c, cpu2_c = (np.round(t) for t in (ambient_c, cpu1_c, cpu2_c))
    dropout = event_runs(
        rng,
        (n_nodes, n_steps),
        events_per_step=1.0 / 400.0,
        min_steps=2,
        max_steps=6,
    )
    for temps in (ambient_c, cpu1_c, cpu2_c):
        temps[dropout > 0] = np.nan

    delivered = rng.random((n_nodes, n_steps)) >= spec.missing_share[:, None]
    node_index, step_index = np.nonzero(delivered)
    frame = pd.DataFrame(
        {
            NODE: np.asarray(spec.names, dtype=object)[node_index],
            TIMESTAMP: START + pd.to_timedelta(elapsed_s[step_index], unit="s"),
            CPU_UTIL: np.round(util[delivered], 4),
            AMBIENT_TEMP_C: ambient_c[delivered],
            CPU1_TEMP_C: cpu1_c[delivered],
            CPU2_TEMP_C: cpu2_c[delivered],
            POWER_W: power_w[delivered],
        },
        columns=list(CONTRACT_COLUMNS),
    )
    frame = frame.assign(**_fact_cells(spec, node_index, power_w))
    log.info(
        "synthesised %d nodes x %d samples (%d rows after %.1f %% missing; %s load, %s "
        "temperatures)",
        n_nodes,
        n_steps,
        len(frame),
        100.0 * (1.0 - len(frame) / (n_nodes * n_steps)),
        sampling,
        temperature,
    )
    return frame


def _fact_cells(
    spec: FleetSpec, node_index: np.ndarray, power_w: np.ndarray
) -> dict[str, np.ndarray]:
    """The optional fact columns, one value per row (constant per node): what a cluster's
    exporters would report. `bmc_max_power_w` is the highest reading the BMC gave in the
    period, so it says only what the telemetry itself saw."""
    facts: dict[str, np.ndarray] = {
        CPU_SOCKETS: spec.sockets.astype(float)[node_index],
        BMC_MAX_POWER_W: np.nanmax(power_w, axis=1)[node_index],
    }
    if spec.cpu_model is not None:
        facts[CPU_MODEL] = spec.cpu_model[node_index]
    if spec.cores is not None:
        facts[CPU_CORES] = spec.cores[node_index]
    if spec.psu_rating_w is not None:
        facts[PSU_RATING_W] = spec.psu_rating_w[node_index]
    return {column: facts[column] for column in FACT_COLUMNS if column in facts}


def steady_state_cpu_temps_c(
    spec: FleetSpec, util: np.ndarray, ambient_c: np.ndarray | float
) -> tuple[np.ndarray, np.ndarray]:
    """CPU1 and CPU2 temperatures each node settles at under `util` ([n, T]) and ambient."""
    target1_c = ambient_c + spec.idle_rise_c[:, None] + spec.load_rise_c[:, None] * util
    # The second socket runs a little hotter or cooler and has a slightly different response.
    target2_c = target1_c + spec.cpu2_offset_c[:, None] + 0.05 * spec.load_rise_c[:, None] * util
    return target1_c, target2_c


def _slow_wander_c(
    rng: np.random.Generator, n_nodes: int, n_steps: int, step_s: float
) -> np.ndarray:
    """A slow random wander of CPU temperatures: standard deviation 3 C, time constant 2 h."""
    alpha = 1.0 - np.exp(-step_s / 7200.0)
    white = rng.normal(0.0, 1.0, (n_nodes, n_steps))
    wander = first_order_lag(white, np.full(n_nodes, alpha), np.zeros(n_nodes))
    return wander * 3.0 / np.sqrt(alpha / (2.0 - alpha))


def write_fleet_files(
    out_dir: Path,
    n_nodes: int,
    hours: float,
    step_s: float,
    seed: int,
    nodes_per_file: int,
    *,
    sampling: str = "even",
    temperature: str = "tight",
) -> list[Path]:
    """A fleet too large to hold in memory, written as one Parquet file per `nodes_per_file`.

    Each file is a `synth_fleet` of its own (seeded from `seed` and the file's index), with its
    nodes renamed into one fleet-wide sequence (`node_names(n_nodes)`): the layout of per-rack
    exports, which `training.dataset.stream_metrics` reads one file at a time.
    """
    if nodes_per_file < 1:
        raise ValueError(f"nodes_per_file must be at least 1, got {nodes_per_file}")
    names = node_names(n_nodes)
    width = len(str(-(-n_nodes // nodes_per_file)))
    files = []
    for index, first in enumerate(range(0, n_nodes, nodes_per_file)):
        batch_names = names[first : first + nodes_per_file]
        file_seed = int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
        frame = synth_fleet(
            len(batch_names),
            hours,
            step_s,
            file_seed,
            sampling=sampling,
            temperature=temperature,
        )
        local = dict(zip(node_names(len(batch_names)), batch_names, strict=True))
        frame[NODE] = frame[NODE].map(local)
        files.append(Path(out_dir) / f"nodes-{index:0{width}d}.parquet")
        write_metrics(frame, files[-1])
    return files


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.synth",
        description="Write a synthetic heterogeneous fleet's metrics (contract 1) to a file.",
    )
    parser.add_argument("--nodes", type=int, default=50, help="number of nodes (default: 50)")
    parser.add_argument(
        "--hours", type=float, default=168.0, help="time span in hours (default: 168, one week)"
    )
    parser.add_argument(
        "--step", type=float, default=60.0, help="sample interval in seconds (default: 60)"
    )
    parser.add_argument(
        "--seed", type=int, default=7, help="random seed; same seed, same data (default: 7)"
    )
    parser.add_argument(
        "--sampling",
        choices=SAMPLINGS,
        default="even",
        help="how load spreads over time: even (daily pattern, bursts, idle periods: the whole "
        "range), levels (held for hours at 0, 20, ..., 100 %%), mostly-idle (hours idle, short "
        "peaks), lowload (never above 50 %%) (default: even)",
    )
    parser.add_argument(
        "--temperature",
        choices=TEMPERATURE_MODES,
        default="tight",
        help="how closely CPU temperature follows load: tight (settles in 1-4 min, as on most "
        "servers) or loose (5-15 min plus a slow wander load does not explain) (default: tight)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output file, .parquet or .csv (required)"
    )
    parser.add_argument(
        "--periods",
        default=",".join(ALL_PERIODS),
        help="which SPECpower servers the nodes' curves come from, comma-separated: old "
        "(2007-2016), modern (2017-2025) (default: %(default)s)",
    )
    parser.add_argument("--quiet", action="store_true", help="log warnings only")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.out.suffix.lower() not in (".parquet", ".csv"):
        print(f"error: --out must end in .parquet or .csv, got {args.out.name!r}", file=sys.stderr)
        return 2
    periods = tuple(p.strip() for p in args.periods.split(",") if p.strip())
    unknown = [p for p in periods if p not in ALL_PERIODS]
    if unknown or not periods:
        print(
            f"error: --periods: unknown {', '.join(unknown) or 'empty'}; known: "
            f"{', '.join(ALL_PERIODS)}",
            file=sys.stderr,
        )
        return 2
    try:
        frame = synth_fleet(
            args.nodes,
            args.hours,
            args.step,
            args.seed,
            sampling=args.sampling,
            temperature=args.temperature,
            periods=periods,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_metrics(frame, args.out)
    log.info("wrote %d rows to %s", len(frame), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
