"""The HTTP face of the extender: kube-scheduler's verbs plus health, status and metrics.

``create_app(runtime)`` builds a FastAPI app whose handlers take the raw request (no model
validation layer: the body is parsed once, by ``extender.protocol``) and answer with orjson
bytes. A scoring request reads the body under a size cap, parses it, reads the runtime's
current model and cluster view (two references, no lock held while scoring, no I/O) and
scores with ``extender.scoring.assess``.

kube-scheduler must never be left without an answer it can read:
- unreadable requests (bad JSON, no Pod, a malformed node object) get 400 and a message;
- a request over an input limit (``extender.limits``: nesting depth, candidate count) gets 400,
  a body over ``max_body_bytes`` 413, each with a message naming the limit and the value;
- an unexpected exception is logged and counted and answered with 200 and a neutral answer:
  the filter passes every candidate, prioritize gives every candidate 0. The extender then
  costs the pod nothing instead of blocking it.

Each answer carries ``Server-Timing: read;dur=<ms>, app;dur=<ms>``: the time spent receiving
the body (which includes waiting for a client that writes headers and body separately) and the
time from the body in hand to the answer built. The latency histogram of ``/metrics`` records
their sum.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from extender.limits import LimitError, body_too_large, check_json_depth, check_node_count
from extender.protocol import (
    ExtenderArgs,
    ProtocolError,
    filter_result,
    parse_extender_args,
    pod_key,
    prioritize_result,
    prioritize_result_arrays,
)
from extender.runtime import Runtime
from extender.scoring import Assessment, assess
from livedata.pod_resources import pod_cpu_demand_cores
from predictor.reload import ModelState

log = logging.getLogger(__name__)

JSON = "application/json"


class WarningThrottle:
    """At most one warning per (verb, kind) every ``interval_s``; the rest only counted.

    A client sending bad requests in a loop must not turn each one into a synchronous write to
    stderr on the request path. Every refusal is still counted in ``/metrics``; the next line
    logged for the same (verb, kind) says how many were left out. Used from the event loop only.
    """

    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def warn(self, verb: str, kind: str, message: str) -> None:
        now_s = self._clock()
        last_s, left_out = self._last.get((verb, kind), (-math.inf, 0))
        if now_s - last_s < self.interval_s:
            self._last[(verb, kind)] = (last_s, left_out + 1)
            return
        self._last[(verb, kind)] = (now_s, 0)
        if left_out:
            message += f" ({left_out} more {kind} requests since the last such line)"
        log.warning("%s: %s", verb, message)


@dataclass(frozen=True)
class Scored:
    """One request's assessment and the model (predictor + curves) it was computed with."""

    assessment: Assessment
    model: ModelState | None


