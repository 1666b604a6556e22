"""The model bundle format (contract 2): read and validate a bundle, write one atomically.

A bundle is a directory holding ``manifest.json`` and the ONNX files it points at. Training
writes it (``write_bundle``), the extender reads it (``read_bundle``), and the model swap reads
every new version a ConfigMap brings. Reading therefore trusts nothing: every problem is a
``BundleError`` whose message names the file, the node and the manifest field at fault, so an
operator can fix the bundle without reading code. Loading the ONNX models themselves is
``predictor.model``'s job; this module only checks that the bytes are the ones the manifest
promised.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import stat
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

BUNDLE_FORMAT = "power-model-bundle/v1"
MANIFEST_NAME = "manifest.json"

FALLBACK_NODE = "(fallback)"  # how error messages name the fallback entry
FALLBACK_FILE = "_fallback.onnx"  # Kubernetes node names never start with "_": no collision

# Manifest keys that write_bundle owns; callers' info/extra may not override them.
_RESERVED_TOP = frozenset(
    {"format", "version", "created_at", "features", "feature_fill", "nodes", "fallback"}
)
_RESERVED_ENTRY = frozenset({"model", "sha256"})
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# A node name used verbatim as a file name must also be a valid ConfigMap key.
_SAFE_FILE_STEM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
THERMAL_SUFFIX = "_per_util"


class BundleError(ValueError):
    """A bundle is unusable; the message names the file, node and field at fault."""


def sha256_mismatch(path: Path, node: str, actual: str, expected: str) -> BundleError:
    """A model file whose content is not what the manifest recorded."""
    return BundleError(
        f"{path}: node {node!r} field 'sha256': the file's hash {actual[:12]}... does not match "
        f"the manifest's {expected[:12]}... (the file changed after the bundle was written: a "
        "partial copy, or files of two bundles mixed?)"
    )


@dataclass(frozen=True)
class ModelEntry:
    file: str  # relative to the bundle directory
    sha256: str
    info: dict  # everything else of the node's manifest entry (metrics, family, thermal...)


@dataclass(frozen=True)
class Bundle:
    directory: Path
    version: str
    created_at: str
    features: tuple[str, ...]
    feature_fill: dict[str, str]
    nodes: dict[str, ModelEntry]
    fallback: ModelEntry | None
    manifest: dict  # the raw manifest

    def entry_for(self, node: str) -> ModelEntry | None:
        """The node's own model entry, else the fallback, else None."""
        return self.nodes.get(node, self.fallback)

    def model_path(self, entry: ModelEntry) -> Path:
        return self.directory / entry.file


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# Reading


def read_bundle(directory: Path) -> Bundle:
    """Read and validate the bundle in ``directory``: manifest, features, files, sha256."""
    directory = Path(directory)
    problem = directory_problem(directory)
    if problem is not None:
        raise BundleError(problem)
    manifest_path = directory / MANIFEST_NAME
    try:
        text = manifest_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BundleError(_manifest_missing(directory)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"{manifest_path}: cannot read manifest: {exc}") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BundleError(
            f"{manifest_path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{manifest_path}: manifest must be a JSON object")

    where = str(manifest_path)
    fmt = manifest.get("format")
    if fmt != BUNDLE_FORMAT:
        raise BundleError(f"{where}: field 'format' is {fmt!r}, expected {BUNDLE_FORMAT!r}")
    version = manifest.get("version")
    if not isinstance(version, str) or not version.strip():
        raise BundleError(f"{where}: field 'version' must be a non-empty string, got {version!r}")
    created_at = manifest.get("created_at", "")
    if not isinstance(created_at, str):
        raise BundleError(f"{where}: field 'created_at' must be an RFC 3339 string")

    features = _check_features(manifest.get("features"), where)
    feature_fill = _check_feature_fill(manifest.get("feature_fill", {}), features, where)

    raw_nodes = manifest.get("nodes", {})
    if not isinstance(raw_nodes, dict):
        raise BundleError(f"{where}: field 'nodes' must be an object of node name -> entry")
    nodes = {
        str(name): _check_entry(directory, where, str(name), raw, features)
        for name, raw in raw_nodes.items()
    }
    raw_fallback = manifest.get("fallback")
    fallback = (
        None
        if raw_fallback is None
        else _check_entry(directory, where, FALLBACK_NODE, raw_fallback, features)
    )
    if not nodes and fallback is None:
        raise BundleError(f"{where}: bundle has no models (field 'nodes' empty, no 'fallback')")

    return Bundle(
        directory=directory,
        version=version,
        created_at=created_at,
        features=features,
        feature_fill=feature_fill,
        nodes=nodes,
        fallback=fallback,
        manifest=manifest,
    )


