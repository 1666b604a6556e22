"""training.publish against the real API server (envtest), as ServiceAccount power-model-trainer.

The publisher runs with the token and rights manifests/base/trainer.yaml gives the trainer
(ConfigMaps power-models-0..7 of namespace power-aware-scheduler, nothing else), so these tests
also prove those rights are enough. The shards' names are the ones the manifests grant, in a
namespace the control plane shares: every test starts and ends without them. What the publisher
sends is recorded as sent (`RequestLog`); the 1 MiB ConfigMap limit and the 3 MiB request limit
are the real server's.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client as k8s
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from onnx import TensorProto, helper, numpy_helper

from envtest import ControlPlane
from predictor.bundle import Bundle, read_bundle, write_bundle
from tests.support.bundles import (
    DEFAULT_FEATURES,
    KubeletMount,
    PowerCurveSpec,
    corrupt_model_bytes,
    fit_curve_model,
    make_bundle,
)
from tests.support.fault_proxy import FaultProxy
from tests.support.kube_api import (
    COMPONENT_NAMESPACE,
    RequestLog,
    SentRequest,
    component_kubeconfig,
    kubeconfig_via,
)
from training import publish

NAMESPACE = COMPONENT_NAMESPACE
NAME = "power-models"  # the shards manifests/base/trainer.yaml lets the trainer write
TRAINER = "power-model-trainer"
# The API server's limit on a ConfigMap's data + binaryData (core.MaxSecretSize).
MAX_CONFIGMAP_BYTES = 1024 * 1024
OURS = re.compile(r"^(power-models|other-models)-\d+$")  # what the tests write
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers


class Kube:
    """The admin's view of the namespace, and what the trainer sent."""

    def __init__(self, plane: ControlPlane, sent: RequestLog) -> None:
        self.plane = plane
        self.core = k8s.CoreV1Api(plane.api_client())
        self.sent = sent

    def configmaps(self) -> dict[str, dict]:
        response = self.core.list_namespaced_config_map(NAMESPACE, _preload_content=False)
        items = json.loads(response.data)["items"]
        return {cm["metadata"]["name"]: cm for cm in items if OURS.match(cm["metadata"]["name"])}

    def remove_ours(self) -> None:
        for name in self.configmaps():
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_config_map(name, NAMESPACE)

    @property
    def requests(self) -> list[SentRequest]:
        """What the publisher sent as the trainer."""
        return self.sent.by(TRAINER)

    def clear_requests(self) -> None:
        self.sent.clear()


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    with RequestLog().recording() as sent:
        admin = Kube(control_plane, sent)
        admin.remove_ours()
        yield admin
        admin.remove_ours()


@pytest.fixture
def trainer_kubeconfig(control_plane: ControlPlane) -> Path:
    return component_kubeconfig(control_plane, TRAINER)


@pytest.fixture(scope="module")
def small_model() -> bytes:
    return fit_curve_model(PowerCurveSpec(idle_w=95.0, max_w=310.0, exponent=2))


def fleet_bundle(directory: Path, model: bytes, n_nodes: int) -> Bundle:
    return write_bundle(
        directory,
        features=DEFAULT_FEATURES,
        node_models={f"node-{i:05d}": model for i in range(n_nodes)},
        node_info={f"node-{i:05d}": {"family": "poly2"} for i in range(n_nodes)},
        fallback_model=model,
        fallback_info={},
        feature_fill={"cpu2_temp_c": "cpu1_temp_c"},
        extra={},
    )


def large_onnx_model(weight_count: int) -> bytes:
    """A real ONNX regression (mean of X @ W, in watts) whose weights make it large."""
    features = len(DEFAULT_FEATURES)
    columns = weight_count // features
    weights = np.full((features, columns), 100.0 / features, dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["XW"]),
            helper.make_node("ReduceMean", ["XW"], ["Y"], axes=[1], keepdims=0),
        ],
        "large",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None])],
        [numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"X": np.ones((2, features), dtype=np.float32)})
    assert np.allclose(out, 100.0)  # a working model, not a blob
    return data


