"""The energy simulator against a real cluster: one scaled-down trace, run on both, side by side.

    python -m bench.cluster_emulation                          # 16 nodes, 1 h of trace, ~20 min
    python -m bench.cluster_emulation --nodes 4 --hours 0.25 --compression 15 --json out.json

The same trace (`bench.sim.workload.generate_trace` on `bench.sim.cluster.build_cluster`'s
nodes, with the adjustments below) goes through:

- **real**: the real control plane (`envtest.ControlPlane`: etcd, kube-apiserver,
  kube-controller-manager, the default scheduler and the power-aware one with the manifests'
  extender entry); one `envtest.NodeAgent` kubelet per simulated node (its name, cores, memory,
  max pods and zone), whose life follows its BMC, sushy-tools' Redfish emulator
  (`bench.support.bmc`); the extender as `python -m extender` in live mode (its Pod and Node
  watches, telemetry from a real Prometheus scraping one fake exporter per node whose CPU
  utilisation is the node's requested share) with the energy bench's power-management profile;
  the node power controller as `python -m controllers.node_power --apply` with the simulator's
  policy settings, its durations divided by the compression. The workload is real Deployments
  (one per trace owner) whose replicas the bench sets, as time passes, to the trace pods of that
  owner alive at the trace time `compression x elapsed`, and the DaemonSets of every simulated
  node (`bench.sim.cluster.DAEMONSET_PODS`);
- **simulated**: the energy bench's `power-aware+power-management` policy (`bench.sim`) on the
  same nodes and trace, with the same boot and shutdown times, controller settings, and
  kube-scheduler's queue timings multiplied by the compression (the real scheduler's 1-10 s
  backoff is 3-30 s of trace at a compression of 3).

Every figure is in trace time (a real second is `compression` trace seconds):

- pods placed: bindings of workload pods (a pod evicted and placed again counts twice);
- pod wait p50/p99: creation (or eviction: the replacement's creation) to binding, seen by a
  watch of the API server on the real side;
- nodes powered off / woken: distinct nodes; power-offs and wakes: how many times (a power-off is
  a power cycle);
- energy (kWh): each node's SPECpower curve at its requested CPU share (workload pods, as the
  simulator's utilisation with every pod using what it requests), its off power while off and
  its boot power while waking or booting, sampled every `--sample-interval` real seconds on the
  real side; the simulator's fans are left out of its figure (the real side has no temperature).

The trace is the energy bench's first hours of the day (night load: about 30 % of the CPU
requested) with its burst (3x the arrival rate for 10 minutes) placed at `--burst-at`, 40 min
by default: after the controller's 30-minute cool-down has let it power nodes off, so that the
burst wakes some. What is changed from the energy bench's trace so that both sides see the
same pods: every pod is owned by a Deployment (the energy bench's Jobs and bare pods go to one
Deployment per request size), replicas of one Deployment request the same memory (its pods'
median), and pods use what they request (usage ratio 1: no overcommit, so a pod's duration is
its wall time on both sides). The simulator's pending pods never give up (the real ones do not
either).

What cannot be the same: a Deployment scaled down deletes the replica its ReplicaSet ranks
first (an unbound one, else one on the most crowded node, else the newest), not the trace's pod
that ended; an evicted pod's replacement in the real cluster ends when its trace pod does, while
the simulator's evicted pod runs the work it had left after its new start. Ctrl-C stops the run
and tears everything down.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.watch
import numpy as np
import yaml
from kubernetes.client.exceptions import ApiException

import bench.sim.presets  # noqa: F401  (registers the policies)
from bench.energy_sim import DEFAULT_OUT_DIR as ENERGY_SIM_OUT_DIR
from bench.sim.cluster import DAEMONSET_PODS, SimCluster, build_cluster, curve_power_w
from bench.sim.engine import PolicyResult, SimSettings, simulate
from bench.sim.power import PowerManagement
from bench.sim.power_policies import POWER_MANAGEMENT_PROFILE
from bench.sim.runner import POLICIES, policy_rng, setup_logging
from bench.sim.scenario import BenchSettings, Scenario, trained_bundle
from bench.sim.workload import CPU_MENU_CORES, DEPLOYMENTS_PER_SIZE, NO_OWNER, Trace, generate_trace
from bench.support.bmc import RedfishEmulator
from bench.support.exporters import Exporter, FakeHost, serve
from bench.support.power_controller import (
    NAMESPACE,
    PASSWORD,
    SCHEDULER,
    ControllerProcess,
    secret_dir,
    wait_until,
)
from bench.support.prometheus import ensure_prometheus, start_prometheus
from bench.support.server import run_extender
from controllers.node_power.policy import PolicySettings
from envtest import ControlPlane, NodeAgent, find_assets
from livedata.labels import (
    POWER_DRIVER_LABEL,
    POWER_MANAGEMENT_ENABLED,
    POWER_MANAGEMENT_LABEL,
    POWER_OFF,
    POWER_STATE_ANNOTATION,
    POWER_WAKING,
)
from training.synth import AMBIENT_MEAN_C

POLICY = "power-aware+power-management"
WORKLOAD_NAMESPACE = "emulation"
APP_LABEL = "emulation/app"
ZONE_LABEL = "topology.kubernetes.io/zone"
EXTENDER_ACCOUNT = (NAMESPACE, "power-extender")
DEFAULT_OUT_DIR = ENERGY_SIM_OUT_DIR  # the bundle cache the energy bench keeps
# kube-scheduler's queue at its defaults (real seconds): podInitialBackoffSeconds,
# podMaxBackoffSeconds, podMaxInUnschedulablePodsDuration.
SCHEDULER_BACKOFF_INITIAL_S = 1.0
SCHEDULER_BACKOFF_MAX_S = 10.0
SCHEDULER_UNSCHEDULABLE_FLUSH_S = 300.0
AGENT_HEARTBEAT_S = 1.0
BMC_POLL_S = 1.0
SCRAPE_S = 1.0
PROGRESS_S = 5.0


@dataclass(frozen=True)
class EmulationSettings:
    nodes: int = 16
    hours: float = 1.0
    load: float = 0.45
    seed: int = 7
    compression: float = 3.0  # trace seconds per real second
    boot_s: float = 300.0  # trace seconds, as the energy bench's --boot-time
    shutdown_s: float = 60.0  # trace seconds, as the energy bench's --shutdown-time
    sample_s: float = 2.0  # real seconds between energy samples
    # When the trace's burst (3x the arrival rate for 10 min) starts, trace seconds: after the
    # cool-down that keeps every node on for the first 30 min, so that it wakes nodes.
    burst_s: tuple[float, ...] = (2400.0,)
    # The controller's --scale-down-unneeded-time and --node-cooldown, trace seconds (None:
    # PolicySettings' defaults, the energy bench's).
    unneeded_s: float | None = None
    cooldown_s: float | None = None
    out_dir: Path = DEFAULT_OUT_DIR

    @property
    def horizon_s(self) -> float:
        return self.hours * 3600.0

    @property
    def real_s(self) -> float:
        return self.horizon_s / self.compression


@dataclass
class SideFigures:
    """One side's figures, all in trace time."""

    pods_placed: int
    pods_unplaced_at_end: int
    # Pods a scale-down deleted before any node took them (real side; the simulator has none)
    pods_removed_unplaced: int
    pod_waits_s: list[float] = field(repr=False)
    nodes_powered_off: int
    nodes_woken: int
    power_offs: int
    wakes: int
    energy_kwh: float
    mean_nodes_on: float
    # (trace s, "off"/"wake", node): each power-off and wake, for the JSON
    events: list[tuple[float, str, str]] = field(default_factory=list, repr=False)

    def wait_quantile_s(self, q: float) -> float:
        return float(np.percentile(self.pod_waits_s, q)) if self.pod_waits_s else 0.0

    def rows(self) -> dict[str, float]:
        return {
            "pods placed": self.pods_placed,
            "pods waiting at the end": self.pods_unplaced_at_end,
            "pods removed before placement": self.pods_removed_unplaced,
            "pod wait p50 (s)": round(self.wait_quantile_s(50), 2),
            "pod wait p99 (s)": round(self.wait_quantile_s(99), 2),
            "nodes powered off": self.nodes_powered_off,
            "nodes woken": self.nodes_woken,
            "power cycles (power-offs)": self.power_offs,
            "wakes": self.wakes,
            "mean nodes on": round(self.mean_nodes_on, 2),
            "energy (kWh)": round(self.energy_kwh, 4),
        }


