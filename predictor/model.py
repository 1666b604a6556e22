"""Load a bundle's ONNX models into onnxruntime and predict node power in watts.

A ``Predictor`` is one loaded, validated bundle: one ``InferenceSession`` per distinct model
file (nodes pointing at the same file share it), each with bounded threads so that background
tabulation never competes with the request path for both cores. Loading checks what the
bundle contract promises about every model (one float32 input ``[N, len(features)]``, output
``[N]`` or ``[N, 1]``) and runs it once, so a model that cannot run is refused at load time,
never discovered while scheduling.

The request path does not call this module: ``predictor.curves`` tabulates each node's curve
in the background and requests interpolate in those tables.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

from livedata.metrics_table import CPU_UTIL
from predictor.bundle import (
    FALLBACK_NODE,
    Bundle,
    BundleError,
    ModelEntry,
    read_bundle,
    read_model_bytes,
)

UTIL_FEATURE = CPU_UTIL  # the feature a power curve P(u) runs along
ModelKind = Literal["own", "fallback"]


class NoModelError(KeyError):
    """A node has neither its own model nor a fallback."""


def session_options(intra_op_threads: int = 1, inter_op_threads: int = 1) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # onnxruntime's default spinning burns a core between calls; models here are tiny.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    # A fleet may load thousands of tiny per-node models. Measured here on 1 KiB models: the
    # defaults cost ~140 KiB resident per session, no memory arena and basic graph
    # optimisation ~64 KiB, at the same inference speed (extended optimisations target large
    # neural-network graphs, not linear models or tree ensembles).
    options.enable_cpu_mem_arena = False
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3  # errors only; our own messages say what went wrong
    return options


class Predictor:
    """One loaded, validated bundle: node -> watts for feature rows."""

    def __init__(self, bundle: Bundle, sessions: Mapping[str, ort.InferenceSession]) -> None:
        self.bundle = bundle
        self.version = bundle.version
        self.features = bundle.features
        self._sessions = dict(sessions)  # model file -> session
        self._input_names = {file: s.get_inputs()[0].name for file, s in self._sessions.items()}
        self._feature_index = {name: i for i, name in enumerate(bundle.features)}
        # Fill plan as (target column, source column) pairs, in manifest order.
        self._fill = [
            (self._feature_index[target], self._feature_index[source])
            for target, source in bundle.feature_fill.items()
        ]

    @classmethod
    def load(
        cls, directory: Path, *, intra_op_threads: int = 1, inter_op_threads: int = 1
    ) -> Predictor:
        """Read, validate and load the bundle in ``directory``; raises ``BundleError``."""
        bundle = read_bundle(Path(directory))
        if UTIL_FEATURE not in bundle.features:
            raise BundleError(
                f"{bundle.directory}: field 'features' must include {UTIL_FEATURE!r} "
                f"(the curve runs along it), got {list(bundle.features)}"
            )
        options = session_options(intra_op_threads, inter_op_threads)
        sessions: dict[str, ort.InferenceSession] = {}
        entries: list[tuple[str, ModelEntry]] = list(bundle.nodes.items())
        if bundle.fallback is not None:
            entries.append((FALLBACK_NODE, bundle.fallback))
        for node, entry in entries:
            if entry.file not in sessions:
                sessions[entry.file] = _load_session(bundle, entry, node, options)
        return cls(bundle, sessions)

    # --- which model serves a node ---------------------------------------------------------

    def has_model(self, node: str) -> bool:
        """True if the node can be predicted at all (own model or fallback)."""
        return node in self.bundle.nodes or self.bundle.fallback is not None

    def model_kind(self, node: str) -> ModelKind | None:
        if node in self.bundle.nodes:
            return "own"
        return "fallback" if self.bundle.fallback is not None else None

    def model_key(self, node: str) -> str | None:
        """The model file that serves ``node`` (nodes sharing a key can be batched)."""
        entry = self.bundle.entry_for(node)
        return None if entry is None else entry.file

    def entry(self, node: str) -> ModelEntry | None:
        return self.bundle.entry_for(node)

    @property
    def model_keys(self) -> tuple[str, ...]:
        return tuple(self._sessions)

    # --- prediction ------------------------------------------------------------------------

    def feature_row(self, telemetry: Mapping[str, float]) -> np.ndarray | None:
        """Telemetry -> one float32 row in manifest feature order, ``feature_fill`` applied.

        A feature absent, None or non-finite counts as missing; None when one is still missing
        after the fill (the node has no usable telemetry).
        """
        row = np.empty(len(self.features), dtype=np.float32)
        for position, name in enumerate(self.features):
            value = telemetry.get(name)
            # numbers.Real covers numpy scalars too (np.float32 is not a float subclass).
            usable = isinstance(value, numbers.Real) and not isinstance(value, bool)
            row[position] = value if usable and math.isfinite(value) else np.float32("nan")
        for target, source in self._fill:
            if np.isnan(row[target]):
                row[target] = row[source]
        if np.isnan(row).any():
            return None
        return row

    def predict_w(self, node: str, rows: np.ndarray) -> np.ndarray:
        """Predicted power in watts (float64, shape ``[N]``) of ``node`` for feature rows."""
        key = self.model_key(node)
        if key is None:
            raise NoModelError(f"node {node!r} has no model and bundle {self.version} no fallback")
        return self.run_model_w(key, rows)

    def run_model_w(self, model_key: str, rows: np.ndarray) -> np.ndarray:
        """Run one model on feature rows ``[N, F]``; float64 watts of shape ``[N]``."""
        batch = np.ascontiguousarray(rows, dtype=np.float32)
        if batch.ndim != 2 or batch.shape[1] != len(self.features):
            raise ValueError(
                f"feature rows must have shape [N, {len(self.features)}], got {batch.shape}"
            )
        session = self._sessions[model_key]
        (output,) = session.run(None, {self._input_names[model_key]: batch})[:1]
        return np.asarray(output, dtype=np.float64).reshape(len(batch))


def _load_session(
    bundle: Bundle, entry: ModelEntry, node: str, options: ort.SessionOptions
) -> ort.InferenceSession:
    path = bundle.model_path(entry)
    where = f"{path}: node {node!r} field 'model'"
    data = read_model_bytes(bundle, entry, node=node)
    try:
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises several unrelated types for bad files
        # All of it on one line: onnxruntime's first line alone may stop mid-sentence.
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise BundleError(f"{where}: onnxruntime cannot load the model: {detail}") from None

    width = len(bundle.features)
    inputs = session.get_inputs()
    if len(inputs) != 1:
        names = [i.name for i in inputs]
        raise BundleError(f"{where}: model must take exactly one input, it takes {names}")
    (model_input,) = inputs
    if model_input.type != "tensor(float)":
        raise BundleError(
            f"{where}: input {model_input.name!r} must be float32, it is {model_input.type}"
        )
    shape = model_input.shape
    if len(shape) != 2 or (isinstance(shape[1], int) and shape[1] != width):
        raise BundleError(
            f"{where}: input {model_input.name!r} has shape {shape}, expected [N, {width}] "
            f"for the features {list(bundle.features)}"
        )
    outputs = session.get_outputs()
    if not outputs:
        raise BundleError(f"{where}: model has no output")
    out_shape = outputs[0].shape
    if not (
        len(out_shape) == 1 or (len(out_shape) == 2 and out_shape[1] in (1, None, "1"))
    ) or outputs[0].type not in ("tensor(float)", "tensor(double)"):
        raise BundleError(
            f"{where}: output {outputs[0].name!r} is {outputs[0].type} {out_shape}, "
            f"expected float [N] or [N, 1] watts"
        )
    # One real call: catches symbolic shapes that do not hold and models that cannot run.
    probe = np.zeros((2, width), dtype=np.float32)
    try:
        result = session.run(None, {model_input.name: probe})[0]
    except Exception as exc:
        raise BundleError(f"{where}: model fails on a [2, {width}] input: {exc}") from None
    if np.asarray(result).size != 2:
        raise BundleError(
            f"{where}: model returned shape {np.asarray(result).shape} for 2 rows, expected 2 "
            f"values"
        )
    return session
