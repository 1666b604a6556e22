"""Pod states -> outcomes: what a placement on a node turned out to be, from the pod watch.

The pod watch sees each pod as the kubelet writes its status. Comparing one state of a pod
with the previous one gives the *outcomes* the reward model learns from, each charged to the
node the pod runs on and to its workload:

    outcome          counts    from the Pod JSON
    restart          bad       a containerStatuses[].restartCount went up, the container's
                               lastState.terminated.reason not "Completed" (exit code != 0)
    oom_killed       bad       the same, with lastState.terminated.reason "OOMKilled" (or a
                               Failed pod whose container state.terminated.reason is OOMKilled)
    crash_loop       bad       state.waiting.reason "CrashLoopBackOff" when the pod is first
                               seen (its earlier restarts are unknown: counted once); later on,
                               the restarts of the loop count one by one
    not_ready        bad       phase Running, every container running, condition Ready False
                               for longer than `readiness_grace_s` (once per episode)
    evicted          bad       phase Failed, reason Evicted (node-pressure eviction)
    failed           bad       phase Failed otherwise (containers failed, kubelet admission)
    never_started    bad       bound to the node, no container started `start_grace_s` later
    healthy          good      every `healthy_interval_s` of continuous readiness
    succeeded        good      phase Succeeded

Not counted against the node (the node is not why; the counts show in metrics as ignored):
image pulls and bad pod specs (waiting reasons ErrImagePull, ImagePullBackOff,
InvalidImageName, ErrImageNeverPull, CreateContainerConfigError: every node would fail the
same way), restarts of containers that exited 0, and Failed pods that something *did* to them:
preemption by the scheduler, API-initiated eviction (drains, the descheduler), the pod
garbage collector, graceful node shutdown (DisruptionTarget condition reasons
PreemptionByScheduler, EvictionByEvictionAPI, DeletionByPodGC; status reasons Shutdown,
Terminated, NodeShutdown). Pods deleted through the API (scale-down, rollouts) end without an
outcome.

The workload is the pod's controller: a Deployment (the ReplicaSet's name without the
`pod-template-hash` suffix), StatefulSet, Job, DaemonSet or any other controller kind; a pod
without one falls back to its `app` (then `app.kubernetes.io/name`) label; a bare pod with
neither counts for its node only.

The watch may start (or relist after a gap) long after a pod's history began. Everything up to
`known_until_s` is assumed counted already (by the persisted evidence or earlier events): a pod
seen for the first time in a list counts only what its own timestamps date after that
(`lastState.terminated.finishedAt`, condition transition times), so a restart of the extender
neither loses the outcomes since its last save nor counts old ones twice.

Pure bookkeeping, no I/O; not thread-safe (the reward source holds a lock around it).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

POD_TEMPLATE_HASH_LABEL = "pod-template-hash"
APP_LABELS = ("app", "app.kubernetes.io/name")

# Waiting reasons that a bad image reference, registry or pod spec causes on any node.
EXCUSED_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
    }
)
# DisruptionTarget reasons (and Failed status reasons) of pods ended by someone, not a fault.
EXCUSED_DISRUPTIONS = frozenset(
    {"PreemptionByScheduler", "EvictionByEvictionAPI", "DeletionByPodGC"}
)
EXCUSED_FAILED_REASONS = frozenset({"Shutdown", "Terminated", "NodeShutdown"})
DEFAULT_MAX_TRACKED_PODS = 200_000


class OutcomeKind(StrEnum):
    HEALTHY = "healthy"
    SUCCEEDED = "succeeded"
    RESTART = "restart"
    OOM_KILLED = "oom_killed"
    CRASH_LOOP = "crash_loop"
    NOT_READY = "not_ready"
    EVICTED = "evicted"
    FAILED = "failed"
    NEVER_STARTED = "never_started"

    @property
    def good(self) -> bool:
        return self in (OutcomeKind.HEALTHY, OutcomeKind.SUCCEEDED)


@dataclass(frozen=True)
class Outcome:
    """One observation of a placement: `kind` happened to `pod` on `node` at `at_s`."""

    node: str
    workload: str | None
    kind: OutcomeKind
    at_s: float
    pod: str  # namespace/name
    detail: str = ""

    @property
    def good(self) -> bool:
        return self.kind.good


@dataclass(frozen=True)
class OutcomeSettings:
    """The time rules of the outcome table (seconds)."""

    healthy_interval_s: float = 600.0
    readiness_grace_s: float = 300.0
    start_grace_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("healthy_interval_s", "readiness_grace_s", "start_grace_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


# ---- identity ---------------------------------------------------------------------------------


def workload_of(pod: Mapping[str, Any]) -> str | None:
    """`namespace/Kind/name` of the pod's controller (Deployment for a ReplicaSet's pods), else
    `namespace/app/<label>`; None for a bare pod without an app label."""
    metadata = pod.get("metadata") or {}
    namespace = metadata.get("namespace") or "default"
    labels = metadata.get("labels") or {}
    for reference in metadata.get("ownerReferences") or []:
        if not reference.get("controller"):
            continue
        kind, name = reference.get("kind") or "", reference.get("name") or ""
        if not kind or not name:
            continue
        if kind == "ReplicaSet":
            template_hash = labels.get(POD_TEMPLATE_HASH_LABEL)
            if template_hash and name.endswith(f"-{template_hash}"):
                return f"{namespace}/Deployment/{name[: -len(template_hash) - 1]}"
        return f"{namespace}/{kind}/{name}"
    for label in APP_LABELS:
        app = labels.get(label)
        if app:
            return f"{namespace}/app/{app}"
    return None


def pod_name(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"


def timestamp_s(text: object) -> float | None:
    """Unix seconds of an RFC 3339 timestamp as the API server writes it; None if unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ---- one pod's history ------------------------------------------------------------------------


