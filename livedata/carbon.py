"""Carbon intensity: its units, its two signals, and the reading every carbon source produces.

A grid's carbon intensity is grams of CO2-equivalent per kWh drawn (g/kWh). Two different
signals go by that name, and they answer different questions:

- **average** (attributional): the emissions of all generation feeding the zone, divided by
  the energy. Electricity Maps' `carbonIntensity` (lifecycle emission factors by default),
  WattTime's `co2_aoer`. It is what CO2 accounting (and this project's bench KPIs) uses.
- **marginal**: the emissions of the generator that would ramp up for one more kWh now.
  WattTime's `co2_moer`. It is what a decision "run here, or now, or not" changes at the
  margin; it can differ from the average by a factor of two or more, either way.

Readings are kept apart by signal and never mixed: a zone known only by its marginal signal
has no average intensity. The carbon-aware-sdk WebAPI passes on whichever its configured data
source gives (WattTime: marginal, Electricity Maps: average), so its signal is configured.

WattTime reports pounds per megawatt-hour; one lb/MWh is 453.59237 g / 1000 kWh =
0.45359237 g/kWh, converted where the answer is read (`lbs_per_mwh_to_g_per_kwh`).

An `IntensityReading` is one zone's (or one node's) intensity of one signal as a source last
read it: the current value and the time it describes, and an optional forecast (points with
start and end). Everything here is plain data and pure functions: the extender's background
source, the simulation and the tests share it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from livedata.labels import CARBON_INTENSITY_ANNOTATION, CARBON_INTENSITY_AT_ANNOTATION

AVERAGE = "average"
MARGINAL = "marginal"
SIGNALS = (AVERAGE, MARGINAL)

# 1 lb = 453.59237 g (exact, by definition); 1 MWh = 1000 kWh.
G_PER_KWH_PER_LBS_PER_MWH = 0.45359237


class CarbonDataError(ValueError):
    """Carbon data that cannot be used; the message names the source, the field and the value."""


def lbs_per_mwh_to_g_per_kwh(lbs_per_mwh: float) -> float:
    """WattTime's lbs CO2 per MWh in grams per kWh."""
    return lbs_per_mwh * G_PER_KWH_PER_LBS_PER_MWH


def check_signal(signal: object, where: str) -> str:
    """`signal` if it is `average` or `marginal`; CarbonDataError naming `where` otherwise."""
    if signal not in SIGNALS:
        raise CarbonDataError(
            f"{where}: signal must be one of {', '.join(SIGNALS)}, got {signal!r}"
        )
    return str(signal)


@dataclass(frozen=True)
class IntensityPoint:
    """One forecast interval [start_s, end_s) (Unix seconds) at `g_per_kwh`."""

    start_s: float
    end_s: float
    g_per_kwh: float


@dataclass(frozen=True)
class IntensityReading:
    """One zone's (or node's) intensity of one signal, as one source last read it.

    `g_per_kwh` is the current value (NaN when the source gave only a forecast) and
    `observed_at_s` the time it describes (its interval's start: an hourly value published at
    10:00 for 10:00-11:00 is observed at 10:00). `forecast` points are sorted by start and do
    not overlap; `forecast_generated_at_s` is when the forecast was made (NaN without one).
    """

    name: str
    signal: str
    source: str
    g_per_kwh: float
    observed_at_s: float
    forecast: tuple[IntensityPoint, ...] = ()
    forecast_generated_at_s: float = math.nan

    def __post_init__(self) -> None:
        check_signal(self.signal, f"reading for {self.name!r} from {self.source}")