# ---- the trace both sides place --------------------------------------------------------------


def emulation_trace(cluster: SimCluster, settings: EmulationSettings) -> Trace:
    """The energy bench's trace for these nodes, every pod owned by a Deployment of one request
    (and memory), pods using what they request (module docstring)."""
    trace = generate_trace(
        float(cluster.cores.sum()),
        settings.hours,
        settings.load,
        settings.seed,
        usage_ratio_range=(1.0, 1.0),
        burst_starts_s=tuple(b for b in settings.burst_s if b < settings.horizon_s),
    )
    size_index = np.searchsorted(CPU_MENU_CORES, trace.cpu_m / 1000.0)
    owners = trace.owners
    # The Jobs and bare pods: one Deployment per size, after the bench's own Deployments.
    owners = np.where(
        owners == NO_OWNER, len(CPU_MENU_CORES) * DEPLOYMENTS_PER_SIZE + size_index, owners
    )
    memory = trace.memory_bytes.copy()
    for owner in np.unique(owners):
        mine = owners == owner
        memory[mine] = int(np.median(trace.memory_bytes[mine]))
    return dataclasses.replace(trace, owner=owners.astype(np.int64), memory_bytes=memory)


def deployment_name(owner: int, cpu_m: int) -> str:
    return f"d{owner:02d}-{cpu_m}m"


