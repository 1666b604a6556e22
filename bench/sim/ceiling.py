"""The most any placement could save on a trace: a lower bound on the cluster's energy.

The bound relaxes everything that makes placement hard, so no policy (ours, the oracle, or one
not yet written) can use less energy on the same trace with every node on:

- hindsight and fluid load: at each instant the CPU that running pods use (requests x usage
  ratio, as if nothing were slowed) may be split over the nodes in any proportion, moved
  freely, and is not held back by requests (a node may be filled to 100 % utilisation);
- each node's above-idle power curve is replaced by its lower convex envelope, which is never
  above the curve; for convex functions the cheapest split of a total is found exactly by
  filling the flattest segments first (water-filling), so the envelope's optimum is a bound
  for the real curves' one;
- fans are left out (they only add power), and idle power is paid by every node, as in the
  simulation's default assumption.

What separates a policy from the bound is then what the relaxations hide: requests reserve CPU
that pods do not use, pods come whole and arrive online, and kube-scheduler's own scores pull
towards spreading.

`constrained_ceiling_energy_kwh` is the same bound when pods may run only on some nodes (the
edge preset's delay limits): the fluid load of each group of pods that share their allowed
nodes goes only to those nodes, the cheapest split found by a linear programme over the
envelopes' segments (HiGHS, through scipy). One programme per instant would be tens of
thousands; it is solved once per `window_s` on the window's mean loads instead, which keeps it
a bound: the least cost of a split is convex in the loads (an LP's value in its right-hand
side), so by Jensen's inequality the cost of the mean load is at most the mean of the costs.
Its distance to the unconstrained bound taken the same way is what the constraints cost any
placement, at the least.

`ceiling_co2_kg` is the same bound for grams of CO2 when each node's watts are weighed by its
grid zone's intensity (the multizone preset): every node pays its idle power times its
intensity, and at each instant the fluid load fills the segments whose grams per core
(slope x intensity) are lowest first. Intensities are constant between their changes (hourly),
so each instant is still a water-filling, of the segments weighed that hour. Pods run from
their arrival, as above: it bounds where work runs, not when (deferral is outside it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_array

from bench.sim.cluster import SimCluster, curve_power_w
from bench.sim.workload import Trace

# Fine enough that the envelope of the sampled curves is within 0.01 % of the real curves' one.
ENVELOPE_GRID_POINTS = 2001


def lower_convex_envelope(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the lower convex envelope of the points (x, y), x increasing (monotone chain)."""
    hull: list[int] = []
    for i in range(len(x)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is not below the chord from a to i: it is not a vertex of the lower envelope.
            if (y[b] - y[a]) * (x[i] - x[a]) >= (y[i] - y[a]) * (x[b] - x[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    return x[hull], y[hull]


def sampled_curves_w(cluster: SimCluster) -> tuple[np.ndarray, np.ndarray]:
    """The utilisation grid and every node's fan-free power on it ([nodes, grid points])."""
    utils = np.linspace(0.0, 1.0, ENVELOPE_GRID_POINTS)
    return utils, curve_power_w(cluster, np.tile(utils, (len(cluster), 1)))


def envelope_curves_w(cluster: SimCluster) -> np.ndarray:
    """Each node's lower convex envelope of its fan-free curve, on `sampled_curves_w`'s grid.

    Where a node's curve is concave (most real servers near idle) the envelope is the chord
    below it: power a node pays above its envelope is the price of running partly loaded.
    """
    utils, curves_w = sampled_curves_w(cluster)
    return np.stack([np.interp(utils, *lower_convex_envelope(utils, row)) for row in curves_w])


def envelope_power_w(envelopes_w: np.ndarray, util: np.ndarray) -> np.ndarray:
    """Each node's envelope (from `envelope_curves_w`) at its utilisation `util` (0..1)."""
    steps = envelopes_w.shape[1] - 1
    position = np.asarray(util, dtype=float) * steps
    lower = np.minimum(position.astype(np.intp), steps - 1)
    rows = np.arange(envelopes_w.shape[0])
    low_w, high_w = envelopes_w[rows, lower], envelopes_w[rows, lower + 1]
    return low_w + (position - lower) * (high_w - low_w)


def envelope_segments(cluster: SimCluster) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per node, its envelope's segments above idle: (lengths in cores, slopes in W per core),
    flattest first (the envelope is convex)."""
    utils, curves_w = sampled_curves_w(cluster)
    segments = []
    for node in range(len(cluster)):
        vx, vy = lower_convex_envelope(
            utils * cluster.cores[node], curves_w[node] - curves_w[node, 0]
        )
        segments.append((np.diff(vx), np.diff(vy) / np.diff(vx)))
    return segments


def cheapest_dynamic_power_w(cluster: SimCluster, used_cores: np.ndarray) -> np.ndarray:
    """The least above-idle power (W) that `used_cores` of busy CPU can cost, per entry.

    Water-filling over every node's envelope segments, flattest first; load beyond the
    cluster's cores is priced at the steepest segment (it cannot run anyway).
    """
    segments = envelope_segments(cluster)
    slopes = np.concatenate([slope for _, slope in segments])
    lengths = np.concatenate([length for length, _ in segments])
    return water_fill(lengths, slopes, np.asarray(used_cores, dtype=float))


def water_fill(lengths: np.ndarray, unit_costs: np.ndarray, load: np.ndarray) -> np.ndarray:
    """The least cost of `load` (per entry) over segments of `lengths` at `unit_costs` each,
    cheapest first; load beyond them all is priced at the dearest unit cost."""
    order = np.argsort(unit_costs, kind="stable")
    filled = np.concatenate([[0.0], np.cumsum(lengths[order])])
    cost = np.concatenate([[0.0], np.cumsum(lengths[order] * unit_costs[order])])
    beyond = np.maximum(load - filled[-1], 0.0)
    return np.interp(load, filled, cost) + beyond * unit_costs.max()


def used_cores_series(
    trace: Trace, times_s: np.ndarray, pods: np.ndarray | None = None
) -> np.ndarray:
    """CPU (cores) used by the trace's pods (or those at indices `pods`) at each time, each
    running unslowed from arrival."""
    chosen = slice(None) if pods is None else pods
    arrival_s = trace.arrival_s[chosen]
    used = trace.cpu_m[chosen] / 1000.0 * trace.usage_ratio[chosen]
    start = np.searchsorted(times_s, arrival_s, side="left")
    end = np.searchsorted(times_s, arrival_s + trace.duration_s[chosen], side="left")
    change = np.zeros(times_s.size + 1)
    np.add.at(change, start, used)
    np.add.at(change, end, -used)
    return np.cumsum(change[:-1])


class Co2Ceiling(NamedTuple):
    co2_kg: float  # the bound
    idle_co2_kg: float  # its part that every node's idle power emits, whatever runs where


def ceiling_co2_kg(
    cluster: SimCluster,
    trace: Trace,
    horizon_s: float,
    step_s: float,
    node_g_per_kwh: Callable[[float], np.ndarray],
) -> Co2Ceiling:
    """Lower bound on the cluster's CO2 (kg) over [0, horizon_s) with every node on.

    `node_g_per_kwh(t_s)` is every node's grid intensity at time `t_s` ([nodes] g/kWh).
    Load beyond the cluster's cores is priced at the steepest weighted segment.
    """
    times_s = np.arange(0.0, horizon_s, step_s)
    used = used_cores_series(trace, times_s)
    segments = envelope_segments(cluster)
    lengths = np.concatenate([length for length, _ in segments])
    node_of = np.concatenate([np.full(length.size, n) for n, (length, _) in enumerate(segments)])
    slopes = np.concatenate([slope for _, slope in segments])
    idle_w = cluster.spec.idle_share * cluster.spec.max_power_w
    dynamic_w_g = idle_w_g = 0.0  # sums over steps of watts x g/kWh
    intensities = np.stack([np.asarray(node_g_per_kwh(float(t)), dtype=float) for t in times_s])
    # Instants under the same intensities share one water-filling (hourly: 24 instead of 86,400).
    _, first, which = np.unique(intensities, axis=0, return_index=True, return_inverse=True)
    for group, start in enumerate(first):
        g_per_kwh = intensities[start]
        load = used[which.ravel() == group]
        dynamic_w_g += float(water_fill(lengths, slopes * g_per_kwh[node_of], load).sum())
        idle_w_g += load.size * float(idle_w @ g_per_kwh)
    kg = step_s / 3.6e6 / 1000.0  # W s x g/kWh -> kg
    return Co2Ceiling((dynamic_w_g + idle_w_g) * kg, idle_w_g * kg)


def ceiling_energy_kwh(cluster: SimCluster, trace: Trace, horizon_s: float, step_s: float) -> float:
    """Lower bound on the cluster's energy (kWh) over [0, horizon_s) with every node on."""
    times_s = np.arange(0.0, horizon_s, step_s)
    dynamic_w = cheapest_dynamic_power_w(cluster, used_cores_series(trace, times_s))
    return _energy_kwh(cluster, times_s.size, float(dynamic_w.sum()), step_s)


def constrained_ceiling_energy_kwh(
    cluster: SimCluster,
    trace: Trace,
    horizon_s: float,
    step_s: float,
    allowed_nodes: Callable[[str], np.ndarray | None],
    window_s: float = 60.0,
) -> float:
    """Lower bound on the energy (kWh) with every node on, each pod only on its allowed nodes.

    `allowed_nodes(pod uid)` is a boolean mask over the cluster's nodes, or None for anywhere.
    Load beyond what a group's nodes can take is priced at the steepest segment, as above.
    Loads are averaged over windows of `window_s` (see the module docstring); with every pod
    allowed everywhere this is `ceiling_energy_kwh` with the same windows, a little lower.
    """
    times_s = np.arange(0.0, horizon_s, step_s)
    groups: dict[bytes, list[int]] = {}
    masks: dict[bytes, np.ndarray] = {}
    everywhere = np.ones(len(cluster), dtype=bool)
    for pod, uid in enumerate(trace.names):
        mask = allowed_nodes(uid)
        mask = everywhere if mask is None else np.asarray(mask, dtype=bool)
        key = mask.tobytes()
        masks.setdefault(key, mask)
        groups.setdefault(key, []).append(pod)
    keys = list(groups)
    loads = np.stack([used_cores_series(trace, times_s, np.array(groups[key])) for key in keys])
    means, steps_in = window_means(loads, max(1, round(window_s / step_s)))
    dynamic_w = _split_cost_w(envelope_segments(cluster), [masks[k] for k in keys], means)
    return _energy_kwh(cluster, times_s.size, float((dynamic_w * steps_in).sum()), step_s)


def window_means(series: np.ndarray, per_window: int) -> tuple[np.ndarray, np.ndarray]:
    """Means of `series` ([..., steps]) over consecutive windows of `per_window` steps (the last
    window may be shorter), and how many steps each window holds."""
    steps = series.shape[-1]
    windows = -(-steps // per_window)
    padded = np.zeros((*series.shape[:-1], windows * per_window))
    padded[..., :steps] = series
    steps_in = np.minimum(per_window, steps - np.arange(windows) * per_window)
    sums = padded.reshape(*series.shape[:-1], windows, per_window).sum(axis=-1)
    return sums / steps_in, steps_in


def _split_cost_w(
    segments: list[tuple[np.ndarray, np.ndarray]], masks: list[np.ndarray], loads: np.ndarray
) -> np.ndarray:
    """Per instant, the least above-idle watts of the groups' loads ([groups, instants]) split
    over their allowed nodes: min sum(slope * fill) over segment fills, group-to-node flows
    and an overflow per group (priced at the steepest slope)."""
    steepest = max(float(slope.max()) for _, slope in segments)
    cost, upper, rows, cols, vals = [], [], [], [], []
    column = 0
    for node, (length, slope) in enumerate(segments):  # segment fills: + into their node's row
        for k in range(length.size):
            cost.append(float(slope[k]))
            upper.append(float(length[k]))
            rows.append(node)
            cols.append(column)
            vals.append(1.0)
            column += 1
    n_nodes = len(segments)
    for g, mask in enumerate(masks):  # flows: - from the node's row, + into the group's row
        for node in np.flatnonzero(mask).tolist():
            cost.append(0.0)
            upper.append(np.inf)
            rows += [node, n_nodes + g]
            cols += [column, column]
            vals += [-1.0, 1.0]
            column += 1
        cost.append(steepest)  # overflow
        upper.append(np.inf)
        rows.append(n_nodes + g)
        cols.append(column)
        vals.append(1.0)
        column += 1
    a_eq = coo_array((vals, (rows, cols)), shape=(n_nodes + len(masks), column)).tocsr()
    bounds = list(zip([0.0] * column, upper, strict=True))
    out = np.zeros(loads.shape[1])
    last: tuple[bytes, float] | None = None
    for t in range(loads.shape[1]):
        key = loads[:, t].round(9).tobytes()
        if last is not None and last[0] == key:
            out[t] = last[1]  # unchanged load, same optimum
            continue
        b_eq = np.concatenate([np.zeros(n_nodes), loads[:, t]])
        result = linprog(cost, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
        if result.status != 0:
            raise RuntimeError(
                f"constrained ceiling: the split at step {t} failed: {result.message}"
            )
        out[t] = float(result.fun)
        last = (key, out[t])
    return out


def _energy_kwh(cluster: SimCluster, steps: int, dynamic_w_sum: float, step_s: float) -> float:
    idle_w = float((cluster.spec.idle_share * cluster.spec.max_power_w).sum())
    return (idle_w * steps + dynamic_w_sum) * step_s / 3.6e6
