"""What the carbon intensity services answer, read into `livedata.carbon.IntensityReading`s.

Pure functions over parsed JSON (the HTTP calls are the extender's background source,
`livedata.carbon_providers`), one per answer shape, each checking every field it uses
and raising `CarbonDataError` with the service, the path to the field and the value:

- **carbon-aware-sdk WebAPI** (Green Software Foundation; values in g/kWh):
  `GET /emissions/bylocations?location=A&location=B&time=..&toTime=..` answers an array of
  `{"location", "time", "rating", "duration"}` (or 204 with no body: no data), newest kept
  per location; `GET /emissions/forecasts/current?location=A&location=B` answers one forecast
  per location, `{"generatedAt", "requestedAt", "location", "dataStartAt", "dataEndAt",
  "windowSize", "optimalDataPoints": [...], "forecastData": [{"location", "timestamp",
  "duration" (minutes), "value"}]}` (SDK releases before 1.0 said `optimalDataPoint`; neither
  is read). The WebAPI passes on its data source's signal, so the caller says which.
- **Electricity Maps API v3** (average, lifecycle by default; g/kWh):
  `GET /v3/carbon-intensity/latest?zone=DE` answers `{"zone", "carbonIntensity", "datetime",
  "updatedAt", "emissionFactorType", "isEstimated", ...}`; `GET
  /v3/carbon-intensity/forecast?zone=DE` answers `{"zone", "forecast": [{"carbonIntensity",
  "datetime"}], "updatedAt"}` (hourly points: each lasts until the next).
- **WattTime API v3**: `GET /v3/forecast?region=CAISO_NORTH&signal_type=co2_moer` answers
  `{"data": [{"point_time", "value"}], "meta": {"data_point_period_seconds", "region",
  "signal_type", "units": "lbs_co2_per_mwh", "generated_at", ...}}`. Its first point applies
  to the current period (WattTime's advice for real-time use), so it is also the current
  value. `co2_moer` is marginal, `co2_aoer` average; values in lbs/MWh are converted to g/kWh.
- **a static file** for sites with their own meters (`read_intensity_file`, YAML or JSON):

      intensities:
        - zone: site-a            # or node: edge-7 (a node's own supply, e.g. its solar)
          signal: average         # or marginal; default average
          g_per_kwh: 45
          observed_at: 2024-05-01T10:00:00Z   # default: the file's modification time
          forecast:               # optional
            - {start: 2024-05-01T11:00:00Z, end: 2024-05-01T12:00:00Z, g_per_kwh: 40}
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from livedata.carbon import (
    AVERAGE,
    MARGINAL,
    CarbonDataError,
    IntensityPoint,
    IntensityReading,
    check_signal,
    checked_intensity,
    lbs_per_mwh_to_g_per_kwh,
    parse_timestamp_s,
    sorted_points,
)

CARBON_AWARE_SDK = "carbon-aware-sdk"
ELECTRICITY_MAPS = "electricity-maps"
WATTTIME = "watttime"
STATIC_FILE = "file"

# WattTime signal types that are carbon intensities, and the signal each is.
WATTTIME_SIGNALS: Mapping[str, str] = {"co2_moer": MARGINAL, "co2_aoer": AVERAGE}
WATTTIME_LBS_UNITS = "lbs_co2_per_mwh"
DEFAULT_POINT_S = 3600.0  # a forecast's last point lasts as long as the ones before it, or 1 h


def _object(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CarbonDataError(f"{where}: expected a JSON object, got {_short(value)}")
    return value


def _array(value: object, where: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise CarbonDataError(f"{where}: expected a JSON array, got {_short(value)}")
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise CarbonDataError(f"{where}: expected a non-empty string, got {_short(value)}")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _step_points(
    starts_s: Sequence[float], values: Sequence[float], period_s: float | None
) -> list[IntensityPoint]:
    """Points that each last until the next start; the last one `period_s` (or the usual step)."""
    if not starts_s:
        return []
    if period_s is None:
        steps = [b - a for a, b in itertools.pairwise(starts_s) if b > a]
        period_s = sorted(steps)[len(steps) // 2] if steps else DEFAULT_POINT_S
    ends = [*starts_s[1:], starts_s[-1] + period_s]
    # A gap longer than the usual step is a gap, not one long point.
    return [
        IntensityPoint(start, min(end, start + period_s), value)
        for start, end, value in zip(starts_s, ends, values, strict=True)
    ]


# ---- carbon-aware-sdk WebAPI -----------------------------------------------------------------


def carbon_aware_emissions(body: object, signal: str, where: str) -> list[IntensityReading]:
    """`/emissions/bylocations`: the newest rating per location (None body: 204, no data)."""
    check_signal(signal, where)
    if body is None:
        return []
    newest: dict[str, IntensityReading] = {}
    for i, item in enumerate(_array(body, where)):
        at = f"{where}[{i}]"
        entry = _object(item, at)
        location = _text(entry.get("location"), f"{at}.location")
        observed_at_s = parse_timestamp_s(entry.get("time"), f"{at}.time")
        rating = checked_intensity(entry.get("rating"), f"{at}.rating")
        previous = newest.get(location)
        if previous is None or observed_at_s >= previous.observed_at_s:
            newest[location] = IntensityReading(
                location, signal, CARBON_AWARE_SDK, rating, observed_at_s
            )
    return list(newest.values())


def carbon_aware_forecasts(
    body: object, signal: str, where: str
) -> dict[str, tuple[tuple[IntensityPoint, ...], float]]:
    """`/emissions/forecasts/current`: location -> (forecast points, generated at)."""
    check_signal(signal, where)
    forecasts: dict[str, tuple[tuple[IntensityPoint, ...], float]] = {}
    for i, item in enumerate(_array(body, where)):
        at = f"{where}[{i}]"
        entry = _object(item, at)
        location = _text(entry.get("location"), f"{at}.location")
        generated_at_s = parse_timestamp_s(entry.get("generatedAt"), f"{at}.generatedAt")
        points = []
        for j, raw in enumerate(_array(entry.get("forecastData"), f"{at}.forecastData")):
            point_at = f"{at}.forecastData[{j}]"
            point = _object(raw, point_at)
            start_s = parse_timestamp_s(point.get("timestamp"), f"{point_at}.timestamp")
            minutes = point.get("duration")
            if isinstance(minutes, bool) or not isinstance(minutes, int | float) or minutes <= 0:
                raise CarbonDataError(
                    f"{point_at}.duration: expected minutes > 0, got {_short(minutes)}"
                )
            value = checked_intensity(point.get("value"), f"{point_at}.value")
            points.append(IntensityPoint(start_s, start_s + 60.0 * float(minutes), value))
        forecasts[location] = (sorted_points(points, f"{at}.forecastData"), generated_at_s)
    return forecasts


# ---- Electricity Maps API v3 -------------------------------------------------------------------


def electricity_maps_latest(body: object, where: str) -> IntensityReading:
    """`/v3/carbon-intensity/latest`: the zone's average intensity and the hour it describes."""
    entry = _object(body, where)
    zone = _text(entry.get("zone"), f"{where}.zone")
    value = checked_intensity(entry.get("carbonIntensity"), f"{where}.carbonIntensity")
    observed_at_s = parse_timestamp_s(entry.get("datetime"), f"{where}.datetime")
    return IntensityReading(zone, AVERAGE, ELECTRICITY_MAPS, value, observed_at_s)


