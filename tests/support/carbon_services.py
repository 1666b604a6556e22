"""Carbon intensity services for tests: the carbon-aware-sdk WebAPI, and recorded answers.

`carbon_aware_sdk(data)` serves a small HTTP server that answers as the Green Software
Foundation carbon-aware-sdk WebAPI does. Same paths, same query parameters, same JSON
(ASP.NET's camelCase, timestamps with a `+00:00` offset), for the two endpoints the extender
reads:

- `GET /emissions/bylocations?location=A&location=B[&time=..&toTime=..]`: every measured
  value of those locations inside [time, toTime] (all of them without bounds), as
  `[{"location", "time", "rating", "duration": "hh:mm:ss"}]`; 204 with no body when nothing
  matches; 400 ValidationProblemDetails without a location.
- `GET /emissions/forecasts/current?location=A&location=B[&dataStartAt&dataEndAt&windowSize]`:
  the latest forecast per location, `{"generatedAt", "requestedAt", "location",
  "dataStartAt", "dataEndAt", "windowSize", "optimalDataPoints", "forecastData"}`
  (SDK 1.x shape; `forecastData` points are `{"location", "timestamp", "duration" (minutes),
  "value"}`, rolling means over `windowSize` minutes when it is given).

The data comes from the test (`emissions`, `forecasts`), which may change it while the server
runs; `requests` records every request's path and query for assertions.

`recorded_service(routes)` serves fixed answers (the recorded shapes in
`tests/fixtures/carbon/`) by path, checking a header when a route asks for one: Electricity
Maps' `auth-token`, WattTime's basic-auth `/login` and `Authorization: Bearer` token.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from livedata.carbon import parse_timestamp_s


def iso(at_s: float) -> str:
    """A timestamp as the SDK writes DateTimeOffset values."""
    return datetime.fromtimestamp(at_s, UTC).isoformat()


@dataclass
class SdkData:
    # location -> [(time_s, rating g/kWh, duration_s)]
    emissions: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    # location -> (generated_at_s, [(start_s, value g/kWh)], point minutes)
    forecasts: dict[str, tuple[float, list[tuple[float, float]], int]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, list[str]]]] = field(default_factory=list)


def _timespan(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _problem(errors: dict[str, list[str]]) -> dict:
    return {
        "type": "https://tools.ietf.org/html/rfc7231#section-6.5.1",
        "title": "One or more validation errors occurred.",
        "status": 400,
        "traceId": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
        "errors": errors,
    }


class _Handler(BaseHTTPRequestHandler):
    data: SdkData

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: object | None) -> None:
        payload = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            content_type = (
                "application/problem+json; charset=utf-8"
                if status == 400
                else "application/json; charset=utf-8"
            )
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        self.data.requests.append((url.path, query))
        locations = [value for value in query.get("location", []) if value]
        if url.path not in ("/emissions/bylocations", "/emissions/forecasts/current"):
            self._send(404, None)
            return
        if not locations:
            self._send(400, _problem({"location": ["The location field is required."]}))
            return
        if url.path == "/emissions/bylocations":
            self._emissions(locations, query)
        else:
            self._forecasts(locations, query)

    def _emissions(self, locations: list[str], query: dict[str, list[str]]) -> None:
        start = parse_timestamp_s(query["time"][0], "time") if "time" in query else None
        end = parse_timestamp_s(query["toTime"][0], "toTime") if "toTime" in query else None
        body = [
            {
                "location": location,
                "time": iso(at_s),
                "rating": rating,
                "duration": _timespan(duration_s),
            }
            for location in locations
            for at_s, rating, duration_s in self.data.emissions.get(location, [])
            if (start is None or at_s >= start) and (end is None or at_s <= end)
        ]
        self._send(200, body) if body else self._send(204, None)

    def _forecasts(self, locations: list[str], query: dict[str, list[str]]) -> None:
        now = datetime.now(UTC).isoformat()
        body = []
        for location in locations:
            if location not in self.data.forecasts:
                continue
            generated_at_s, points, minutes = self.data.forecasts[location]
            window = int(query["windowSize"][0]) if "windowSize" in query else minutes
            steps = max(1, window // minutes)
            values = [value for _, value in points]
            means = [sum(values[i : i + steps]) / steps for i in range(len(values) - steps + 1)]
            data = [
                {
                    "location": location,
                    "timestamp": iso(points[i][0]),
                    "duration": window,
                    "value": mean,
                }
                for i, mean in enumerate(means)
            ]
            optimal = [min(data, key=lambda p: p["value"])] if data else []
            body.append(
                {
                    "generatedAt": iso(generated_at_s),
                    "requestedAt": now,
                    "location": location,
                    "dataStartAt": data[0]["timestamp"] if data else now,
                    "dataEndAt": data[-1]["timestamp"] if data else now,
                    "windowSize": window,
                    "optimalDataPoints": optimal,
                    "forecastData": data,
                }
            )
        self._send(200, body)


@contextlib.contextmanager
def carbon_aware_sdk(data: SdkData) -> Iterator[str]:
    """Serve `data` as the carbon-aware-sdk WebAPI on 127.0.0.1; yields the base URL."""
    handler = type("SdkHandler", (_Handler,), {"data": data})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="fake-carbon-aware-sdk")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class Route:
    """A recorded answer: status and JSON body; `header` (name, value) the request must carry."""

    body: object
    status: int = 200
    header: tuple[str, str] | None = None


class _RecordedHandler(BaseHTTPRequestHandler):
    routes: dict[str, Route]
    seen: list[tuple[str, dict[str, list[str]], dict[str, str]]]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        self.seen.append((url.path, parse_qs(url.query), dict(self.headers.items())))
        route = self.routes.get(url.path)
        if route is None:
            status, body = 404, {"error": f"no route {url.path}"}
        elif route.header is not None and self.headers.get(route.header[0]) != route.header[1]:
            status, body = 401, {"error": "unauthorized"}
        else:
            status, body = route.status, route.body
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@contextlib.contextmanager
def recorded_service(
    routes: dict[str, Route],
) -> Iterator[tuple[str, list[tuple[str, dict[str, list[str]], dict[str, str]]]]]:
    """Serve `routes` on 127.0.0.1; yields (base URL, the requests seen)."""
    seen: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []
    handler = type("RecordedHandler", (_RecordedHandler,), {"routes": routes, "seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="recorded-carbon-service")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
