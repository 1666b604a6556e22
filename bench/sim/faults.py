"""The `faults` preset and the `power-aware+rewards` policy: learning where pods crash.

The preset (contract 5: `faults`) is the default 16-node cluster and trace, with every pod
belonging to one of `WORKLOADS` Deployments (Zipf-distributed: a few busy services, a tail of
small ones) and two nodes with hidden faults (`bench.sim.pod_faults`):

- the cheapest node on power (fewest watts per core of work: where power-aware sends most
  pods) fails two workloads' starts with probability 0.9 (their containers exit with Error:
  a bad DIMM corrupting a memory-heavy service), and is repaired half-way through the run;
- another node, drawn at random, fails one workload's starts with probability 0.6 (OOMKilled:
  a noisy neighbour squeezing it) for the whole run.

Failing pods use CPU until they are given up and re-created; the run reports failed pod starts
(contract 5's `failed_pod_starts`, and after the warm-up), restarts, the energy wasted on
failing pods and how long after its repair the repaired node ran its workloads' pods again.

`power-aware+rewards` is `power-aware` with the extender's `Reward` plugin enabled
(`PROFILE`). The simulation plays the extender's pod watch: every pod state a kubelet would
write (bound, running and ready, crashed in CrashLoopBackOff, Succeeded, deleted) goes as Pod
JSON (`bench.support.pods`) into a `RewardSource`, the plugin's own source class, which
publishes its snapshot into the extender's state; the pods sent to `/filter` and
`/prioritize` carry their ReplicaSet owner, as kube-scheduler sends them.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.sim.cluster import SimCluster, curve_power_w
from bench.sim.kube_default import PodRequest
from bench.sim.pod_faults import FaultPlan, NodeFault
from bench.sim.policies import ExtenderPolicy, Policy
from bench.sim.runner import PolicySpec, extender_policy, register_policy
from bench.sim.scenario import Preset, Scenario, register_preset
from bench.support import pods
from extender.plugins.reward import RewardArgs, settings_from_args
from extender.profile import load_profile
from extender.rewards.source import RewardSource

PROFILE = Path(__file__).with_name("profiles") / "power-aware+rewards.yaml"
WORKLOADS = 10
NAMESPACE = "shop"
CHEAPEST_FAULT = (frozenset({0, 2}), 0.9, "Error")  # workloads, fail probability, reason
OTHER_FAULT = (frozenset({1}), 0.6, "OOMKilled")
WARMUP_S = 2 * 3600.0


def cheapest_node(cluster: SimCluster) -> int:
    """The node whose true curve adds the fewest watts per core between 20 and 60 % load."""
    low = curve_power_w(cluster, np.full(len(cluster), 0.2))
    high = curve_power_w(cluster, np.full(len(cluster), 0.6))
    return int(np.argmin((high - low) / (0.4 * cluster.cores)))


def workload_name(index: int) -> str:
    return f"svc-{index:02d}"


def template_hash(workload: str) -> str:
    """A stable pod-template-hash for the workload's ReplicaSet (10 hex-ish characters)."""
    return hashlib.sha256(workload.encode()).hexdigest()[:10]


def prepare(scenario: Scenario) -> None:
    """Assign every pod a workload and hide the two faults (`scenario.world["faults"]`)."""
    settings, cluster, trace = scenario.settings, scenario.cluster, scenario.trace
    rng = np.random.default_rng([settings.seed, 19])
    weights = 1.0 / np.arange(1, WORKLOADS + 1)
    pod_workload = rng.choice(WORKLOADS, len(trace), p=weights / weights.sum())
    cheapest = cheapest_node(cluster)
    others = [i for i in range(len(cluster)) if i != cheapest]
    other = int(rng.choice(others))
    horizon_s = settings.hours * 3600.0
    scenario.world["faults"] = FaultPlan(
        workload_names=tuple(workload_name(i) for i in range(WORKLOADS)),
        pod_workload=pod_workload,
        faults=(
            NodeFault(cheapest, *CHEAPEST_FAULT, repaired_at_s=horizon_s / 2),
            NodeFault(other, *OTHER_FAULT),
        ),
        warmup_s=WARMUP_S,
        seed=settings.seed,
    )


FAULTS = register_preset(
    Preset(
        name="faults",
        description=(
            "the default cluster and trace, pods of 10 Deployments; the cheapest node fails two "
            "of them (90 % of starts, repaired half-way), another node one (60 %, OOMKilled)"
        ),
        policies=("default", "power-aware", "power-aware+rewards"),
        prepare=prepare,
    )
)


# ---- the policy: power-aware + Reward, the pod watch played from the simulation ----------------


@dataclass
class _PodLife:
    """What the simulated pod watch knows of one trace pod's current start."""

    pod: dict
    node: str
    started_s: float
    start: int
    restarts: int = 0
    replaced: bool = False


