"""Publish a model bundle to the cluster as ConfigMaps, for the extender to mount.

The last step of training: `python -m training.publish --bundle DIR --name NAME --namespace NS`
reads the bundle (validated by `predictor.bundle.read_bundle`: manifest, files, sha256) and
writes its files as `binaryData` of ConfigMaps `NAME-0`, `NAME-1`, ... through the official
Kubernetes client. The extender's pod mounts them with one projected volume, so they appear as
one directory that kubelet swaps atomically (the `..data` symlink), and the extender's reloader
picks the new version up without a restart.

Why several ConfigMaps: one holds at most 1 MiB. A shard here is sized by the object as sent,
base64 and metadata included, so it stays under 1 MiB by any measure (the API server's 1 MiB of
decoded data, etcd's 1.5 MiB per request once managed fields are added). `manifest.json` always
goes into `NAME-0`; the model files fill shards in name order. A single file that cannot fit
even alone is refused before any API call, with its size and the limit.

Order of writes: the data shards first, `NAME-0` (the manifest) last, then shards left over
from an earlier, larger publish are deleted (found by label). A reader that sees the new
manifest therefore finds its files already published; one that catches kubelet between two
shard updates sees sha256 mismatches and keeps its old bundle (predictor.reload).

Every shard is labelled with the bundle name, the shard index and the bundle version
(label-value-safe; the exact version is in an annotation).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from tqdm import tqdm
from urllib3.exceptions import HTTPError as ConnectionFailure

from livedata.kube_client import (
    KubeConfigError,
    add_kube_arguments,
    describe_api_error,
    describe_unreachable,
    kube_api_client,
    quiet_client_retries,
)
from predictor.bundle import MANIFEST_NAME, Bundle, BundleError, read_bundle

log = logging.getLogger("training.publish")

# The largest ConfigMap we write, measured as the JSON object sent (base64 included).
MAX_CONFIGMAP_BYTES = 1024 * 1024
# Per binaryData entry, JSON punctuation around key and value: quotes, colon, comma, spaces.
_ENTRY_OVERHEAD_BYTES = 8

PART_OF_LABEL = "app.kubernetes.io/part-of"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
BUNDLE_LABEL = "power-aware-scheduler/bundle"
SHARD_LABEL = "power-aware-scheduler/shard"
VERSION_LABEL = "power-aware-scheduler/bundle-version"
VERSION_ANNOTATION = "power-aware-scheduler/bundle-version"
SHARD_COUNT_ANNOTATION = "power-aware-scheduler/shard-count"
FILES_ANNOTATION = "power-aware-scheduler/files"

# A bundle name leaves room for "-<shard>" within a 63-character label value and name.
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,54}[a-z0-9])?$")
_CONFIGMAP_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
_LABEL_VALUE_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
LABEL_VALUE_MAX = 63
RBAC_MANIFEST = "manifests/base/trainer.yaml"  # the trainer's rights, named in a 403's hint


class PublishError(RuntimeError):
    """The bundle cannot be published; the message says which file, ConfigMap or answer."""


@dataclass(frozen=True)
class BundleFile:
    key: str  # the ConfigMap key, which is the file's name in the mounted directory
    data: bytes

    @property
    def encoded_bytes(self) -> int:
        """What the entry costs in the ConfigMap's JSON."""
        return len(self.key) + 4 * ((len(self.data) + 2) // 3) + _ENTRY_OVERHEAD_BYTES


@dataclass
class PublishResult:
    names: list[str]
    created: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Pure: files, shards, objects, snippets
# --------------------------------------------------------------------------------------------


def label_value(text: str) -> str:
    """`text` made a valid label value: [A-Za-z0-9._-], alphanumeric at both ends, <= 63.

    A value that had to be shortened ends in a hash of the original, so two long versions that
    share a prefix still get different labels.
    """
    safe = _LABEL_VALUE_UNSAFE.sub("-", text)
    if len(safe) > LABEL_VALUE_MAX:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        safe = f"{safe[: LABEL_VALUE_MAX - 9]}-{digest}"
    safe = safe.strip("-_.")
    return safe or "unknown"


def shard_names(name: str, count: int) -> list[str]:
    return [f"{name}-{index}" for index in range(count)]


def check_bundle_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise PublishError(
            f"--name {name!r}: use 1-56 lower-case letters, digits and '-', starting and ending "
            "with a letter or digit (shards are named <name>-0, <name>-1, ...)"
        )
    return name


def bundle_files(bundle: Bundle) -> list[BundleFile]:
    """The manifest and every model file it names (nothing else in the directory)."""
    entries = [*bundle.nodes.values(), *([bundle.fallback] if bundle.fallback else [])]
    keys = sorted({entry.file for entry in entries})
    files = [BundleFile(MANIFEST_NAME, (bundle.directory / MANIFEST_NAME).read_bytes())]
    for key in keys:
        if not _CONFIGMAP_KEY_RE.match(key):
            raise PublishError(
                f"{bundle.directory}: model file {key!r} cannot be a ConfigMap key (only "
                "letters, digits, '-', '_' and '.'; no subdirectories)"
            )
        files.append(BundleFile(key, (bundle.directory / key).read_bytes()))
    return files


def _base_object(
    name: str, namespace: str, bundle_name: str, version: str, index: int, count: int
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                PART_OF_LABEL: "power-aware-scheduler",
                COMPONENT_LABEL: "model-bundle",
                MANAGED_BY_LABEL: "training.publish",
                BUNDLE_LABEL: bundle_name,
                SHARD_LABEL: str(index),
                VERSION_LABEL: label_value(version),
            },
            "annotations": {
                VERSION_ANNOTATION: version,
                SHARD_COUNT_ANNOTATION: str(count),
                FILES_ANNOTATION: "",
            },
        },
        "binaryData": {},
    }