@dataclass(slots=True)
class _PodTrack:
    node: str
    workload: str | None
    name: str
    bound_at_s: float
    restarts: dict[str, int] = field(default_factory=dict)
    started: bool = False
    excused: str | None = None  # the waiting reason that excuses the node, once seen
    ready_since_s: float | None = None
    credited_until_s: float | None = None  # healthy time counted up to here
    unready_since_s: float | None = None
    unready_counted: bool = False
    never_started_counted: bool = False
    terminal: bool = False
    outcomes: int = 0  # outcomes charged so far (0: an unproven placement, "in flight")
    flying: bool = False  # counted in PodOutcomes' in-flight counts

    @property
    def unproven(self) -> bool:
        """Placed, not judged yet, and not waiting on its image or spec."""
        return self.outcomes == 0 and not self.terminal and self.excused is None

    @property
    def key(self) -> tuple[str, str | None]:
        return self.node, self.workload


class PodOutcomes:
    """Successive states of every bound pod -> `Outcome`s; see the module docstring.

    `namespaces`: only pods in these (None: all). `known_until_s`: what happened before it is
    already counted (the persisted evidence's save time, or the process start). At most
    `max_pods` pods are followed; the one heard of least recently is forgotten first.
    """

    def __init__(
        self,
        settings: OutcomeSettings = OutcomeSettings(),
        *,
        known_until_s: float,
        namespaces: Iterable[str] | None = None,
        max_pods: int = DEFAULT_MAX_TRACKED_PODS,
    ) -> None:
        if max_pods < 1:
            raise ValueError(f"max_pods must be at least 1, got {max_pods}")
        self.settings = settings
        self.namespaces = frozenset(namespaces) if namespaces else None
        self.known_until_s = float(known_until_s)
        self.max_pods = max_pods
        self._pods: OrderedDict[str, _PodTrack] = OrderedDict()
        self._flying: dict[tuple[str, str | None], int] = {}  # kept in step with each track
        self.ignored: dict[str, int] = {}  # reason -> signals not counted against a node
        self.forgotten_pods = 0

    @property
    def tracked_pods(self) -> int:
        return len(self._pods)

    # ---- what the watch reports ----------------------------------------------------------

    def listed(self, pods: Iterable[Mapping[str, Any]], now_s: float) -> list[Outcome]:
        """A full list (start, or relist after a gap): new pods may have a past; gone pods go."""
        outcomes: list[Outcome] = []
        seen: set[str] = set()
        for pod in pods:
            uid = (pod.get("metadata") or {}).get("uid")
            if uid:
                seen.add(uid)
                outcomes.extend(self._observe(uid, pod, now_s, may_have_past=True))
        for uid in [uid for uid in self._pods if uid not in seen]:
            self._drop(uid)
        self.known_until_s = max(self.known_until_s, now_s)
        return outcomes

    def event(self, event_type: str, pod: Mapping[str, Any], now_s: float) -> list[Outcome]:
        """One watch event (ADDED, MODIFIED, DELETED) of a pod."""
        uid = (pod.get("metadata") or {}).get("uid")
        if not uid:
            return []
        # An ADDED pod is new to the selection (created, or just bound): it has no past. A
        # MODIFIED one not followed yet (forgotten, or filtered before) may have.
        outcomes = self._observe(uid, pod, now_s, may_have_past=event_type != "ADDED")
        if event_type == "DELETED":
            self._drop(uid)
        self.known_until_s = max(self.known_until_s, now_s)
        return outcomes

    def sweep(self, now_s: float) -> list[Outcome]:
        """Outcomes that time alone produces: healthy intervals, readiness and start graces."""
        settings = self.settings
        outcomes: list[Outcome] = []
        for track in self._pods.values():
            if track.terminal:
                continue
            self._credit_healthy(track, now_s, outcomes)
            if (
                track.unready_since_s is not None
                and not track.unready_counted
                and now_s - track.unready_since_s >= settings.readiness_grace_s
            ):
                track.unready_counted = True
                self._charge(track, OutcomeKind.NOT_READY, now_s, outcomes, "not ready")
            if (
                not track.started
                and track.excused is None
                and not track.never_started_counted
                and now_s - track.bound_at_s >= settings.start_grace_s
            ):
                track.never_started_counted = True
                self._charge(
                    track,
                    OutcomeKind.NEVER_STARTED,
                    now_s,
                    outcomes,
                    f"no container started {now_s - track.bound_at_s:.0f} s after binding",
                )
            if track.flying and not track.unproven:
                self._refresh_flight(track)
        self.known_until_s = max(self.known_until_s, now_s)
        return outcomes

    def in_flight(self) -> dict[tuple[str, str | None], int]:
        """(node, workload) -> pods placed there that have no outcome yet."""
        return dict(self._flying)

    def forget(self) -> None:
        """Drop every pod's history (a reset of the learned rewards)."""
        self._pods.clear()
        self._flying.clear()

    # ---- internals ------------------------------------------------------------------------

    def _observe(
        self, uid: str, pod: Mapping[str, Any], now_s: float, *, may_have_past: bool
    ) -> list[Outcome]:
        metadata = pod.get("metadata") or {}
        if self.namespaces is not None and (metadata.get("namespace") or "") not in self.namespaces:
            return []
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return []
        track = self._pods.get(uid)
        first_sight = track is None or track.node != node
        if first_sight:
            track = _PodTrack(
                node=node,
                workload=workload_of(pod),
                name=pod_name(pod),
                bound_at_s=_bound_at_s(pod, now_s),
            )
            if uid in self._pods:
                self._drop(uid)
            self._pods[uid] = track
            while len(self._pods) > self.max_pods:
                self._drop(next(iter(self._pods)))
                self.forgotten_pods += 1
        else:
            self._pods.move_to_end(uid)
        assert track is not None
        # What happened before `since_s` is counted already (only a first sight has a past).
        since_s = self.known_until_s if (first_sight and may_have_past) else -math.inf
        outcomes: list[Outcome] = []
        self._update(track, pod, now_s, since_s, first_sight, outcomes)
        if uid in self._pods:
            self._refresh_flight(track)
        return outcomes

    def _refresh_flight(self, track: _PodTrack) -> None:
        """Keep the in-flight counts in step with the track."""
        flying = track.unproven
        if flying == track.flying:
            return
        track.flying = flying
        count = self._flying.get(track.key, 0) + (1 if flying else -1)
        if count > 0:
            self._flying[track.key] = count
        else:
            self._flying.pop(track.key, None)

    def _drop(self, uid: str) -> None:
        track = self._pods.pop(uid, None)
        if track is not None and track.flying:
            track.outcomes += 1  # no longer unproven: it is gone
            self._refresh_flight(track)

    def _update(
        self,
        track: _PodTrack,
        pod: Mapping[str, Any],
        now_s: float,
        since_s: float,
        first_sight: bool,
        outcomes: list[Outcome],
    ) -> None:
        status = pod.get("status") or {}
        containers = list(status.get("containerStatuses") or [])
        statuses = containers + list(status.get("initContainerStatuses") or [])
        if first_sight and since_s > -math.inf:
            # A pod already bound when we first hear of it: its start grace ran from binding,
            # and if that ran out before `since_s` it was judged already.
            track.never_started_counted = track.bound_at_s + self.settings.start_grace_s < since_s
        if track.terminal:
            return
        phase = status.get("phase")
        terminal = phase in ("Failed", "Succeeded")
        if not terminal:  # healthy time first: it ran before whatever this update reports
            self._readiness(track, status, containers, now_s, since_s, outcomes)
        restarted = self._restarts(track, statuses, now_s, since_s, first_sight, outcomes)
        for container in statuses:
            state = container.get("state") or {}
            if state.get("running") or state.get("terminated") or container.get("restartCount"):
                track.started = True
            reason = (state.get("waiting") or {}).get("reason")
            if reason in EXCUSED_WAITING_REASONS and track.excused is None:
                track.excused = reason
                self._ignore(reason)
            elif (
                reason == "CrashLoopBackOff"
                and first_sight
                and container.get("name") not in restarted
            ):
                self._charge(track, OutcomeKind.CRASH_LOOP, now_s, outcomes, "crash loop")
        if terminal:
            self._credit_healthy(track, now_s, outcomes)
            track.terminal = True
            self._finished(track, pod, phase, now_s, since_s, outcomes)

    def _restarts(
        self,
        track: _PodTrack,
        statuses: list[Mapping[str, Any]],
        now_s: float,
        since_s: float,
        first_sight: bool,
        outcomes: list[Outcome],
    ) -> set[str]:
        """Charge new restarts; the names of the containers that had some."""
        restarted: set[str] = set()
        for container in statuses:
            name = container.get("name") or ""
            count = container.get("restartCount") or 0
            if not isinstance(count, int) or count < 0:
                continue
            previous = track.restarts.get(name)
            track.restarts[name] = count
            terminated = (container.get("lastState") or {}).get("terminated") or {}
            if previous is None and first_sight and since_s > -math.inf:
                # Restarts before we heard of the pod: only the last one has a time; it counts
                # when that time is news to us.
                finished_s = timestamp_s(terminated.get("finishedAt"))
                new = 1 if count > 0 and finished_s is not None and finished_s >= since_s else 0
            else:
                new = count - (previous or 0)
            if new <= 0:
                continue
            restarted.add(name)
            reason = terminated.get("reason") or "unknown"
            if reason == "Completed" or terminated.get("exitCode") == 0:
                self._ignore("restart_after_exit_0", new)
                continue
            kind = OutcomeKind.OOM_KILLED if reason == "OOMKilled" else OutcomeKind.RESTART
            detail = f"container {name} restarted ({reason}, restart {count})"
            for _ in range(new):
                self._charge(track, kind, now_s, outcomes, detail)
        return restarted

    def _finished(
        self,
        track: _PodTrack,
        pod: Mapping[str, Any],
        phase: str,
        now_s: float,
        since_s: float,
        outcomes: list[Outcome],
    ) -> None:
        status = pod.get("status") or {}
        if since_s > -math.inf:
            finished_s = _finished_at_s(status)
            if finished_s is None or finished_s < since_s:
                return  # ended before what we know: counted already (or undatable)
        if phase == "Succeeded":
            self._charge(track, OutcomeKind.SUCCEEDED, now_s, outcomes, "completed")
            return
        reason = status.get("reason") or ""
        disruption = _condition(status, "DisruptionTarget")
        disruption_reason = (disruption or {}).get("reason") or ""
        if reason in EXCUSED_FAILED_REASONS or (
            disruption is not None
            and disruption.get("status") == "True"
            and disruption_reason in EXCUSED_DISRUPTIONS
        ):
            self._ignore(f"failed_{(disruption_reason or reason).lower()}")
            return
        terminated = [
            (c.get("state") or {}).get("terminated") or {}
            for c in status.get("containerStatuses") or []
        ]
        if any(t.get("reason") == "OOMKilled" for t in terminated):
            self._charge(track, OutcomeKind.OOM_KILLED, now_s, outcomes, "OOMKilled, pod Failed")
        elif reason == "Evicted":
            message = status.get("message") or "evicted"
            self._charge(track, OutcomeKind.EVICTED, now_s, outcomes, message)
        else:
            self._charge(track, OutcomeKind.FAILED, now_s, outcomes, reason or "pod Failed")

    def _readiness(
        self,
        track: _PodTrack,
        status: Mapping[str, Any],
        containers: list[Mapping[str, Any]],
        now_s: float,
        since_s: float,
        outcomes: list[Outcome],
    ) -> None:
        ready = _condition(status, "Ready")
        ready_changed_s = _clamped((ready or {}).get("lastTransitionTime"), track, now_s)
        all_running = bool(containers) and all(
            (c.get("state") or {}).get("running") for c in containers
        )
        if status.get("phase") == "Running" and ready and ready.get("status") == "True":
            track.unready_since_s = None
            track.unready_counted = False
            if track.ready_since_s is not None and ready_changed_s > track.ready_since_s:
                # Ready again since a later time: it was not ready in between (a restart seen
                # only as a count). Healthy time counts up to that change, then anew.
                self._credit_healthy(track, ready_changed_s, outcomes)
                track.ready_since_s = None
            if track.ready_since_s is None:
                track.ready_since_s = ready_changed_s
                track.credited_until_s = max(
                    ready_changed_s, since_s, track.credited_until_s or -math.inf
                )
            self._credit_healthy(track, now_s, outcomes)
            return
        # Not ready (any more): healthy time up to the change counts, then stops.
        if track.ready_since_s is not None:
            self._credit_healthy(track, max(ready_changed_s, track.ready_since_s), outcomes)
            track.ready_since_s = track.credited_until_s = None
        if status.get("phase") == "Running" and all_running and ready is not None:
            if track.unready_since_s is None:
                track.unready_since_s = ready_changed_s
                # A grace that ran out before what we know was judged already.
                track.unready_counted = ready_changed_s + self.settings.readiness_grace_s < since_s
        else:
            # Containers not running (waiting, crash looping): the restarts tell that story.
            track.unready_since_s = None
            track.unready_counted = False

    def _credit_healthy(self, track: _PodTrack, until_s: float, outcomes: list[Outcome]) -> None:
        if track.ready_since_s is None or track.credited_until_s is None:
            return
        interval_s = self.settings.healthy_interval_s
        intervals = math.floor((until_s - track.credited_until_s) / interval_s)
        for _ in range(max(0, intervals)):
            track.credited_until_s += interval_s
            self._charge(
                track, OutcomeKind.HEALTHY, track.credited_until_s, outcomes, "ready and running"
            )

    def _charge(
        self,
        track: _PodTrack,
        kind: OutcomeKind,
        at_s: float,
        outcomes: list[Outcome],
        detail: str,
    ) -> None:
        track.outcomes += 1
        outcomes.append(Outcome(track.node, track.workload, kind, at_s, track.name, detail))

    def _ignore(self, reason: str, count: int = 1) -> None:
        self.ignored[reason] = self.ignored.get(reason, 0) + count


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def _bound_at_s(pod: Mapping[str, Any], now_s: float) -> float:
    scheduled = _condition(pod.get("status") or {}, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "True":
        at_s = timestamp_s(scheduled.get("lastTransitionTime"))
        if at_s is not None:
            return min(at_s, now_s)
    return now_s


def _clamped(text: object, track: _PodTrack, now_s: float) -> float:
    """A transition time from the pod, within [binding, now]; now when absent."""
    at_s = timestamp_s(text)
    if at_s is None:
        return now_s
    return min(max(at_s, track.bound_at_s), now_s)


def _finished_at_s(status: Mapping[str, Any]) -> float | None:
    """When a terminal pod ended: its containers' last finishedAt, else its Ready transition."""
    times = [
        timestamp_s(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for c in status.get("containerStatuses") or []
    ]
    known = [t for t in times if t is not None]
    if known:
        return max(known)
    ready = _condition(status, "Ready")
    return timestamp_s((ready or {}).get("lastTransitionTime"))