def directory_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot be a bundle directory, said for what is there; None for a
    directory. A file, the manifest itself, a dangling link and nothing at all each get their
    own reason: "missing" for a path that exists sends a person looking in the wrong place."""
    try:
        mode = directory.stat().st_mode
    except FileNotFoundError:
        if directory.is_symlink():
            target = os.readlink(directory)
            return (
                f"{directory}: bundle directory is missing (a symbolic link to {target}, "
                "which does not exist)"
            )
        return f"{directory}: bundle directory is missing"
    except OSError as exc:
        return f"{directory}: cannot look at the bundle directory: {exc.strerror}"
    if stat.S_ISDIR(mode):
        return None
    if stat.S_ISREG(mode) and directory.name == MANIFEST_NAME:
        return (
            f"{directory}: is the bundle's manifest, not its directory: give the directory "
            f"that holds it, {directory.parent}"
        )
    kind = "a file" if stat.S_ISREG(mode) else "not a regular file"
    return f"{directory}: is {kind}, not a bundle directory"


def _manifest_missing(directory: Path) -> str:
    """The reason for a directory without a manifest: empty, a bundle one level down, or other."""
    manifest_path = directory / MANIFEST_NAME
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return f"{manifest_path}: manifest missing"
    if not entries:
        return f"{directory}: the directory is empty, not a bundle"
    below = [entry for entry in entries if (entry / MANIFEST_NAME).is_file()]
    if below:
        others = f" (also {', '.join(e.name for e in below[1:4])})" if len(below) > 1 else ""
        return (
            f"{manifest_path}: manifest missing: the bundle is one level down, in {below[0]}"
            f"{others}"
        )
    count = f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
    return f"{manifest_path}: manifest missing: {directory} has {count}, none of them a bundle"


def read_model_bytes(bundle: Bundle, entry: ModelEntry, *, node: str = "") -> bytes:
    """The model file's bytes, checked again against the manifest's sha256.

    Checking at load time (not only in ``read_bundle``) guarantees the bytes handed to
    onnxruntime are the ones the manifest promised, even if the directory changed in between.
    """
    path = _resolve_inside(bundle.directory, entry.file, str(bundle.directory), node)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BundleError(f"{path}: node {node!r} field 'model': cannot read: {exc}") from None
    actual = sha256_hex(data)
    if actual != entry.sha256:
        raise sha256_mismatch(path, node, actual, entry.sha256)
    return data


def _check_features(raw: object, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        raise BundleError(f"{where}: field 'features' must be a non-empty list of strings")
    seen: set[str] = set()
    for position, name in enumerate(raw):
        if not isinstance(name, str) or not name:
            raise BundleError(
                f"{where}: field 'features' item {position} must be a non-empty string, "
                f"got {name!r}"
            )
        if name in seen:
            raise BundleError(f"{where}: field 'features' lists {name!r} twice")
        seen.add(name)
    return tuple(raw)


def _check_feature_fill(raw: object, features: tuple[str, ...], where: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise BundleError(f"{where}: field 'feature_fill' must be an object feature -> feature")
    for target, source in raw.items():
        for role, name in (("key", target), ("value", source)):
            if name not in features:
                raise BundleError(
                    f"{where}: field 'feature_fill' {role} {name!r} is not one of the "
                    f"features {list(features)}"
                )
        if target == source:
            raise BundleError(f"{where}: field 'feature_fill' fills {target!r} from itself")
    return dict(raw)


def _check_entry(
    directory: Path, where: str, node: str, raw: object, features: tuple[str, ...]
) -> ModelEntry:
    if not isinstance(raw, dict):
        raise BundleError(f"{where}: node {node!r}: entry must be an object with 'model', 'sha256'")
    file = raw.get("model")
    if not isinstance(file, str) or not file:
        raise BundleError(f"{where}: node {node!r} field 'model' must be a file name")
    expected = raw.get("sha256")
    if not isinstance(expected, str) or not _SHA256_RE.match(expected):
        raise BundleError(
            f"{where}: node {node!r} field 'sha256' must be 64 lowercase hex digits, "
            f"got {expected!r}"
        )
    path = _resolve_inside(directory, file, where, node)
    try:
        with path.open("rb") as handle:
            actual = hashlib.file_digest(handle, "sha256").hexdigest()
    except FileNotFoundError:
        raise BundleError(f"{path}: node {node!r} field 'model': file missing") from None
    except OSError as exc:
        raise BundleError(f"{path}: node {node!r} field 'model': cannot read: {exc}") from None
    if actual != expected:
        raise sha256_mismatch(path, node, actual, expected)
    info = {key: value for key, value in raw.items() if key not in _RESERVED_ENTRY}
    _check_thermal(info.get("thermal"), features, where, node)
    _check_max_util(info.get("max_util_measured"), where, node)
    return ModelEntry(file=file, sha256=expected, info=info)


def _check_max_util(raw: object, where: str, node: str) -> None:
    """``max_util_measured`` (optional): the highest load the model was trained on, 0..1."""
    if raw is None:
        return
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0.0 <= raw <= 1.0:
        raise BundleError(
            f"{where}: node {node!r} field 'max_util_measured' must be a utilisation between "
            f"0 and 1, got {raw!r}"
        )


def _check_thermal(raw: object, features: tuple[str, ...], where: str, node: str) -> None:
    """``thermal`` maps '<feature>_per_util' to degrees C per unit utilisation."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise BundleError(f"{where}: node {node!r} field 'thermal' must be an object")
    for key, slope in raw.items():
        feature = key.removesuffix(THERMAL_SUFFIX) if isinstance(key, str) else None
        if feature is None or feature == key or feature not in features:
            raise BundleError(
                f"{where}: node {node!r} field 'thermal' key {key!r} must be "
                f"'<feature>{THERMAL_SUFFIX}' for one of {list(features)}"
            )
        if (
            isinstance(slope, bool)
            or not isinstance(slope, int | float)
            or not math.isfinite(slope)
        ):
            raise BundleError(
                f"{where}: node {node!r} field 'thermal.{key}' must be a finite number, "
                f"got {slope!r}"
            )


