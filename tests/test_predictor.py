"""Predictor: real ONNX models through onnxruntime against the curves they were fitted on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from predictor.bundle import MANIFEST_NAME, BundleError
from predictor.model import NoModelError, Predictor
from tests.support.bundles import PowerCurveSpec, edit_manifest, make_bundle, truncate_model

NODE_A = PowerCurveSpec(100.0, 300.0, exponent=1, temp_w_per_c=0.8)
NODE_B = PowerCurveSpec(60.0, 220.0, exponent=3)
FLEET = PowerCurveSpec(80.0, 250.0, exponent=2)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pred") / "bundle"
    make_bundle(directory, {"node-a": NODE_A, "node-b": NODE_B}, fallback=FLEET)
    return directory


@pytest.fixture(scope="module")
def predictor(bundle_dir: Path) -> Predictor:
    return Predictor.load(bundle_dir)


def rows(util: np.ndarray, cpu1_c: np.ndarray) -> np.ndarray:
    return np.column_stack([util, np.full_like(util, 24.0), cpu1_c, cpu1_c]).astype(np.float32)


def test_own_models_match_their_curves(predictor: Predictor) -> None:
    util = np.linspace(0.0, 1.0, 37)
    cpu1 = np.linspace(35.0, 85.0, 37)
    for node, spec in (("node-a", NODE_A), ("node-b", NODE_B)):
        got = predictor.predict_w(node, rows(util, cpu1))
        assert got.dtype == np.float64 and got.shape == (37,)
        # float32 inference of an exact fit: well under a tenth of a watt
        np.testing.assert_allclose(got, spec.power_w(util, cpu1), atol=0.05)


def test_fallback_serves_unknown_nodes(predictor: Predictor) -> None:
    util = np.array([0.0, 0.5, 1.0])
    got = predictor.predict_w("node-without-model", rows(util, np.full(3, 50.0)))
    np.testing.assert_allclose(got, FLEET.power_w(util, 50.0), atol=0.05)
    assert predictor.has_model("node-without-model")
    assert predictor.model_kind("node-a") == "own"
    assert predictor.model_kind("node-z") == "fallback"
    assert predictor.model_key("node-z") == predictor.bundle.fallback.file


def test_no_fallback_means_no_model(tmp_path: Path) -> None:
    make_bundle(tmp_path / "b", {"node-a": NODE_A})
    only_own = Predictor.load(tmp_path / "b")
    assert only_own.has_model("node-a")
    assert not only_own.has_model("node-z")
    assert only_own.model_kind("node-z") is None
    with pytest.raises(NoModelError, match=r"node 'node-z' has no model"):
        only_own.predict_w("node-z", rows(np.array([0.5]), np.array([50.0])))


def test_feature_row_order_and_fill(predictor: Predictor) -> None:
    one_socket = {"cpu1_temp_c": 61.5, "cpu_util": 0.25, "ambient_temp_c": 22.0}
    row = predictor.feature_row(one_socket)
    assert row is not None and row.dtype == np.float32
    np.testing.assert_array_equal(row, np.array([0.25, 22.0, 61.5, 61.5], dtype=np.float32))
    two_sockets = {**one_socket, "cpu2_temp_c": 58.0}
    np.testing.assert_array_equal(predictor.feature_row(two_sockets)[3], np.float32(58.0))
    nan_cpu2 = {**one_socket, "cpu2_temp_c": float("nan")}
    assert predictor.feature_row(nan_cpu2)[3] == np.float32(61.5)
    numpy_values = {name: np.float32(value) for name, value in two_sockets.items()}
    np.testing.assert_array_equal(
        predictor.feature_row(numpy_values), predictor.feature_row(two_sockets)
    )


def test_feature_row_missing_feature_is_none(predictor: Predictor) -> None:
    assert predictor.feature_row({"cpu_util": 0.3, "cpu1_temp_c": 50.0}) is None  # no ambient
    assert predictor.feature_row({"cpu_util": 0.3, "ambient_temp_c": 20.0}) is None  # no cpu1
    no_value = {"cpu_util": None, "ambient_temp_c": 20.0, "cpu1_temp_c": 50.0}
    assert predictor.feature_row(no_value) is None
    assert predictor.feature_row({**no_value, "cpu_util": "0.3"}) is None  # not a number
    assert (
        predictor.feature_row(
            {"cpu_util": float("inf"), "ambient_temp_c": 20.0, "cpu1_temp_c": 50.0}
        )
        is None
    )


def test_rows_of_wrong_width_are_refused(predictor: Predictor) -> None:
    with pytest.raises(ValueError, match=r"shape \[N, 4\], got \(2, 3\)"):
        predictor.predict_w("node-a", np.zeros((2, 3), dtype=np.float32))


def test_nodes_sharing_a_file_share_a_session(predictor: Predictor) -> None:
    assert len(predictor.model_keys) == 3  # node-a, node-b, fallback


def test_wrong_input_width_is_refused_at_load(tmp_path: Path) -> None:
    directory = tmp_path / "b"
    make_bundle(directory, {"node-a": NODE_A}, features=["cpu_util", "cpu1_temp_c"])
    edit_manifest(directory, features=["cpu_util", "ambient_temp_c", "cpu1_temp_c"])
    with pytest.raises(
        BundleError,
        match=r"node-a\.onnx: node 'node-a' field 'model': input 'X' has shape \[None, 2\], "
        r"expected \[N, 3\]",
    ):
        Predictor.load(directory)


def test_truncated_onnx_is_refused_at_load(tmp_path: Path) -> None:
    directory = tmp_path / "b"
    make_bundle(directory, {"node-a": NODE_A}, fallback=FLEET)
    truncate_model(directory, "(fallback)")
    with pytest.raises(
        BundleError, match=r"_fallback\.onnx: node '\(fallback\)' field 'model': onnxruntime cannot"
    ):
        Predictor.load(directory)


def test_bundle_without_cpu_util_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "b"
    make_bundle(directory, {"node-a": NODE_A})
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    manifest["features"][0] = "cpu_busy"
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"field 'features' must include 'cpu_util'"):
        Predictor.load(directory)