def electricity_maps_forecast(
    body: object, where: str
) -> tuple[str, tuple[IntensityPoint, ...], float]:
    """`/v3/carbon-intensity/forecast`: (zone, hourly points, updatedAt)."""
    entry = _object(body, where)
    zone = _text(entry.get("zone"), f"{where}.zone")
    generated_at_s = parse_timestamp_s(entry.get("updatedAt"), f"{where}.updatedAt")
    starts, values = [], []
    for i, raw in enumerate(_array(entry.get("forecast"), f"{where}.forecast")):
        at = f"{where}.forecast[{i}]"
        point = _object(raw, at)
        starts.append(parse_timestamp_s(point.get("datetime"), f"{at}.datetime"))
        values.append(checked_intensity(point.get("carbonIntensity"), f"{at}.carbonIntensity"))
    order = sorted(range(len(starts)), key=starts.__getitem__)
    points = _step_points([starts[i] for i in order], [values[i] for i in order], None)
    return zone, sorted_points(points, f"{where}.forecast"), generated_at_s


# ---- WattTime API v3 -----------------------------------------------------------------------------


def watttime_forecast(body: object, where: str) -> IntensityReading:
    """`/v3/forecast`: the region's forecast in g/kWh; its first point is the current value."""
    entry = _object(body, where)
    meta = _object(entry.get("meta"), f"{where}.meta")
    region = _text(meta.get("region"), f"{where}.meta.region")
    signal_type = _text(meta.get("signal_type"), f"{where}.meta.signal_type")
    signal = WATTTIME_SIGNALS.get(signal_type)
    if signal is None:
        raise CarbonDataError(
            f"{where}.meta.signal_type: {signal_type!r} is not a carbon intensity "
            f"(use {' or '.join(WATTTIME_SIGNALS)})"
        )
    units = _text(meta.get("units"), f"{where}.meta.units")
    if units.lower() != WATTTIME_LBS_UNITS:
        raise CarbonDataError(
            f"{where}.meta.units: expected {WATTTIME_LBS_UNITS!r} (converted to g/kWh), "
            f"got {units!r}"
        )
    generated_at_s = parse_timestamp_s(meta.get("generated_at"), f"{where}.meta.generated_at")
    period = meta.get("data_point_period_seconds")
    period_s = float(period) if isinstance(period, int | float) and period > 0 else None
    starts, values = [], []
    for i, raw in enumerate(_array(entry.get("data"), f"{where}.data")):
        at = f"{where}.data[{i}]"
        point = _object(raw, at)
        starts.append(parse_timestamp_s(point.get("point_time"), f"{at}.point_time"))
        lbs_per_mwh = checked_intensity(point.get("value"), f"{at}.value")
        values.append(lbs_per_mwh_to_g_per_kwh(lbs_per_mwh))
    if not starts:
        raise CarbonDataError(f"{where}.data: the forecast has no points")
    order = sorted(range(len(starts)), key=starts.__getitem__)
    points = sorted_points(
        _step_points([starts[i] for i in order], [values[i] for i in order], period_s),
        f"{where}.data",
    )
    first = points[0]
    return IntensityReading(
        region, signal, WATTTIME, first.g_per_kwh, first.start_s, points, generated_at_s
    )