@dataclass(frozen=True)
class Deployments:
    """Per Deployment (trace owner): its pods' request, and their start and end times."""

    names: list[str]
    cpu_m: list[int]
    memory_bytes: list[int]
    starts_s: list[np.ndarray]
    ends_s: list[np.ndarray]

    @classmethod
    def of(cls, trace: Trace) -> Deployments:
        names, cpu, memory, starts, ends = [], [], [], [], []
        for owner in np.unique(trace.owners).tolist():
            mine = np.flatnonzero(trace.owners == owner)
            names.append(deployment_name(owner, int(trace.cpu_m[mine[0]])))
            cpu.append(int(trace.cpu_m[mine[0]]))
            memory.append(int(trace.memory_bytes[mine[0]]))
            starts.append(np.sort(trace.arrival_s[mine]))
            ends.append(np.sort(trace.arrival_s[mine] + trace.duration_s[mine]))
        return cls(names, cpu, memory, starts, ends)

    def replicas_at(self, t_s: float) -> list[int]:
        """The trace pods of each Deployment alive at trace time `t_s`."""
        return [
            int(np.searchsorted(s, t_s, "right") - np.searchsorted(e, t_s, "right"))
            for s, e in zip(self.starts_s, self.ends_s, strict=True)
        ]


def policy_settings(settings: EmulationSettings) -> PolicySettings:
    """The controller's policy on both sides: the simulator's (`power_management_for` at the
    energy bench's defaults)."""
    policy = PolicySettings(boot_s=settings.boot_s)
    if settings.unneeded_s is not None:
        policy = dataclasses.replace(policy, unneeded_time_s=settings.unneeded_s)
    if settings.cooldown_s is not None:
        policy = dataclasses.replace(policy, cooldown_s=settings.cooldown_s)
    return policy


def sim_settings(settings: EmulationSettings, trace: Trace) -> SimSettings:
    compression = settings.compression
    return SimSettings(
        boot_s=settings.boot_s,
        shutdown_s=settings.shutdown_s,
        backoff_initial_s=SCHEDULER_BACKOFF_INITIAL_S * compression,
        backoff_max_s=SCHEDULER_BACKOFF_MAX_S * compression,
        unschedulable_flush_s=SCHEDULER_UNSCHEDULABLE_FLUSH_S * compression,
        max_pending_s=settings.horizon_s,  # never given up, as in the real cluster
        tail_s=max(0.0, settings.horizon_s - trace.end_s),
    )


# ---- the simulated side --------------------------------------------------------------------


def run_simulated(scenario: Scenario, settings: EmulationSettings) -> SideFigures:
    spec = POLICIES[POLICY]
    with spec.make(scenario, policy_rng(scenario, POLICY)) as policy:
        assert isinstance(policy.power, PowerManagement)
        # The settings the real controller gets as flags (the bench's own flags set fewer).
        policy.power.policy_settings = policy_settings(settings)
        result: PolicyResult = simulate(
            scenario.cluster, scenario.trace, policy, scenario.sim_settings, progress=False
        )
        manager = policy.power
        assert isinstance(manager, PowerManagement)
        log = manager.decision_log
    off_nodes = {node for _, what, node, _ in log if what == "off"}
    woken = {node for _, what, node, _ in log if what == "wake"}
    nodes_on = result.nodes_on if result.nodes_on is not None else np.zeros(0)
    return SideFigures(
        pods_placed=result.placed_pods,
        pods_unplaced_at_end=result.unplaced_pods,
        pods_removed_unplaced=0,
        pod_waits_s=[float(w) for w in result.pod_waits_s],
        nodes_powered_off=len(off_nodes),
        nodes_woken=len(woken),
        power_offs=result.power_cycles,
        wakes=int(result.kpis.get("wakes", 0)),
        # What the real side measures: the curves, off and boot power, no fans.
        energy_kwh=result.energy_kwh - result.fan_energy_kwh,
        mean_nodes_on=float(nodes_on.mean()) if nodes_on.size else float(len(scenario.cluster)),
        events=[(round(t, 1), what, node) for t, what, node, _ in log],
    )


# ---- the real side: what runs ----------------------------------------------------------------


class BmcStates:
    """Every node's PowerState from the Redfish emulator, polled in one thread: what the
    kubelets follow and what the energy sampler reads."""

    def __init__(self, bmc: RedfishEmulator, names: list[str]) -> None:
        self.bmc, self.names = bmc, names
        self.states = dict.fromkeys(names, "On")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bmc-poll", daemon=True)

    def __enter__(self) -> BmcStates:
        self._poll()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _poll(self) -> None:
        for name in self.names:
            with contextlib.suppress(Exception):
                self.states[name] = self.bmc.power_state(name)

    def _run(self) -> None:
        while not self._stop.wait(BMC_POLL_S):
            self._poll()

    def power_of(self, node: str) -> str:
        return self.states.get(node, "On").lower()


