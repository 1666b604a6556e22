"""Real model bundles with known power curves, for tests, and ways to break them.

``make_bundle`` writes a bundle through ``predictor.bundle.write_bundle`` with one model per
``PowerCurveSpec`` (fitted exactly by ``fit_curve_model``): tests run the real ONNX files through
real onnxruntime and still know the expected watts. Then ways to break a bundle (bad sha256,
truncated ONNX; a NaN-predicting model is ``PowerCurveSpec(nan_output=True)``).

The curve models, ``edit_manifest`` and ``KubeletMount`` (kubelet's ConfigMap volume layout)
live in ``bench.support.bundles``: benches use them too, and a benchmark never imports tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.support.bundles import (
    DEFAULT_FEATURES,
    DEFAULT_FILL,
    KubeletMount,
    PowerCurveSpec,
    edit_manifest,
    fit_curve_model,
    load_manifest,
    save_manifest,
)
from predictor.bundle import FALLBACK_NODE, Bundle, sha256_hex, write_bundle

__all__ = [
    "DEFAULT_FEATURES",
    "KubeletMount",
    "PowerCurveSpec",
    "corrupt_model_bytes",
    "edit_manifest",
    "fit_curve_model",
    "make_bundle",
    "model_file",
    "truncate_model",
]


def make_bundle(
    directory: Path,
    curves: Mapping[str, PowerCurveSpec],
    *,
    fallback: PowerCurveSpec | None = None,
    features: Sequence[str] = DEFAULT_FEATURES,
    feature_fill: Mapping[str, str] | None = None,
    extra: Mapping[str, object] | None = None,
) -> Bundle:
    """Write a real bundle with one model per entry of ``curves`` (and an optional fallback)."""
    if feature_fill is None:
        feature_fill = {k: v for k, v in DEFAULT_FILL.items() if k in features and v in features}
    node_info: dict[str, dict] = {}
    for node, spec in curves.items():
        info = dict(spec.info)
        if spec.thermal is not None:
            info["thermal"] = dict(spec.thermal)
        node_info[node] = info
    fallback_info = None
    if fallback is not None:
        fallback_info = dict(fallback.info)
        if fallback.thermal is not None:
            fallback_info["thermal"] = dict(fallback.thermal)
    return write_bundle(
        Path(directory),
        features=features,
        node_models={node: fit_curve_model(spec, features) for node, spec in curves.items()},
        node_info=node_info,
        fallback_model=None if fallback is None else fit_curve_model(fallback, features),
        fallback_info=fallback_info,
        feature_fill=feature_fill,
        extra=extra or {},
    )


# ---------------------------------------------------------------------------------------------
# Breaking bundles


def _entry(manifest: dict, node: str) -> dict:
    return manifest["fallback"] if node == FALLBACK_NODE else manifest["nodes"][node]


def model_file(directory: Path, node: str) -> Path:
    """The node's model file (``FALLBACK_NODE`` for the fallback)."""
    return Path(directory) / _entry(load_manifest(directory), node)["model"]


def corrupt_model_bytes(directory: Path, node: str) -> None:
    """Flip a byte of the node's model without updating the manifest: sha256 no longer matches."""
    path = model_file(directory, node)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate_model(directory: Path, node: str, *, keep_fraction: float = 0.5) -> None:
    """Cut the node's ONNX file short and update its sha256, so only loading it can fail."""
    path = model_file(directory, node)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    manifest = load_manifest(directory)
    _entry(manifest, node)["sha256"] = sha256_hex(path.read_bytes())
    save_manifest(directory, manifest)