def thermal_slopes(entry: ModelEntry) -> dict[str, float]:
    """Feature -> degrees C per unit utilisation, from a (validated) entry's ``thermal``."""
    raw = entry.info.get("thermal") or {}
    return {key.removesuffix(THERMAL_SUFFIX): float(value) for key, value in raw.items()}


def _resolve_inside(directory: Path, file: str, where: str, node: str) -> Path:
    """The model path, refusing anything that could leave the bundle directory."""
    relative = PurePosixPath(file)
    if relative.is_absolute() or ".." in relative.parts or "\\" in file:
        raise BundleError(
            f"{where}: node {node!r} field 'model' {file!r} must be a path inside the bundle"
        )
    path = directory / relative
    # Symlinks are fine while they stay inside (kubelet mounts are name -> ..data/name).
    root = directory.resolve()
    if not path.resolve().is_relative_to(root):
        raise BundleError(
            f"{where}: node {node!r} field 'model' {file!r} resolves outside the bundle "
            f"directory {root}"
        )
    return path


# ---------------------------------------------------------------------------------------------
# Writing


def write_bundle(
    directory: Path,
    *,
    features: Sequence[str],
    node_models: Mapping[str, bytes],
    node_info: Mapping[str, dict],
    fallback_model: bytes | None,
    fallback_info: dict | None,
    feature_fill: Mapping[str, str],
    extra: Mapping[str, object],
) -> Bundle:
    """Write a bundle into ``directory`` atomically and return it as ``read_bundle`` sees it.

    Everything goes into a temporary sibling directory first, which is then renamed into place,
    so a reader never finds half a bundle. An existing bundle at ``directory`` is replaced; an
    existing directory that is not a bundle (and not empty) is refused rather than deleted.
    """
    directory = Path(directory)
    unknown_info = sorted(set(node_info) - set(node_models))
    if unknown_info:
        raise BundleError(f"{directory}: node_info names nodes without a model: {unknown_info}")
    if fallback_info is not None and fallback_model is None:
        raise BundleError(f"{directory}: fallback_info given without a fallback_model")
    for key in extra:
        if key in _RESERVED_TOP:
            raise BundleError(f"{directory}: extra field {key!r} is reserved for the bundle")

    files = _model_file_names(node_models)
    nodes: dict[str, dict] = {}
    for node, data in node_models.items():
        nodes[node] = _entry_dict(directory, node, files[node], data, node_info.get(node, {}))
    fallback = (
        None
        if fallback_model is None
        else _entry_dict(directory, FALLBACK_NODE, FALLBACK_FILE, fallback_model, fallback_info)
    )

    now = datetime.now(UTC).replace(microsecond=0)
    body: dict[str, object] = {
        "features": list(features),
        "feature_fill": dict(feature_fill),
        "nodes": nodes,
        "fallback": fallback,
        **extra,
    }
    content = _to_json(body, directory)
    version = f"{now:%Y%m%dT%H%M%SZ}-{sha256_hex(content.encode())[:10]}"
    manifest = {
        "format": BUNDLE_FORMAT,
        "version": version,
        "created_at": now.isoformat().replace("+00:00", "Z"),
        **body,
    }

    blobs = {files[node]: data for node, data in node_models.items()}
    if fallback_model is not None:
        blobs[FALLBACK_FILE] = fallback_model
    _replace_directory(directory, blobs, _to_json(manifest, directory, indent=2) + "\n")
    return read_bundle(directory)