@dataclass
class PodRecord:
    created_s: float  # monotonic, first seen
    bound_s: float | None = None
    node: str | None = None
    cpu_m: int = 0
    deleted: bool = False


class PodWatch:
    """The workload's pods as a watch of the API server shows them: when each appeared, when it
    was bound and where, when it went."""

    def __init__(self, core: kubernetes.client.CoreV1Api) -> None:
        self.core = core
        self.pods: dict[str, PodRecord] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._watch: kubernetes.watch.Watch | None = None

    def __enter__(self) -> PodWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(10)

    def _seen(self, pod: Any, kind: str) -> None:
        if (pod.metadata.labels or {}).get(APP_LABEL) is None:
            return
        now = time.monotonic()
        uid = pod.metadata.uid
        with self.lock:
            record = self.pods.get(uid)
            if record is None:
                requests = (pod.spec.containers[0].resources.requests or {}) if pod.spec else {}
                cpu = str(requests.get("cpu", "0"))
                cpu_m = int(cpu[:-1]) if cpu.endswith("m") else round(float(cpu) * 1000)
                record = self.pods[uid] = PodRecord(created_s=now, cpu_m=cpu_m)
            if pod.spec.node_name and record.bound_s is None:
                record.bound_s, record.node = now, pod.spec.node_name
            if kind == "DELETED" or pod.metadata.deletion_timestamp is not None:
                record.deleted = True

    def _run(self) -> None:
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self.core.list_namespaced_pod(WORKLOAD_NAMESPACE)
                    for pod in listed.items:
                        self._seen(pod, "LISTED")
                    version = listed.metadata.resource_version
                self._watch = kubernetes.watch.Watch()
                for event in self._watch.stream(
                    self.core.list_namespaced_pod,
                    WORKLOAD_NAMESPACE,
                    resource_version=version,
                    timeout_seconds=30,
                ):
                    pod = event["object"]
                    version = pod.metadata.resource_version
                    self._seen(pod, event["type"])
                    if self._stop.is_set():
                        break
            except ApiException as error:
                if error.status == 410:  # too old a version: list again
                    version = None
                else:
                    time.sleep(0.5)
            except Exception:  # a dropped stream: resume from the last version
                time.sleep(0.5)

    def requested_m(self) -> dict[str, int]:
        """Millicores requested on each node by bound workload pods not being deleted."""
        out: dict[str, int] = {}
        with self.lock:
            for record in self.pods.values():
                if record.node and not record.deleted:
                    out[record.node] = out.get(record.node, 0) + record.cpu_m
        return out

    def counts(self) -> tuple[int, int]:
        """(bound, waiting) workload pods."""
        with self.lock:
            bound = sum(r.bound_s is not None for r in self.pods.values())
            waiting = sum(r.bound_s is None and not r.deleted for r in self.pods.values())
        return bound, waiting


