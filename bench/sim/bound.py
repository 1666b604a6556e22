"""The least energy any power management could use on a trace: a lower bound in hindsight.

`bench.sim.ceiling` bounds placement with every node on. This bounds every policy that may
also power nodes off and on, under the simulated power states of `bench.sim.power` (the same
boot time and boot power, shutdown time, off power) and the limits the node power controller
obeys: a node powered on (or on since the start) less than `cooldown_s` ago is not powered
off, and the cluster's power-offs stay within `max_cycles_per_node_day` per node-day on
average (the goal the controller was built to; None: no limit).

It is an integer programme's linear relaxation, solved with HiGHS through scipy. Time is cut
into windows of `window_s`; for node n and window w the variables are

- `on[n,w]` in [0, 1]: the share of the window the node is ON (Ready, taking pods);
- `fill[n,w,k]` >= 0: the mean cores of busy CPU on segment k of the node's lower convex
  envelope (above idle), with `fill[n,w,k] <= on[n,w] x length[k]`;
- `up_a, up_b, down_a, down_b[n,w]` >= 0: the node's boots completed (ups) and power-offs
  (downs) in the window, each split into two parts (below);

and the load row `sum over n, k of fill[n,w,k] = the trace's mean used cores in w` (plus, as
in the ceiling, load beyond every core of the cluster priced at the steepest slope). Its
objective, in joules: every node's off power all the time; `(idle - off) x seconds on`;
`slope x fill x seconds`; per up `boot_s x (boot power - off)`; per down whose shutdown ends in
the horizon `shutdown_s x (idle - off)`.

**Why it is a lower bound.** Take any schedule a policy could follow: each node's state
s_n(t) (1 when ON, 0 otherwise), the busy CPU y_n(t) it runs, its boots and power-offs. Map it
to the programme: `on` = each window's mean of s_n, `fill` = each window's mean of y_n(t)
poured into the envelope's segments flattest first, ups and downs = its events. That point is
feasible, and its objective is at most the schedule's energy:

1. *Envelopes below curves.* An ON node draws its curve at y_n (plus fans, left out), which is
   at least idle plus the envelope at y_n; the envelope is convex, so filling its segments in
   order costs exactly the envelope (any other fill costs more: the programme may pick it but
   gains nothing). Coarsening the envelope to a few of its tangent lines (`coarse_segments`)
   stays below it: the maximum of some of a convex function's tangent lines is below it.
2. *Fluid load, split freely over the nodes that are on.* Pods come whole, request more than
   they use, and must fit; the programme only asks that at each instant the trace's busy CPU
   (each pod from its arrival, unslowed, as in the ceiling) sit on nodes that are on,
   `y_n(t) <= s_n(t) x cores` (the segment rows, which are linear in (s, y)). Two covers
   keep the relaxation from time-sharing a node (one node on a quarter of the time at four
   times the load): at every instant of a window the load is at least the window's least
   load L, so the nodes on then hold L: at least the fewest nodes whose cores add up to L
   are on, and `sum over n of s_n(t) x min(cores_n, L) >= L` (if a node on holds L alone its
   term is L; if none does, the terms are their cores). Both are linear in s_n(t).
3. *Per-window means.* Every per-instant row is linear, so its window mean holds for the
   window means, and the objective is linear in them: averaging keeps the point feasible at
   the same cost. (This is the ceiling's Jensen step, for a programme: the least cost of a
   window is at most the mean of its instants' least costs.)
4. *On/off fractional.* s_n(t) in {0, 1} is relaxed to window means in [0, 1], and events to
   real counts. Each window's change of `on` is tied to the events: an event at phase
   phi in [0, 1) of window w moves `on[w] - on[w-1]` by 1 - phi and `on[w+1] - on[w]` by phi
   (exactly: the window means are a sliding mean of s_n sampled once per window), so
   `on[w] - on[w-1] <= up_a[w] + up_b[w-1]` and `on[w-1] - on[w] <= down_a[w] + down_b[w-1]`,
   with `up_a + up_b` the ups of a window (and downs alike). Every node is ON at 0.
5. *Boot and shutdown.* A node booting draws its boot power and gives no capacity, so the
   boot's seconds lie in the node's not-ON time, charged at off power by the first term, and
   each up adds `boot_s x (boot power - off)`; a shutdown draws at least idle power, so each
   down whose shutdown ends within the horizon adds `shutdown_s x (idle - off)`. Before an up
   at time p the node was not ON over [p - shutdown_s - boot_s, p) (it shut down, then
   booted; a wake-up while shutting down waits for the shutdown): the windows that cover that
   interval hold at least that much not-ON time per up. Before a down at p the node was ON
   over [p - cooldown_s, p), and no down comes before `cooldown_s` (every node is on since 0).
   Two events' intervals never overlap, so the rows add them up.
6. *Cycle limit.* The sum of the downs is at most the limit times node-days
   (`PolicyResult.power_cycles_per_node_day`'s count).

So the programme's least value is at most any such schedule's energy. What it leaves out is
what a policy has to live with: foresight (it wakes a node exactly a boot before the load
that needs it, and never for a burst that does not come), headroom (it keeps no free CPU but
the load's own), requests against usage (it fills nodes to their used CPU, where pods reserve
their requests), whole nodes and whole pods (granularity: `on` may be 0.3 of a node, and a
window's load splits to the core), and the window means (a burst within a window is
averaged; finer windows give a tighter bound and a larger programme).

It bounds policies that run every pod from its arrival at its usage: a policy that makes pods
wait, or slows them on an overcommitted node, runs the same work later, outside the bound
(the bench prints each policy's waits). With `node_g_per_kwh` the objective weighs each
node's watts by its grid zone's intensity (the multizone preset): each window by the least
intensity in it (hourly series: constant in windows that divide an hour), each event by the
least over the windows its boot or shutdown may span, so it bounds grams of CO2 alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_array

from bench.sim.ceiling import envelope_segments, used_cores_series, window_means
from bench.sim.cluster import SimCluster
from bench.sim.scenario import Scenario
from bench.sim.workload import Trace
from controllers.node_power.policy import PolicySettings

# The controller's goal: at most 6 power cycles per node per day (docs/results.md).
CYCLE_LIMIT_PER_NODE_DAY = 6.0
# Tangent lines kept per node's envelope: the coarse envelope is within `COARSE_GAP_W` of the
# fine one (or this many lines, whichever comes first).
COARSE_MAX_SEGMENTS = 12
COARSE_GAP_W = 0.05
# Finer windows tighten the bound little and grow the programme: on the default run 300 s gives
# 0.6 % less than 60 s, 120 s 0.1 % less, and with requests to fit 60 s takes minutes.
DEFAULT_WINDOW_S = 120.0


@dataclass(frozen=True)
class PowerLimits:
    """The power states' physics (`SimSettings`' fields) and the controller's limits."""

    boot_s: float = 300.0
    boot_power_share: float = 0.5
    shutdown_s: float = 60.0
    off_power_w: float = 10.0
    cooldown_s: float = 1800.0
    max_cycles_per_node_day: float | None = CYCLE_LIMIT_PER_NODE_DAY

    def __post_init__(self) -> None:
        for name in ("boot_s", "shutdown_s", "off_power_w", "cooldown_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 <= self.boot_power_share <= 1:
            raise ValueError(f"boot_power_share must be 0..1, got {self.boot_power_share}")
        if self.max_cycles_per_node_day is not None and not self.max_cycles_per_node_day >= 0:
            raise ValueError(
                f"max_cycles_per_node_day must be >= 0, got {self.max_cycles_per_node_day}"
            )


def limits_for(scenario: Scenario) -> PowerLimits:
    """The limits of a bench run: its power states (`SimSettings`) and the controller's
    cool-down (`--cooldown`, else `PolicySettings`' default)."""
    sim, bench = scenario.sim_settings, scenario.settings
    cooldown_s = bench.power_cooldown_s
    return PowerLimits(
        boot_s=sim.boot_s,
        boot_power_share=sim.boot_power_share,
        shutdown_s=sim.shutdown_s,
        off_power_w=sim.off_power_w,
        cooldown_s=PolicySettings().cooldown_s if cooldown_s is None else cooldown_s,
    )


class PowerBound(NamedTuple):
    value: float  # kWh (or kg of CO2 when weighed by intensities)
    power_offs: float  # the relaxed schedule's power-offs (a real count in the relaxation)
    boots: float
    mean_nodes_off: float  # mean number of nodes not ON over the horizon
    variables: int
    constraints: int


def coarse_segments(
    lengths: np.ndarray, slopes: np.ndarray, max_segments: int, gap_w: float
) -> tuple[np.ndarray, np.ndarray]:
    """A convex envelope's segments (lengths, slopes, flattest first) cut to a few of its
    tangent lines: their maximum is never above the envelope, equal at both ends, and within
    `gap_w` of it unless `max_segments` lines are reached first.

    Greedy: start from the first and last segments' lines, add the line of the segment at the
    vertex where the envelope is furthest above the lines kept.
    """
    x = np.concatenate([[0.0], np.cumsum(lengths)])
    y = np.concatenate([[0.0], np.cumsum(lengths * slopes)])
    last = slopes.size - 1
    kept = sorted({0, last})
    while len(kept) < max_segments:
        lines = y[kept][:, None] + slopes[kept][:, None] * (x[None, :] - x[kept][:, None])
        gap = y - lines.max(axis=0)
        vertex = int(np.argmax(gap))
        if gap[vertex] <= gap_w:
            break
        kept = sorted({*kept, min(vertex, last)})
    ks = np.array(kept)
    k_slopes = slopes[ks]
    # Consecutive kept lines meet where y_i + s_i (x - x_i) = y_j + s_j (x - x_j).
    xi, yi, si = x[ks[:-1]], y[ks[:-1]], k_slopes[:-1]
    xj, yj, sj = x[ks[1:]], y[ks[1:]], k_slopes[1:]
    parallel = np.isclose(si, sj)
    meet = np.where(parallel, xj, (yj - sj * xj - yi + si * xi) / np.where(parallel, 1.0, si - sj))
    breaks = np.clip(np.concatenate([[0.0], meet, [x[-1]]]), 0.0, x[-1])
    breaks = np.maximum.accumulate(breaks)
    return np.diff(breaks), k_slopes


def power_bound(
    cluster: SimCluster,
    trace: Trace,
    horizon_s: float,
    step_s: float,
    limits: PowerLimits,
    window_s: float = DEFAULT_WINDOW_S,
    node_g_per_kwh: Callable[[float], np.ndarray] | None = None,
    fit_requests: bool = False,
) -> PowerBound:
    """Lower bound on the energy (kWh) over [0, horizon_s) of any power management of the
    trace under `limits`, or with `node_g_per_kwh(t_s)` ([nodes] g/kWh) on its CO2 (kg).

    With `fit_requests` the nodes on must also hold every running pod's CPU request beside
    their DaemonSet pods' (as kube-scheduler places: the same covers, on requests): a bound on
    power management that places as Kubernetes does, higher; the difference is what requests
    above usage cost any such policy.

    The trace's load is sampled every `step_s` (the simulation's tick) and averaged over
    windows of `window_s` (see the module docstring).
    """
    times_s = np.arange(0.0, horizon_s, step_s)
    per_window = max(1, round(window_s / step_s))
    used = used_cores_series(trace, times_s)
    load, steps_in = window_means(used, per_window)
    total_cores = float(cluster.cores.sum())
    overflow_max, _ = window_means(np.maximum(used - total_cores, 0.0), per_window)
    seconds = steps_in * step_s  # each window's length
    n_windows = seconds.size
    starts_s = np.arange(n_windows) * per_window * step_s
    n_nodes = len(cluster)

    if node_g_per_kwh is None:
        weight = np.ones((n_nodes, n_windows))
        unit = 1.0 / 3.6e6  # J -> kWh
    else:
        intensities = np.stack([np.asarray(node_g_per_kwh(float(t)), float) for t in times_s])
        weight = _window_min(intensities.T, per_window)
        unit = 1.0 / 3.6e6 / 1000.0  # J x g/kWh -> kg
    # What the nodes on must hold at every instant of each window: at least its least load
    # (and, fitting requests, its least requested CPU in the room DaemonSets leave).
    covers = [(_window_min(used, per_window), cluster.cores, None)]
    if fit_requests:
        requested = used_cores_series(
            dataclasses.replace(trace, usage_ratio=np.ones(len(trace))), times_s
        )
        room = cluster.cores - sum(pod.cpu_m for pod in cluster.daemon_pods) / 1000.0
        mean_requested, _ = window_means(requested, per_window)
        covers.append((_window_min(requested, per_window), room, mean_requested))

    spec = cluster.spec
    idle_w = spec.idle_share * spec.max_power_w
    boot_w = idle_w + limits.boot_power_share * (spec.max_power_w - idle_w)
    off_w = limits.off_power_w
    segments = [
        coarse_segments(length, slope, COARSE_MAX_SEGMENTS, COARSE_GAP_W)
        for length, slope in envelope_segments(cluster)
    ]
    window_len_s = per_window * step_s
    dead_s = limits.shutdown_s + limits.boot_s  # not ON before each up
    k_dead = math.ceil(dead_s / window_len_s)
    k_cool = math.ceil(limits.cooldown_s / window_len_s)
    k_boot = math.ceil(limits.boot_s / window_len_s)
    k_shut = math.ceil(limits.shutdown_s / window_len_s)

    cost: list[np.ndarray] = []
    upper: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    rhs: list[np.ndarray] = []
    load_cols: list[np.ndarray] = []
    down_cols: list[np.ndarray] = []
    row = 0
    col = 0
    w = np.arange(n_windows)

    def add(r: np.ndarray, c: np.ndarray, v: np.ndarray | float) -> None:
        rows.append(np.asarray(r, dtype=np.int64).ravel())
        cols.append(np.asarray(c, dtype=np.int64).ravel())
        vals.append(np.broadcast_to(np.asarray(v, dtype=float), np.shape(r)).ravel())

    def least_before(values: np.ndarray, span: int) -> np.ndarray:
        """Per window j, the least of `values` over windows j - span .. j."""
        out = values.copy()
        for back in range(1, span + 1):
            out[back:] = np.minimum(out[back:], values[:-back])
        return out

    def least_after(values: np.ndarray, span: int) -> np.ndarray:
        out = values.copy()
        for ahead in range(1, span + 1):
            out[:-ahead] = np.minimum(out[:-ahead], values[ahead:])
        return out

    node_blocks = []
    for n in range(n_nodes):
        lengths, slopes = segments[n]
        k_count = lengths.size
        on, up_a, up_b, dn_a, dn_b = (col + i * n_windows + w for i in range(5))
        fill = col + 5 * n_windows + w[:, None] * k_count + np.arange(k_count)[None, :]
        node_blocks.append((on, up_a, up_b, dn_a, dn_b))
        col += (5 + k_count) * n_windows
        wt = weight[n]
        up_j = limits.boot_s * (boot_w[n] - off_w) * least_before(wt, k_boot)
        shut_ends = starts_s + seconds + limits.shutdown_s <= horizon_s + 1e-9
        dn_j = np.where(
            shut_ends, limits.shutdown_s * (idle_w[n] - off_w) * least_after(wt, k_shut), 0.0
        )
        cost += [seconds * (idle_w[n] - off_w) * wt, up_j, up_j, dn_j, dn_j]
        cost.append((seconds * wt)[:, None] * slopes[None, :])
        # No power-off in a window that ends before the cool-down has passed since the start.
        dn_upper = np.where(starts_s + seconds <= limits.cooldown_s + 1e-9, 0.0, np.inf)
        upper += [np.ones(n_windows), np.full(n_windows, np.inf), np.full(n_windows, np.inf)]
        upper += [dn_upper, dn_upper, np.full(n_windows * k_count, np.inf)]
        load_cols.append(fill)
        down_cols += [dn_a, dn_b]

        # fill[w,k] - length[k] on[w] <= 0
        r = row + w[:, None] * k_count + np.arange(k_count)[None, :]
        add(r, fill, 1.0)
        add(r, np.broadcast_to(on[:, None], r.shape), -np.broadcast_to(lengths, r.shape))
        rhs.append(np.zeros(r.size))
        row += r.size
        # on[w] - on[w-1] - up_a[w] - up_b[w-1] <= 0  (w >= 1; at 0 it holds: on <= 1)
        r = row + w[1:] - 1
        add(r, on[1:], 1.0)
        add(r, on[:-1], -1.0)
        add(r, up_a[1:], -1.0)
        add(r, up_b[:-1], -1.0)
        rhs.append(np.zeros(r.size))
        row += r.size
        # on[w-1] - on[w] - down_a[w] - down_b[w-1] <= 0, with on[-1] = 1
        r = row + w
        add(r[1:], on[:-1], 1.0)
        add(r, on, -1.0)
        add(r, dn_a, -1.0)
        add(r[1:], dn_b[:-1], -1.0)
        rhs.append(np.concatenate([[-1.0], np.zeros(n_windows - 1)]))
        row += r.size
        # dead_s (up_a[j] + up_b[j]) + sum_{i=j-k_dead..j} seconds[i] on[i] <= sum seconds[i]
        r = row + w
        add(r, up_a, dead_s)
        add(r, up_b, dead_s)
        covered = np.zeros(n_windows)
        for back in range(k_dead + 1):
            add(r[back:], on[: n_windows - back], seconds[: n_windows - back])
            covered[back:] += seconds[: n_windows - back]
        rhs.append(covered)
        row += r.size
        # cooldown_s (down_a[j] + down_b[j]) - sum_{i=j-k_cool..j} seconds[i] on[i] <= 0
        r = row + w
        add(r, dn_a, limits.cooldown_s)
        add(r, dn_b, limits.cooldown_s)
        for back in range(k_cool + 1):
            add(r[back:], on[: n_windows - back], -seconds[: n_windows - back])
        rhs.append(np.zeros(r.size))
        row += r.size

    # Covers: at each instant the nodes on hold the floor, so at least the fewest nodes whose
    # capacity adds up to it are on, and sum(on x min(capacity, floor)) >= floor (the
    # module docstring's point 2); fitting requests, their mean too.
    on_cols = np.stack([block[0] for block in node_blocks])
    for floor, capacity, mean in covers:
        floor = np.minimum(floor, capacity.sum())
        largest_first = np.cumsum(np.sort(capacity)[::-1])
        fewest = np.searchsorted(largest_first, floor - 1e-9, side="left") + 1.0
        fewest = np.where(floor > 1e-9, np.minimum(fewest, n_nodes), 0.0)
        r = np.broadcast_to(row + w, on_cols.shape)
        add(r, on_cols, -1.0)
        rhs.append(-fewest)
        row += n_windows
        r = np.broadcast_to(row + w, on_cols.shape)
        add(r, on_cols, -np.minimum(capacity[:, None], floor[None, :]))
        rhs.append(-floor)
        row += n_windows
        if mean is not None:
            r = np.broadcast_to(row + w, on_cols.shape)
            add(r, on_cols, -np.broadcast_to(capacity[:, None], on_cols.shape))
            rhs.append(-np.minimum(mean, capacity.sum()))
            row += n_windows

    overflow = col + w
    col += n_windows
    steepest_w = max(float(slope.max()) for _, slope in segments)
    cost.append(seconds * steepest_w * weight.max(axis=0))
    upper.append(overflow_max)
    ub_rows = row
    if limits.max_cycles_per_node_day is not None:
        node_days = n_nodes * horizon_s / 86_400.0
        downs = np.concatenate(down_cols)
        add(np.full(downs.size, row), downs, 1.0)
        rhs.append(np.array([limits.max_cycles_per_node_day * node_days]))
        ub_rows += 1

    a_ub = coo_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(ub_rows, col),
    ).tocsr()
    # Load rows: sum of every node's fills + overflow = the window's mean used cores.
    eq_rows = [np.broadcast_to(w[:, None], f.shape).ravel() for f in load_cols] + [w]
    eq_cols = [f.ravel() for f in load_cols] + [overflow]
    eq_r, eq_c = np.concatenate(eq_rows), np.concatenate(eq_cols)
    a_eq = coo_array((np.ones(eq_r.size), (eq_r, eq_c)), shape=(n_windows, col)).tocsr()
    c = np.concatenate([np.ravel(x) for x in cost])
    ub = np.concatenate([np.ravel(x) for x in upper])
    result = linprog(
        c,
        A_ub=a_ub,
        b_ub=np.concatenate(rhs),
        A_eq=a_eq,
        b_eq=load,
        bounds=np.stack([np.zeros(col), ub], axis=1),
        method="highs",
    )
    if result.status != 0:
        raise RuntimeError(f"power bound: the programme failed: {result.message}")
    x = result.x
    off_floor = float((seconds[None, :] * off_w * weight).sum())  # every node's off power
    on_share = np.stack([x[block[0]] for block in node_blocks])
    return PowerBound(
        value=(float(result.fun) + off_floor) * unit,
        power_offs=float(sum(x[b[3]].sum() + x[b[4]].sum() for b in node_blocks)),
        boots=float(sum(x[b[1]].sum() + x[b[2]].sum() for b in node_blocks)),
        mean_nodes_off=float(((1.0 - on_share) * seconds[None, :]).sum() / seconds.sum()),
        variables=col,
        constraints=ub_rows + n_windows,
    )


def _window_min(series: np.ndarray, per_window: int) -> np.ndarray:
    """The least of `series` ([..., steps]) in each window of `per_window` steps."""
    steps = series.shape[-1]
    windows = -(-steps // per_window)
    padded = np.full((*series.shape[:-1], windows * per_window), np.inf)
    padded[..., :steps] = series
    return padded.reshape(*series.shape[:-1], windows, per_window).min(axis=-1)