def _model_file_names(node_models: Mapping[str, bytes]) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in node_models:
        if _SAFE_FILE_STEM_RE.match(node) and node.lower() != MANIFEST_NAME.lower():
            names[node] = f"{node}.onnx"
        else:  # a name unfit for a file or ConfigMap key: name the file by its hash
            names[node] = f"node-{sha256_hex(node.encode())[:16]}.onnx"
    return names


def _entry_dict(directory: Path, node: str, file: str, data: bytes, info: dict | None) -> dict:
    if not isinstance(data, bytes | bytearray) or not data:
        raise BundleError(f"{directory}: node {node!r}: model must be non-empty ONNX bytes")
    info = dict(info or {})
    clash = sorted(_RESERVED_ENTRY & set(info))
    if clash:
        raise BundleError(f"{directory}: node {node!r}: info fields {clash} are reserved")
    return {"model": file, "sha256": sha256_hex(bytes(data)), **info}


def _to_json(value: object, directory: Path, *, indent: int | None = None) -> str:
    try:
        return json.dumps(value, indent=indent, allow_nan=False, default=_json_default)
    except ValueError as exc:
        raise BundleError(
            f"{directory}: manifest value at {_find_non_finite(value)} is NaN or infinite "
            f"(not valid JSON): {exc}"
        ) from None
    except TypeError as exc:
        raise BundleError(f"{directory}: manifest value is not JSON-serialisable: {exc}") from None


def _json_default(value: object) -> object:
    # numpy scalars and arrays come straight from training's metrics.
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(value).__name__} {value!r}")


def _find_non_finite(value: object, path: str = "$") -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _find_non_finite(item, f"{path}.{key}")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for position, item in enumerate(value):
            found = _find_non_finite(item, f"{path}[{position}]")
            if found:
                return found
    elif hasattr(value, "tolist"):
        return _find_non_finite(value.tolist(), path)
    return ""


def _replace_directory(directory: Path, blobs: Mapping[str, bytes], manifest_text: str) -> None:
    if directory.exists() and not directory.is_dir():
        raise BundleError(f"{directory}: exists and is not a directory")
    if (
        directory.is_dir()
        and any(directory.iterdir())
        and not (directory / MANIFEST_NAME).is_file()
    ):
        raise BundleError(f"{directory}: exists, is not empty and holds no {MANIFEST_NAME}")
    directory.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:12]
    staging = directory.parent / f".{directory.name}.tmp-{token}"
    retired = directory.parent / f".{directory.name}.old-{token}"
    try:
        staging.mkdir()
        for name, data in blobs.items():
            _write_synced(staging / name, bytes(data))
        # The manifest last: a staging directory with a manifest is complete.
        _write_synced(staging / MANIFEST_NAME, manifest_text.encode("utf-8"))
        if directory.exists():
            # A directory cannot be renamed over a non-empty one; move the old one aside first.
            os.rename(directory, retired)
        os.rename(staging, directory)
    except BaseException:
        if retired.exists() and not directory.exists():
            os.rename(retired, directory)  # put the previous bundle back
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
