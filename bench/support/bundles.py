"""Model bundles for benches (and tests): ONNX models of known power curves, manifest edits, and
kubelet's ConfigMap volume layout.

Each node's curve is a ``PowerCurveSpec``: ``P(u, t) = idle_w + (max_w - idle_w) * u**exponent
+ temp_w_per_c * (cpu1_temp_c - ref_temp_c)``. A scikit-learn ``LinearRegression`` on
``[u, u**2, ..., u**exponent, cpu1_temp_c]`` fits that exactly and skl2onnx converts it
(``fit_curve_model``), so real ONNX files through real onnxruntime still give known watts (to
float32 precision). ``KubeletMount`` reproduces kubelet's AtomicWriter layout for a mounted
ConfigMap, for bundle swaps as a cluster makes them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from skl2onnx import to_onnx
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import PolynomialFeatures

from predictor.bundle import MANIFEST_NAME

DEFAULT_FEATURES: tuple[str, ...] = ("cpu_util", "ambient_temp_c", "cpu1_temp_c", "cpu2_temp_c")
DEFAULT_FILL: dict[str, str] = {"cpu2_temp_c": "cpu1_temp_c"}


@dataclass(frozen=True)
class PowerCurveSpec:
    """A node's known power curve (the formula above) and how its manifest entry looks."""

    idle_w: float
    max_w: float
    exponent: int = 1  # 1 = linear in u; 2, 3... = convex
    temp_w_per_c: float = 0.0  # watts per degree C of cpu1_temp_c above ref_temp_c
    ref_temp_c: float = 50.0
    thermal: Mapping[str, float] | None = (
        None  # manifest "thermal" entry, e.g. cpu1_temp_c_per_util
    )
    nan_output: bool = False  # the model predicts NaN everywhere
    info: Mapping[str, object] = field(default_factory=dict)  # more manifest entry fields

    def power_w(self, util: np.ndarray | float, cpu1_temp_c: np.ndarray | float) -> np.ndarray:
        """The exact curve the model was fitted on."""
        u = np.asarray(util, dtype=np.float64)
        t = np.asarray(cpu1_temp_c, dtype=np.float64)
        return (
            self.idle_w
            + (self.max_w - self.idle_w) * u**self.exponent
            + self.temp_w_per_c * (t - self.ref_temp_c)
        )


def fit_curve_model(spec: PowerCurveSpec, features: Sequence[str] = DEFAULT_FEATURES) -> bytes:
    """A real scikit-learn model fitted exactly on ``spec``, converted to ONNX bytes."""
    if spec.exponent < 1:
        raise ValueError(f"exponent must be a positive integer, got {spec.exponent}")
    features = tuple(features)
    util_col = features.index("cpu_util")
    rng = np.random.default_rng(7)
    n = 64 * (spec.exponent + 2)
    x = np.column_stack(
        [
            rng.uniform(0.0, 1.0, n) if name == "cpu_util" else rng.uniform(20.0, 90.0, n)
            for name in features
        ]
    )
    columns = [("util", PolynomialFeatures(spec.exponent, include_bias=False), [util_col])]
    if "cpu1_temp_c" in features:
        temp_col = features.index("cpu1_temp_c")
        columns.append(("temp", "passthrough", [temp_col]))
        y = spec.power_w(x[:, util_col], x[:, temp_col])
    else:
        y = spec.power_w(x[:, util_col], spec.ref_temp_c)
    pipeline = Pipeline(
        [("features", ColumnTransformer(columns)), ("linear", LinearRegression())]
    ).fit(x, y)
    if spec.nan_output:
        pipeline.named_steps["linear"].intercept_ = np.float64("nan")
    model = to_onnx(pipeline, x[:1].astype(np.float32))
    return model.SerializeToString()


# ---------------------------------------------------------------------------------------------
# Manifest edits


def load_manifest(directory: Path) -> dict:
    """A bundle's manifest.json as written (no validation)."""
    return json.loads((Path(directory) / MANIFEST_NAME).read_text())


def save_manifest(directory: Path, manifest: dict) -> None:
    """Write a bundle's manifest.json as given (no validation)."""
    (Path(directory) / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))


def edit_manifest(directory: Path, **changes: object) -> dict:
    """Rewrite top-level manifest fields in place (no validation); returns the new manifest."""
    manifest = load_manifest(directory)
    manifest.update(changes)
    save_manifest(directory, manifest)
    return manifest


# ---------------------------------------------------------------------------------------------
# kubelet's ConfigMap volume layout


def raw_files(directory: Path) -> dict[str, bytes]:
    """A directory's files as a ConfigMap carries them (name -> bytes), valid bundle or not."""
    return {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}


class KubeletMount:
    """A directory updated exactly as kubelet's AtomicWriter updates a ConfigMap volume.

    Layout: ``..2026_11_22_19_55_00.123456789/`` holds the files, ``..data -> ..<timestamp>``,
    and each visible file is a symlink ``name -> ..data/name``. ``project`` follows kubelet's
    order: new timestamped dir, write payload, create missing visible symlinks, symlink
    ``..data_tmp`` to the new dir, rename it over ``..data``, remove visible names no longer in
    the payload, remove the old timestamped dir.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def data_target(self) -> str | None:
        try:
            return os.readlink(self.directory / "..data")
        except FileNotFoundError:
            return None

    def project(self, files: Mapping[str, bytes]) -> str:
        """Atomically replace the mounted files with ``files``; returns the new timestamp dir."""
        for name in files:
            if "/" in name or name.startswith(".."):
                raise ValueError(f"invalid ConfigMap key for a volume path: {name!r}")
        old_target = self.data_target
        old_names: set[str] = set()
        if old_target is not None:
            old_names = {p.name for p in (self.directory / old_target).iterdir()}
        prefix = datetime.now(UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
        new_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=self.directory))
        new_dir.chmod(0o755)
        for name, data in files.items():
            (new_dir / name).write_bytes(data)
            (new_dir / name).chmod(0o644)
        for name in files:
            visible = self.directory / name
            if not visible.is_symlink():
                os.symlink(os.path.join("..data", name), visible)
        tmp_link = self.directory / "..data_tmp"
        os.symlink(new_dir.name, tmp_link)
        os.rename(tmp_link, self.directory / "..data")
        for name in old_names - set(files):
            (self.directory / name).unlink(missing_ok=True)
        if old_target is not None:
            shutil.rmtree(self.directory / old_target, ignore_errors=True)
        return new_dir.name

    def project_bundle(self, bundle_directory: Path) -> str:
        return self.project(raw_files(bundle_directory))
