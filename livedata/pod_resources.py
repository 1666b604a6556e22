"""Pod CPU and memory requests, counted the way kube-scheduler counts them (`PodRequests`).

The extender prices a pod by how much CPU it will use, and the best estimate the scheduler has
is what the pod requests; the node power controller needs the same counts to tell whether a
node's pods fit elsewhere and how full a node is. Shared here so that both count alike.
kube-scheduler's NodeResourcesFit sums, per pod and per resource:

- the app containers' requests;
- restartable init containers (sidecars, `restartPolicy: Always`) like app containers, since
  they keep running beside them;
- at least the largest "init phase": each ordinary init container's request plus the sidecars
  started before it (init containers run one after another);
- plus `spec.overhead` (the runtime's own cost, e.g. a VM sandbox).

A container without a request uses its limit (the API server defaults request to limit). A
pod asking for no CPU at all counts as 100m, so that it still costs power (the scheduler's
own scoring does the same); a pod asking for no memory counts as 0 bytes, as the fit filter
counts it.

Quantities are Kubernetes `resource.Quantity` strings ("100m", "2", "0.5", "1e3", "1k",
"1Ki"); kube-scheduler reads CPU in whole millicores and memory in whole bytes, rounded up,
and so do we.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from decimal import ROUND_CEILING, Decimal

DEFAULT_POD_CPU_MILLICORES = 100
MAX_CPU_CORES = 1e6
MAX_MEMORY_BYTES = 2**70  # a zebibyte: anything larger is a typo, not a request

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE](?P<exponent>[+-]?\d+))?"
)
_SUFFIX_FACTORS: Mapping[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_cpu_quantity(value: object) -> float:
    """CPU cores from a Kubernetes quantity (string, int or float), rounded up to 1m.

    Raises `ValueError` naming the value for anything that is not a non-negative quantity of
    at most 1e6 cores.
    """
    return _millicores(value) / 1000.0


def pod_cpu_demand_cores(pod: Mapping) -> float:
    """The pod's CPU demand in cores as kube-scheduler counts it (see the module docstring).

    Raises `ValueError` naming the field (e.g. `spec.containers[1].resources.requests.cpu`)
    when a quantity or a structure is malformed.
    """
    if not isinstance(pod, Mapping):
        raise ValueError(f"pod must be an object, got {type(pod).__name__}")
    total_m = _pod_requests(pod, "cpu", _millicores)
    if total_m == 0:
        total_m = DEFAULT_POD_CPU_MILLICORES
    if total_m > MAX_CPU_CORES * 1000:
        raise ValueError(f"pod CPU demand {total_m / 1000:g} cores exceeds {MAX_CPU_CORES:g}")
    return total_m / 1000.0


def parse_memory_quantity(value: object) -> int:
    """Bytes from a Kubernetes quantity ("512Mi", "1G", "1e9", 1024), rounded up to a byte.

    Raises `ValueError` naming the value for anything that is not a non-negative quantity of
    at most `MAX_MEMORY_BYTES`.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"memory quantity {value!r} is not a string or number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"memory quantity {value!r} is not finite")
    try:
        amount = _quantity_decimal(value) if isinstance(value, str) else Decimal(value)
    except ValueError as exc:
        raise ValueError(f"memory {exc}") from None
    if amount < 0:
        raise ValueError(f"memory quantity {value!r} is negative")
    if amount > MAX_MEMORY_BYTES:
        raise ValueError(f"memory quantity {value!r} is absurd (more than 2^70 bytes)")
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def pod_memory_request_bytes(pod: Mapping) -> int:
    """The pod's memory request in bytes as kube-scheduler's fit filter counts it (0 if none).

    Raises `ValueError` naming the field when a quantity or a structure is malformed.
    """
    if not isinstance(pod, Mapping):
        raise ValueError(f"pod must be an object, got {type(pod).__name__}")
    return _pod_requests(pod, "memory", parse_memory_quantity)


def _pod_requests(pod: Mapping, resource: str, parse: Callable[[object], int]) -> int:
    """Sum of one resource over a pod (whole units: millicores or bytes); see the docstring."""
    spec = _mapping_field(pod, "spec", "spec")
    total = 0
    for where, container in _containers(spec, "containers"):
        total += _container_request(container, where, resource, parse)

    sidecars = 0
    largest_init = 0
    for where, container in _containers(spec, "initContainers"):
        own = _container_request(container, where, resource, parse)
        if container.get("restartPolicy") == "Always":
            total += own
            sidecars += own
            phase = sidecars
        else:
            phase = own + sidecars
        largest_init = max(largest_init, phase)
    total = max(total, largest_init)

    overhead = _mapping_field(spec, "overhead", "spec.overhead")
    if overhead.get(resource) is not None:
        total += _parsed_at(overhead[resource], f"spec.overhead.{resource}", parse)
    return total


def _millicores(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"CPU quantity {value!r} is not a string or number")
    if isinstance(value, str):
        return _text_millicores(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"CPU quantity {value!r} is not finite")
    return _whole_millicores(Decimal(value), value)


# Node objects repeat the same few allocatable strings ("8", "7910m") in every nocache request.
@functools.lru_cache(maxsize=4096)
def _text_millicores(value: str) -> int:
    try:
        number = _quantity_decimal(value)
    except ValueError as exc:
        raise ValueError(f"CPU {exc}") from None
    return _whole_millicores(number, value)


def _quantity_decimal(value: str) -> Decimal:
    """The exact amount a quantity string stands for (in its base unit: cores or bytes)."""
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(f"quantity {value!r} is not a Kubernetes quantity")
    try:
        number = Decimal(match["number"])
        if match["exponent"] is not None:
            return number.scaleb(int(match["exponent"]))
        return number * _SUFFIX_FACTORS[match["suffix"] or ""]
    except (ArithmeticError, ValueError) as exc:
        raise ValueError(f"quantity {value!r} is out of range") from exc


def _whole_millicores(cores: Decimal, value: object) -> int:
    if cores < 0:
        raise ValueError(f"CPU quantity {value!r} is negative")
    if cores > MAX_CPU_CORES:
        raise ValueError(f"CPU quantity {value!r} is absurd (more than {MAX_CPU_CORES:g} cores)")
    return int((cores * 1000).to_integral_value(rounding=ROUND_CEILING))


def _parsed_at(value: object, where: str, parse: Callable[[object], int]) -> int:
    try:
        return parse(value)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _mapping_field(parent: Mapping, key: str, where: str) -> Mapping:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object, got {type(value).__name__}")
    return value


def _containers(spec: Mapping, key: str) -> list[tuple[str, Mapping]]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"spec.{key} must be a list, got {type(value).__name__}")
    containers = []
    for i, container in enumerate(value):
        where = f"spec.{key}[{i}]"
        if not isinstance(container, Mapping):
            raise ValueError(f"{where} must be an object, got {type(container).__name__}")
        containers.append((where, container))
    return containers


def _container_request(
    container: Mapping, where: str, resource: str, parse: Callable[[object], int]
) -> int:
    resources = _mapping_field(container, "resources", f"{where}.resources")
    for kind in ("requests", "limits"):
        quantities = _mapping_field(resources, kind, f"{where}.resources.{kind}")
        if quantities.get(resource) is not None:
            return _parsed_at(quantities[resource], f"{where}.resources.{kind}.{resource}", parse)
    return 0
