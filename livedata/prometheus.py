"""Reading Prometheus: bounded in time, every failure a `CollectError` that says what happened.

`PrometheusReader` runs range and instant queries on Prometheus's HTTP API with `requests` (a
client library would bring pandas into every service's image), with a per-request timeout (also
sent to Prometheus as its query timeout), and retries only what is safe to retry (connection
failures, 502/503/504). Anything unexpected (unreachable server, HTTP errors, non-JSON, JSON of
the wrong shape, non-numeric points) raises `CollectError` naming the URL, the query and the
problem. Answers come back as `Series`: labels plus numpy arrays of Unix seconds and values,
parsed in C (a 1,000-node chunk has millions of points). No pandas.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from livedata.collect_config import CollectConfig


class CollectError(RuntimeError):
    """Prometheus could not be read; the message names the URL, the query and the problem."""


class _HttpStatusError(RuntimeError):
    """Prometheus answered with a status other than 200 (`_http_problem` says what it said)."""


class _ReaderRetry(Retry):
    """The reader's retry policy, a class of its own so that urllib3's notices of its retries
    can be told apart from those of other clients in the process (the Kubernetes client's)."""


class _DropReaderRetryNotices(logging.Filter):
    """Drops urllib3's "Retrying (...) after connection broken" warning for a reader's request.

    Each retry of an unreachable Prometheus printed one (four before the one error of
    ``training.fit``); the reader's `CollectError` names the URL, the query and the final cause,
    which is all a person needs. Other clients' retry notices pass.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and args and isinstance(args[0], _ReaderRetry))


logging.getLogger("urllib3.connectionpool").addFilter(_DropReaderRetryNotices())


@dataclass(frozen=True)
class Series:
    """One series of a query answer: its labels and its points (Unix seconds, values)."""

    labels: Mapping[str, str]
    timestamps_s: np.ndarray
    values: np.ndarray


# --------------------------------------------------------------------------------------------
# Answers (pure)


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def parse_result(result: object, *, instant: bool, where: str) -> list[Series]:
    """Validate `data.result` of a range (matrix) or instant (vector) answer into `Series`."""
    if not isinstance(result, list):
        raise CollectError(f"{where}: data.result is {type(result).__name__}, expected a list")
    key = "value" if instant else "values"
    parsed = []
    for index, item in enumerate(result):
        if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
            raise CollectError(
                f"{where}: result[{index}] has no 'metric' object: {_describe(item)}"
            )
        points = [item.get(key)] if instant else item.get(key)
        pairs = _points_array(points)
        if pairs is None:  # say exactly what is wrong, point by point (the slow path)
            _explain_bad_points(points, item, f"{where}: result[{index}]", key)
        labels = {str(k): str(v) for k, v in item["metric"].items()}
        parsed.append(Series(labels, pairs[:, 0].copy(), pairs[:, 1].copy()))
    return parsed


def _points_array(points: object) -> np.ndarray | None:
    """`[[time, "value"], ...]` as an (n, 2) float array, or None if it is not one. numpy parses
    the value strings ("NaN", "+Inf" too) in C: a 1,000-node chunk has millions of points."""
    if not isinstance(points, list):
        return None
    if not points:
        return np.empty((0, 2))
    try:
        pairs = np.array(points, dtype=float)
    except (TypeError, ValueError):
        return None
    return pairs if pairs.ndim == 2 and pairs.shape[1] == 2 else None


def _explain_bad_points(points: object, item: dict, where: str, key: str) -> NoReturn:
    """Raise the `CollectError` that says what is wrong with points `_points_array` refused."""
    if not isinstance(points, list) or not all(
        isinstance(p, list | tuple) and len(p) == 2 for p in points
    ):
        raise CollectError(
            f"{where}.{key} is not a list of [time, value] pairs: {_describe(item.get(key))}"
        )
    for point in points:
        try:
            float(point[0]), float(point[1])
        except (TypeError, ValueError) as error:
            raise CollectError(
                f"{where} ({item['metric']}) has a non-numeric point: {error}"
            ) from error
    raise CollectError(f"{where}.{key} is not a list of [time, value] pairs")


# --------------------------------------------------------------------------------------------
# Talking to Prometheus (the I/O edge)


class PrometheusReader:
    """Queries one Prometheus with bounded time and turns every failure into `CollectError`."""

    def __init__(self, config: CollectConfig) -> None:
        self.config = config
        self._last_response: requests.Response | None = None
        session = requests.Session()
        session.hooks["response"].append(self._remember)
        retry = _ReaderRetry(
            total=config.retries,
            connect=config.retries,
            read=False,  # a server too slow once is too slow twice: keep the total time bounded
            status=config.retries,
            backoff_factor=0.2,
            status_forcelist=(502, 503, 504),
            allowed_methods=frozenset({"GET"}),
            raise_on_status=False,
        )
        self._base_url = config.url.rstrip("/")
        session.mount(self._base_url, HTTPAdapter(max_retries=retry))
        self._session = session

    def _remember(self, response: requests.Response, *args: object, **kwargs: object) -> None:
        self._last_response = response

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> PrometheusReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def range(self, query: str, start_s: float, end_s: float) -> list[Series]:
        """A range (matrix) query: each series' points from `start_s` to `end_s`, `step_s` apart."""
        step = f"{int(self.config.step_s)}"
        result = self._call(
            query,
            lambda: self._get(
                "query_range",
                {
                    "query": query,
                    "start": round(start_s),
                    "end": round(end_s),
                    "step": step,
                    "timeout": self._query_timeout,
                },
            )["result"],
        )
        return parse_result(result, instant=False, where=self._where(query))

    def instant(self, query: str, at_s: float) -> list[Series]:
        """An instant (vector) query: every series' one point, evaluated at `at_s`."""
        result = self._call(
            query,
            lambda: self._get(
                "query", {"query": query, "time": f"{at_s:.3f}", "timeout": self._query_timeout}
            )["result"],
        )
        return parse_result(result, instant=True, where=self._where(query))

    def label_values(self, label: str, start_s: float, end_s: float) -> list[str]:
        """Every value `label` takes on any series between `start_s` and `end_s` (read from the
        index only: cheap even for a large fleet over a long range)."""
        where = f"Prometheus at {self.config.url} listing label {label!r}"
        values = self._call(
            label,
            lambda: self._get(
                f"label/{label}/values", {"start": f"{start_s:.3f}", "end": f"{end_s:.3f}"}
            ),
            where=where,
        )
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise CollectError(f"{where}: expected a list of strings, got {_describe(values)}")
        return values

    def _get(self, endpoint: str, params: Mapping[str, object]) -> Any:
        """GET /api/v1/`endpoint`: the answer's `data` (KeyError, TypeError or ValueError when
        the JSON has the wrong shape, which `_call` explains from the response)."""
        response = self._session.get(
            f"{self._base_url}/api/v1/{endpoint}", params=params, timeout=self.config.timeout_s
        )
        if response.status_code != 200:
            status = response.status_code
            raise _HttpStatusError(f"HTTP Status Code {status} ({response.content!r})")
        return response.json()["data"]

    @property
    def _query_timeout(self) -> str:
        # Prometheus durations take whole numbers per unit ("1.25s" is bad_data): send ms.
        return f"{max(1, round(self.config.timeout_s * 1000))}ms"

    def _where(self, query: str) -> str:
        return f"Prometheus at {self.config.url} answering {query!r}"

    def _call(self, query: str, request: Callable[[], object], where: str | None = None) -> object:
        self._last_response = None
        where = where or self._where(query)
        try:
            return request()
        except _HttpStatusError as error:
            raise CollectError(f"{where}: {self._http_problem() or error}") from error
        except requests.exceptions.JSONDecodeError as error:
            raise CollectError(
                f"{where}: the answer is not JSON ({self._body_excerpt()})"
            ) from error
        except requests.exceptions.Timeout as error:
            raise CollectError(
                f"{where}: no answer within the {self.config.timeout_s:g} s timeout ({error})"
            ) from error
        except requests.exceptions.ConnectionError as error:
            raise CollectError(f"{where}: cannot connect ({_root_cause(error)})") from error
        except requests.exceptions.RequestException as error:
            raise CollectError(f"{where}: request failed ({error})") from error
        except (KeyError, TypeError, ValueError) as error:
            raise CollectError(f"{where}: {self._envelope_problem()}") from error

    def _body_excerpt(self) -> str:
        response = self._last_response
        if response is None:
            return "no response body"
        body = response.text[:120]
        content_type = response.headers.get("Content-Type", "no Content-Type")
        return f"HTTP {response.status_code}, {content_type}, body starts {body!r}"

    def _http_problem(self) -> str | None:
        response = self._last_response
        if response is None:
            return None
        try:
            payload = response.json()
            detail = f"{payload.get('errorType', 'error')}: {payload['error']}"
        except (ValueError, KeyError, TypeError, AttributeError):
            detail = f"body starts {response.text[:200]!r}"
        return f"HTTP {response.status_code} {response.reason}: {detail}"

    def _envelope_problem(self) -> str:
        response = self._last_response
        if response is None:
            return "no usable answer"
        try:
            payload = response.json()
        except ValueError:
            return f"the answer is not JSON ({self._body_excerpt()})"
        if isinstance(payload, dict) and payload.get("status") == "error":
            return f"status 'error': {payload.get('errorType', '?')}: {payload.get('error', '?')}"
        if not isinstance(payload, dict):
            return f"JSON of the wrong shape: a {type(payload).__name__}, expected an object"
        return (
            "JSON of the wrong shape: expected {'status': 'success', 'data': {'result': [...]}}, "
            f"got {_describe(payload)}"
        )


def _root_cause(error: BaseException) -> str:
    while error.__context__ is not None and error.__context__ is not error:
        error = error.__context__
    return f"{type(error).__name__}: {error}"
