"""training.export: ONNX conversion through skl2onnx, parity against scikit-learn, the bundle."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from sklearn.linear_model import Ridge

from livedata.metrics_table import FEATURES
from predictor.bundle import read_bundle
from training.export import (
    ONNX_INPUT_NAME,
    PARITY_TOLERANCE_W,
    ExportError,
    check_parity,
    export_bundle,
    model_to_onnx,
    onnx_predict_w,
)
from training.families import FAMILIES, fit_family


def _rows(n: int = 600, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    util = rng.uniform(0, 1, n)
    ambient = 22 + rng.normal(0, 2, n)
    cpu1 = ambient + 15 + 30 * util + rng.normal(0, 1, n)
    features = np.column_stack([util, ambient, cpu1, cpu1 - 1]).astype(np.float32)
    power_w = 90 + 160 * util - 30 * util**2 + 0.8 * np.maximum(cpu1 - 50, 0) + rng.normal(0, 2, n)
    return features, power_w


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_converts_and_matches_sklearn(family: str) -> None:
    features, power_w = _rows()
    model = fit_family(FAMILIES[family], features, power_w, seed=0)
    onnx_bytes = model_to_onnx(model, len(FEATURES))

    session = onnxruntime.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    (onnx_input,) = session.get_inputs()
    assert onnx_input.name == ONNX_INPUT_NAME
    assert onnx_input.type == "tensor(float)"
    assert onnx_input.shape[1] == len(FEATURES)

    result = check_parity("node-a", model, onnx_bytes, features)
    assert result.passed, result
    assert result.rows_checked == len(features)
    predicted_w = onnx_predict_w(onnx_bytes, features)
    assert np.allclose(predicted_w, model.predict(features), atol=PARITY_TOLERANCE_W)
    assert np.mean(np.abs(predicted_w - power_w)) < 5.0  # a real fit, not a constant


def _cancelling_ridge() -> tuple[Ridge, np.ndarray]:
    """A model ONNX cannot reproduce: a plain ridge on a column with a huge offset.

    Think of a temperature reported in millikelvin: power = 50 W per unit of a column near
    300,000, so the intercept is about -1.5e7. scikit-learn sums in float64; ONNX sums the same
    terms in float32, whose spacing at 1.5e7 is a whole watt.
    """
    rng = np.random.default_rng(0)
    n = 400
    features = np.column_stack(
        [
            rng.uniform(0, 1, n),
            300_000 + rng.normal(0, 0.5, n),
            rng.uniform(40, 60, n),
            rng.uniform(40, 60, n),
        ]
    ).astype(np.float32)
    power_w = 100 + 100 * features[:, 0] + 50 * (features[:, 1].astype(np.float64) - 300_000)
    return Ridge(alpha=1e-6).fit(features, power_w), features


def test_parity_failure_names_the_node_and_writes_no_bundle(tmp_path) -> None:
    good_features, good_power_w = _rows()
    good = fit_family(FAMILIES["poly3"], good_features, good_power_w, seed=0)
    good_onnx = model_to_onnx(good, len(FEATURES))
    bad, bad_features = _cancelling_ridge()
    bad_onnx = model_to_onnx(bad, len(FEATURES))

    bad_result = check_parity("node-millikelvin", bad, bad_onnx, bad_features)
    assert not bad_result.passed
    assert bad_result.max_abs_diff_w > PARITY_TOLERANCE_W

    out = tmp_path / "bundle"
    with pytest.raises(ExportError, match="node-millikelvin") as caught:
        export_bundle(
            out,
            features=FEATURES,
            node_models={"node-good": good_onnx, "node-millikelvin": bad_onnx},
            node_info={"node-good": {"family": "poly3"}, "node-millikelvin": {"family": "x"}},
            fallback_model=good_onnx,
            fallback_info={"family": "poly3"},
            feature_fill={"cpu2_temp_c": "cpu1_temp_c"},
            extra={},
            parity=[
                check_parity("node-good", good, good_onnx, good_features),
                bad_result,
            ],
        )
    assert "node-good" not in str(caught.value)
    assert not out.exists()


def test_export_writes_a_bundle_read_bundle_accepts(tmp_path) -> None:
    features, power_w = _rows()
    model = fit_family(FAMILIES["gbr"], features, power_w, seed=0)
    onnx_bytes = model_to_onnx(model, len(FEATURES))
    bundle = export_bundle(
        tmp_path / "bundle",
        features=FEATURES,
        node_models={"node-a": onnx_bytes},
        node_info={"node-a": {"family": "gbr", "thermal": {"cpu1_temp_c_per_util": 30.0}}},
        fallback_model=onnx_bytes,
        fallback_info={"family": "gbr", "min_rows": 500},
        feature_fill={"cpu2_temp_c": "cpu1_temp_c"},
        extra={"training_window": {"start": "2026-01-05T00:00:00Z", "end": "2026-01-06T00:00:00Z"}},
        parity=[check_parity("node-a", model, onnx_bytes, features)],
    )
    again = read_bundle(tmp_path / "bundle")
    assert again.version == bundle.version
    assert again.nodes["node-a"].info["family"] == "gbr"
    assert again.fallback is not None and again.fallback.info["min_rows"] == 500
    stored = (tmp_path / "bundle" / again.nodes["node-a"].file).read_bytes()
    assert np.allclose(onnx_predict_w(stored, features), model.predict(features), atol=0.01)


def test_export_refuses_a_model_without_a_parity_check(tmp_path) -> None:
    features, power_w = _rows()
    onnx_bytes = model_to_onnx(fit_family(FAMILIES["poly3"], features, power_w, 0), 4)
    with pytest.raises(ExportError, match="node-unchecked"):
        export_bundle(
            tmp_path / "bundle",
            features=FEATURES,
            node_models={"node-unchecked": onnx_bytes},
            node_info={},
            fallback_model=onnx_bytes,
            fallback_info={},
            feature_fill={},
            extra={},
            parity=[],
        )
    assert not (tmp_path / "bundle").exists()
