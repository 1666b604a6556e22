"""The energy adapter's pass: read batteries, read Nodes, patch the ones whose level changed.

Every `interval_s` a pass reads each node's stored energy (`readings`), reads every Node from
the API, decides each node's level with hysteresis and the patch that sets it (`policy`), and
sends only the patches that change something. The label is the adapter's memory: each pass
reads the current labels from the API, so a restart (or a second replica) neither forgets a
level nor repeats a patch.

A failed pass (Prometheus or the API unreachable) leaves every label as it is and is retried
at the next interval; `health()` says whether passes keep being attempted and succeed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError as ConnectionFailure

from controllers.energy_adapter.metrics import AdapterMetrics
from controllers.energy_adapter.policy import (
    DEFAULT_HYSTERESIS_PCT,
    MAX_HYSTERESIS_PCT,
    MERGE_PATCH,
    POWERLESS_TAINT_EFFECT,
    POWERLESS_TAINT_KEY,
    NodeEnergy,
    next_level,
    plan_node_patch,
)
from controllers.energy_adapter.readings import DEFAULT_QUERY, BatteryReadings, read_batteries
from livedata.collect_config import CollectConfig
from livedata.kube_client import describe_unreachable
from livedata.labels import ENERGY_BANDS, ENERGY_LABEL, POWERLESS
from livedata.logs import FailureStreak
from livedata.prometheus import CollectError

# One logger name for the whole process (every module of the package), for log filters.
log = logging.getLogger(__package__)
# What fails a pass, not the process: Prometheus, an API answer, or no answer at all (the
# official client raises urllib3's errors, not OSError, when the API server cannot be reached
# or stops answering within the timeout).
PASS_ERRORS = (CollectError, ApiException, OSError, ConnectionFailure)


@dataclass(frozen=True)
class AdapterSettings:
    """Everything one adapter process is told on its command line."""

    prometheus_url: str
    query: str = DEFAULT_QUERY
    interval_s: float = 30.0
    hysteresis_pct: float = DEFAULT_HYSTERESIS_PCT
    timeout_s: float = 10.0
    node_from: str = "uname"
    node_label: str = "node"
    taint_powerless: bool = True
    dry_run: bool = False

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"--interval must be positive, got {self.interval_s} s")
        if not 0.0 <= self.hysteresis_pct < MAX_HYSTERESIS_PCT:
            raise ValueError(
                f"--hysteresis-pct must be 0 <= pct < {MAX_HYSTERESIS_PCT:g} (half the "
                f"narrowest band), got {self.hysteresis_pct}"
            )

    def collect_config(self) -> CollectConfig:
        """The collector's Prometheus settings: same client, same instance -> node mapping."""
        return CollectConfig(
            url=self.prometheus_url,
            timeout_s=self.timeout_s,
            node_from=self.node_from,
            node_label=self.node_label,
        )


@dataclass(frozen=True)
class LabelChange:
    """One node's label (and maybe taint) changed by a pass (or, in a dry run, to be)."""

    node: str
    old_label: str | None
    new_label: str
    stored_pct: float
    taint_changed: bool


@dataclass
class PassResult:
    """What one pass did: its changes, the nodes it saw and had readings for, 409s met."""

    changes: list[LabelChange] = field(default_factory=list)
    nodes_seen: int = 0
    nodes_with_reading: int = 0
    conflicts: int = 0