class EnergySampler:
    """Every `sample_s`: each node's power from its curve and state; nodes on; transitions of
    the controller's power-state annotation (power-offs, wakes)."""

    def __init__(
        self,
        cluster: SimCluster,
        core: kubernetes.client.CoreV1Api,
        bmc: BmcStates,
        pods: PodWatch,
        exporters: dict[str, Exporter],
        settings: EmulationSettings,
    ) -> None:
        self.cluster, self.core, self.bmc, self.pods = cluster, core, bmc, pods
        self.exporters = exporters
        self.settings = settings
        spec = cluster.spec
        self.idle_w = spec.idle_share * spec.max_power_w
        sim = SimSettings()
        self.boot_w = self.idle_w + sim.boot_power_share * (spec.max_power_w - self.idle_w)
        self.off_w = sim.off_power_w
        self.energy_j = 0.0  # trace time
        self.node_on_s = 0.0  # trace node-seconds on (taking pods)
        self.elapsed_s = 0.0  # trace seconds sampled
        self.states: dict[str, str] = {}
        self.power_offs = self.wakes = 0
        self.off_nodes: set[str] = set()
        self.woken_nodes: set[str] = set()
        self.nodes_on = len(cluster)
        self.events: list[tuple[float, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="energy", daemon=True)

    def __enter__(self) -> EnergySampler:
        self.started = self._last = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.sample_s):
            with contextlib.suppress(Exception):
                self.sample()

    def sample(self) -> None:
        nodes = {n.metadata.name: n for n in self.core.list_node().items}
        requested = self.pods.requested_m()
        now = time.monotonic()
        dt_s = (now - self._last) * self.settings.compression
        self._last = now
        cluster = self.cluster
        util = np.array(
            [
                min(requested.get(name, 0) / 1000.0 / cluster.cores[i], 1.0)
                for i, name in enumerate(cluster.names)
            ]
        )
        curve_w = curve_power_w(cluster, util)
        total_w, on = 0.0, 0
        for i, name in enumerate(cluster.names):
            node = nodes.get(name)
            annotations = (node.metadata.annotations or {}) if node else {}
            state = annotations.get(POWER_STATE_ANNOTATION, "on")
            self._transition(name, state)
            ready = node is not None and any(
                c.type == "Ready" and c.status == "True" for c in node.status.conditions or []
            )
            powered = self.bmc.states.get(name, "On") == "On"
            if state == POWER_WAKING or (powered and not ready):
                total_w += self.boot_w[i]
            elif not powered:
                total_w += self.off_w
            else:
                total_w += curve_w[i]
                on += state not in (POWER_OFF, "draining") and not node.spec.unschedulable
            exporter = self.exporters.get(name)
            if exporter is not None:  # what node_exporter would show of the node
                exporter.host.cpu_util = float(util[i]) if powered else 0.0
        self.energy_j += total_w * dt_s
        self.node_on_s += on * dt_s
        self.elapsed_s += dt_s
        self.nodes_on = on

    def _transition(self, name: str, state: str) -> None:
        before = self.states.get(name, "on")
        if state != before:
            t_s = round((time.monotonic() - self.started) * self.settings.compression, 1)
            if state == POWER_OFF and before != POWER_OFF:
                self.power_offs += 1
                self.off_nodes.add(name)
                self.events.append((t_s, "off", name))
            if state == POWER_WAKING:
                self.wakes += 1
                self.woken_nodes.add(name)
                self.events.append((t_s, "wake", name))
            self.states[name] = state


# ---- the real side: setting it up ------------------------------------------------------------


def wait_http_ok(url: str, timeout_s: float, what: str) -> None:
    def ok() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    wait_until(ok, timeout_s, what)


def register_nodes(
    agent: NodeAgent, cluster: SimCluster, core: kubernetes.client.CoreV1Api, boot_s: float
) -> None:
    for i, name in enumerate(cluster.names):
        labels = {
            POWER_MANAGEMENT_LABEL: POWER_MANAGEMENT_ENABLED,
            POWER_DRIVER_LABEL: "redfish",
            "kubernetes.io/hostname": name,
        }
        if cluster.zone_labels is not None:
            labels[ZONE_LABEL] = cluster.zone_labels[i]
        max_pods = 110 if cluster.max_pods is None else int(cluster.max_pods[i])
        with contextlib.suppress(ApiException):  # its Lease made first by the heartbeat: fine
            agent.add_node(
                name,
                cpu=int(cluster.cores[i]),
                memory=str(int(cluster.memory_bytes[i])),
                pods=max_pods,
                labels=labels,
                boot_s=boot_s,
            )

    def ready() -> bool:
        for node in core.list_node().items:
            if node.metadata.name not in cluster.names:
                continue
            conditions = node.status.conditions or []
            if not any(c.type == "Ready" and c.status == "True" for c in conditions):
                return False
            if node.spec.taints:
                return False
        return True

    wait_until(ready, 120, "every node Ready and untainted")


def container(cpu_m: int, memory_bytes: int) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": f"{cpu_m}m"}
    if memory_bytes:
        requests["memory"] = str(memory_bytes)
    return {"name": "app", "image": "app", "resources": {"requests": requests}}


def create_workloads(apps: kubernetes.client.AppsV1Api, deployments: Deployments) -> None:
    for i, pod in enumerate(DAEMONSET_PODS):
        name = f"daemon-{i}"
        apps.create_namespaced_daemon_set(
            WORKLOAD_NAMESPACE,
            {
                "metadata": {"name": name},
                "spec": {
                    "selector": {"matchLabels": {"daemon": name}},
                    "template": {
                        "metadata": {"labels": {"daemon": name}},
                        "spec": {
                            "terminationGracePeriodSeconds": 0,
                            "containers": [container(pod.cpu_m, pod.memory_bytes)],
                        },
                    },
                },
            },
        )
    for name, cpu_m, memory in zip(
        deployments.names, deployments.cpu_m, deployments.memory_bytes, strict=True
    ):
        apps.create_namespaced_deployment(
            WORKLOAD_NAMESPACE,
            {
                "metadata": {"name": name},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {APP_LABEL: name}},
                    "template": {
                        "metadata": {"labels": {APP_LABEL: name}},
                        "spec": {
                            "schedulerName": SCHEDULER,
                            "terminationGracePeriodSeconds": 0,
                            "containers": [container(cpu_m, memory)],
                        },
                    },
                },
            },
        )