async def read_body_capped(request: Request, limit_bytes: int) -> bytes:
    """The whole request body, or a 413 LimitError as soon as it passes ``limit_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise body_too_large(limit_bytes, int(declared))
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit_bytes:
            raise body_too_large(limit_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _json(
    payload: object,
    status_code: int = 200,
    duration_s: float | None = None,
    read_s: float = 0.0,
) -> Response:
    headers = None
    if duration_s is not None:
        app_ms, read_ms = (duration_s - read_s) * 1000.0, read_s * 1000.0
        headers = {"Server-Timing": f"read;dur={read_ms:.3f}, app;dur={app_ms:.3f}"}
    return Response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type=JSON,
        headers=headers,
    )


# ---- answers per verb --------------------------------------------------------------------


def _filter_answer(args: ExtenderArgs, scored: Scored, runtime: Runtime) -> object:
    assessment = scored.assessment
    return filter_result(args, assessment.failed, assessment.unresolvable)


def _prioritize_answer(args: ExtenderArgs, scored: Scored, runtime: Runtime) -> object:
    return prioritize_result_arrays(scored.assessment.names, scored.assessment.score)


def _explain_answer(args: ExtenderArgs, scored: Scored, runtime: Runtime) -> object:
    # The model the scores were computed with, not runtime.model: a swap may have happened since.
    model, assessment = scored.model, scored.assessment
    return {
        "pod": pod_key(args.pod),
        "demand_cores": assessment.demand_cores,
        "bundle_version": model.predictor.version if model else None,
        "curves_built_at_s": model.built_at_s if model else None,
        "weights": runtime.profile.weights,
        "filters": [plugin.name for plugin in runtime.profile.filters],
        "telemetry_ttl_s": runtime.telemetry_ttl_s,
        "nodes": assessment.explain(),
    }


def _neutral_filter(args: ExtenderArgs | None) -> object:
    if args is None:
        return {"NodeNames": [], "FailedNodes": {}, "Error": "extender internal error"}
    return filter_result(args, {})


def _neutral_prioritize(args: ExtenderArgs | None) -> object:
    if args is None:
        return []
    return prioritize_result((name, 0) for name in args.candidate_names)


Answer = Callable[[ExtenderArgs, Scored, Runtime], object]
Neutral = Callable[[ExtenderArgs | None], object]


def create_app(runtime: Runtime) -> FastAPI:
    """The FastAPI app serving ``runtime``; starting and stopping the runtime is the caller's."""
    app = FastAPI(
        title="power-aware-scheduler extender",
        description="kube-scheduler extender v1: filter and prioritize by predicted power",
    )
    app.state.runtime = runtime
    metrics = runtime.metrics
    decisions = metrics.decisions
    limits = runtime.config.limits
    warnings = WarningThrottle()

    def assess_request(args: ExtenderArgs, now_s: float, verb: str) -> Scored:
        try:
            demand_cores = pod_cpu_demand_cores(args.pod)
        except ValueError as exc:
            raise ProtocolError(f"Pod {pod_key(args.pod)}: {exc}") from None
        model = runtime.model
        assessment = assess(
            runtime.state.view(now_s),
            model.curves if model is not None else None,
            args.candidates,
            demand_cores,
            runtime.profile,
            now_s=now_s,
            telemetry_ttl_s=runtime.telemetry_ttl_s,
            pod=args.pod,
            run_filters=verb != "prioritize",
            run_scores=verb != "filter",
        )
        if assessment.unknown_nodes:
            metrics.unknown_nodes.inc(assessment.unknown_nodes)
        runtime.note_unscored(assessment.no_telemetry_nodes + assessment.no_curve_nodes, now_s)
        return Scored(assessment, model)

    def record_decisions(verb: str, scored: Scored) -> None:
        """Count the answer per node for /metrics; a failure here never changes the answer."""
        assessment = scored.assessment
        cycle = assessment.cycle
        try:
            if verb == "prioritize":
                decisions.record_prioritize(cycle.view.names, cycle.candidates, assessment.score)
            elif verb == "filter":
                decisions.record_filter(cycle.view.names, cycle.candidates, assessment.failed_by)
        except Exception:
            metrics.errors.labels(verb=verb, kind="internal").inc()
            log.exception("%s: counting the decision for /metrics failed", verb)

    async def handle(request: Request, verb: str, answer: Answer, neutral: Neutral) -> Response:
        started = time.perf_counter()
        read_s = 0.0
        args: ExtenderArgs | None = None
        try:
            body = await read_body_capped(request, limits.max_body_bytes)
            read_s = time.perf_counter() - started
            check_json_depth(body, limits.max_json_depth)
            args = parse_extender_args(body)
            check_node_count(len(args.candidate_names), limits.max_nodes)
            scored = assess_request(args, runtime.clock(), verb)
            payload, code = answer(args, scored, runtime), 200
            record_decisions(verb, scored)
        except LimitError as exc:
            metrics.errors.labels(verb=verb, kind=exc.kind).inc()
            warnings.warn(verb, exc.kind, str(exc))
            payload, code = {"Error": str(exc)}, exc.status_code
        except ClientDisconnect:  # the scheduler gave up (httpTimeout): nobody reads an answer
            metrics.errors.labels(verb=verb, kind="client_disconnect").inc()
            warnings.warn(verb, "client_disconnect", "client disconnected before the body was read")
            payload, code = {"Error": "client disconnected"}, 400
        except ProtocolError as exc:
            metrics.errors.labels(verb=verb, kind="bad_request").inc()
            warnings.warn(verb, "bad_request", f"unreadable request: {exc}")
            payload, code = {"Error": str(exc)}, 400
        except Exception:
            metrics.errors.labels(verb=verb, kind="internal").inc()
            log.exception("%s: internal error; answering neutrally so the pod is not held", verb)
            payload, code = neutral(args), 200
        duration_s = time.perf_counter() - started
        try:
            response = _json(payload, code, duration_s, read_s)
        except Exception:  # an answer that cannot be encoded must not become a 500 either
            metrics.errors.labels(verb=verb, kind="internal").inc()
            log.exception("%s: answer could not be encoded", verb)
            response = _json(neutral(args), 200, duration_s, read_s)
        metrics.observe_request(verb, response.status_code, duration_s)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request",
                extra={
                    "verb": verb,
                    "code": response.status_code,
                    "pod": pod_key(args.pod) if args else None,
                    "nodes": len(args.candidate_names) if args else None,
                    "duration_ms": round(duration_s * 1000.0, 3),
                },
            )
        return response

    @app.post("/filter")
    async def filter_verb(request: Request) -> Response:
        return await handle(request, "filter", _filter_answer, _neutral_filter)

    @app.post("/prioritize")
    async def prioritize_verb(request: Request) -> Response:
        if request.query_params.get("explain") in ("1", "true", "yes"):
            return await handle(request, "explain", _explain_answer, _neutral_prioritize)
        return await handle(request, "prioritize", _prioritize_answer, _neutral_prioritize)

    @app.post("/explain")
    async def explain_verb(request: Request) -> Response:
        return await handle(request, "explain", _explain_answer, _neutral_prioritize)

    def observed(verb: str, build: Callable[[], Response]) -> Response:
        started = time.perf_counter()
        try:
            response = build()
        except Exception:
            log.exception("%s failed", verb)
            metrics.errors.labels(verb=verb, kind="internal").inc()
            response = _json({"error": f"{verb} failed; see the extender log"}, 503)
        metrics.observe_request(verb, response.status_code, time.perf_counter() - started)
        return response

    @app.get("/healthz")
    async def healthz() -> Response:
        return observed("healthz", lambda: _json({"status": "ok"}))

    @app.get("/readyz")
    async def readyz() -> Response:
        def build() -> Response:
            readiness = runtime.readiness()
            body: dict[str, Any] = {"ready": readiness.ready, "reasons": list(readiness.reasons)}
            return _json(body, 200 if readiness.ready else 503)

        return observed("readyz", build)

    @app.get("/status")
    async def status() -> Response:
        return observed("status", lambda: _json(runtime.status()))

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        # Per-node series make a scrape of a large fleet cost milliseconds: render them in a
        # worker thread, so that the event loop keeps answering the scheduler meanwhile.
        return await run_in_threadpool(
            observed,
            "metrics",
            lambda: Response(metrics.render(), media_type=CONTENT_TYPE_LATEST),
        )

    return app