# ---- a static file ------------------------------------------------------------------------


def read_intensity_file(path: Path) -> tuple[list[IntensityReading], list[IntensityReading]]:
    """(zone readings, node readings) from a YAML/JSON file (format in the module docstring).

    Entries without `observed_at` describe the time the file was last written, so a meter
    that stops rewriting it lets its values age and expire like any other source's.
    """
    path = Path(path)
    try:
        text = path.read_text()
        modified_s = os.stat(path).st_mtime
    except OSError as exc:
        raise CarbonDataError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CarbonDataError(f"{path}: not valid YAML/JSON: {exc}") from None
    where = str(path)
    entries = _array(_object(document, where).get("intensities"), f"{where}: intensities")
    zones: list[IntensityReading] = []
    nodes: list[IntensityReading] = []
    for i, item in enumerate(entries):
        at = f"{where}: intensities[{i}]"
        entry = _object(item, at)
        unknown = set(entry) - {"zone", "node", "signal", "g_per_kwh", "observed_at", "forecast"}
        if unknown:
            raise CarbonDataError(f"{at}: unknown field(s) {', '.join(sorted(unknown))}")
        if ("zone" in entry) == ("node" in entry):
            raise CarbonDataError(f"{at}: give exactly one of zone or node")
        kind = "zone" if "zone" in entry else "node"
        name = _text(entry[kind], f"{at}.{kind}")
        signal = check_signal(entry.get("signal", AVERAGE), f"{at}.signal")
        value = (
            checked_intensity(entry["g_per_kwh"], f"{at}.g_per_kwh")
            if "g_per_kwh" in entry
            else math.nan
        )
        observed_at_s = (
            parse_timestamp_s(entry["observed_at"], f"{at}.observed_at")
            if "observed_at" in entry
            else modified_s
        )
        points = []
        for j, raw in enumerate(_array(entry.get("forecast", []), f"{at}.forecast")):
            point_at = f"{at}.forecast[{j}]"
            point = _object(raw, point_at)
            points.append(
                IntensityPoint(
                    parse_timestamp_s(point.get("start"), f"{point_at}.start"),
                    parse_timestamp_s(point.get("end"), f"{point_at}.end"),
                    checked_intensity(point.get("g_per_kwh"), f"{point_at}.g_per_kwh"),
                )
            )
        if math.isnan(value) and not points:
            raise CarbonDataError(f"{at}: give g_per_kwh, a forecast, or both")
        reading = IntensityReading(
            name,
            signal,
            STATIC_FILE,
            value,
            observed_at_s,
            sorted_points(points, f"{at}.forecast"),
            observed_at_s if points else math.nan,
        )
        (zones if kind == "zone" else nodes).append(reading)
    return zones, nodes