def daemon_pods_running(core: kubernetes.client.CoreV1Api, expected: int) -> bool:
    pods = core.list_namespaced_pod(WORKLOAD_NAMESPACE, label_selector="daemon").items
    return sum(p.status.phase == "Running" for p in pods) >= expected


def controller_flags(settings: EmulationSettings, bundle: Path, prometheus_url: str) -> list[str]:
    """The simulator's controller settings as flags, durations in real seconds."""
    policy = policy_settings(settings)
    f = settings.compression
    interval_s = SimSettings().power_interval_s / f
    boot_s, shutdown_s = settings.boot_s / f, settings.shutdown_s / f
    return [
        f"--scan-interval={interval_s:.3f}s",
        f"--scale-down-unneeded-time={policy.unneeded_time_s / f:.3f}s",
        f"--scale-down-utilization-threshold={policy.utilization_threshold}",
        f"--node-cooldown={policy.cooldown_s / f:.3f}s",
        f"--min-on-nodes={policy.min_on_nodes}",
        f"--max-off-fraction={policy.max_off_fraction}",
        f"--min-headroom-cores={policy.min_headroom_cores}",
        f"--boot-time={boot_s:.3f}s",
        f"--headroom-factor={policy.headroom_factor}",
        f"--off-margin-sd={policy.off_margin_sd}",
        f"--max-drain-parallelism={policy.max_drains_per_round}",
        f"--wake-horizon={policy.wake_horizon_s / f:.3f}s",
        f"--drain-timeout={max(60.0, 600.0 / f):.0f}s",
        "--max-graceful-termination-sec=5",
        f"--shutdown-timeout={shutdown_s + 60:.0f}s",
        f"--wake-timeout={boot_s * 3 + 60:.0f}s",
        "--retry-backoff=5s",
        "--max-retry-backoff=20s",
        "--bmc-timeout=5s",
        "--api-timeout=5s",
        f"--bundle={bundle}",
        f"--prometheus={prometheus_url}",
        "--log-format=text",
    ]


@contextlib.contextmanager
def real_cluster(
    settings: EmulationSettings, cluster: SimCluster, bundle: Path, work: Path
) -> Iterator[tuple[ControlPlane, BmcStates, dict[str, Exporter], Callable[[], ControllerProcess]]]:
    """Everything of the real side running but the controller, nodes Ready; the controller's
    start, for trace time 0 (its first round counts unneeded time from then, as the
    simulator's)."""
    f = settings.compression
    # The emulator's delay before a requested power state shows: the shutdown; the boot is that
    # delay plus the kubelet's own boot.
    delay_s = max(0, round(settings.shutdown_s / f))
    agent_boot_s = max(0.0, settings.boot_s / f - delay_s)
    names = list(cluster.names)
    with contextlib.ExitStack() as stack:
        plane = stack.enter_context(ControlPlane(assets=find_assets()))
        admin = plane.api_client()
        core = kubernetes.client.CoreV1Api(admin)
        core.create_namespace({"metadata": {"name": WORKLOAD_NAMESPACE}})
        exporters: dict[str, Exporter] = {}
        for i, name in enumerate(names):
            temperatures = {
                "Inlet Temp": AMBIENT_MEAN_C,
                "CPU1 Temp": AMBIENT_MEAN_C + float(cluster.spec.idle_rise_c[i]),
            }
            exporters[name] = serve(
                FakeHost(cpu_util=0.0, temperatures_c=temperatures, power_w=0.0, nodename=name)
            )
            stack.callback(exporters[name].stop)
        prometheus = stack.enter_context(
            start_prometheus(
                work,
                scrape_targets=[e.target for e in exporters.values()],
                scrape_interval_s=SCRAPE_S,
            )
        )
        collect = work / "collect.yaml"
        collect.write_text(
            yaml.safe_dump(
                {
                    "cpu_rate_window": "5s",
                    "instance_nodes": {e.target: n for n, e in exporters.items()},
                }
            )
        )
        extender_kubeconfig = plane.service_account_kubeconfig(
            *EXTENDER_ACCOUNT, work / "extender.kubeconfig"
        )
        extender = stack.enter_context(
            run_extender(
                [
                    "--port",
                    str(plane.extender_port),
                    "--kubeconfig",
                    str(extender_kubeconfig),
                    "--prometheus",
                    prometheus.url,
                    "--collect-config",
                    str(collect),
                    "--refresh-interval",
                    "1",
                    "--bundle",
                    str(bundle),
                    "--config",
                    str(POWER_MANAGEMENT_PROFILE),
                    "--assumed-window",
                    f"{BenchSettings().assumed_window_s / f:.3f}",
                ]
            )
        )
        bmc = stack.enter_context(
            RedfishEmulator(
                work / "redfish", names, auth=("admin", PASSWORD), power_delay_s=(delay_s, delay_s)
            )
        )
        states = stack.enter_context(BmcStates(bmc, names))
        agent = NodeAgent(admin, power_of=states.power_of, heartbeat_s=AGENT_HEARTBEAT_S)
        agent.start()
        stack.callback(agent.stop)
        register_nodes(agent, cluster, core, agent_boot_s)
        wait_http_ok(f"{extender.url}/readyz", 120, "the extender ready")
        secrets = secret_dir(work, dict.fromkeys(names, bmc.url))

        def start_controller() -> ControllerProcess:
            controller = ControllerProcess(
                plane,
                work,
                secrets,
                *controller_flags(settings, bundle, prometheus.url),
                name="power-node-controller",
            )
            stack.callback(controller.stop)
            return controller

        yield plane, states, exporters, start_controller


