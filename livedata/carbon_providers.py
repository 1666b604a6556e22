"""Where carbon intensity comes from: one provider class per kind of source, each doing its I/O.

Every provider is built from one entry of the Carbon plugin's `sources` list (camelCase keys,
checked here: a bad entry raises `ValueError` naming the key) and answers `fetch(now_s, zones)`
with the readings it found (`livedata.carbon.IntensityReading`, zone or node readings), or
raises `CarbonSourceError` saying which URL or file failed and how. `zones` are the cluster's
zone names (from the nodes' labels); an API provider asks for those, or for the ones its
`zones` map names (`{cluster zone: the service's name for it}`), and reports readings under
the cluster's names. Providers run only in the background source's thread
(`livedata.carbon_source`), never on the request path; every HTTP call has a timeout and no
retries (the next poll is the retry).

Kinds (`kind`), what each reads, and the signal its values are:

- `prometheus`: an instant query (`query`), one series per zone in label `zoneLabel`
  (default `zone`); optional forecast series (`forecastQuery`, hours ahead in label
  `horizonLabel`, default `hours_ahead`, each point `forecastStepSeconds` long). `signal`
  (default average).
- `prometheus-node`: an instant query, one series per node in label `nodeLabel` (default
  `node`): a node's own supply. `signal` (default average).
- `carbon-aware-sdk`: `GET {url}/emissions/bylocations` and `/emissions/forecasts/current`.
  `signal` required (the SDK passes on its data source's: WattTime marginal, Electricity Maps
  average).
- `electricity-maps`: `GET {url}/v3/carbon-intensity/latest` and `/forecast` per zone, header
  `auth-token` read from `tokenFile`. Average.
- `watttime`: `GET {url}/login` (basic auth from `usernameFile`, `passwordFile`), then
  `/v3/forecast` per region. `signalType` co2_moer (default): marginal; co2_aoer: average.
- `file`: a YAML/JSON file (`path`). Per entry.

Every kind takes `name` (for metrics and /status; default `<kind>-<index>`) and
`maxAgeSeconds` (its own max age, for values and forecasts, instead of the plugin's).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import requests

from livedata.carbon import (
    AVERAGE,
    SIGNALS,
    CarbonDataError,
    IntensityPoint,
    IntensityReading,
)
from livedata.carbon_apis import (
    CARBON_AWARE_SDK,
    ELECTRICITY_MAPS,
    STATIC_FILE,
    WATTTIME,
    WATTTIME_SIGNALS,
    carbon_aware_emissions,
    carbon_aware_forecasts,
    electricity_maps_forecast,
    electricity_maps_latest,
    read_intensity_file,
    watttime_forecast,
)

PROMETHEUS = "prometheus"
PROMETHEUS_NODE = "prometheus-node"
ELECTRICITY_MAPS_URL = "https://api.electricitymap.org"
WATTTIME_URL = "https://api.watttime.org"
# How far back the carbon-aware-sdk is asked for measured values (its data is 5-60 min apart).
SDK_LOOKBACK_S = 3 * 3600.0
# WattTime tokens last 30 minutes; log in again a little before.
WATTTIME_TOKEN_S = 25 * 60.0


class CarbonSourceError(RuntimeError):
    """A source could not be read this time; the message names the URL or file and the problem."""


@dataclass(frozen=True)
class Readings:
    """What one fetch found: zone readings and node-local readings."""

    zones: tuple[IntensityReading, ...] = ()
    nodes: tuple[IntensityReading, ...] = ()


# ---- configuration ---------------------------------------------------------------------------


class _Config:
    """One `sources[i]` entry: typed getters that name the key at fault."""

    def __init__(self, raw: object, where: str) -> None:
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
        self.raw, self.where, self.used = raw, where, {"kind", "name", "maxAgeSeconds"}

    def text(self, key: str, default: str | None = None) -> str:
        self.used.add(key)
        value = self.raw.get(key, default)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{self.where}.{key}: a non-empty string is required, got {value!r}")
        return value

    def optional_text(self, key: str) -> str | None:
        return self.text(key) if key in self.raw else self._skip(key)

    def number(self, key: str, default: float) -> float:
        self.used.add(key)
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"{self.where}.{key}: a number > 0 is required, got {value!r}")
        return float(value)

    def signal(self, default: str | None) -> str:
        self.used.add("signal")
        value = self.raw.get("signal", default)
        if value not in SIGNALS:
            hint = "" if default else " (this source does not say which signal it gives)"
            raise ValueError(
                f"{self.where}.signal: one of {', '.join(SIGNALS)} is required, got {value!r}"
                + hint
            )
        return str(value)

    def zone_map(self) -> dict[str, str] | None:
        self.used.add("zones")
        value = self.raw.get("zones")
        if value is None:
            return None
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items()
        ):
            raise ValueError(
                f"{self.where}.zones: a mapping of cluster zone -> the service's zone name "
                f"is required, got {value!r}"
            )
        return dict(value)

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.used)
        if unknown:
            raise ValueError(
                f"{self.where}.{unknown[0]}: unknown key for a {self.raw.get('kind')} source; "
                f"known: {', '.join(sorted(self.used))}"
            )

    def _skip(self, key: str) -> None:
        self.used.add(key)
        return None


def _secret(path: str, where: str) -> str:
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise CarbonSourceError(f"{where}: cannot read {path}: {exc.strerror}") from None
    if not value:
        raise CarbonSourceError(f"{where}: {path} is empty")
    return value


def _get_json(
    session: requests.Session,
    url: str,
    *,
    params: Iterable[tuple[str, str]] | Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    auth: tuple[str, str] | None = None,
    timeout_s: float,
) -> object:
    """GET `url` and parse JSON; None for 204 No Content. CarbonSourceError on any failure."""
    try:
        response = session.get(url, params=params, headers=headers, auth=auth, timeout=timeout_s)
    except requests.exceptions.Timeout:
        raise CarbonSourceError(f"{url}: no answer within {timeout_s:g} s") from None
    except requests.exceptions.RequestException as exc:
        raise CarbonSourceError(f"{url}: request failed ({type(exc).__name__}: {exc})") from None
    if response.status_code == 204:
        return None
    if response.status_code != 200:
        raise CarbonSourceError(
            f"{response.url}: HTTP {response.status_code} {response.reason}: "
            f"{response.text[:200]!r}"
        )
    try:
        return response.json()
    except ValueError:
        raise CarbonSourceError(
            f"{response.url}: the answer is not JSON (starts {response.text[:80]!r})"
        ) from None


# ---- providers --------------------------------------------------------------------------------


@dataclass
class Provider:
    """Base of the providers: a name (for metrics and /status) and its own max age, if any."""

    kind: ClassVar[str] = ""
    name: str
    max_age_s: float | None  # None: the plugin's maxAgeSeconds
    timeout_s: float

    def fetch(self, now_s: float, zones: Iterable[str]) -> Readings:
        raise NotImplementedError

    def describe(self) -> str:
        return self.kind


def _reverse(zone_map: Mapping[str, str] | None, zones: Iterable[str]) -> dict[str, str]:
    """The service's zone name -> the cluster's, for the zones to ask about."""
    if zone_map is not None:
        return {service: cluster for cluster, service in zone_map.items()}
    return {zone: zone for zone in zones}


def _renamed(reading: IntensityReading, name: str) -> IntensityReading:
    return IntensityReading(
        name,
        reading.signal,
        reading.source,
        reading.g_per_kwh,
        reading.observed_at_s,
        reading.forecast,
        reading.forecast_generated_at_s,
    )


@dataclass
class PrometheusProvider(Provider):
    """Zone (or node) intensities from an instant query, e.g. an exporter's gauge."""

    kind: ClassVar[str] = PROMETHEUS
    url: str = ""
    query: str = ""
    key_label: str = "zone"
    signal: str = AVERAGE
    forecast_query: str | None = None
    horizon_label: str = "hours_ahead"
    forecast_step_s: float = 3600.0
    node_local: bool = False
    session: requests.Session = field(default_factory=requests.Session, repr=False)

    def describe(self) -> str:
        return f"{self.kind} {self.query!r} at {self.url}"

    def fetch(self, now_s: float, zones: Iterable[str]) -> Readings:
        values = self._instant(self.query, now_s)
        # timestamp() of a selector is each sample's own time: how old the value really is.
        stamps = self._instant(f"timestamp({self.query})", now_s)
        forecasts: dict[str, list[tuple[float, float, float]]] = {}
        if self.forecast_query:
            forecast_values = self._instant(self.forecast_query, now_s)
            forecast_stamps = self._instant(f"timestamp({self.forecast_query})", now_s)
            for labels, value in forecast_values:
                key, horizon = labels.get(self.key_label), labels.get(self.horizon_label)
                stamp = _match(forecast_stamps, labels)
                try:
                    hours = float(horizon) if horizon is not None else math.nan
                except ValueError:
                    hours = math.nan
                if key and math.isfinite(hours) and math.isfinite(value) and value >= 0:
                    forecasts.setdefault(key, []).append((stamp, hours, value))
        readings = []
        for labels, value in values:
            key = labels.get(self.key_label)
            if not key or not math.isfinite(value) or value < 0:
                continue
            observed_at_s = _match(stamps, labels)
            points, generated_at_s = self._points(forecasts.pop(key, []))
            readings.append(
                IntensityReading(
                    key, self.signal, self.name, value, observed_at_s, points, generated_at_s
                )
            )
        for key, rows in forecasts.items():  # a forecast without a current value
            points, generated_at_s = self._points(rows)
            readings.append(
                IntensityReading(
                    key, self.signal, self.name, math.nan, generated_at_s, points, generated_at_s
                )
            )
        if self.node_local:
            return Readings(nodes=tuple(readings))
        return Readings(zones=tuple(readings))

    def _points(
        self, rows: list[tuple[float, float, float]]
    ) -> tuple[tuple[IntensityPoint, ...], float]:
        if not rows:
            return (), math.nan
        generated_at_s = min(stamp for stamp, _, _ in rows)
        points = {}
        for _, hours, value in rows:
            start_s = generated_at_s + hours * 3600.0
            points[start_s] = IntensityPoint(start_s, start_s + self.forecast_step_s, value)
        ordered = [points[k] for k in sorted(points)]
        # Later horizons never overlap earlier ones: each point ends where the next begins.
        trimmed = [
            IntensityPoint(p.start_s, min(p.end_s, q.start_s), p.g_per_kwh)
            for p, q in itertools.pairwise(ordered)
        ] + ordered[-1:]
        return tuple(trimmed), generated_at_s

    def _instant(self, query: str, at_s: float) -> list[tuple[dict[str, str], float]]:
        url = f"{self.url.rstrip('/')}/api/v1/query"
        body = _get_json(
            self.session,
            url,
            params={"query": query, "time": f"{at_s:.3f}", "timeout": f"{int(self.timeout_s)}s"},
            timeout_s=self.timeout_s,
        )
        try:
            assert isinstance(body, dict) and body.get("status") == "success"
            result = body["data"]["result"]
            return [
                ({str(k): str(v) for k, v in item["metric"].items()}, float(item["value"][1]))
                for item in result
            ]
        except (AssertionError, KeyError, TypeError, ValueError, IndexError):
            raise CarbonSourceError(
                f"{url} answering {query!r}: not an instant vector ({str(body)[:120]})"
            ) from None