class RewardsPolicy(ExtenderPolicy):
    """`power-aware` with the Reward plugin; pod states go to the plugin's `RewardSource`."""

    plan: FaultPlan
    source: RewardSource
    trace_index: dict[str, int]

    def attach(self, plan: FaultPlan, source: RewardSource, trace_names: list[str]) -> None:
        self.plan = plan
        self.source = source
        self.trace_index = {name: i for i, name in enumerate(trace_names)}
        self.lives: dict[str, _PodLife] = {}
        self.starts: dict[str, int] = {}

    def metadata(self, uid: str, start: int) -> dict:
        workload = self.plan.workload_names[int(self.plan.pod_workload[self.trace_index[uid]])]
        name = f"{uid}-{start}"
        return pods.deployment_pod_metadata(
            name, f"uid-{name}", workload, template_hash(workload), NAMESPACE
        )

    def pod_object(self, uid: str, pod: PodRequest) -> dict:
        body = super().pod_object(uid, pod)
        body["metadata"] = {**self.metadata(uid, self.starts.get(uid, 0) + 1), "uid": uid}
        return body

    def place(self, uid: str, pod: PodRequest, ledger, now_s: float):  # type: ignore[override]
        self._at(now_s)
        self.source.run_once()  # healthy intervals judged, a fresh snapshot published
        return super().place(uid, pod, ledger, now_s)

    def bound(self, node: int, uid: str, cpu_cores: float, now_s: float) -> None:
        super().bound(node, uid, cpu_cores, now_s)
        start = self.starts[uid] = self.starts.get(uid, 0) + 1
        name = self.node_names[node]
        bound = pods.bound_pod(self.metadata(uid, start), name, at_s=now_s)
        self.lives[uid] = _PodLife(bound, name, now_s, start)
        self._at(now_s)
        self.source.pod_event("ADDED", bound)
        # Containers start at once in the simulation: running and ready.
        self._update(uid, pods.running_pod(bound, started_at_s=now_s))

    def pod_crashed(self, uid: str, node: int, now_s: float, restarts: int, reason: str) -> None:
        life = self.lives[uid]
        life.restarts = restarts
        exit_code = 137 if reason == "OOMKilled" else 1
        self._at(now_s)
        self._update(
            uid,
            pods.crash_looping_pod(
                life.pod,
                restarts=restarts,
                reason=reason,
                exit_code=exit_code,
                finished_at_s=now_s,
                started_at_s=max(life.started_s, now_s - self.plan.crash_after_s),
            ),
        )

    def pod_replaced(self, uid: str, node: int, now_s: float) -> None:
        self.lives[uid].replaced = True

    def gone(self, uid: str) -> None:
        super().gone(uid)
        life = self.lives.pop(uid, None)
        if life is None:
            return
        now_s = self.clock.now_s
        if not life.replaced:
            life.pod = pods.succeeded_pod(
                life.pod, started_at_s=life.started_s, finished_at_s=now_s
            )
            self.source.pod_event("MODIFIED", life.pod)
        self.source.pod_event("DELETED", life.pod)

    def _update(self, uid: str, pod: dict) -> None:
        self.lives[uid].pod = pod
        self.source.pod_event("MODIFIED", pod)

    def _at(self, now_s: float) -> None:
        self.clock.now_s = max(self.clock.now_s, now_s)


def reward_args(profile: Path = PROFILE) -> RewardArgs:
    """The Reward plugin's arguments in the policy's profile."""
    args = load_profile(profile).plugin("Reward").args
    assert isinstance(args, RewardArgs)
    return args


@contextlib.contextmanager
def rewards_policy(
    name: str, scenario: Scenario, rng: np.random.Generator, profile: Path = PROFILE
) -> Iterator[Policy]:
    plan = scenario.world.get("faults")
    if not isinstance(plan, FaultPlan):
        raise ValueError(f"{name} needs a preset with workloads and faults (--preset faults)")
    assert scenario.bundle_dir is not None
    with extender_policy(
        name,
        scenario.cluster,
        scenario.bundle_dir,
        scenario.settings,
        hears_labels=False,
        config_file=profile,
        rng=rng,
        policy_class=RewardsPolicy,
    ) as policy:
        assert isinstance(policy, RewardsPolicy)
        source = RewardSource(
            settings_from_args(reward_args(profile)),
            policy.state,
            clock=policy.clock,
            learning_from="the simulated pod watch",
        )
        policy.attach(plan, source, scenario.trace.names)
        yield policy


def _make(scenario: Scenario, rng: np.random.Generator) -> AbstractContextManager[Policy]:
    return rewards_policy("power-aware+rewards", scenario, rng)


register_policy(
    PolicySpec(
        "power-aware+rewards",
        "power-aware plus the Reward plugin, learning from the pod watch where pods fail "
        f"({PROFILE.name}); needs a preset with workloads (faults)",
        _make,
        needs_bundle=True,
    )
)
