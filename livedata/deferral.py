"""The `power-aware-scheduler/defer-until` pod annotation: how long a pod may wait for clean power.

Its value is either an RFC 3339 time (`2024-05-01T18:00:00Z`) or a duration in Go's notation,
as Kubernetes spells durations (`6h`, `90m`, `1h30m`, `45s`), counted from the pod's
`metadata.creationTimestamp`. The extender's Carbon plugin holds such a pod (fails every node
with a reason starting `power-aware-scheduler/carbon-hold`) while a forecast says a window
before the deadline is cleaner by more than its margin; it never holds a pod past the deadline.

Other tools read the same things here, so that they agree with the extender:

- `pod_deadline_s(pod)`: the deadline of a Pod object (None when it has no annotation);
- `is_carbon_hold(message)`: whether a pod's PodScheduled condition message says the extender
  holds it. A node power controller or an autoscaler that wakes or adds nodes for pods that
  wait as unschedulable must not do so for a held pod: there is room, the pod waits for time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from livedata.carbon import CarbonDataError, parse_timestamp_s
from livedata.labels import CARBON_HOLD_REASON, DEFER_UNTIL_ANNOTATION

# Go's time.ParseDuration units, in seconds ("us" and "µs" both mean microseconds).
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_DURATION = re.compile(r"^(?:(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")


class DeferralError(ValueError):
    """A defer-until annotation that cannot be read; the message says what is wrong."""


def parse_duration_s(text: str) -> float:
    """Seconds of a Go duration (`6h`, `1h30m`, `90m`, `2.5h`); DeferralError otherwise."""
    compact = text.strip()
    if not _DURATION.match(compact):
        raise DeferralError(
            f"{text!r} is neither an RFC 3339 time nor a duration like 6h, 90m or 1h30m"
        )
    return sum(float(number) * _UNIT_S[unit] for number, unit in _DURATION_PART.findall(compact))


def defer_deadline_s(value: str, created_at_s: float | None) -> float:
    """The deadline (Unix seconds) an annotation value names; a duration counts from creation."""
    text = value.strip()
    if text[:1].isdigit() and "-" in text[:5]:  # a date: 2024-05-01T...
        try:
            return parse_timestamp_s(text, DEFER_UNTIL_ANNOTATION)
        except CarbonDataError:
            raise DeferralError(f"{value!r} is not an RFC 3339 time") from None
    duration_s = parse_duration_s(text)
    if created_at_s is None or not math.isfinite(created_at_s):
        raise DeferralError(
            f"duration {value!r} needs the pod's metadata.creationTimestamp, which is missing"
        )
    return created_at_s + duration_s


def pod_deadline_s(pod: Mapping[str, Any] | None) -> float | None:
    """The defer-until deadline of a Pod object; None without the annotation.

    Raises DeferralError when the annotation (or, for a duration, the creation time) cannot
    be read.
    """
    if not isinstance(pod, Mapping):
        return None
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    annotations = metadata.get("annotations")
    if not isinstance(annotations, Mapping):
        return None
    value = annotations.get(DEFER_UNTIL_ANNOTATION)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise DeferralError(f"{value!r} is not a time or a duration")
    created = metadata.get("creationTimestamp")
    created_at_s = None
    if created is not None:
        try:
            created_at_s = parse_timestamp_s(created, "metadata.creationTimestamp")
        except CarbonDataError as exc:
            raise DeferralError(str(exc)) from None
    return defer_deadline_s(value, created_at_s)


def is_carbon_hold(message: str | None) -> bool:
    """Whether a PodScheduled condition message (or a node's reason) is the Carbon plugin's hold."""
    return bool(message) and CARBON_HOLD_REASON in message