class EnergyAdapter:
    """Reads Prometheus, reads nodes, patches the ones whose level changed."""

    def __init__(
        self,
        settings: AdapterSettings,
        core_api: client.CoreV1Api,
        *,
        metrics: AdapterMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.core_api = core_api
        self.metrics = metrics or AdapterMetrics()
        self._collect_config = settings.collect_config()
        self._warned: set[tuple[str, str]] = set()  # (what, node): warn once per problem
        self.last_attempt_at_s: float | None = None
        self.last_success_at_s: float | None = None
        self._failures = FailureStreak(
            log,
            "pass failed, labels left as they are: %s",
            "pass succeeded again after %d failed; labels follow",
        )

    @property
    def last_error(self) -> str | None:
        """Why the last pass failed; None when it succeeded."""
        return self._failures.cause

    def read_nodes(self) -> dict[str, NodeEnergy]:
        """Every Node's energy label, taints and resourceVersion, by name (one list call)."""
        response = self.core_api.list_node(
            _preload_content=False, _request_timeout=self.settings.timeout_s
        )
        items = json.loads(response.data)["items"]
        return {node.name: node for node in map(NodeEnergy.from_object, items)}

    def run_pass(self, *, at_s: float | None = None) -> PassResult:
        """One pass over all nodes. Raises CollectError / ApiException when a source fails."""
        at_s = time.time() if at_s is None else at_s
        self.last_attempt_at_s = time.monotonic()
        readings = read_batteries(self._collect_config, self.settings.query, at_s)
        nodes = self.read_nodes()
        self._warn_about(readings, nodes)
        result = PassResult(nodes_seen=len(nodes))
        counts = {band.name: 0 for band in ENERGY_BANDS} | {"none": 0}
        for name, node in sorted(nodes.items()):
            stored_pct = readings.pct_by_node.get(name)
            if stored_pct is None:
                counts["none"] += 1
                continue
            result.nodes_with_reading += 1
            target = next_level(stored_pct, node.level, self.settings.hysteresis_pct)
            counts[target] += 1
            patch = plan_node_patch(node, target, taint_powerless=self.settings.taint_powerless)
            if patch is None:
                continue
            change = LabelChange(name, node.label, target, stored_pct, "spec" in patch)
            if self._apply(node, patch, change):
                result.changes.append(change)
            else:
                result.conflicts += 1
        for level, count in counts.items():
            self.metrics.nodes.labels(level=level).set(count)
        self.last_success_at_s = time.monotonic()
        self._failures.succeeded()
        self.metrics.passes.labels(result="ok").inc()
        self.metrics.last_success.set(time.time())
        return result

    def _apply(self, node: NodeEnergy, patch: dict[str, Any], change: LabelChange) -> bool:
        """Send one node's patch (or log it, dry run); False if the node changed (409) or left."""
        taint_note = ""
        if change.taint_changed:
            verb = "added" if change.new_label == POWERLESS else "removed"
            taint_note = f"; taint {POWERLESS_TAINT_KEY}:{POWERLESS_TAINT_EFFECT} {verb}"
        what = (
            f"node {node.name}: {ENERGY_LABEL} {change.old_label or '(none)'} -> "
            f"{change.new_label} at {change.stored_pct:.1f} % stored energy{taint_note}"
        )
        if self.settings.dry_run:
            log.info("dry run, not patched: %s", what)
            return True
        try:
            self.core_api.patch_node(
                node.name,
                patch,
                _content_type=MERGE_PATCH,
                _request_timeout=self.settings.timeout_s,
            )
        except ApiException as error:
            if error.status == 409:
                log.warning("node %s changed while we patched it; retrying next pass", node.name)
                return False
            if error.status == 404:
                log.info("node %s is gone; nothing to label", node.name)
                return False
            raise
        log.info("%s", what)
        self.metrics.changes.labels(level=change.new_label).inc()
        return True

    def _warn_about(self, readings: BatteryReadings, nodes: Mapping[str, NodeEnergy]) -> None:
        """Warn about readings that label nothing, once per problem while it lasts."""
        for node, value in readings.invalid.items():
            self._warn_once(
                "invalid",
                node,
                "node %s: stored energy reading %r is not 0..100 %%; its label is left as is",
                node,
                value,
            )
        for node in sorted(set(readings.pct_by_node) - set(nodes)):
            self._warn_once(
                "unknown",
                node,
                "Prometheus has a battery reading for %r, which is not a Kubernetes node: "
                "check --node-from / --node-label",
                node,
            )
        if readings.unmapped_series:
            self._warn_once(
                "unmapped",
                "",
                "%d battery series map to no node (first: %s): check --node-from / --node-label",
                len(readings.unmapped_series),
                readings.unmapped_series[0],
            )
        # A problem that went away may be reported again when it comes back.
        current = (
            {("invalid", n) for n in readings.invalid}
            | {("unknown", n) for n in set(readings.pct_by_node) - set(nodes)}
            | ({("unmapped", "")} if readings.unmapped_series else set())
        )
        self._warned &= current

    def _warn_once(self, what: str, node: str, message: str, *args: object) -> None:
        if (what, node) not in self._warned:
            self._warned.add((what, node))
            log.warning(message, *args)

    def run_forever(self, stop: threading.Event) -> None:
        """Pass after pass, every interval, until `stop` is set; a failed pass is retried (its
        cause logged once while it lasts: `FailureStreak`)."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                result = self.run_pass()
                log.debug(
                    "pass: %d nodes, %d with a reading, %d changed",
                    result.nodes_seen,
                    result.nodes_with_reading,
                    len(result.changes),
                )
            except PASS_ERRORS as error:
                self.metrics.passes.labels(result="error").inc()
                self._failures.failed(one_line_error(error))
            stop.wait(max(0.0, self.settings.interval_s - (time.monotonic() - started)))

    def health(self) -> tuple[bool, bool, dict[str, Any]]:
        """(alive, ready, details): alive while passes keep being attempted on schedule."""
        now = time.monotonic()
        # A pass may take two timeouts (Prometheus, then the API) plus the patches.
        grace_s = 3 * self.settings.interval_s + 4 * self.settings.timeout_s
        attempted = self.last_attempt_at_s
        alive = attempted is None or now - attempted <= grace_s
        ready = self.last_success_at_s is not None and self.last_error is None
        details = {
            "last_success_age_s": None
            if self.last_success_at_s is None
            else round(now - self.last_success_at_s, 1),
            "last_error": self.last_error,
        }
        return alive, ready, details


def one_line_error(error: BaseException) -> str:
    """A failed pass's cause on one line, for the log, /readyz and the CLI's error."""
    if isinstance(error, ApiException):
        return f"Kubernetes API: HTTP {error.status} {error.reason}"
    if isinstance(error, ConnectionFailure):
        return describe_unreachable(error)
    return " ".join(str(error).split())
