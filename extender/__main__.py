"""``python -m extender``: start the power-aware kube-scheduler extender.

With no flags: the shipped bundle (``extender/models/default``) on the built-in demo cluster, on
http://127.0.0.1:8888. ``--help`` lists every flag. Startup logs one line per step (config,
cluster, bundle, background threads, listening) and a curl line to paste. Bad input (a
missing bundle, an unreadable snapshot, conflicting flags) ends with a one-line error and
exit status 2, no traceback. Ctrl-C (SIGINT) or SIGTERM, while starting or serving, stops it
with one ``stopped`` log line naming the signal and exit status 0.
"""

from __future__ import annotations

import gc
import logging
import shlex
import signal
import socket
import ssl
import sys
from collections.abc import Sequence
from types import FrameType

import orjson
import uvicorn

from extender.app import create_app
from extender.config import ConfigError, ExtenderConfig, parse_config
from extender.profile import ProfileError
from extender.runtime import Runtime, build_live_sources
from extender.sources.snapshot import SnapshotError
from livedata.logs import configure_logging

log = logging.getLogger("extender")

EXIT_USAGE = 2
EXAMPLE_NODE_COUNT = 12
REQUEST_GIL_WAIT_S = 0.001
BUNDLE_HINT = (
    "Point --bundle at a directory that `python -m training.fit --out DIR` wrote "
    "(manifest.json and its .onnx files, unchanged), or rebuild the shipped one with "
    "`make models`"
)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StartupError(Exception):
    """A one-line reason the service cannot start."""


class StopSignal(Exception):
    """Ctrl-C (SIGINT) or SIGTERM arrived: stop. ``args[0]`` is the signal's name."""


def _raise_stop_signal(signum: int, _frame: FrameType | None) -> None:
    raise StopSignal(signal.Signals(signum).name)


def example_curl(
    url: str, node_names: Sequence[str], verb: str = "prioritize", curl_options: str = ""
) -> str:
    """A curl command scoring a 1-CPU pod on ``node_names`` (a body shaped as kube-scheduler's).

    ``curl_options`` go before the URL (TLS: the CA to trust, a client certificate).
    """
    body = {
        "Pod": {
            "metadata": {"name": "demo", "namespace": "default", "uid": "demo-0001"},
            "spec": {
                "schedulerName": "power-aware-scheduler",
                "containers": [
                    {"name": "app", "image": "nginx", "resources": {"requests": {"cpu": "1"}}}
                ],
            },
        },
        "Nodes": None,
        "NodeNames": list(node_names),
    }
    options = f"{curl_options} " if curl_options else ""
    return (
        f"curl -s {options}-X POST {url}/{verb} -H 'Content-Type: application/json' "
        f"-d {shlex.quote(orjson.dumps(body).decode())}"
    )


def bind_socket(config: ExtenderConfig) -> socket.socket:
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on sockets whose proto says TCP,
    # and without it every small answer waits ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        sock.close()
        raise StartupError(
            f"cannot listen on {config.host}:{config.port}: {exc.strerror}"
        ) from None
    sock.listen(2048)
    return sock


def _curl_tls_options(config: ExtenderConfig) -> str:
    if config.tls_cert is None:
        return ""
    # The server's own certificate works as the CA to trust when it is self-signed; a client
    # certificate of the operator's is needed with mutual TLS.
    options = f"--cacert {shlex.quote(str(config.tls_cert))}"
    if config.tls_client_ca is not None:
        options += " --cert CLIENT.crt --key CLIENT.key"
    return options