def run_real(
    settings: EmulationSettings,
    cluster: SimCluster,
    trace: Trace,
    bundle: Path,
    work: Path,
    *,
    progress: bool,
) -> SideFigures:
    deployments = Deployments.of(trace)
    f = settings.compression
    with real_cluster(settings, cluster, bundle, work) as (plane, bmc, exporters, start):
        admin = plane.api_client()
        core = kubernetes.client.CoreV1Api(admin)
        apps = kubernetes.client.AppsV1Api(admin)
        with PodWatch(core) as pods:
            create_workloads(apps, deployments)
            expected = len(DAEMONSET_PODS) * len(cluster)
            wait_until(lambda: daemon_pods_running(core, expected), 120, "DaemonSet pods running")
            replicas = [0] * len(deployments.names)
            controller = start()
            with EnergySampler(cluster, core, bmc, pods, exporters, settings) as sampler:
                started = time.monotonic()
                next_progress = 0.0
                while True:
                    controller.check_alive()
                    elapsed = time.monotonic() - started
                    t_s = min(elapsed * f, settings.horizon_s)
                    wanted = deployments.replicas_at(t_s)
                    for i, (now, want) in enumerate(zip(replicas, wanted, strict=True)):
                        if now != want:
                            apps.patch_namespaced_deployment_scale(
                                deployments.names[i],
                                WORKLOAD_NAMESPACE,
                                {"spec": {"replicas": want}},
                            )
                            replicas[i] = want
                    if progress and elapsed >= next_progress:
                        show_progress(elapsed, settings, pods, sampler)
                        next_progress = elapsed + PROGRESS_S
                    if t_s >= settings.horizon_s:
                        break
                    time.sleep(0.25)
                sampler.sample()  # up to the horizon
            if progress:
                print(file=sys.stderr)
            with pods.lock:
                records = list(pods.pods.values())
    bound = [r for r in records if r.bound_s is not None]
    return SideFigures(
        pods_placed=len(bound),
        pods_unplaced_at_end=sum(r.bound_s is None and not r.deleted for r in records),
        pods_removed_unplaced=sum(r.bound_s is None and r.deleted for r in records),
        pod_waits_s=sorted((r.bound_s - r.created_s) * f for r in bound if r.bound_s),
        nodes_powered_off=len(sampler.off_nodes),
        nodes_woken=len(sampler.woken_nodes),
        power_offs=sampler.power_offs,
        wakes=sampler.wakes,
        energy_kwh=sampler.energy_j / 3.6e6,
        mean_nodes_on=sampler.node_on_s / sampler.elapsed_s if sampler.elapsed_s else 0.0,
        events=sampler.events,
    )


def show_progress(
    elapsed_s: float, settings: EmulationSettings, pods: PodWatch, sampler: EnergySampler
) -> None:
    bound, waiting = pods.counts()
    t_s = min(elapsed_s * settings.compression, settings.horizon_s)
    share = t_s / settings.horizon_s
    bar = "#" * round(20 * share)
    print(
        f"\r  real [{bar:<20}] {elapsed_s / 60:4.1f}/{settings.real_s / 60:.1f} min, "
        f"trace {t_s / 60:5.1f} min: {bound} pods bound, {waiting} waiting, "
        f"{sampler.nodes_on} nodes on, {sampler.power_offs} power-offs, {sampler.wakes} wakes ",
        end="",
        file=sys.stderr,
        flush=True,
    )


# ---- the comparison ------------------------------------------------------------------------


def relative(real: float, sim: float) -> float | None:
    if sim == 0:
        return None if real != 0 else 0.0
    return (real - sim) / abs(sim)


def comparison(real: SideFigures, sim: SideFigures) -> list[dict[str, Any]]:
    sim_rows = sim.rows()
    return [
        {"row": name, "real": value, "sim": sim_rows[name], "rel": relative(value, sim_rows[name])}
        for name, value in real.rows().items()
    ]


