"""Carbon intensity series per grid zone: a realistic generator, and a CSV loader for real ones.

A series is one value per zone per hour (g/kWh, average intensity), from simulated time 0
(midnight UTC, as the workload's daily pattern) on: grid data is published hourly (Electricity
Maps, ENTSO-E, EIA) and the simulator holds each hour's value for the whole hour.

**The generator** (`generate_zone_series`) builds each zone from what published grid data
shows:

- a long-run mean per zone, spread geometrically between the cleanest and the dirtiest
  (default 50-700 g/kWh: hydro and nuclear grids such as Norway, Sweden or France sit at
  20-80, wind-heavy ones such as Great Britain at 150-250, Germany at 300-450, coal-heavy
  grids such as Poland or India at 650-750);
- a diurnal solar dip: intensity falls by a zone's solar share (drawn 5-40 %) times a
  half-sine from 06:00 to 18:00, scaled each day by a cloudiness factor (drawn 0.3-1);
- an evening demand peak (peaking plants), a few percent around 19:00;
- a wind-driven random walk: an AR(1) process on the logarithm, with a zone's own spread
  (drawn 0.1-0.35) and correlation time (drawn 12-36 h: weather fronts take a day or two);

then the zone is rescaled so that its mean over the series is exactly its long-run mean, and
clipped to 5-1500 g/kWh. Zone parameters and noise come from the seed.

**The CSV loader** (`load_zone_series_csv`) reads real series users bring, one row per zone
per timestamp, header required:

    column                        meaning
    timestamp                     RFC 3339 (no offset: UTC) or Unix seconds
    zone                          zone name (any text)
    carbon_intensity_g_per_kwh    g/kWh (average; the bench's CO2 figures are attributional)

Rows are averaged into hours; simulated time 0 is the first midnight (UTC) at or after the
earliest timestamp, and every zone must cover the hours the run needs (a gap of up to 3 hours
is filled with the hour before; longer gaps are an error naming the zone and the hour).
Electricity Maps' hourly CSV exports fit after renaming their columns (`Datetime (UTC)` ->
`timestamp`, `Zone Id` -> `zone`, `Carbon Intensity gCO₂eq/kWh (LCA)` ->
`carbon_intensity_g_per_kwh`). Bad rows stop the load with the file, line and field.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from livedata.carbon import CarbonDataError, format_timestamp, parse_timestamp_s

HOUR_S = 3600.0
DAY_S = 86_400.0
CSV_COLUMNS = ("timestamp", "zone", "carbon_intensity_g_per_kwh")
MAX_FILLED_GAP_H = 3
MIN_G_PER_KWH, MAX_G_PER_KWH = 5.0, 1500.0
SOLAR_SHARE_RANGE = (0.05, 0.40)
CLOUDINESS_RANGE = (0.3, 1.0)
WIND_SPREAD_RANGE = (0.10, 0.35)
WIND_HOURS_RANGE = (12.0, 36.0)
EVENING_PEAK = 0.05
EVENING_PEAK_HOUR = 19.0


class SeriesError(ValueError):
    """A carbon series file that cannot be used; the message names the file, line and field."""


@dataclass(frozen=True)
class ZoneSeries:
    """Hourly intensity per zone from simulated time 0: `g_per_kwh[zone, hour]`."""

    zones: tuple[str, ...]
    g_per_kwh: np.ndarray
    origin: str  # how it was made: the generator's settings, or the CSV file

    @property
    def hours(self) -> int:
        return int(self.g_per_kwh.shape[1])

    def hour_of(self, t_s: float) -> int:
        """The series' hour holding simulated time `t_s` (the last hour beyond the end)."""
        return min(max(int(t_s // HOUR_S), 0), self.hours - 1)

    def at(self, t_s: float) -> np.ndarray:
        """Every zone's intensity at simulated time `t_s`."""
        return self.g_per_kwh[:, self.hour_of(t_s)]

    def means(self) -> np.ndarray:
        return self.g_per_kwh.mean(axis=1)


def zone_means(count: int, low: float, high: float) -> np.ndarray:
    """`count` long-run means spread geometrically from `low` to `high` g/kWh."""
    if count == 1:
        return np.array([math.sqrt(low * high)])
    return low * (high / low) ** (np.arange(count) / (count - 1))


def zone_names(count: int) -> tuple[str, ...]:
    return tuple(f"zone-{chr(ord('a') + i)}" if i < 26 else f"zone-{i}" for i in range(count))


def generate_zone_series(
    count: int, hours: int, seed: int, *, low: float = 50.0, high: float = 700.0
) -> ZoneSeries:
    """`count` zones of `hours` hourly values (see the module docstring); deterministic per seed."""
    if count < 1 or hours < 1:
        raise ValueError(f"need at least one zone and one hour, got {count} and {hours}")
    if not 0 < low <= high:
        raise ValueError(f"zone means must satisfy 0 < low <= high, got {low} and {high}")
    rng = np.random.default_rng([seed, 17])
    means = zone_means(count, low, high)
    hour_of_day = np.arange(hours) % 24 + 0.5  # the middle of each hour
    solar_shape = np.where(
        (hour_of_day > 6) & (hour_of_day < 18), np.sin(np.pi * (hour_of_day - 6) / 12), 0.0
    )
    evening = np.cos(2 * np.pi * (hour_of_day - EVENING_PEAK_HOUR) / 24)
    days = math.ceil(hours / 24)
    series = np.empty((count, hours))
    for zone in range(count):
        solar_share = rng.uniform(*SOLAR_SHARE_RANGE)
        cloudiness = np.repeat(rng.uniform(*CLOUDINESS_RANGE, days), 24)[:hours]
        spread = rng.uniform(*WIND_SPREAD_RANGE)
        phi = math.exp(-1.0 / rng.uniform(*WIND_HOURS_RANGE))
        shocks = rng.normal(0.0, spread * math.sqrt(1 - phi**2), hours)
        walk = np.empty(hours)
        walk[0] = rng.normal(0.0, spread)
        for hour in range(1, hours):
            walk[hour] = phi * walk[hour - 1] + shocks[hour]
        shape = (1 - solar_share * cloudiness * solar_shape) * (1 + EVENING_PEAK * evening)
        values = shape * np.exp(walk)
        series[zone] = np.clip(means[zone] * values / values.mean(), MIN_G_PER_KWH, MAX_G_PER_KWH)
    origin = f"generated: seed {seed}, {count} zones, means {low:g}-{high:g} g/kWh"
    return ZoneSeries(zone_names(count), series, origin)


def load_zone_series_csv(path: Path, hours: int) -> ZoneSeries:
    """Real series from a CSV (columns in the module docstring), `hours` hours from time 0."""
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise SeriesError(f"{path}: cannot read: {exc.strerror}") from None
    sums: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    first_s = math.inf
    with handle:
        reader = csv.DictReader(handle)
        header = [name.strip() for name in reader.fieldnames or []]
        missing = [column for column in CSV_COLUMNS if column not in header]
        if missing:
            raise SeriesError(
                f"{path}, line 1: missing column(s) {', '.join(missing)} "
                f"(need {', '.join(CSV_COLUMNS)})"
            )
        reader.fieldnames = header
        rows = []
        for row in reader:
            line = reader.line_num
            try:
                at_s = parse_timestamp_s(
                    (row.get("timestamp") or "").strip(), f"{path}, line {line}, field timestamp"
                )
            except CarbonDataError as exc:
                raise SeriesError(str(exc)) from None
            zone = (row.get("zone") or "").strip()
            if not zone:
                raise SeriesError(f"{path}, line {line}, field zone: empty")
            raw = (row.get("carbon_intensity_g_per_kwh") or "").strip()
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not (math.isfinite(value) and value >= 0):
                raise SeriesError(
                    f"{path}, line {line}, field carbon_intensity_g_per_kwh: {raw!r} is not a "
                    "number of g/kWh >= 0"
                )
            rows.append((at_s, zone, value))
            first_s = min(first_s, at_s)
    if not rows:
        raise SeriesError(f"{path}: no rows (only a header)")
    start_s = math.ceil(first_s / DAY_S) * DAY_S  # the first midnight (UTC) at or after
    for at_s, zone, value in rows:
        sums[zone][math.floor((at_s - start_s) / HOUR_S)].append(value)
    zones = tuple(sorted(sums))
    series = np.empty((len(zones), hours))
    for z, zone in enumerate(zones):
        by_hour = sums[zone]
        previous, gap = math.nan, 0
        for hour in range(hours):
            values = by_hour.get(hour)
            if values:
                previous, gap = float(np.mean(values)), 0
            else:
                gap += 1
                if math.isnan(previous) or gap > MAX_FILLED_GAP_H:
                    when = start_s + hour * HOUR_S
                    raise SeriesError(
                        f"{path}: zone {zone} has no value for hour {hour} of the run "
                        f"({format_timestamp(when)}); the run needs {hours} hours from "
                        f"{format_timestamp(start_s)} (gaps of up to {MAX_FILLED_GAP_H} h are "
                        "filled)"
                    )
            series[z, hour] = previous
    return ZoneSeries(zones, series, f"{path} ({len(zones)} zones)")
