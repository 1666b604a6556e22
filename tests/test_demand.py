"""Pod CPU and memory requests as kube-scheduler counts them, and Kubernetes quantities."""

from __future__ import annotations

import math

import pytest

from livedata.pod_resources import (
    parse_cpu_quantity,
    parse_memory_quantity,
    pod_cpu_demand_cores,
    pod_memory_request_bytes,
)


def container(name: str, requests: object = None, limits: object = None, **extra) -> dict:
    resources = {}
    if requests is not None:
        resources["requests"] = {"cpu": requests}
    if limits is not None:
        resources["limits"] = {"cpu": limits}
    return {"name": name, "image": "x", "resources": resources or None, **extra}


def pod(containers=(), init=(), overhead=None) -> dict:
    return {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "containers": list(containers),
            "initContainers": list(init) or None,
            "overhead": overhead,
        },
        "status": {"phase": "Pending"},
    }


@pytest.mark.parametrize(
    ("text", "cores"),
    [
        ("100m", 0.1),
        ("2", 2.0),
        ("0.5", 0.5),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("1E-3", 0.001),
        ("1e+2", 100.0),
        ("1k", 1000.0),
        ("1Ki", 1024.0),
        ("0.5Mi", 0.5 * 1024**2),
        ("250000u", 0.25),
        ("1500000000n", 1.5),
        ("+3", 3.0),
        (4, 4.0),
        (0.25, 0.25),
        ("0", 0.0),
    ],
)
def test_quantity_forms(text: object, cores: float) -> None:
    assert parse_cpu_quantity(text) == pytest.approx(cores)


def test_quantity_rounds_up_to_whole_millicores_as_the_scheduler_does() -> None:
    assert parse_cpu_quantity("0.0001") == 0.001
    assert parse_cpu_quantity("1500u") == 0.002


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "'abc' is not a Kubernetes quantity"),
        ("1K", "'1K' is not a Kubernetes quantity"),
        (" 1", "' 1' is not a Kubernetes quantity"),
        ("", "'' is not a Kubernetes quantity"),
        ("NaN", "'NaN' is not a Kubernetes quantity"),
        ("-1", "'-1' is negative"),
        (-0.5, "-0.5 is negative"),
        (math.nan, "nan is not finite"),
        (math.inf, "inf is not finite"),
        ("2e6", "'2e6' is absurd"),
        ("1Ei", "'1Ei' is absurd"),
        ("1e999999999", "'1e999999999' is out of range"),
        (True, "True is not a string or number"),
        ([1], "[1] is not a string or number"),
    ],
)
def test_quantity_garbage_names_the_value(value: object, message: str) -> None:
    with pytest.raises(ValueError, match="CPU quantity") as caught:
        parse_cpu_quantity(value)
    assert message in str(caught.value)


def test_containers_requests_are_summed() -> None:
    assert pod_cpu_demand_cores(pod([container("a", "250m"), container("b", "1")])) == 1.25


def test_limit_stands_in_for_a_missing_request() -> None:
    assert pod_cpu_demand_cores(pod([container("a", limits="2"), container("b", "500m")])) == 2.5


def test_request_wins_over_limit() -> None:
    assert pod_cpu_demand_cores(pod([container("a", "300m", limits="4")])) == 0.3


def test_pod_asking_for_nothing_counts_as_100m() -> None:
    assert pod_cpu_demand_cores(pod([container("a")])) == 0.1
    assert pod_cpu_demand_cores(pod([container("a", "0")])) == 0.1
    assert pod_cpu_demand_cores({"spec": None}) == 0.1
    assert pod_cpu_demand_cores({}) == 0.1


def test_nulls_everywhere_are_unset() -> None:
    nulls = {
        "spec": {
            "containers": [
                {"name": "a", "resources": {"requests": None, "limits": {"cpu": None}}},
                {"name": "b", "resources": {"requests": {"cpu": "200m", "memory": None}}},
            ],
            "initContainers": None,
            "overhead": None,
        }
    }
    assert pod_cpu_demand_cores(nulls) == 0.2


def test_init_container_bigger_than_the_sum_sets_the_demand() -> None:
    p = pod([container("a", "500m"), container("b", "500m")], init=[container("i", "3")])
    assert pod_cpu_demand_cores(p) == 3.0


