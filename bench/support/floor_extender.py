"""The floor of an extender round trip: an extender that parses and answers, and decides nothing.

`bench.scheduler_throughput` runs kube-scheduler against it to measure what the protocol itself
costs on this machine: the scheduler encoding the pod and the candidates' names, one HTTP
round trip per verb, the Python server reading the body with the extender's own parser
(`extender.protocol.parse_extender_args`) and writing back `{"Host", "Score": 0}` per candidate
(`/prioritize`) or every candidate passing (`/filter`, `extender.protocol.filter_result`). No
model, no cluster view, no plugin: whatever an extender served by Python over HTTP does on top,
it cannot be cheaper than this, so the throughput measured against it bounds every such
extender's with the same verbs.

It is served as the extender is: uvicorn (httptools, uvloop when installed) in its own process,
on a socket bound before it starts.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson
import uvicorn

from bench.support.server import bind_free_socket
from extender.protocol import ProtocolError, filter_result, parse_extender_args

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
JSON_HEADERS = [(b"content-type", b"application/json")]


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """ASGI: /prioritize scores every candidate 0, /filter passes them all; anything else 404."""
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    verb = scope["path"].rsplit("/", 1)[-1]
    if verb in ("prioritize", "filter"):
        try:
            args = parse_extender_args(body)
        except ProtocolError as error:
            status, answer = 400, orjson.dumps({"error": str(error)})
        else:
            status = 200
            if verb == "prioritize":
                answer = orjson.dumps([{"Host": n, "Score": 0} for n in args.candidate_names])
            else:
                answer = orjson.dumps(filter_result(args, {}))
    else:
        status, answer = 404, b'{"error": "only /prioritize and /filter"}'
    await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": answer})


def _serve(sock: Any) -> None:
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


@contextlib.contextmanager
def run_floor_extender() -> Iterator[str]:
    """Serve the floor extender in a child process; yield its base URL."""
    sock = bind_free_socket()
    port = sock.getsockname()[1]
    # fork: the child inherits the bound socket, so the parent may send right away.
    process = multiprocessing.get_context("fork").Process(target=_serve, args=(sock,), daemon=True)
    process.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.join(timeout=10)
        sock.close()