def tls_context(config: ExtenderConfig) -> ssl.SSLContext | None:
    """The server's TLS context (None: plain HTTP); StartupError naming the unreadable file."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=config.tls_cert, keyfile=config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(
            f"cannot load --tls-cert {config.tls_cert} / --tls-key {config.tls_key}: {exc}"
        ) from None
    if config.tls_client_ca is not None:
        try:
            context.load_verify_locations(cafile=config.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise StartupError(
                f"cannot load --tls-client-ca {config.tls_client_ca}: {exc}"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def prepare(config: ExtenderConfig) -> Runtime:
    """Build the runtime and load what the mode needs; StartupError on bad input."""
    try:
        runtime = Runtime(config)
    except ProfileError as exc:
        raise StartupError(f"--config: {exc}") from None
    log.info(
        "starting",
        extra={
            "mode": runtime.mode,
            "bundle_dir": str(config.bundle_dir),
            "profile": runtime.profile.describe(),
        },
    )
    try:
        runtime.load_cluster()
    except SnapshotError as exc:
        raise StartupError(str(exc)) from None
    if runtime.mode == "live":
        try:
            runtime.live_sources = build_live_sources(runtime)
        except Exception as exc:
            raise StartupError(f"live mode: cannot set up Kubernetes/Prometheus: {exc}") from None
        log.info("live sources ready", extra={"prometheus": config.prometheus_url})
    try:
        runtime.build_plugin_sources()
    except (ValueError, OSError) as exc:
        raise StartupError(f"--config: a plugin's data source cannot start: {exc}") from None
    if not runtime.load_bundle():
        problem = runtime.bundle_problem()
        if runtime.mode != "live":
            raise StartupError(f"{problem}. {BUNDLE_HINT}")
        # In a cluster the ConfigMap may be fixed without a restart: serve, not ready.
        log.warning(
            f"{problem}. Serving without a bundle: /readyz answers 503 until a valid bundle "
            "appears there (it is checked every --bundle-poll-interval)"
        )
    return runtime


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        print(f"python -m extender: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(config.log_level, config.log_format)
    # Both signals raise StopSignal while starting (a bundle may take a while to load). While
    # serving, uvicorn handles them itself (finish the open requests, run the app's shutdown)
    # and, once done, signals the process again with the handler it found: this one, so the
    # stop ends here rather than in a KeyboardInterrupt traceback or a death by SIGTERM.
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, _raise_stop_signal)
    try:
        serve(config)
    except StartupError as exc:
        print(f"python -m extender: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StopSignal as stop:
        log.info("stopped", extra={"signal": stop.args[0]})
    else:
        log.info("stopped")
    finally:
        # Stopped already: a further Ctrl-C while the interpreter exits changes nothing.
        for stop_signal in STOP_SIGNALS:
            signal.signal(stop_signal, signal.SIG_IGN)
    return 0


def serve(config: ExtenderConfig) -> None:
    """Load, listen and serve until uvicorn stops; StartupError on bad input."""
    tls = tls_context(config)
    runtime = prepare(config)
    sock = bind_socket(config)
    try:
        _serve_on(config, runtime, sock, tls)
    finally:
        runtime.stop()
        sock.close()


def _serve_on(
    config: ExtenderConfig, runtime: Runtime, sock: socket.socket, tls: ssl.SSLContext | None
) -> None:
    port = sock.getsockname()[1]
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    url = f"{config.scheme}://{host}:{port}"
    app = create_app(runtime)
    runtime.start_background()
    # Everything loaded so far lives as long as the process: keep it out of the cyclic
    # collector's passes, which would otherwise walk it during requests.
    gc.collect()
    gc.freeze()
    # A background thread (curve rebuild, bundle validation) holding the GIL makes a request
    # wait up to the switch interval (default 5 ms): bound that wait to 1 ms.
    sys.setswitchinterval(REQUEST_GIL_WAIT_S)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            # The context is built (and its files checked) above, before anything started.
            ssl_context_factory=(lambda _config, _default: tls) if tls is not None else None,
        )
    )
    names = runtime.state.node_names()[:EXAMPLE_NODE_COUNT]
    if names:
        options = _curl_tls_options(config)
        log.info("try it", extra={"curl": example_curl(url, names, "prioritize", options)})
        log.info("why those scores", extra={"curl": example_curl(url, names, "explain", options)})
    # Last startup line: the socket already accepts connections (they queue until uvicorn
    # runs), so whoever waits for this line can send requests right away.
    log.info(
        "listening",
        extra={
            "url": url,
            "bind": f"{config.host}:{port}",
            "mutual_tls": bool(config.tls_client_ca),
        },
    )
    server.run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
