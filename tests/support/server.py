"""Run the extender for tests: the bench's servers (`bench.support.server`) and the whole
service in the test process.

``extender_service(bundle_dir, ...)`` builds the runtime and app the way ``python -m extender``
does and serves them with ``serve_app``, so a test can reach into the runtime. ``serve_app``,
``run_extender``, ``write_snapshot`` and ``REPO_ROOT`` come from ``bench.support.server``
(benches use them too, and a benchmark never imports tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from bench.support.server import REPO_ROOT, run_extender, serve_app, write_snapshot
from extender.app import create_app
from extender.config import ExtenderConfig
from extender.runtime import Runtime

__all__ = ["REPO_ROOT", "extender_service", "run_extender", "serve_app", "write_snapshot"]


@contextlib.contextmanager
def extender_service(
    bundle_dir: Path, cluster_file: Path | None = None, **settings: object
) -> Iterator[tuple[str, Runtime]]:
    """The whole service (runtime + app) in this process under uvicorn; yields (url, runtime).

    ``settings`` are ``ExtenderConfig`` fields (e.g. ``max_body_bytes=4096``).
    """
    config = ExtenderConfig(bundle_dir=bundle_dir, cluster_file=cluster_file, port=0, **settings)
    runtime = Runtime(config.validate())
    runtime.load_cluster()
    runtime.load_bundle()
    runtime.build_plugin_sources()
    runtime.start_background()
    try:
        with serve_app(create_app(runtime)) as url:
            yield url, runtime
    finally:
        runtime.stop()
