"""The extender built the naive way, as the baseline of ``bench.extender_latency``.

The naive design calls the model on the request path: one onnxruntime call per candidate node
per request (the node's own session, or the fallback). Scoring reuses P(u + a) within one
cluster view, so the naive service runs each node's model once per request for P(u + a + d)
(twice on the first request after the view changes): the baseline gets the same reuse as the
served design, never less. Everything else is the real service: ``python -m extender``'s entry
point, HTTP server, body limits, parsing, scoring and encoding. Only the power lookup that
``extender.scoring.assess`` makes through ``PowerCurves`` is answered by ``NaivePowerModel``
instead of a tabulated ``CurveTable``, so the difference between the two services' latencies
is the cost of the design and nothing else. The sessions are the ones the service loads from
the bundle (bounded threads, as served).

``run_naive_extender(args)`` starts it in a child process on a port the OS picks and yields
its URL; ``args`` are ``python -m extender`` flags.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import sys
from collections.abc import Iterator, Mapping, Sequence
from itertools import repeat
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from extender.config import ExtenderConfig
from extender.runtime import Runtime
from predictor.core_scaling import FallbackScaling
from predictor.curves import FALLBACK
from predictor.model import UTIL_FEATURE, Predictor
from predictor.reload import ModelHolder

STARTUP_TIMEOUT_S = 120.0


class NaivePowerModel:
    """What scoring reads of a curve table, answered by calling each node's model per request.

    Scoring asks for P(u + a) once per view and candidate list and for P(u + a + d) per pod;
    the naive design has no such reuse, so every ``power_w`` call runs the models.
    """

    def __init__(self, predictor: Predictor, telemetry: Mapping[str, Mapping[str, float]]) -> None:
        self.version = predictor.version
        self._predictor = predictor
        self._util_column = predictor.features.index(UTIL_FEATURE)
        names, rows = [], []
        for node, values in telemetry.items():
            row = predictor.feature_row(values)
            if row is not None and predictor.model_key(node) is not None:
                names.append(node)
                rows.append(row)
        self.names = tuple(names)
        self._feature_rows = np.array(rows, dtype=np.float32).reshape(len(names), -1)
        self._index = {name: i for i, name in enumerate(names)}
        # What the runtime's status and logs read of a table.
        self.skipped: Mapping[str, str] = {}
        # The naive design predicts each node's own model as the bundle gives it: fallback
        # nodes are named but not scaled by their CPU count.
        self.model_kind = tuple(predictor.model_kind(n) or "" for n in names)
        kinds = zip(names, self.model_kind, strict=True)
        self.fallback_names = tuple(n for n, k in kinds if k == FALLBACK)
        self.fallback_scaling = FallbackScaling.unscaled(self.model_kind, FALLBACK)
        self.computed_rows = len(names)
        self.reused_rows = 0

    def __len__(self) -> int:
        return len(self.names)

    def index_of(self, names: Sequence[str]) -> np.ndarray:
        return np.fromiter(map(self._index.get, names, repeat(-1)), dtype=np.intp, count=len(names))

    def power_w(self, idx: np.ndarray, util: np.ndarray | float) -> np.ndarray:
        """P(util) per row: one model call per distinct node, with all its utilisations."""
        idx, util = np.broadcast_arrays(
            np.asarray(idx, dtype=np.intp), np.asarray(util, dtype=np.float64)
        )
        power = np.full(idx.shape, np.nan)
        wanted = np.flatnonzero((idx >= 0) & ~np.isnan(util))
        by_node = wanted[np.argsort(idx[wanted], kind="stable")]
        node_starts = np.flatnonzero(np.diff(idx[by_node], prepend=-1))
        for positions in np.split(by_node, node_starts[1:]):
            row = int(idx[positions[0]])
            inputs = np.repeat(self._feature_rows[row : row + 1], len(positions), axis=0)
            inputs[:, self._util_column] = util[positions]
            power[positions] = self._predictor.predict_w(self.names[row], inputs)
        return power


class NaiveModelBuilder:
    """Stands in for ``CurveBuilder``: 'building' only records each node's feature row."""

    def build(
        self,
        predictor: Predictor,
        telemetry: Mapping[str, Mapping[str, float]],
        previous: object | None,
    ) -> NaivePowerModel:
        return NaivePowerModel(predictor, telemetry)


class NaiveRuntime(Runtime):
    """The service's runtime with the naive power model where the curve tables would be."""

    def __init__(self, config: ExtenderConfig, **kwargs: object) -> None:
        super().__init__(config, **kwargs)  # type: ignore[arg-type]
        self.holder = ModelHolder(self._telemetry_for_curves, NaiveModelBuilder())  # type: ignore[arg-type]


class _ListeningUrl(logging.Handler):
    """Sends the URL of the service's ``listening`` log line to the parent process."""

    def __init__(self, connection: Connection) -> None:
        super().__init__()
        self.connection = connection

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "listening":
            self.connection.send(record.__dict__.get("url"))


def _serve(args: Sequence[str], connection: Connection, log_path: Path) -> None:
    """Child process: ``python -m extender <args>`` with the naive runtime, logging to a file."""
    import extender.__main__ as service

    sys.stderr = log_path.open("w", buffering=1)
    service.Runtime = NaiveRuntime  # type: ignore[misc]  # the only change to the service
    logging.getLogger().addHandler(_ListeningUrl(connection))
    service.main(["--port", "0", *args])


@contextlib.contextmanager
def run_naive_extender(args: Sequence[str], log_path: Path) -> Iterator[str]:
    """Start the naive service in a child process (its log in ``log_path``); yield its URL."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_serve, args=(list(args), send, log_path), daemon=True)
    process.start()
    try:
        if not receive.poll(STARTUP_TIMEOUT_S):
            tail = log_path.read_text()[-2000:] if log_path.exists() else ""
            raise RuntimeError(f"the naive extender did not start; its log ends:\n{tail}")
        yield receive.recv()
    finally:
        process.terminate()
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