def _object_bytes(obj: dict[str, Any]) -> int:
    return len(json.dumps(obj).encode())


def plan_shards(
    files: Sequence[BundleFile],
    *,
    overhead_bytes: int,
    files_overhead_per_key: int = 1,
    max_bytes: int = MAX_CONFIGMAP_BYTES,
) -> list[list[BundleFile]]:
    """Group files into shards of at most `max_bytes` each; files[0] (the manifest) first.

    `overhead_bytes` is what a shard costs with no files (its metadata). Files are placed in
    order, each into the first shard with room (first fit), so a bundle that changes a little
    keeps most files in the shards they were in. Raises PublishError for a file too large
    for any shard, naming it and the limit.
    """
    room = max_bytes - overhead_bytes
    shards: list[list[BundleFile]] = []
    used: list[int] = []
    for file in files:
        cost = file.encoded_bytes + len(file.key) + files_overhead_per_key
        if cost > room:
            max_raw = max(0, (room - len(file.key) * 2 - _ENTRY_OVERHEAD_BYTES) * 3 // 4)
            raise PublishError(
                f"{file.key} is {len(file.data):,} bytes ({file.encoded_bytes:,} base64-encoded); "
                f"a ConfigMap holds at most {max_bytes:,} bytes, so one file can be at most "
                f"about {max_raw:,} bytes: use a smaller model family for this node"
            )
        for index in range(len(shards)):
            if used[index] + cost <= room:
                shards[index].append(file)
                used[index] += cost
                break
        else:
            shards.append([file])
            used.append(cost)
    return shards


def build_configmaps(
    bundle: Bundle,
    name: str,
    namespace: str,
    *,
    max_bytes: int = MAX_CONFIGMAP_BYTES,
) -> list[dict[str, Any]]:
    """The ConfigMap objects (JSON dicts) that carry `bundle`, NAME-0 with the manifest."""
    check_bundle_name(name)
    files = bundle_files(bundle)
    # Metadata of the largest shard index we could need (a bound on every shard's metadata).
    worst_case = _base_object(
        f"{name}-{len(files)}", namespace, name, bundle.version, len(files), len(files)
    )
    groups = plan_shards(files, overhead_bytes=_object_bytes(worst_case), max_bytes=max_bytes)
    objects = []
    for index, group in enumerate(groups):
        obj = _base_object(f"{name}-{index}", namespace, name, bundle.version, index, len(groups))
        obj["metadata"]["annotations"][FILES_ANNOTATION] = ",".join(f.key for f in group)
        obj["binaryData"] = {f.key: base64.b64encode(f.data).decode("ascii") for f in group}
        size = _object_bytes(obj)
        # The plan's arithmetic is an upper bound; checked here so a mistake never reaches
        # the API server as a half-published bundle.
        if size > max_bytes:
            raise PublishError(
                f"internal: shard {obj['metadata']['name']} came out at {size:,} bytes, over "
                f"{max_bytes:,}"
            )
        objects.append(obj)
    return objects


def projected_volume(configmap_names: Sequence[str], volume_name: str = "models") -> dict:
    """The pod volume that mounts the shards as one directory."""
    return {
        "name": volume_name,
        "projected": {"sources": [{"configMap": {"name": n}} for n in configmap_names]},
    }


def volume_snippet(configmap_names: Sequence[str], version: str) -> str:
    """YAML comment + `volumes:` block to paste into the extender's pod spec."""
    header = (
        f"# Bundle {version} in {len(configmap_names)} ConfigMap(s). Mount them as one "
        "directory\n# (the extender's --bundle) with this volume in its pod spec:\n"
    )
    body = yaml.safe_dump(
        {"volumes": [projected_volume(configmap_names)]}, sort_keys=False, default_flow_style=False
    )
    return header + body


def render_dry_run(objects: Sequence[dict[str, Any]], version: str) -> str:
    """Multi-document YAML of the ConfigMaps, then the volume snippet as comments.

    The output stays valid YAML (`kubectl apply -f -` takes it as is).
    """
    documents = yaml.safe_dump_all(
        objects, sort_keys=False, default_flow_style=False, width=2**31 - 1
    )
    snippet = volume_snippet([o["metadata"]["name"] for o in objects], version)
    commented = "".join(
        line if line.startswith("#") else f"# {line}" for line in snippet.splitlines(True)
    )
    return f"{documents}---\n{commented}"


# --------------------------------------------------------------------------------------------
# I/O: the API
# --------------------------------------------------------------------------------------------


def publish_configmaps(
    core_api: client.CoreV1Api,
    objects: Sequence[dict[str, Any]],
    *,
    namespace: str,
    bundle_name: str,
    progress: bool = False,
) -> PublishResult:
    """Create or replace each shard (NAME-0 last), then delete shards no longer used."""
    names = [o["metadata"]["name"] for o in objects]
    result = PublishResult(names=names)
    ordered = [*objects[1:], objects[0]]  # the manifest's shard last
    for obj in tqdm(ordered, desc="ConfigMaps", unit="cm", disable=not progress):
        name = obj["metadata"]["name"]
        where = f"ConfigMap {namespace}/{name}"
        try:
            try:
                core_api.create_namespaced_config_map(namespace, obj)
                result.created.append(name)
            except ApiException as error:
                if error.status != 409:
                    raise
                # It exists: replace it whole (no resourceVersion: this writer owns it).
                core_api.replace_namespaced_config_map(name, namespace, obj)
                result.replaced.append(name)
        except ApiException as error:
            raise PublishError(
                describe_api_error(error, f"writing {where}", rbac_manifest=RBAC_MANIFEST)
            ) from None
        except ConnectionFailure as error:
            raise PublishError(describe_unreachable(error, f"writing {where}")) from None
        log.info("wrote %s (%d files)", where, len(obj["binaryData"]))
    result.deleted = _delete_stale_shards(core_api, namespace, bundle_name, set(names))
    return result


def _delete_stale_shards(
    core_api: client.CoreV1Api, namespace: str, bundle_name: str, keep: set[str]
) -> list[str]:
    shard_name = re.compile(rf"^{re.escape(bundle_name)}-\d+$")
    try:
        response = core_api.list_namespaced_config_map(
            namespace, label_selector=f"{BUNDLE_LABEL}={bundle_name}", _preload_content=False
        )
        listed = json.loads(response.data)["items"]
    except ApiException as error:
        raise PublishError(
            describe_api_error(
                error,
                f"listing old shards of {bundle_name} in {namespace}",
                rbac_manifest=RBAC_MANIFEST,
            )
        ) from None
    except ConnectionFailure as error:
        raise PublishError(
            describe_unreachable(error, f"listing old shards of {bundle_name} in {namespace}")
        ) from None
    deleted = []
    for item in listed:
        name = item["metadata"]["name"]
        if name in keep or not shard_name.match(name):
            continue
        try:
            core_api.delete_namespaced_config_map(name, namespace)
        except ApiException as error:
            if error.status == 404:
                continue
            raise PublishError(
                describe_api_error(
                    error, f"deleting stale shard {namespace}/{name}", rbac_manifest=RBAC_MANIFEST
                )
            ) from None
        except ConnectionFailure as error:
            raise PublishError(
                describe_unreachable(error, f"deleting stale shard {namespace}/{name}")
            ) from None
        log.info("deleted stale shard ConfigMap %s/%s", namespace, name)
        deleted.append(name)
    return deleted


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.publish",
        description=(
            "Write a model bundle into ConfigMaps NAME-0, NAME-1, ... (binaryData, each under "
            "1 MiB, manifest.json in NAME-0), creating or replacing them, delete shards left "
            "from a larger earlier bundle, and print the projected volume that mounts them as "
            "one directory."
        ),
    )
    parser.add_argument("--bundle", type=Path, required=True, help="bundle directory (required)")
    parser.add_argument(
        "--name",
        required=True,
        help="ConfigMap name prefix: shards are NAME-0, NAME-1, ... (required; the manifests "
        "mount power-models-*)",
    )
    parser.add_argument("--namespace", required=True, help="namespace to write to (required)")
    add_kube_arguments(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the ConfigMaps as YAML (and the volume as comments); call no API",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar; warnings only")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    quiet_client_retries()
    try:
        bundle = read_bundle(args.bundle)
        objects = build_configmaps(bundle, args.name, args.namespace)
    except (BundleError, PublishError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    names = [o["metadata"]["name"] for o in objects]
    if args.dry_run:
        sys.stdout.write(render_dry_run(objects, bundle.version))
        return 0
    try:
        api_client = kube_api_client(kubeconfig=args.kubeconfig, in_cluster=args.in_cluster)
        result = publish_configmaps(
            client.CoreV1Api(api_client),
            objects,
            namespace=args.namespace,
            bundle_name=args.name,
            progress=not args.quiet and sys.stderr.isatty(),
        )
    except (KubeConfigError, PublishError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    log.info(
        "published bundle %s as %s (%d created, %d replaced, %d stale deleted)",
        bundle.version,
        ", ".join(names),
        len(result.created),
        len(result.replaced),
        len(result.deleted),
    )
    sys.stdout.write(volume_snippet(names, bundle.version))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