def checked_intensity(value: object, where: str) -> float:
    """A finite, non-negative number of g/kWh from an answer's field, or CarbonDataError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CarbonDataError(f"{where}: expected a number of g/kWh, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise CarbonDataError(f"{where}: expected a finite number >= 0, got {value!r}")
    return number


def parse_timestamp_s(value: object, where: str) -> float:
    """Unix seconds from RFC 3339 text (any fraction digits; no offset means UTC) or a number.

    A `datetime` (what YAML makes of an unquoted timestamp) is taken as it is, naive as UTC.
    """
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise CarbonDataError(f"{where}: timestamp {value!r} is not finite")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise CarbonDataError(f"{where}: expected an RFC 3339 timestamp, got {value!r}")
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise CarbonDataError(f"{where}: {text!r} is not an RFC 3339 timestamp") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def format_timestamp(at_s: float) -> str:
    """RFC 3339 in UTC to the minute, as reasons and logs print times (`2024-05-01T13:00Z`)."""
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%MZ")


def sorted_points(points: Sequence[IntensityPoint], where: str) -> tuple[IntensityPoint, ...]:
    """Forecast points sorted by start; overlapping or empty intervals are a CarbonDataError."""
    ordered = tuple(sorted(points, key=lambda p: p.start_s))
    for point in ordered:
        if not point.end_s > point.start_s:
            raise CarbonDataError(
                f"{where}: forecast point at {format_timestamp(point.start_s)} has no duration"
            )
    for before, after in itertools.pairwise(ordered):
        if after.start_s < before.end_s - 1e-6:
            raise CarbonDataError(
                f"{where}: forecast points at {format_timestamp(before.start_s)} and "
                f"{format_timestamp(after.start_s)} overlap"
            )
    return ordered


def value_at(points: Sequence[IntensityPoint], at_s: float) -> float:
    """The forecast's value for the interval holding `at_s`; NaN when none does."""
    for point in points:
        if point.start_s <= at_s < point.end_s:
            return point.g_per_kwh
    return math.nan


def _segments(points: Sequence[IntensityPoint]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each gap-free run of `points` as (edges, integral of intensity over time at the edges).

    Within a run the integral is piecewise linear in time, so any window's mean is two
    interpolations.
    """
    segments = []
    run: list[IntensityPoint] = []
    for point in (*points, None):
        if point is not None and (not run or abs(point.start_s - run[-1].end_s) < 1e-6):
            run.append(point)
            continue
        if run:
            edges = np.array([p.start_s for p in run] + [run[-1].end_s], dtype=float)
            values = np.array([p.g_per_kwh for p in run], dtype=float)
            segments.append((edges, np.concatenate(([0.0], np.cumsum(values * np.diff(edges))))))
        run = [point] if point is not None else []
    return segments


def window_means(
    points: Sequence[IntensityPoint], starts_s: np.ndarray, window_s: float
) -> np.ndarray:
    """The forecast's mean over [start, start + window_s) for each start; NaN where the
    forecast does not cover the whole window (past its end, or across a gap)."""
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s!r}")
    starts_s = np.asarray(starts_s, dtype=float)
    means = np.full(starts_s.shape, np.nan)
    for edges, integral in _segments(points):
        inside = (starts_s >= edges[0] - 1e-6) & (starts_s + window_s <= edges[-1] + 1e-6)
        if inside.any():
            begin, end = starts_s[inside], starts_s[inside] + window_s
            total = np.interp(end, edges, integral) - np.interp(begin, edges, integral)
            means[inside] = total / window_s
    return means


# ---- a node's own supply, declared on the Node object ----------------------------------------


def annotated_intensity(annotations: Mapping[str, str] | None) -> float:
    """The node's own-supply intensity annotation in g/kWh; NaN when absent or unreadable."""
    raw = (annotations or {}).get(CARBON_INTENSITY_ANNOTATION)
    if raw is None:
        return math.nan
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return math.nan
    return value if math.isfinite(value) and value >= 0 else math.nan


def annotated_at_s(annotations: Mapping[str, str] | None) -> float:
    """When the annotation's value was measured; +inf (never ages) without the -at annotation."""
    raw = (annotations or {}).get(CARBON_INTENSITY_AT_ANNOTATION)
    if raw is None:
        return math.inf
    try:
        return parse_timestamp_s(raw, CARBON_INTENSITY_AT_ANNOTATION)
    except CarbonDataError:
        return -math.inf  # unreadable: treated as stale, never as fresh