def bundle_with_large_model(directory: Path, model: bytes, large: bytes) -> Bundle:
    return write_bundle(
        directory,
        features=DEFAULT_FEATURES,
        node_models={"node-a": model, "node-huge": large},
        node_info={},
        fallback_model=None,
        fallback_info=None,
        feature_fill={},
        extra={},
    )


def decoded_files(configmap: dict) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (configmap.get("binaryData") or {}).items()}


def on_disk(bundle: Bundle) -> dict[str, bytes]:
    entries = [*bundle.nodes.values(), *([bundle.fallback] if bundle.fallback else [])]
    files = {e.file: (bundle.directory / e.file).read_bytes() for e in entries}
    return {"manifest.json": (bundle.directory / "manifest.json").read_bytes(), **files}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = publish.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_args(bundle_dir: Path, kubeconfig: Path, *extra: str) -> list[str]:
    return [
        "--bundle",
        str(bundle_dir),
        "--name",
        NAME,
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        str(kubeconfig),
        "--quiet",
        *extra,
    ]


def configmap_writes(kube: Kube) -> list[tuple[str, str]]:
    """(method, ConfigMap name) of every create/replace/delete, in order."""
    writes = []
    for request in kube.requests:
        if "/configmaps" not in request.path or request.method == "GET":
            continue
        if request.method == "POST":
            writes.append(("POST", request.body["metadata"]["name"]))
        else:
            writes.append((request.method, request.path.rsplit("/", 1)[-1]))
    return writes


# ---------------------------------------------------------------------------------------------
# Create, update, labels


