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
"""

from __future__ import annotations

import numpy as np

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


def cheapest_dynamic_power_w(cluster: SimCluster, used_cores: np.ndarray) -> np.ndarray:
    """The least above-idle power (W) that `used_cores` of busy CPU can cost, per entry.

    Water-filling over every node's envelope segments, flattest first; load beyond the
    cluster's cores is priced at the steepest segment (it cannot run anyway).
    """
    utils, curves_w = sampled_curves_w(cluster)
    slopes_w_per_core: list[np.ndarray] = []
    lengths_cores: list[np.ndarray] = []
    for node in range(len(cluster)):
        vx, vy = lower_convex_envelope(
            utils * cluster.cores[node], curves_w[node] - curves_w[node, 0]
        )
        lengths_cores.append(np.diff(vx))
        slopes_w_per_core.append(np.diff(vy) / np.diff(vx))
    slopes = np.concatenate(slopes_w_per_core)
    lengths = np.concatenate(lengths_cores)
    order = np.argsort(slopes, kind="stable")
    filled_cores = np.concatenate([[0.0], np.cumsum(lengths[order])])
    cost_w = np.concatenate([[0.0], np.cumsum(lengths[order] * slopes[order])])
    load = np.asarray(used_cores, dtype=float)
    beyond = np.maximum(load - filled_cores[-1], 0.0)
    return np.interp(load, filled_cores, cost_w) + beyond * slopes.max()


def used_cores_series(trace: Trace, times_s: np.ndarray) -> np.ndarray:
    """CPU (cores) used by the trace's pods at each time, each running unslowed from arrival."""
    used = trace.cpu_m / 1000.0 * trace.usage_ratio
    start = np.searchsorted(times_s, trace.arrival_s, side="left")
    end = np.searchsorted(times_s, trace.arrival_s + trace.duration_s, side="left")
    change = np.zeros(times_s.size + 1)
    np.add.at(change, start, used)
    np.add.at(change, end, -used)
    return np.cumsum(change[:-1])


def ceiling_energy_kwh(cluster: SimCluster, trace: Trace, horizon_s: float, step_s: float) -> float:
    """Lower bound on the cluster's energy (kWh) over [0, horizon_s) with every node on."""
    times_s = np.arange(0.0, horizon_s, step_s)
    dynamic_w = cheapest_dynamic_power_w(cluster, used_cores_series(trace, times_s))
    idle_w = float((cluster.spec.idle_share * cluster.spec.max_power_w).sum())
    return (idle_w * times_s.size + float(dynamic_w.sum())) * step_s / 3.6e6
