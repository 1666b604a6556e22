"""The headroom learned from what the cluster did: pod wait as an objective.

The policy keeps free CPU on for what arrives while a node boots (`policy.headroom_cores`):
the recent arrival rate times the boot time, or a fixed reserve. The rate lags a burst that
begins while nodes are off, and the reserve that covers the bursts depends on how bursty the
workload is and how long nodes boot, which an operator does not know. This module learns it
from two things the controller observes:

- **demand growth within one boot time**: the requested cores of the pods created over any
  window of `boot_s` (what a node woken now would have to take by the time it is Ready). The
  largest such sum in each slot of `boot_s` is a sample, kept in one of 24 hour-of-day buckets
  (bursts come at the same hours: office hours, nightly batches), weighted by
  `day_decay ** age in days` so the learning follows a workload that changes over weeks;
- **pods' wait**: creation to scheduled, for the pods placed. The p99 over the last
  `wait_window_s` (a day by default: the window a p99 target is usually stated over) says
  whether the target is met.

The learned headroom is the `quantile` of the current hour's samples (and the next hour's,
which a boot starting now reaches into), and the quantile adapts: a p99 over the target with
pods over the target seen since the quantile last moved raises it (halves its distance to 1,
at most once per `adjust_interval_s`): one burst's misses, which stay in the window for a day,
raise it once, not every interval of that day; a p99 under `margin_ratio` of the target
lowers it slowly (the distance to 1 grows by `lower_factor`): a miss costs pods a boot time's
wait, a reserve too high costs watts all day. A bucket with too few samples (the first day)
borrows from the nearest hours, widening an hour at a time: demand at 10:00 says more about
11:00 than demand at 03:00 does.

Measured on `bench.energy_sim` (docs/results.md, "A pod wait target"): a 30-minute window
judges every burst a miss, cluster-full waits included, and pins the quantile near its top.

Pure: no clocks, no I/O; the controller and the energy simulation feed it the same way.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

HOURS_PER_DAY = 24
_DAY_S = 86_400.0
_HOUR_S = 3600.0
# Samples whose weight has decayed below this no longer count (and are forgotten).
_MIN_WEIGHT = 1e-3


@dataclass(frozen=True)
class HeadroomSettings:
    """The target and how the learning moves towards it."""

    target_wait_p99_s: float
    boot_s: float = 300.0
    # The p99 is over the waits of the pods placed in this window, judged only with at least
    # `min_waits` of them (a handful of pods says nothing about a 99th percentile).
    wait_window_s: float = 86_400.0
    min_waits: int = 100
    # The quantile moves at most once per this long: a change needs a boot time or two to
    # show in the waits.
    adjust_interval_s: float = 600.0
    initial_quantile: float = 0.5
    min_quantile: float = 0.5
    max_quantile: float = 0.995
    # On a miss the distance to 1 (1 - quantile) is multiplied by `raise_factor`; met with the
    # p99 under `margin_ratio` x target, by `lower_factor`.
    raise_factor: float = 0.5
    lower_factor: float = 1.05
    margin_ratio: float = 0.5
    # Weight of a sample a day older than another.
    day_decay: float = 0.8
    # A bucket with less weight than this borrows all hours' samples.
    min_bucket_weight: float = 3.0

    def __post_init__(self) -> None:
        positive = ("target_wait_p99_s", "boot_s", "wait_window_s", "adjust_interval_s")
        for name in positive:
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be positive, got {value!r}")
        if not 0 < self.min_quantile <= self.initial_quantile <= self.max_quantile < 1:
            raise ValueError(
                "quantiles must satisfy 0 < min <= initial <= max < 1, got "
                f"{self.min_quantile}, {self.initial_quantile}, {self.max_quantile}"
            )
        if not (0 < self.raise_factor < 1 < self.lower_factor):
            raise ValueError("raise_factor must be in (0, 1) and lower_factor > 1")
        if not (0 < self.margin_ratio <= 1 and 0 < self.day_decay <= 1):
            raise ValueError("margin_ratio and day_decay must be in (0, 1]")
        if self.min_waits < 1 or self.min_bucket_weight < 0:
            raise ValueError("min_waits must be >= 1 and min_bucket_weight >= 0")


@dataclass(frozen=True)
class HeadroomState:
    """What the learner says now (for the policy, /status, the metrics)."""

    learned_cores: float
    quantile: float
    wait_p99_s: float  # NaN while fewer than `min_waits` waits are in the window
    waits: int  # pods placed within the window
    hour: int  # the hour-of-day bucket in use
    # Why the quantile last moved, in words ("" until it has).
    last_change: str = ""


def weighted_quantile(samples: list[tuple[float, float]], quantile: float) -> float:
    """The `quantile` of (value, weight) samples (the smallest value whose cumulative weight
    reaches `quantile` of the total); 0 with none."""
    kept = sorted((v, w) for v, w in samples if w > 0)
    total = sum(w for _, w in kept)
    if total <= 0:
        return 0.0
    running = 0.0
    for value, weight in kept:
        running += weight
        if running >= quantile * total - 1e-12:
            return value
    return kept[-1][0]


def wait_p99_s(waits_s: list[float]) -> float:
    """The 99th percentile of `waits_s` (nearest rank; NaN with none)."""
    if not waits_s:
        return math.nan
    ordered = sorted(waits_s)
    return ordered[min(len(ordered) - 1, max(math.ceil(0.99 * len(ordered)) - 1, 0))]


def hour_of_day(time_s: float) -> int:
    return int((time_s % _DAY_S) // _HOUR_S)


class HeadroomLearner:
    """Demand growth by hour of day at an adaptive quantile; see the module docstring.

    Feed it `add_arrival` (each pod's creation once) and `add_wait` (each pod placed, when),
    then `update(now_s)` once a round: the learned headroom in cores. Memory is bounded by the
    arrivals within one boot time, the waits within the window, and 24 x (slots per hour) x
    (days until a sample's weight decays away) samples.
    """

    def __init__(self, settings: HeadroomSettings) -> None:
        self.settings = settings
        self.quantile = settings.initial_quantile
        self.last_change = ""
        self._arrivals: deque[tuple[float, float]] = deque()  # (created_s, cores)
        self._waits: deque[tuple[float, float]] = deque()  # (placed_s, wait_s)
        # Per hour of day: (value cores, day index) of each slot's largest growth.
        self._buckets: list[list[tuple[float, int]]] = [[] for _ in range(HOURS_PER_DAY)]
        self._slot: int | None = None  # index of the current slot of boot_s
        self._slot_max = 0.0
        self._adjusted_at_s = -math.inf
        self._fresh_misses = 0  # waits over the target seen since the quantile last moved

    # ---- input ------------------------------------------------------------------------------

    def add_arrival(self, created_s: float, cores: float) -> None:
        """A pod asking for `cores` was created at `created_s` (each pod once)."""
        if cores > 0 and math.isfinite(cores) and math.isfinite(created_s):
            self._arrivals.append((created_s, cores))

    def add_wait(self, placed_s: float, wait_s: float) -> None:
        """A pod was scheduled at `placed_s`, `wait_s` after its creation."""
        if math.isfinite(placed_s) and math.isfinite(wait_s):
            self._waits.append((placed_s, max(wait_s, 0.0)))
            if wait_s > self.settings.target_wait_p99_s:
                self._fresh_misses += 1

    # ---- the round --------------------------------------------------------------------------

    def update(self, now_s: float) -> HeadroomState:
        """Record this round's demand growth, adapt the quantile, and the learned headroom."""
        self._record_growth(now_s)
        p99, count = self._wait_p99(now_s)
        self._adapt(p99, now_s)
        hour = hour_of_day(now_s)
        return HeadroomState(
            learned_cores=self.learned_cores(now_s),
            quantile=self.quantile,
            wait_p99_s=p99,
            waits=count,
            hour=hour,
            last_change=self.last_change,
        )

    def growth_cores(self, now_s: float) -> float:
        """Requested cores of the pods created within the last boot time (never negative)."""
        start_s = now_s - self.settings.boot_s
        while self._arrivals and self._arrivals[0][0] <= start_s:
            self._arrivals.popleft()
        return sum(c for t, c in self._arrivals if start_s < t <= now_s)

    def learned_cores(self, now_s: float) -> float:
        """The quantile of the demand growth the current hour (and the next) has seen."""
        day = int(now_s // _DAY_S)
        hour = hour_of_day(now_s)
        reach = hour_of_day(now_s + self.settings.boot_s)
        hours = {hour, reach}
        for widen in range(HOURS_PER_DAY // 2 + 1):
            hours |= {(hour - widen) % HOURS_PER_DAY, (reach + widen) % HOURS_PER_DAY}
            samples = self._weighted(hours, day)
            if self._slot is not None:
                samples.append((self._slot_max, 1.0))  # the slot under way, as one more sample
            if sum(w for _, w in samples) >= self.settings.min_bucket_weight:
                break
        return max(weighted_quantile(samples, self.quantile), 0.0)

    def bucket_samples(self, hour: int) -> list[tuple[float, int]]:
        """(growth cores, day) of the closed slots that started in `hour` (for tests, /status)."""
        return list(self._buckets[hour])

    # ---- internals --------------------------------------------------------------------------

    def _record_growth(self, now_s: float) -> None:
        boot_s = self.settings.boot_s
        slot = math.floor(now_s / boot_s)
        growth = self.growth_cores(now_s)
        if self._slot is not None and slot != self._slot:
            start_s = self._slot * boot_s
            day = int(start_s // _DAY_S)
            self._buckets[hour_of_day(start_s)].append((self._slot_max, day))
            self._slot_max = 0.0
            self._forget(day)
        self._slot = slot
        self._slot_max = max(self._slot_max, growth)

    def _forget(self, day: int) -> None:
        decay = self.settings.day_decay
        if decay >= 1:
            return
        oldest = math.log(_MIN_WEIGHT) / math.log(decay)  # days after which weight < minimum
        for hour, samples in enumerate(self._buckets):
            if samples and day - samples[0][1] > oldest:
                self._buckets[hour] = [(v, d) for v, d in samples if day - d <= oldest]

    def _weighted(self, hours: set[int], day: int) -> list[tuple[float, float]]:
        decay = self.settings.day_decay
        return [
            (value, decay ** max(day - sample_day, 0))
            for hour in hours
            for value, sample_day in self._buckets[hour]
        ]

    def _wait_p99(self, now_s: float) -> tuple[float, int]:
        start_s = now_s - self.settings.wait_window_s
        while self._waits and self._waits[0][0] <= start_s:
            self._waits.popleft()
        inside = [w for t, w in self._waits if start_s < t <= now_s]
        if len(inside) < self.settings.min_waits:
            return math.nan, len(inside)
        return wait_p99_s(inside), len(inside)

    def _adapt(self, p99_s: float, now_s: float) -> None:
        s = self.settings
        if math.isnan(p99_s) or now_s - self._adjusted_at_s < s.adjust_interval_s:
            return
        before = self.quantile
        if p99_s > s.target_wait_p99_s:
            if not self._fresh_misses:
                return  # the misses in the window have moved it already
            self.quantile = min(1 - (1 - before) * s.raise_factor, s.max_quantile)
            why = f"p99 wait {p99_s:.0f} s over the {s.target_wait_p99_s:g} s target"
        elif p99_s <= s.margin_ratio * s.target_wait_p99_s:
            self.quantile = max(1 - (1 - before) * s.lower_factor, s.min_quantile)
            why = (
                f"p99 wait {p99_s:.0f} s under {s.margin_ratio:g} x the "
                f"{s.target_wait_p99_s:g} s target"
            )
        else:
            return
        if self.quantile != before:
            self._adjusted_at_s = now_s
            self._fresh_misses = 0
            self.last_change = f"quantile {before:.3f} -> {self.quantile:.3f}: {why}"