def test_publish_creates_a_configmap_with_the_bundle_and_its_version(
    tmp_path: Path, kube: Kube, trainer_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = make_bundle(
        tmp_path / "bundle",
        {"node-a": PowerCurveSpec(100.0, 300.0), "node-b": PowerCurveSpec(80.0, 220.0, 2)},
        fallback=PowerCurveSpec(90.0, 260.0),
    )
    kubeconfig = trainer_kubeconfig

    code, out, err = run_cli(capsys, *cli_args(bundle.directory, kubeconfig))

    assert code == 0, err
    stored = kube.configmaps()
    assert list(stored) == [f"{NAME}-0"]
    shard = stored[f"{NAME}-0"]
    assert decoded_files(shard) == on_disk(bundle)
    labels = shard["metadata"]["labels"]
    assert labels[publish.VERSION_LABEL] == bundle.version
    assert labels[publish.BUNDLE_LABEL] == NAME
    assert labels[publish.SHARD_LABEL] == "0"
    assert shard["metadata"]["annotations"][publish.VERSION_ANNOTATION] == bundle.version
    # The printed snippet is the volume that mounts it.
    volumes = yaml.safe_load(out)["volumes"]
    assert volumes == [
        {"name": "models", "projected": {"sources": [{"configMap": {"name": f"{NAME}-0"}}]}}
    ]


def test_publish_again_replaces_the_existing_configmap(
    tmp_path: Path, kube: Kube, trainer_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = trainer_kubeconfig
    first = make_bundle(tmp_path / "one", {"node-a": PowerCurveSpec(100.0, 300.0)})
    assert run_cli(capsys, *cli_args(first.directory, kubeconfig))[0] == 0
    second = make_bundle(
        tmp_path / "two",
        {"node-a": PowerCurveSpec(110.0, 320.0), "node-c": PowerCurveSpec(70.0, 180.0)},
    )
    assert second.version != first.version
    kube.clear_requests()

    code, _, err = run_cli(capsys, *cli_args(second.directory, kubeconfig))

    assert code == 0, err
    # The create answers 409 AlreadyExists; the publisher then replaces the object.
    assert configmap_writes(kube) == [("POST", f"{NAME}-0"), ("PUT", f"{NAME}-0")]
    posted = next(r for r in kube.requests if r.method == "POST")
    assert posted.body["metadata"]["name"] == f"{NAME}-0"
    shard = kube.configmaps()[f"{NAME}-0"]
    assert decoded_files(shard) == on_disk(second)
    assert shard["metadata"]["labels"][publish.VERSION_LABEL] == second.version


@pytest.mark.parametrize(
    "version",
    [
        "20261122T195500Z-abc1234567",
        "run 42: fitted on 2026-01-05/2026-01-12 (fleet A)",
        "x" * 200,
        "-._leading-and-trailing_.-",
        "",
    ],
)
def test_label_value_is_always_a_valid_label(version: str) -> None:
    value = publish.label_value(version)
    assert len(value) <= 63
    assert LABEL_VALUE_RE.match(value), value
    assert value


def test_long_versions_with_a_common_prefix_get_distinct_labels() -> None:
    a = publish.label_value("v" * 80 + "-run-1")
    b = publish.label_value("v" * 80 + "-run-2")
    assert a != b


# ---------------------------------------------------------------------------------------------
# Sharding a fleet's bundle


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, small_model: bytes) -> Bundle:
    # ~2.4 MB of model files plus a ~0.4 MB manifest: three to four shards.
    return fleet_bundle(tmp_path_factory.mktemp("fleet") / "bundle", small_model, 2600)


def test_fleet_bundle_is_sharded_under_the_limit_and_mounts_as_one_directory(
    tmp_path: Path,
    kube: Kube,
    trainer_kubeconfig: Path,
    fleet: Bundle,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = on_disk(fleet)
    assert sum(len(data) for data in files.values()) > 2 * MAX_CONFIGMAP_BYTES
    kubeconfig = trainer_kubeconfig

    code, out, err = run_cli(capsys, *cli_args(fleet.directory, kubeconfig))

    assert code == 0, err
    stored = kube.configmaps()
    names = [f"{NAME}-{i}" for i in range(len(stored))]
    assert sorted(stored) == sorted(names) and len(names) >= 3
    # Every shard under 1 MiB, measured as sent (base64 included) and as stored.
    for request in kube.requests:
        if request.method == "POST":
            assert request.body_bytes <= MAX_CONFIGMAP_BYTES
    for shard in stored.values():
        assert sum(len(d) for d in decoded_files(shard).values()) <= MAX_CONFIGMAP_BYTES
        assert shard["metadata"]["annotations"][publish.SHARD_COUNT_ANNOTATION] == str(len(names))
        assert shard["metadata"]["labels"][publish.VERSION_LABEL] == fleet.version
    assert "manifest.json" in decoded_files(stored[f"{NAME}-0"])
    # The manifest's shard is written last, so its files are already there when it lands.
    assert [name for _, name in configmap_writes(kube)][-1] == f"{NAME}-0"

    # The printed volume mounts all shards; projecting them (as kubelet does) into one
    # directory gives back a bundle that reads and validates as the original.
    (volume,) = yaml.safe_load(out)["volumes"]
    mounted_names = [s["configMap"]["name"] for s in volume["projected"]["sources"]]
    assert mounted_names == names
    projected: dict[str, bytes] = {}
    for name in mounted_names:
        shard_files = decoded_files(stored[name])
        assert not set(shard_files) & set(projected), "a file in two shards"
        projected.update(shard_files)
    assert projected == files
    mount = KubeletMount(tmp_path / "mounted")
    mount.project(projected)
    remounted = read_bundle(mount.directory)
    assert remounted.version == fleet.version
    assert set(remounted.nodes) == set(fleet.nodes)


def test_a_smaller_publish_removes_stale_shards_after_writing(
    tmp_path: Path,
    kube: Kube,
    trainer_kubeconfig: Path,
    fleet: Bundle,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kubeconfig = trainer_kubeconfig
    assert run_cli(capsys, *cli_args(fleet.directory, kubeconfig))[0] == 0
    old_names = set(kube.configmaps())
    assert len(old_names) >= 3
    # Bystanders: another bundle's shard, and an unlabelled ConfigMap with a similar name.
    kube.core.create_namespaced_config_map(
        NAMESPACE,
        {
            "metadata": {
                "name": "other-models-0",
                "labels": {publish.BUNDLE_LABEL: "other-models"},
            },
            "data": {"x": "1"},
        },
    )
    kube.core.create_namespaced_config_map(
        NAMESPACE, {"metadata": {"name": f"{NAME}-9"}, "data": {"x": "1"}}
    )
    small = make_bundle(tmp_path / "small", {"node-a": PowerCurveSpec(100.0, 300.0)})
    kube.clear_requests()

    code, _, err = run_cli(capsys, *cli_args(small.directory, kubeconfig))

    assert code == 0, err
    assert set(kube.configmaps()) == {f"{NAME}-0", "other-models-0", f"{NAME}-9"}
    writes = configmap_writes(kube)
    deletes = [name for method, name in writes if method == "DELETE"]
    assert set(deletes) == old_names - {f"{NAME}-0"}
    # Deletion only after the new shard (with its manifest) is written.
    assert writes.index(("PUT", f"{NAME}-0")) < min(writes.index(("DELETE", n)) for n in deletes)
    assert decoded_files(kube.configmaps()[f"{NAME}-0"]) == on_disk(small)


# ---------------------------------------------------------------------------------------------
# Dry run and refusals before any API call


def test_dry_run_prints_valid_configmaps_and_calls_no_api(
    tmp_path: Path,
    kube: Kube,
    trainer_kubeconfig: Path,
    fleet: Bundle,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kubeconfig = trainer_kubeconfig

    code, out, err = run_cli(capsys, *cli_args(fleet.directory, kubeconfig, "--dry-run"))

    assert code == 0, err
    assert kube.requests == []
    documents = [d for d in yaml.safe_load_all(out) if d is not None]
    assert len(documents) >= 3
    projected: dict[str, bytes] = {}
    for index, document in enumerate(documents):
        model = k8s.V1ConfigMap.model_validate(document)  # a valid API object
        assert model.metadata.name == f"{NAME}-{index}"
        assert model.metadata.namespace == NAMESPACE
        assert len(json.dumps(document)) <= MAX_CONFIGMAP_BYTES
        projected.update(decoded_files(document))
    assert projected == on_disk(fleet)
    # The volume snippet follows as comments naming every shard.
    commented = [line for line in out.splitlines() if line.startswith("#")]
    for index in range(len(documents)):
        assert any(f"name: {NAME}-{index}" in line for line in commented)


def test_a_file_too_large_for_any_configmap_is_refused_before_any_api_call(
    tmp_path: Path,
    kube: Kube,
    trainer_kubeconfig: Path,
    small_model: bytes,
    capsys: pytest.CaptureFixture[str],
) -> None:
    large = large_onnx_model(weight_count=240_000)  # ~0.96 MB, ~1.28 MB base64
    bundle = bundle_with_large_model(tmp_path / "bundle", small_model, large)
    kubeconfig = trainer_kubeconfig

    code, out, err = run_cli(capsys, *cli_args(bundle.directory, kubeconfig))

    assert code == 2
    assert out == ""
    assert kube.requests == []
    message = err.strip()
    assert "\n" not in message
    assert "node-huge.onnx" in message
    assert f"{len(large):,} bytes" in message
    assert f"{MAX_CONFIGMAP_BYTES:,}" in message


def test_an_invalid_bundle_is_refused_before_any_api_call(
    tmp_path: Path, kube: Kube, trainer_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = make_bundle(tmp_path / "bundle", {"node-a": PowerCurveSpec(100.0, 300.0)})
    corrupt_model_bytes(bundle.directory, "node-a")
    kubeconfig = trainer_kubeconfig

    code, _, err = run_cli(capsys, *cli_args(bundle.directory, kubeconfig))

    assert code == 2
    assert kube.requests == []
    assert "sha256" in err and "node-a" in err


def test_a_bad_name_is_refused_before_any_api_call(
    tmp_path: Path, kube: Kube, trainer_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = make_bundle(tmp_path / "bundle", {"node-a": PowerCurveSpec(100.0, 300.0)})
    kubeconfig = trainer_kubeconfig
    args = cli_args(bundle.directory, kubeconfig)
    args[args.index("--name") + 1] = "Power_Models"

    code, _, err = run_cli(capsys, *args)

    assert code == 2
    assert kube.requests == []
    assert "--name 'Power_Models'" in err


# ---------------------------------------------------------------------------------------------
# The server's refusals, reported clearly


@pytest.mark.parametrize(
    ("weight_count", "trusted_max_bytes", "expected"),
    [
        # ~1.12 MB decoded: over the server's 1 MiB of ConfigMap data (its own words).
        (280_000, 2 * 1024 * 1024, ["HTTP 422", "may not be more than 1048576 bytes"]),
        # ~2.6 MB, ~3.4 MB base64: over the 3 MiB request body limit.
        (640_000, 8 * 1024 * 1024, ["HTTP 413", "larger than the API server accepts"]),
    ],
    ids=["422-configmap-too-long", "413-body-too-large"],
)
def test_server_refusals_of_large_configmaps_are_reported(
    tmp_path: Path,
    kube: Kube,
    trainer_kubeconfig: Path,
    small_model: bytes,
    weight_count: int,
    trusted_max_bytes: int,
    expected: list[str],
) -> None:
    bundle = bundle_with_large_model(
        tmp_path / "bundle", small_model, large_onnx_model(weight_count)
    )
    # A publisher told to trust a larger limit than the server's own.
    objects = publish.build_configmaps(bundle, NAME, NAMESPACE, max_bytes=trusted_max_bytes)
    core = k8s.CoreV1Api(kube.plane.api_client(trainer_kubeconfig))

    with pytest.raises(publish.PublishError) as raised:
        publish.publish_configmaps(core, objects, namespace=NAMESPACE, bundle_name=NAME)

    message = str(raised.value)
    assert f"ConfigMap {NAMESPACE}/{NAME}-" in message
    for words in expected:
        assert words in message
    assert kube.configmaps() == {}


def test_a_missing_namespace_is_reported_with_the_servers_message(
    tmp_path: Path, kube: Kube, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = make_bundle(tmp_path / "bundle", {"node-a": PowerCurveSpec(100.0, 300.0)})
    # As someone allowed everywhere (the trainer would be refused first: the next test).
    args = cli_args(bundle.directory, kube.plane.kubeconfig)
    args[args.index("--namespace") + 1] = "nowhere"

    code, _, err = run_cli(capsys, *args)

    assert code == 1
    assert "ConfigMap nowhere/power-models-0" in err
    assert "HTTP 404" in err and 'namespaces "nowhere" not found' in err


def test_a_namespace_the_trainer_may_not_write_is_a_403_naming_its_rbac(
    tmp_path: Path, kube: Kube, trainer_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = make_bundle(tmp_path / "bundle", {"node-a": PowerCurveSpec(100.0, 300.0)})
    args = cli_args(bundle.directory, trainer_kubeconfig)
    args[args.index("--namespace") + 1] = "default"

    code, _, err = run_cli(capsys, *args)

    assert code == 1
    assert err.count("\n") == 1
    assert "ConfigMap default/power-models-0" in err and "HTTP 403" in err
    assert publish.RBAC_MANIFEST in err and f"serviceaccount:{NAMESPACE}:{TRAINER}" in err


def test_an_unreachable_api_server_is_one_clear_line(
    tmp_path: Path, kube: Kube, trainer_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = make_bundle(tmp_path / "bundle", {"node-a": PowerCurveSpec(100.0, 300.0)})
    with FaultProxy("127.0.0.1", kube.plane.apiserver_port) as proxy:
        proxy.refuse()  # every connection reset: no answer at all
        kubeconfig = kubeconfig_via(trainer_kubeconfig, proxy.url)
        code, out, err = run_cli(capsys, *cli_args(bundle.directory, kubeconfig))

    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert f"writing ConfigMap {NAMESPACE}/{NAME}-0: Kubernetes API unreachable" in err
    assert kube.configmaps() == {}


def test_a_missing_kubeconfig_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = make_bundle(tmp_path / "bundle", {"node-a": PowerCurveSpec(100.0, 300.0)})
    missing = tmp_path / "no-such-kubeconfig"

    code, out, err = run_cli(capsys, *cli_args(bundle.directory, missing))

    assert code == 1
    assert out == ""
    assert err.count("\n") == 1 and str(missing) in err
