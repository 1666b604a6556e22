"""Bundle format: write_bundle round trip and every read_bundle validation error."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from predictor.bundle import (
    BUNDLE_FORMAT,
    MANIFEST_NAME,
    BundleError,
    read_bundle,
    read_model_bytes,
    sha256_hex,
    thermal_slopes,
    write_bundle,
)
from tests.support.bundles import (
    KubeletMount,
    PowerCurveSpec,
    corrupt_model_bytes,
    edit_manifest,
    make_bundle,
    model_file,
)

CURVES = {
    "node-a": PowerCurveSpec(100.0, 300.0, thermal={"cpu1_temp_c_per_util": 28.0}),
    "node-b": PowerCurveSpec(60.0, 200.0, exponent=2, info={"family": "poly2"}),
}


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("good") / "bundle"
    make_bundle(directory, CURVES, fallback=PowerCurveSpec(80.0, 250.0))
    return directory


@pytest.fixture
def bundle_copy(good_bundle: Path, tmp_path: Path) -> Path:
    target = tmp_path / "bundle"
    target.mkdir()
    for path in good_bundle.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def test_round_trip(good_bundle: Path) -> None:
    bundle = read_bundle(good_bundle)
    assert bundle.manifest["format"] == BUNDLE_FORMAT
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{10}", bundle.version)
    assert bundle.created_at.endswith("Z")
    assert bundle.features == ("cpu_util", "ambient_temp_c", "cpu1_temp_c", "cpu2_temp_c")
    assert bundle.feature_fill == {"cpu2_temp_c": "cpu1_temp_c"}
    assert set(bundle.nodes) == {"node-a", "node-b"}
    assert bundle.nodes["node-b"].info == {"family": "poly2"}
    assert thermal_slopes(bundle.nodes["node-a"]) == {"cpu1_temp_c": 28.0}
    assert bundle.fallback is not None
    assert bundle.entry_for("unknown-node") is bundle.fallback
    data = read_model_bytes(bundle, bundle.nodes["node-a"], node="node-a")
    assert sha256_hex(data) == bundle.nodes["node-a"].sha256


def test_rewrite_replaces_atomically_and_changes_version(tmp_path: Path) -> None:
    directory = tmp_path / "bundle"
    first = make_bundle(directory, {"node-a": CURVES["node-a"]})
    second = make_bundle(directory, {"node-b": CURVES["node-b"]})
    assert first.version != second.version
    assert set(read_bundle(directory).nodes) == {"node-b"}
    assert not (directory / "node-a.onnx").exists()  # nothing of the old bundle is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no staging leftovers


def test_write_refuses_to_replace_a_directory_that_is_not_a_bundle(tmp_path: Path) -> None:
    directory = tmp_path / "precious"
    directory.mkdir()
    (directory / "notes.txt").write_text("keep me")
    with pytest.raises(BundleError, match=r"precious: exists, is not empty and holds no"):
        make_bundle(directory, {"node-a": CURVES["node-a"]})
    assert (directory / "notes.txt").read_text() == "keep me"


def test_write_names_the_non_finite_value(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"\$\.nodes\.node-a\.metrics\.mae_w is NaN"):
        write_bundle(
            tmp_path / "b",
            features=["cpu_util"],
            node_models={"node-a": b"not-onnx-but-bytes"},
            node_info={"node-a": {"metrics": {"mae_w": float("nan")}}},
            fallback_model=None,
            fallback_info=None,
            feature_fill={},
            extra={},
        )
    assert not (tmp_path / "b").exists()


def test_write_refuses_reserved_fields(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"extra field 'version' is reserved"):
        write_bundle(
            tmp_path / "b",
            features=["cpu_util"],
            node_models={"node-a": b"x"},
            node_info={},
            fallback_model=None,
            fallback_info=None,
            feature_fill={},
            extra={"version": "mine"},
        )


def test_odd_node_names_get_safe_file_names(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", {"rack 1/node:a": CURVES["node-a"]})
    file = bundle.nodes["rack 1/node:a"].file
    assert re.fullmatch(r"node-[0-9a-f]{16}\.onnx", file)


# --- read_bundle errors: each names the file, node and field --------------------------------


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"nowhere: bundle directory is missing$"):
        read_bundle(tmp_path / "nowhere")


# Paths a person gives by mistake: each gets its own reason, not "missing".
def _a_file(tmp: Path, bundle: Path) -> Path:
    (tmp / "README.md").write_text("# not a bundle\n")
    return tmp / "README.md"


def _an_empty_directory(tmp: Path, bundle: Path) -> Path:
    (tmp / "empty").mkdir()
    return tmp / "empty"


def _a_dangling_link(tmp: Path, bundle: Path) -> Path:
    (tmp / "link").symlink_to(tmp / "gone")
    return tmp / "link"


def _a_directory_of_other_files(tmp: Path, bundle: Path) -> Path:
    (tmp / "notes").mkdir()
    (tmp / "notes" / "a.txt").write_text("x")
    return tmp / "notes"


@pytest.mark.parametrize(
    ("make_path", "reason"),
    [
        (_a_file, "README.md: is a file, not a bundle directory"),
        (lambda tmp, bundle: bundle / MANIFEST_NAME, "is the bundle's manifest, not its directory"),
        (_an_empty_directory, "empty: the directory is empty, not a bundle"),
        (_a_dangling_link, "link: bundle directory is missing (a symbolic link to "),
        (_a_directory_of_other_files, "notes/manifest.json: manifest missing: "),
        (lambda tmp, bundle: bundle.parent, "manifest missing: the bundle is one level down, in "),
    ],
    ids=["file", "manifest-file", "empty-dir", "dangling-link", "other-files", "parent-dir"],
)
def test_a_path_that_is_not_a_bundle_directory_says_what_it_is(
    good_bundle: Path, tmp_path: Path, make_path, reason: str
) -> None:
    with pytest.raises(BundleError) as error:
        read_bundle(make_path(tmp_path, good_bundle))
    assert reason in str(error.value)
    assert "\n" not in str(error.value)
    if make_path is _a_directory_of_other_files:
        assert str(error.value).endswith("notes has 1 entry, none of them a bundle")


def test_missing_manifest(bundle_copy: Path) -> None:
    (bundle_copy / MANIFEST_NAME).unlink()
    with pytest.raises(BundleError, match=r"manifest\.json: manifest missing"):
        read_bundle(bundle_copy)


def test_manifest_not_json(bundle_copy: Path) -> None:
    (bundle_copy / MANIFEST_NAME).write_text('{"format": ')
    with pytest.raises(BundleError, match=r"manifest\.json: not valid JSON at line 1 column 12"):
        read_bundle(bundle_copy)


def test_bad_format(bundle_copy: Path) -> None:
    edit_manifest(bundle_copy, format="power-model-bundle/v9")
    with pytest.raises(
        BundleError, match=r"field 'format' is 'power-model-bundle/v9', expected 'power-model"
    ):
        read_bundle(bundle_copy)


def test_empty_version(bundle_copy: Path) -> None:
    edit_manifest(bundle_copy, version="  ")
    with pytest.raises(BundleError, match=r"field 'version' must be a non-empty string"):
        read_bundle(bundle_copy)


def test_duplicate_feature(bundle_copy: Path) -> None:
    edit_manifest(bundle_copy, features=["cpu_util", "cpu1_temp_c", "cpu_util"])
    with pytest.raises(BundleError, match=r"field 'features' lists 'cpu_util' twice"):
        read_bundle(bundle_copy)


def test_feature_fill_unknown_feature(bundle_copy: Path) -> None:
    edit_manifest(bundle_copy, feature_fill={"cpu2_temp_c": "gpu_temp_c"})
    with pytest.raises(
        BundleError, match=r"manifest\.json: field 'feature_fill' value 'gpu_temp_c' is not one"
    ):
        read_bundle(bundle_copy)


def test_missing_model_file(bundle_copy: Path) -> None:
    model_file(bundle_copy, "node-b").unlink()
    with pytest.raises(
        BundleError, match=r"node-b\.onnx: node 'node-b' field 'model': file missing"
    ):
        read_bundle(bundle_copy)


def test_bad_sha256(bundle_copy: Path) -> None:
    corrupt_model_bytes(bundle_copy, "node-a")
    with pytest.raises(
        BundleError,
        match=r"node-a\.onnx: node 'node-a' field 'sha256': the file's hash [0-9a-f]{12}\.\.\. "
        r"does not match the manifest's [0-9a-f]{12}\.\.\. \(the file changed after",
    ):
        read_bundle(bundle_copy)


def test_bad_sha256_of_the_fallback(bundle_copy: Path) -> None:
    corrupt_model_bytes(bundle_copy, "(fallback)")
    with pytest.raises(BundleError, match=r"node '\(fallback\)' field 'sha256'"):
        read_bundle(bundle_copy)


def test_path_escape_with_dotdot(bundle_copy: Path) -> None:
    manifest = json.loads((bundle_copy / MANIFEST_NAME).read_text())
    manifest["nodes"]["node-a"]["model"] = "../elsewhere/node-a.onnx"
    (bundle_copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(
        BundleError,
        match=r"node 'node-a' field 'model' '\.\./elsewhere/node-a\.onnx' must be a path inside",
    ):
        read_bundle(bundle_copy)


def test_path_escape_through_a_symlink(bundle_copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(model_file(bundle_copy, "node-a").read_bytes())
    model_file(bundle_copy, "node-a").unlink()
    os.symlink(outside, bundle_copy / "node-a.onnx")
    with pytest.raises(BundleError, match=r"node 'node-a' field 'model' 'node-a\.onnx' resolves "):
        read_bundle(bundle_copy)


def test_bad_thermal_key(bundle_copy: Path) -> None:
    manifest = json.loads((bundle_copy / MANIFEST_NAME).read_text())
    manifest["nodes"]["node-a"]["thermal"] = {"gpu_temp_c_per_util": 3.0}
    (bundle_copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(
        BundleError, match=r"node 'node-a' field 'thermal' key 'gpu_temp_c_per_util' must be"
    ):
        read_bundle(bundle_copy)


def test_no_models(bundle_copy: Path) -> None:
    edit_manifest(bundle_copy, nodes={}, fallback=None)
    with pytest.raises(BundleError, match=r"bundle has no models"):
        read_bundle(bundle_copy)


def test_reads_through_kubelet_symlinks(good_bundle: Path, tmp_path: Path) -> None:
    mount = KubeletMount(tmp_path / "mount")
    mount.project_bundle(good_bundle)
    assert (tmp_path / "mount" / "node-a.onnx").is_symlink()
    bundle = read_bundle(tmp_path / "mount")
    assert bundle.version == read_bundle(good_bundle).version


def test_extra_fields_are_kept(tmp_path: Path) -> None:
    window = {"start": "2026-01-05T00:00:00Z", "end": "2026-01-06T00:00:00Z"}
    bundle = make_bundle(tmp_path / "b", CURVES, extra={"training_window": window})
    assert bundle.manifest["training_window"] == window
