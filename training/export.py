"""Export: fitted scikit-learn models -> ONNX -> a checked model bundle (contract 2).

The extender only ever runs the ONNX files, so the ONNX a node ships must predict what the model
we evaluated predicts. Each model is converted with skl2onnx (one float32 input `features` of
shape `[None, len(features)]`, output watts `[N, 1]`) and run through onnxruntime on the node's
held-out rows; a model whose ONNX differs from scikit-learn by more than `PARITY_TOLERANCE_W` is
not written, and the whole run fails naming the node, so no bundle with a wrong model exists.

The bundle itself is written by `predictor.bundle.write_bundle` (the format's one owner) and read
back with `predictor.bundle.read_bundle` before we call the run a success.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime
from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType

import training.families  # noqa: F401  (registers the converters of our own transformers)
from predictor.bundle import Bundle, read_bundle, write_bundle

log = logging.getLogger(__name__)

PARITY_TOLERANCE_W = 0.01
ONNX_INPUT_NAME = "features"
# ai.onnx opset supported by every onnxruntime in the pinned range
TARGET_OPSET = 17


class ExportError(RuntimeError):
    """A model could not be exported faithfully; the message names the node(s)."""


@dataclass(frozen=True)
class ParityResult:
    """How far a node's ONNX predictions are from scikit-learn's on the held-out rows."""

    node: str
    max_abs_diff_w: float
    rows_checked: int

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.max_abs_diff_w)) and (
            self.max_abs_diff_w <= PARITY_TOLERANCE_W
        )


def model_to_onnx(model, n_features: int) -> bytes:
    """Serialised ONNX for a fitted scikit-learn regressor taking `n_features` float32 columns."""
    onnx_model = to_onnx(
        model,
        initial_types=[(ONNX_INPUT_NAME, FloatTensorType([None, n_features]))],
        target_opset=TARGET_OPSET,
    )
    # skl2onnx lists the opset domains in set order, which varies with each process's string
    # hashing: sorted, the same model serialises to the same bytes in any process.
    opsets = sorted(onnx_model.opset_import, key=lambda opset: opset.domain)
    del onnx_model.opset_import[:]
    onnx_model.opset_import.extend(opsets)
    return onnx_model.SerializeToString()


def onnx_predict_w(onnx_bytes: bytes, rows: np.ndarray) -> np.ndarray:
    """Run an ONNX power model on float32 rows (one thread: callers parallelise over nodes)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    (predicted,) = session.run(None, {input_name: np.asarray(rows, dtype=np.float32)})
    return np.asarray(predicted, dtype=np.float64).reshape(-1)


def check_parity(node: str, model, onnx_bytes: bytes, rows: np.ndarray) -> ParityResult:
    """Compare ONNX against scikit-learn on `rows` (the node's held-out feature rows)."""
    rows32 = np.asarray(rows, dtype=np.float32)
    if len(rows32) == 0:
        return ParityResult(node, float("nan"), 0)
    expected_w = np.asarray(model.predict(rows32), dtype=np.float64).reshape(-1)
    got_w = onnx_predict_w(onnx_bytes, rows32)
    diff_w = float(np.max(np.abs(expected_w - got_w)))
    return ParityResult(node, diff_w if np.isfinite(diff_w) else float("inf"), len(rows32))


def parity_failures(results: Sequence[ParityResult]) -> list[ParityResult]:
    return [result for result in results if not result.passed]


def raise_for_parity(results: Sequence[ParityResult]) -> None:
    """Fail the run, naming every node whose ONNX disagrees with its scikit-learn model."""
    failed = parity_failures(results)
    if not failed:
        return
    detail = ", ".join(
        f"{result.node} (max |onnx - sklearn| = {result.max_abs_diff_w:.4g} W "
        f"over {result.rows_checked} held-out rows)"
        for result in failed
    )
    raise ExportError(
        f"ONNX parity check failed (tolerance {PARITY_TOLERANCE_W} W) for "
        f"{len(failed)} model(s): {detail}; no bundle written"
    )


def export_bundle(
    out_dir: Path,
    *,
    features: Sequence[str],
    node_models: Mapping[str, bytes],
    node_info: Mapping[str, dict],
    fallback_model: bytes,
    fallback_info: dict,
    feature_fill: Mapping[str, str],
    extra: Mapping[str, object],
    parity: Sequence[ParityResult],
) -> Bundle:
    """Write the bundle after every model passed parity, then read it back as a check."""
    raise_for_parity(parity)
    missing = sorted(set(node_models) - {result.node for result in parity})
    if missing:
        raise ExportError(f"no parity check recorded for node(s) {', '.join(missing)}")
    written = write_bundle(
        Path(out_dir),
        features=list(features),
        node_models=node_models,
        node_info=node_info,
        fallback_model=fallback_model,
        fallback_info=fallback_info,
        feature_fill=feature_fill,
        extra=extra,
    )
    bundle = read_bundle(Path(out_dir))
    if bundle.version != written.version or set(bundle.nodes) != set(node_models):
        raise ExportError(
            f"bundle read back from {out_dir} does not match what was written "
            f"(version {bundle.version!r} vs {written.version!r})"
        )
    log.info(
        "wrote bundle %s: version %s, %d node models + fallback",
        out_dir,
        bundle.version,
        len(bundle.nodes),
    )
    return bundle