def print_table(rows: list[dict[str, Any]]) -> None:
    width = max(len(r["row"]) for r in rows)
    print(f"  {'':<{width}}  {'real':>10}  {'simulated':>10}  {'real vs sim':>11}")
    for r in rows:
        rel = "n/a" if r["rel"] is None else f"{100 * r['rel']:+.1f} %"
        print(f"  {r['row']:<{width}}  {r['real']:>10}  {r['sim']:>10}  {rel:>11}")


# ---- the command ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    d = EmulationSettings()
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster_emulation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=d.nodes, help="(default: %(default)s)")
    parser.add_argument(
        "--hours", type=float, default=d.hours, help="trace hours (default: %(default)s)"
    )
    parser.add_argument(
        "--load",
        type=float,
        default=d.load,
        help="mean requested share of the CPU, as the energy bench's (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=d.seed, help="(default: %(default)s)")
    parser.add_argument(
        "--compression",
        type=float,
        default=d.compression,
        help="trace seconds per real second: 3 runs an hour of trace in 20 min (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--boot-time",
        type=float,
        default=d.boot_s,
        metavar="S",
        help="trace seconds from power-on to a Ready node (default: %(default)s)",
    )
    parser.add_argument(
        "--shutdown-time",
        type=float,
        default=d.shutdown_s,
        metavar="S",
        help="trace seconds a node takes to power off (default: %(default)s)",
    )
    parser.add_argument(
        "--burst-at",
        type=float,
        nargs="*",
        default=list(d.burst_s),
        metavar="S",
        help="trace seconds at which a burst (3x the arrival rate for 10 min, the energy "
        "bench's) starts; none without values (default: %(default)s)",
    )
    parser.add_argument(
        "--unneeded-time",
        type=float,
        metavar="S",
        help="trace seconds a node stays unneeded before it goes off, both sides (default: "
        f"{PolicySettings().unneeded_time_s:g}, the controller's)",
    )
    parser.add_argument(
        "--cooldown",
        type=float,
        metavar="S",
        help="trace seconds a node is left alone after a power change, both sides (default: "
        f"{PolicySettings().cooldown_s:g}, the controller's)",
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=d.sample_s,
        metavar="S",
        help="real seconds between energy samples of the real side (default: %(default)s)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=d.out_dir,
        help="the model bundle cache, as the energy bench's (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the figures here")
    parser.add_argument(
        "--keep-logs",
        type=Path,
        metavar="DIR",
        help="keep the real side's logs (controller, BMC, Prometheus) in DIR",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress, warnings only")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.quiet)
    if args.compression <= 0 or args.nodes < 1 or args.hours <= 0:
        print("--compression, --nodes and --hours must be positive", file=sys.stderr)
        return 2
    ensure_prometheus()
    settings = EmulationSettings(
        nodes=args.nodes,
        hours=args.hours,
        load=args.load,
        seed=args.seed,
        compression=args.compression,
        boot_s=args.boot_time,
        shutdown_s=args.shutdown_time,
        sample_s=args.sample_interval,
        burst_s=tuple(args.burst_at),
        unneeded_s=args.unneeded_time,
        cooldown_s=args.cooldown,
        out_dir=args.out_dir,
    )
    bench = BenchSettings(nodes=settings.nodes, hours=settings.hours, seed=settings.seed)
    cluster = build_cluster(settings.nodes, settings.seed, battery_share=bench.battery_share)
    trace = emulation_trace(cluster, settings)
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    bundle = trained_bundle(bench, settings.out_dir, progress=not args.quiet)
    scenario = Scenario(bench, sim_settings(settings, trace), cluster, trace, bundle)
    progress = not args.quiet
    if progress:
        print(
            f"{len(trace)} pods on {settings.nodes} nodes ({cluster.cores.sum():.0f} cores) over "
            f"{settings.hours:g} h of trace; {len(Deployments.of(trace).names)} Deployments",
            file=sys.stderr,
        )
        print("  simulated ...", file=sys.stderr)
    sim = run_simulated(scenario, settings)
    if progress:
        print(f"  real, {settings.real_s / 60:.1f} min ...", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="cluster-emulation-"))
    try:
        real = run_real(settings, cluster, trace, bundle, work, progress=progress)
    except KeyboardInterrupt:
        print("\ninterrupted: everything stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep_logs is not None:
            shutil.copytree(work, args.keep_logs, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    rows = comparison(real, sim)
    print(
        f"\nthe simulator against a real cluster: {settings.nodes} nodes, {settings.hours:g} h of "
        f"trace at {settings.compression:g}x, {len(trace)} pods (figures in trace time)"
    )
    print_table(rows)
    if args.json is not None:
        document = {
            "settings": {
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in dataclasses.asdict(settings).items()
            },
            "pods": len(trace),
            "deployments": len(Deployments.of(trace).names),
            "rows": rows,
            "real": real.rows(),
            "sim": sim.rows(),
            "events": {"real": real.events, "sim": sim.events},
        }
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