def _match(stamps: list[tuple[dict[str, str], float]], labels: Mapping[str, str]) -> float:
    """The timestamp() answer for the series with these labels (its name dropped)."""
    wanted = {k: v for k, v in labels.items() if k != "__name__"}
    for stamp_labels, stamp in stamps:
        if stamp_labels == wanted:
            return stamp
    return math.nan


@dataclass
class _WebApiProvider(Provider):
    """A web service asked about the cluster's zones under its own names (`zone_map`: cluster
    zone -> the service's; None: the same names)."""

    url: str = ""
    zone_map: dict[str, str] | None = None
    session: requests.Session = field(default_factory=requests.Session, repr=False)

    def describe(self) -> str:
        return f"{self.kind} at {self.url}"


@dataclass
class CarbonAwareSdkProvider(_WebApiProvider):
    """The Green Software Foundation carbon-aware-sdk WebAPI (values in g/kWh)."""

    kind: ClassVar[str] = CARBON_AWARE_SDK
    signal: str = AVERAGE

    def fetch(self, now_s: float, zones: Iterable[str]) -> Readings:
        names = _reverse(self.zone_map, zones)
        if not names:
            return Readings()
        base = self.url.rstrip("/")
        locations = [("location", name) for name in sorted(names)]
        window = [
            ("time", _rfc3339(now_s - SDK_LOOKBACK_S)),
            ("toTime", _rfc3339(now_s)),
        ]
        where = f"{base}/emissions/bylocations"
        body = _get_json(self.session, where, params=locations + window, timeout_s=self.timeout_s)
        try:
            current = carbon_aware_emissions(body, self.signal, where)
            where = f"{base}/emissions/forecasts/current"
            forecast_body = _get_json(
                self.session, where, params=locations, timeout_s=self.timeout_s
            )
            forecasts = carbon_aware_forecasts(forecast_body, self.signal, where)
        except CarbonDataError as exc:
            raise CarbonSourceError(str(exc)) from None
        readings = {}
        for reading in current:
            if reading.name in names:
                readings[reading.name] = reading
        for location, (points, generated_at_s) in forecasts.items():
            if location not in names:
                continue
            base_reading = readings.get(location)
            readings[location] = IntensityReading(
                location,
                self.signal,
                self.name,
                base_reading.g_per_kwh if base_reading else math.nan,
                base_reading.observed_at_s if base_reading else generated_at_s,
                points,
                generated_at_s,
            )
        return Readings(
            zones=tuple(
                _renamed(_with_source(r, self.name), names[r.name]) for r in readings.values()
            )
        )


