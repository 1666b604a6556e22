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

kube-scheduler's verbs (``POST /filter`` and ``/prioritize`` without a query string, ``POST
/explain``) are answered straight from ASGI (``ExtenderApp``), ahead of FastAPI's routing,
request and response objects and middleware: measured on a real kube-scheduler those cost
each pod more than the scoring itself (docs/results.md, "What the extender costs
kube-scheduler"). Every other path, and the verbs with a query (``?explain=1``), go through
FastAPI. Both ways run the same ``handle``, so the answers are the same to the byte.

Each answer carries ``Server-Timing: read;dur=<ms>, app;dur=<ms>``: the time spent receiving
the body (which includes waiting for a client that writes headers and body separately) and the
time from the body in hand to the answer built. The latency histogram of ``/metrics`` records
their sum.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
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
    PrioritizeAnswers,
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


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ReadBody = Callable[[int], Awaitable[bytes]]


def _check_declared_length(declared: str | None, limit_bytes: int) -> None:
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise body_too_large(limit_bytes, int(declared))


async def read_body_capped(request: Request, limit_bytes: int) -> bytes:
    """The whole request body, or a 413 LimitError as soon as it passes ``limit_bytes``."""
    _check_declared_length(request.headers.get("content-length"), limit_bytes)
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit_bytes:
            raise body_too_large(limit_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


async def receive_body_capped(scope: Scope, receive: Receive, limit_bytes: int) -> bytes:
    """``read_body_capped`` on bare ASGI: the same limits, ClientDisconnect when the peer goes."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            _check_declared_length(value.decode("latin-1"), limit_bytes)
            break
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > limit_bytes:
            raise body_too_large(limit_bytes)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _json(payload: object, status_code: int = 200) -> Response:
    return Response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type=JSON,
    )


@dataclass(frozen=True)
class VerbAnswer:
    """A verb's answer, encoded: what both the ASGI fast path and FastAPI send."""

    status_code: int
    body: bytes
    server_timing: str

    def response(self) -> Response:
        return Response(
            self.body,
            status_code=self.status_code,
            media_type=JSON,
            headers={"Server-Timing": self.server_timing},
        )

    async def send(self, send: Send) -> None:
        headers = [
            (b"content-type", JSON.encode()),
            (b"content-length", str(len(self.body)).encode()),
            (b"server-timing", self.server_timing.encode()),
        ]
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


def _encoded(payload: object, status_code: int, duration_s: float, read_s: float) -> VerbAnswer:
    app_ms, read_ms = (duration_s - read_s) * 1000.0, read_s * 1000.0
    return VerbAnswer(
        status_code,
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        f"read;dur={read_ms:.3f}, app;dur={app_ms:.3f}",
    )


# ---- answers per verb --------------------------------------------------------------------


def _filter_answer(args: ExtenderArgs, scored: Scored, runtime: Runtime) -> object:
    assessment = scored.assessment
    return filter_result(args, assessment.failed, assessment.unresolvable)


def _prioritize_answer(args: ExtenderArgs, scored: Scored, runtime: Runtime) -> object:
    assessment = scored.assessment
    candidates, view = assessment.cycle.candidates, assessment.cycle.view
    if not candidates.all_in_view:  # a name the extender does not know: built plainly
        return prioritize_result_arrays(assessment.names, assessment.score)
    # Encoded here from the node set's prebuilt entries; orjson passes a Fragment as it is.
    answers = view.layout_memo(
        PrioritizeAnswers,
        lambda: PrioritizeAnswers(view.names),
        carry=lambda previous: PrioritizeAnswers(view.names, previous),
    )
    return orjson.Fragment(answers.json(candidates.positions, assessment.score))


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
ServeVerb = Callable[[str, Scope, Receive, Send], Awaitable[None]]


class ExtenderApp(FastAPI):
    """FastAPI, except that kube-scheduler's verbs skip it: ``POST`` to a verb's path with no
    query string goes straight to ``serve_verb``; everything else to FastAPI's routing."""

    def __init__(self, serve_verb: ServeVerb, verb_paths: frozenset[str], **kwargs: Any):
        super().__init__(**kwargs)
        self._serve_verb = serve_verb
        self._verb_paths = verb_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in self._verb_paths
            and not scope.get("query_string")
        ):
            await self._serve_verb(scope["path"], scope, receive, send)
            return
        await super().__call__(scope, receive, send)  # type: ignore[arg-type]


def create_app(runtime: Runtime) -> ExtenderApp:
    """The FastAPI app serving ``runtime``; starting and stopping the runtime is the caller's."""
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

    async def handle(
        read_body: ReadBody, verb: str, answer: Answer, neutral: Neutral
    ) -> VerbAnswer:
        started = time.perf_counter()
        read_s = 0.0
        args: ExtenderArgs | None = None
        try:
            body = await read_body(limits.max_body_bytes)
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
            encoded = _encoded(payload, code, duration_s, read_s)
        except Exception:  # an answer that cannot be encoded must not become a 500 either
            metrics.errors.labels(verb=verb, kind="internal").inc()
            log.exception("%s: answer could not be encoded", verb)
            encoded = _encoded(neutral(args), 200, duration_s, read_s)
        metrics.observe_request(verb, encoded.status_code, duration_s)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request",
                extra={
                    "verb": verb,
                    "code": encoded.status_code,
                    "pod": pod_key(args.pod) if args else None,
                    "nodes": len(args.candidate_names) if args else None,
                    "duration_ms": round(duration_s * 1000.0, 3),
                },
            )
        return encoded

    verbs: dict[str, tuple[str, Answer, Neutral]] = {
        "/filter": ("filter", _filter_answer, _neutral_filter),
        "/prioritize": ("prioritize", _prioritize_answer, _neutral_prioritize),
        "/explain": ("explain", _explain_answer, _neutral_prioritize),
    }

    async def serve_verb(path: str, scope: Scope, receive: Receive, send: Send) -> None:
        verb, answer, neutral = verbs[path]

        async def read_body(limit_bytes: int) -> bytes:
            return await receive_body_capped(scope, receive, limit_bytes)

        encoded = await handle(read_body, verb, answer, neutral)
        await encoded.send(send)

    app = ExtenderApp(
        serve_verb,
        frozenset(verbs),
        title="power-aware-scheduler extender",
        description="kube-scheduler extender v1: filter and prioritize by predicted power",
    )
    app.state.runtime = runtime

    # The same verbs as FastAPI routes: what a query string (?explain=1) reaches, and what
    # the app's route table and OpenAPI document list.
    async def routed(request: Request, path: str) -> Response:
        verb, answer, neutral = verbs[path]

        async def read_body(limit_bytes: int) -> bytes:
            return await read_body_capped(request, limit_bytes)

        return (await handle(read_body, verb, answer, neutral)).response()

    @app.post("/filter")
    async def filter_verb(request: Request) -> Response:
        return await routed(request, "/filter")

    @app.post("/prioritize")
    async def prioritize_verb(request: Request) -> Response:
        if request.query_params.get("explain") in ("1", "true", "yes"):
            return await routed(request, "/explain")
        return await routed(request, "/prioritize")

    @app.post("/explain")
    async def explain_verb(request: Request) -> Response:
        return await routed(request, "/explain")

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