def test_init_container_smaller_than_the_sum_changes_nothing() -> None:
    p = pod(
        [container("a", "500m"), container("b", "700m")],
        init=[container("i1", "1"), container("i2", "200m")],
    )
    assert pod_cpu_demand_cores(p) == 1.2


def test_sidecars_add_like_containers_and_stack_under_later_init_containers() -> None:
    sidecar = container("proxy", "500m", restartPolicy="Always")
    # Sidecar runs beside the app: 1 + 0.5.
    assert pod_cpu_demand_cores(pod([container("app", "1")], init=[sidecar])) == 1.5
    # An init container after the sidecar runs beside it: 0.5 + 2 = 2.5 > 1.5.
    after = pod([container("app", "1")], init=[sidecar, container("migrate", "2")])
    assert pod_cpu_demand_cores(after) == 2.5
    # Before the sidecar it runs alone: max(2, 1.5) = 2.
    before = pod([container("app", "1")], init=[container("migrate", "2"), sidecar])
    assert pod_cpu_demand_cores(before) == 2.0


def test_overhead_is_added_on_top() -> None:
    p = pod([container("a", "1")], init=[container("i", "2")], overhead={"cpu": "250m"})
    assert pod_cpu_demand_cores(p) == 2.25


def test_garbage_in_a_pod_names_the_field() -> None:
    bad = pod([container("a", "1"), container("b", "lots")])
    with pytest.raises(ValueError, match=r"spec\.containers\[1\]\.resources\.requests\.cpu"):
        pod_cpu_demand_cores(bad)
    bad_overhead = pod([container("a", "1")], overhead={"cpu": "-1"})
    with pytest.raises(ValueError, match=r"spec\.overhead\.cpu: CPU quantity '-1' is negative"):
        pod_cpu_demand_cores(bad_overhead)
    with pytest.raises(ValueError, match=r"spec\.containers must be a list"):
        pod_cpu_demand_cores({"spec": {"containers": {"a": 1}}})
    with pytest.raises(ValueError, match=r"spec\.initContainers\[0\] must be an object"):
        pod_cpu_demand_cores({"spec": {"initContainers": ["x"]}})
    with pytest.raises(ValueError, match="pod must be an object"):
        pod_cpu_demand_cores([])  # type: ignore[arg-type]


# ---- memory (the node power controller's fit check) -------------------------------------------


def memory_container(requests: object = None, limits: object = None, **extra) -> dict:
    resources = {}
    if requests is not None:
        resources["requests"] = {"memory": requests}
    if limits is not None:
        resources["limits"] = {"memory": limits}
    return {"name": "c", "image": "x", "resources": resources, **extra}


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512Mi", 512 * 2**20),
        ("1G", 10**9),
        ("1e9", 10**9),
        ("1.5Ki", 1536),
        ("100m", 1),  # a tenth of a byte rounds up to one
        (1024, 1024),
        ("0", 0),
    ],
)
def test_memory_quantity_forms(text: object, size: int) -> None:
    assert parse_memory_quantity(text) == size


@pytest.mark.parametrize("bad", ["-1Gi", "1 Gi", "lots", None, True, float("inf"), "1e30"])
def test_bad_memory_quantities_name_the_value(bad: object) -> None:
    with pytest.raises(ValueError, match="memory quantity"):
        parse_memory_quantity(bad)


def test_pod_memory_follows_the_same_rules_as_cpu_but_defaults_to_nothing() -> None:
    app = [memory_container("1Gi"), memory_container(limits="512Mi")]  # limit stands in
    sidecar = memory_container("256Mi", restartPolicy="Always")
    big_init = memory_container("3Gi")
    spec_pod = pod(app, init=[sidecar, big_init], overhead={"memory": "128Mi"})
    # max(1Gi + 512Mi + 256Mi sidecar, 3Gi init + 256Mi sidecar) + 128Mi overhead
    assert pod_memory_request_bytes(spec_pod) == (3 * 1024 + 256 + 128) * 2**20
    assert pod_memory_request_bytes(pod([memory_container()])) == 0
    # The CPU count of the same pod is untouched by memory.
    assert pod_cpu_demand_cores(spec_pod) == 0.1


def test_bad_memory_request_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"spec\.containers\[1\]\.resources\.requests\.memory"):
        pod_memory_request_bytes(pod([memory_container("1Gi"), memory_container("big")]))