def _with_source(reading: IntensityReading, source: str) -> IntensityReading:
    return IntensityReading(
        reading.name,
        reading.signal,
        source,
        reading.g_per_kwh,
        reading.observed_at_s,
        reading.forecast,
        reading.forecast_generated_at_s,
    )


def _rfc3339(at_s: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ElectricityMapsProvider(_WebApiProvider):
    """Electricity Maps API v3: latest and forecast per zone (average, g/kWh)."""

    kind: ClassVar[str] = ELECTRICITY_MAPS
    url: str = ELECTRICITY_MAPS_URL
    token_file: str | None = None

    def fetch(self, now_s: float, zones: Iterable[str]) -> Readings:
        names = _reverse(self.zone_map, zones)
        headers = {}
        if self.token_file:
            headers["auth-token"] = _secret(self.token_file, f"{self.name}.tokenFile")
        base = self.url.rstrip("/")

        def get(endpoint: str, service_zone: str) -> tuple[object, str]:
            """One zone's answer from `endpoint`, and where it came from (for errors)."""
            where = f"{base}/v3/carbon-intensity/{endpoint}"
            body = _get_json(
                self.session,
                where,
                params={"zone": service_zone},
                headers=headers,
                timeout_s=self.timeout_s,
            )
            return body, f"{where}?zone={service_zone}"

        readings = []
        for service_zone, cluster_zone in sorted(names.items()):
            try:
                latest = electricity_maps_latest(*get("latest", service_zone))
                _, points, generated_at_s = electricity_maps_forecast(
                    *get("forecast", service_zone)
                )
            except CarbonDataError as exc:
                raise CarbonSourceError(str(exc)) from None
            readings.append(
                IntensityReading(
                    cluster_zone,
                    latest.signal,
                    self.name,
                    latest.g_per_kwh,
                    latest.observed_at_s,
                    points,
                    generated_at_s,
                )
            )
        return Readings(zones=tuple(readings))


@dataclass
class WattTimeProvider(_WebApiProvider):
    """WattTime API v3: a region's forecast (lbs/MWh, converted); its first point is now."""

    kind: ClassVar[str] = WATTTIME
    url: str = WATTTIME_URL
    username_file: str = ""
    password_file: str = ""
    signal_type: str = "co2_moer"
    _token: str | None = field(default=None, repr=False)
    _token_at_s: float = field(default=-math.inf, repr=False)

    def describe(self) -> str:
        return f"{self.kind} {self.signal_type} at {self.url}"

    def fetch(self, now_s: float, zones: Iterable[str]) -> Readings:
        names = _reverse(self.zone_map, zones)
        base = self.url.rstrip("/")
        readings = []
        for region, cluster_zone in sorted(names.items()):
            where = f"{base}/v3/forecast"
            params = {"region": region, "signal_type": self.signal_type}
            try:
                body = self._authorised_get(where, params)
                reading = watttime_forecast(body, f"{where}?region={region}")
            except CarbonDataError as exc:
                raise CarbonSourceError(str(exc)) from None
            readings.append(_renamed(_with_source(reading, self.name), cluster_zone))
        return Readings(zones=tuple(readings))

    def _authorised_get(self, url: str, params: Mapping[str, str]) -> object:
        for attempt in (1, 2):
            headers = {"Authorization": f"Bearer {self._login()}"}
            try:
                return _get_json(
                    self.session, url, params=params, headers=headers, timeout_s=self.timeout_s
                )
            except CarbonSourceError as exc:
                if attempt == 1 and "HTTP 401" in str(exc):
                    self._token = None  # expired early: log in once more
                    continue
                raise
        raise AssertionError("unreachable")

    def _login(self) -> str:
        if self._token is not None and time.monotonic() - self._token_at_s < WATTTIME_TOKEN_S:
            return self._token
        username = _secret(self.username_file, f"{self.name}.usernameFile")
        password = _secret(self.password_file, f"{self.name}.passwordFile")
        url = f"{self.url.rstrip('/')}/login"
        body = _get_json(self.session, url, auth=(username, password), timeout_s=self.timeout_s)
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise CarbonSourceError(f"{url}: the answer has no token")
        self._token, self._token_at_s = token, time.monotonic()
        return token


@dataclass
class FileProvider(Provider):
    """A YAML/JSON file of zone and node intensities (`livedata.carbon_apis`' format)."""

    kind: ClassVar[str] = STATIC_FILE
    path: str = ""

    def describe(self) -> str:
        return f"{self.kind} {self.path}"

    def fetch(self, now_s: float, zones: Iterable[str]) -> Readings:
        try:
            zone_readings, node_readings = read_intensity_file(Path(self.path))
        except CarbonDataError as exc:
            raise CarbonSourceError(str(exc)) from None
        return Readings(
            zones=tuple(_with_source(r, self.name) for r in zone_readings),
            nodes=tuple(_with_source(r, self.name) for r in node_readings),
        )


KINDS = (PROMETHEUS, PROMETHEUS_NODE, CARBON_AWARE_SDK, ELECTRICITY_MAPS, WATTTIME, STATIC_FILE)


def provider_from_config(
    raw: object,
    where: str,
    *,
    index: int,
    timeout_s: float,
    prometheus_url: str | None,
) -> Provider:
    """The provider one `sources[i]` entry describes; ValueError naming the key at fault.

    `prometheus_url` is the service's `--prometheus-url`, used by Prometheus sources without
    a `url` of their own (None outside live mode: then such a source needs its own url).
    """
    config = _Config(raw, where)
    kind = config.text("kind")
    if kind not in KINDS:
        raise ValueError(f"{where}.kind: one of {', '.join(KINDS)} is required, got {kind!r}")
    name = config.text("name", f"{kind}-{index}")
    max_age = config.raw.get("maxAgeSeconds")
    if max_age is not None and (
        isinstance(max_age, bool) or not isinstance(max_age, int | float) or not max_age > 0
    ):
        raise ValueError(f"{where}.maxAgeSeconds: a number > 0 is required, got {max_age!r}")
    common: dict[str, Any] = {
        "name": name,
        "max_age_s": None if max_age is None else float(max_age),
        "timeout_s": timeout_s,
    }
    provider: Provider
    if kind in (PROMETHEUS, PROMETHEUS_NODE):
        url = config.optional_text("url") or prometheus_url
        if not url:
            raise ValueError(f"{where}.url: required here (no --prometheus-url outside live mode)")
        node_local = kind == PROMETHEUS_NODE
        provider = PrometheusProvider(
            **common,
            url=url,
            query=config.text("query"),
            key_label=config.text(
                "nodeLabel" if node_local else "zoneLabel", "node" if node_local else "zone"
            ),
            signal=config.signal(AVERAGE),
            forecast_query=None if node_local else config.optional_text("forecastQuery"),
            horizon_label="hours_ahead"
            if node_local
            else config.text("horizonLabel", "hours_ahead"),
            forecast_step_s=3600.0 if node_local else config.number("forecastStepSeconds", 3600.0),
            node_local=node_local,
        )
    elif kind == CARBON_AWARE_SDK:
        provider = CarbonAwareSdkProvider(
            **common, url=config.text("url"), signal=config.signal(None), zone_map=config.zone_map()
        )
    elif kind == ELECTRICITY_MAPS:
        provider = ElectricityMapsProvider(
            **common,
            url=config.text("url", ELECTRICITY_MAPS_URL),
            token_file=config.optional_text("tokenFile"),
            zone_map=config.zone_map(),
        )
    elif kind == WATTTIME:
        signal_type = config.text("signalType", "co2_moer")
        if signal_type not in WATTTIME_SIGNALS:
            raise ValueError(
                f"{where}.signalType: one of {', '.join(WATTTIME_SIGNALS)} is required, "
                f"got {signal_type!r}"
            )
        provider = WattTimeProvider(
            **common,
            url=config.text("url", WATTTIME_URL),
            username_file=config.text("usernameFile"),
            password_file=config.text("passwordFile"),
            signal_type=signal_type,
            zone_map=config.zone_map(),
        )
    else:
        provider = FileProvider(**common, path=config.text("path"))
    config.done()
    return provider
