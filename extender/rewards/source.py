"""The reward source: pod events in, a reward snapshot out, evidence saved to a ConfigMap.

A background source of the `Reward` plugin (`LiveSource`). The Kubernetes pod watch calls
`pods_listed` and `pod_event` (`ClusterWatcher.add_pod_listener`) on its own thread; each
call turns pod states into outcomes (`PodOutcomes`) and evidence (`RewardModel`) under one
lock, in microseconds. The source's own thread wakes every `publish_interval_s` to

1. judge what time alone decides (healthy intervals, readiness and start graces: `sweep`,
   every `SWEEP_EVERY_S`), and apply per-node resets: a node annotated
   `power-aware-scheduler/reward-reset-at: <RFC 3339>` (read from the cluster state's nodes
   when they change) has what it taught forgotten once, and outcomes dated before that time
   are ignored from then on (`RewardModel.reset_node`; the resets are saved with the evidence,
   so a restart neither brings the old evidence back nor forgets the new);
2. publish an immutable `RewardSnapshot` as the state signal `rewards` when anything changed
   (and at least every `REPUBLISH_S`) - the request path reads only that, and decays its
   counts to the request's time itself;
3. every `save_interval_s`, save the evidence to its ConfigMap (`store`), off the lock.

At start the saved evidence is loaded (and merged with whatever the watch delivered first:
events that arrive before the load are held and replayed after it, so that the outcomes since
the last save are judged against the save time). A save that finds its ConfigMap deleted
forgets the evidence (the documented reset). If the ConfigMap cannot be read at start, the
source learns from scratch and saves nothing until a later read succeeds and merges, so a
passing API failure never overwrites good evidence with an empty model.

The simulator uses the same class without a thread or a store: it calls `pod_event` with Pod
JSON as the watch would and `run_once` as time passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from extender.rewards.model import RewardModel, RewardSnapshot
from extender.rewards.outcomes import (
    DEFAULT_MAX_TRACKED_PODS,
    Outcome,
    OutcomeKind,
    OutcomeSettings,
    PodOutcomes,
    timestamp_s,
)
from extender.rewards.store import (
    MAX_PAYLOAD_BYTES,
    ConfigMapStore,
    SaveResult,
    StoreError,
    encode_document,
)
from extender.state import ClusterState
from livedata.labels import REWARD_RESET_AT_ANNOTATION

log = logging.getLogger(__name__)

REWARD_SIGNAL = "rewards"
REPUBLISH_S = 30.0  # in-flight pods and pruning: republish at least this often
SWEEP_EVERY_S = 10.0  # time-based outcomes (healthy intervals, graces) are judged this often
MAX_HELD_EVENTS = 100_000  # pod events held while the saved evidence loads
PREFIX = "power_aware_extender_reward"

Clock = Callable[[], float]


@dataclass(frozen=True)
class RewardSettings:
    """What the source learns from and how long it remembers (the plugin's arguments)."""

    half_life_s: float = 21_600.0
    outcomes: OutcomeSettings = field(default_factory=OutcomeSettings)
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    max_nodes: int = 10_000
    max_workloads: int = 5_000
    max_pairs: int = 100_000
    max_tracked_pods: int = DEFAULT_MAX_TRACKED_PODS
    publish_interval_s: float = 1.0
    save_interval_s: float = 60.0


@dataclass
class _Persistence:
    store: ConfigMapStore
    loaded: bool = False
    last_saved_at_s: float | None = None
    last_error: str | None = None
    saves: int = 0
    resets: int = 0
    failures: int = 0


class RewardSource:
    """Learns rewards from pod events and publishes them; see the module docstring."""

    def __init__(
        self,
        settings: RewardSettings,
        state: ClusterState,
        *,
        clock: Clock = time.time,
        store: ConfigMapStore | None = None,
        registry: Any = None,
        learning_from: str = "the pod watch",
    ) -> None:
        self.settings = settings
        self._state = state
        self._clock = clock
        self._lock = threading.Lock()
        self.model = RewardModel(
            half_life_s=settings.half_life_s,
            max_nodes=settings.max_nodes,
            max_workloads=settings.max_workloads,
            max_pairs=settings.max_pairs,
        )
        self.outcomes = PodOutcomes(
            settings.outcomes,
            known_until_s=clock(),
            namespaces=settings.namespaces or None,
            max_pods=settings.max_tracked_pods,
        )
        self.learning_from = learning_from
        self._persistence = _Persistence(store) if store is not None else None
        # Until the saved evidence is loaded, pod events wait here (see the module docstring).
        self._held: deque[tuple[str, Any]] | None = deque() if store is not None else None
        self.held_events_dropped = 0
        self._dirty = True
        self._last_publish_s = -float("inf")
        self._last_sweep_s = -float("inf")
        self._last_save_s = clock()
        self.snapshot: RewardSnapshot | None = None
        self.outcome_counts: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nodes_seen_version: int | None = None  # the state's layout the resets were read at
        self._unreadable_resets: set[tuple[str, str]] = set()  # logged once per value
        self.node_resets_applied = 0
        if registry is not None:
            registry.register(_RewardCollector(self))

    # ---- the pod watch's listener interface -----------------------------------------------

    def pods_listed(self, pods: Sequence[Mapping[str, Any]]) -> None:
        """The watch listed every bound pod (start, or relist after a gap)."""
        with self._lock:
            if self._held is not None:
                self._hold(("LIST", list(pods)))
                return
            self._record(self.outcomes.listed(pods, self._clock()))

    def pod_event(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """One watch event of a bound pod (ADDED, MODIFIED, DELETED)."""
        with self._lock:
            if self._held is not None:
                self._hold((event_type, pod))
                return
            self._record(self.outcomes.event(event_type, pod, self._clock()))

    # ---- one round of background work -----------------------------------------------------

    def run_once(self, *, force_publish: bool = False) -> RewardSnapshot | None:
        """Sweep, publish when due, save when due; the snapshot published (None: none now)."""
        now_s = self._clock()
        published = None
        with self._lock:
            if self._held is None and now_s - self._last_sweep_s >= SWEEP_EVERY_S:
                self._last_sweep_s = now_s
                self._record(self.outcomes.sweep(now_s))
            if self._held is None:
                self._apply_node_resets()
            if force_publish or self._dirty or now_s - self._last_publish_s >= REPUBLISH_S:
                published = self._publish_locked(now_s)
        persistence = self._persistence
        if persistence is not None and now_s - self._last_save_s >= self.settings.save_interval_s:
            self._last_save_s = now_s
            self.save()
        return published

    def publish(self) -> RewardSnapshot:
        with self._lock:
            return self._publish_locked(self._clock())

    def load(self) -> bool:
        """Merge the saved evidence, then replay the held events; True when the read worked."""
        persistence = self._persistence
        if persistence is None:
            return True
        store = persistence.store
        try:
            loaded = store.load()
        except StoreError as exc:
            persistence.last_error = str(exc)
            persistence.failures += 1
            log.warning("rewards: cannot load saved evidence (%s); learning from scratch", exc)
            self._release_held()
            return False
        with self._lock:
            if loaded.document is not None:
                try:
                    self.model.merge_document(loaded.document, where=store.where)
                except ValueError as exc:
                    persistence.last_error = str(exc)
                    log.warning("rewards: ignoring unreadable saved evidence: %s", exc)
                else:
                    saved_at_s = float(loaded.document["saved_at_s"])
                    if self._held is not None:  # the first load: outcomes since the save count
                        self.outcomes.known_until_s = min(saved_at_s, self._clock())
                    log.info(
                        "rewards: loaded saved evidence",
                        extra={
                            "configmap": store.where,
                            "saved_at_s": saved_at_s,
                            "nodes": self.model.nodes,
                            "pairs": self.model.pairs,
                        },
                    )
            persistence.loaded = True
            self._dirty = True
        self._release_held()
        return True

    def save(self) -> SaveResult | None:
        """Save the evidence to the ConfigMap now (None: no store, or not loaded yet)."""
        persistence = self._persistence
        if persistence is None:
            return None
        if not persistence.loaded and not self.load():
            return None
        now_s = self._clock()
        try:
            payload, summary = self._encoded(now_s)
            result = persistence.store.save(payload, summary)
        except StoreError as exc:
            persistence.failures += 1
            if persistence.last_error != str(exc):
                log.warning("rewards: saving failed (%s); retrying next interval", exc)
            persistence.last_error = str(exc)
            return None
        persistence.last_error = None
        if result is SaveResult.RESET:
            with self._lock:
                self.model.forget()
                self._dirty = True
            persistence.store.forget_identity()
            persistence.resets += 1
            log.warning(
                "rewards: %s was deleted or replaced: learned rewards forgotten (reset)",
                persistence.store.where,
            )
        elif result is SaveResult.SAVED:
            persistence.saves += 1
            persistence.last_saved_at_s = now_s
        return result

    # ---- lifecycle (LiveSource) -----------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="reward-source", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None
        persistence = self._persistence
        if persistence is not None and persistence.loaded:
            self.save()  # a last save, so a restart loses as little as possible

    def _run(self) -> None:
        self.load()
        self.run_once(force_publish=True)
        while not self._stop.wait(self.settings.publish_interval_s):
            try:
                self.run_once()
            except Exception:  # the loop must outlive any one failure
                log.exception("reward source: unexpected error")

    # ---- what /status and /metrics read ---------------------------------------------------

    def now(self) -> float:
        return self._clock()

    def status(self) -> dict[str, Any]:
        now_s = self._clock()
        with self._lock:
            snapshot = self.snapshot
            status: dict[str, Any] = {
                "learning_from": self.learning_from,
                "namespaces": list(self.settings.namespaces) or "all",
                "half_life_s": self.settings.half_life_s,
                "nodes": self.model.nodes,
                "workloads": self.model.workloads,
                "pairs": self.model.pairs,
                "tracked_pods": self.outcomes.tracked_pods,
                "outcomes": dict(sorted(self.outcome_counts.items())),
                "ignored": dict(sorted(self.outcomes.ignored.items())),
                "evictions": vars(self.model.evictions).copy(),
                "node_resets_applied": self.node_resets_applied,
                "node_resets": dict(sorted(self.model.node_resets.items())),
                "snapshot_age_s": None if snapshot is None else now_s - snapshot.built_at_s,
            }
        persistence = self._persistence
        if persistence is None:
            status["persistence"] = "off"
        else:
            status["persistence"] = {
                "configmap": persistence.store.where,
                "loaded": persistence.loaded,
                "last_saved_at_s": persistence.last_saved_at_s,
                "saves": persistence.saves,
                "resets": persistence.resets,
                "failures": persistence.failures,
                "last_error": persistence.last_error,
            }
        return status

    # ---- internals ------------------------------------------------------------------------

    def _apply_node_resets(self) -> None:
        """Reset the nodes whose reset annotation is newer than the reset applied (under the
        lock; reads the nodes only when the state's node set or a node's info changed)."""
        version = self._state.layout_version()
        if version == self._nodes_seen_version:
            return
        self._nodes_seen_version = version
        for node in self._state.node_infos():
            raw = (node.annotations or {}).get(REWARD_RESET_AT_ANNOTATION)
            if raw is None:
                continue
            at_s = timestamp_s(raw)
            if at_s is None:
                if (node.name, raw) not in self._unreadable_resets:
                    self._unreadable_resets.add((node.name, raw))
                    log.warning(
                        "rewards: node %s: %s %r is not an RFC 3339 time; nothing reset",
                        node.name,
                        REWARD_RESET_AT_ANNOTATION,
                        raw,
                    )
                continue
            if self.model.reset_node(node.name, at_s):
                self.node_resets_applied += 1
                self._dirty = True
                log.info(
                    "rewards: node %s reset (%s=%s): what it taught is forgotten, and its "
                    "outcomes before that time are ignored",
                    node.name,
                    REWARD_RESET_AT_ANNOTATION,
                    raw,
                )

    def _record(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            self.model.record(outcome)
            kind = outcome.kind.value
            self.outcome_counts[kind] = self.outcome_counts.get(kind, 0) + 1
        # New pods change the in-flight counts too: publish after any event.
        self._dirty = True

    def _publish_locked(self, now_s: float) -> RewardSnapshot:
        snapshot = self.model.snapshot(now_s, self.outcomes.in_flight())
        self.snapshot = snapshot
        self._state.set_signal(REWARD_SIGNAL, snapshot)
        self._dirty = False
        self._last_publish_s = now_s
        return snapshot

    def _hold(self, item: tuple[str, Any]) -> None:
        assert self._held is not None
        if len(self._held) >= MAX_HELD_EVENTS:
            self._held.popleft()
            self.held_events_dropped += 1
        self._held.append(item)

    def _release_held(self) -> None:
        with self._lock:
            held, self._held = self._held, None
            now_s = self._clock()
            for kind, payload in held or ():
                if kind == "LIST":
                    self._record(self.outcomes.listed(payload, now_s))
                else:
                    self._record(self.outcomes.event(kind, payload, now_s))

    def _encoded(self, now_s: float) -> tuple[bytes, str]:
        """The document as bytes under the ConfigMap's limit (most recent pairs kept)."""
        with self._lock:
            max_pairs: int | None = None
            while True:
                document = self.model.to_document(now_s, max_pairs=max_pairs)
                payload = encode_document(document)
                if len(payload) <= MAX_PAYLOAD_BYTES or max_pairs == 0:
                    break
                max_pairs = (self.model.pairs if max_pairs is None else max_pairs) // 2
            kept = sum(len(v) for v in document["workloads"].values())
        if max_pairs is not None:
            log.warning(
                "rewards: only the %d most recent of %d pairs fit the ConfigMap",
                kept,
                self.model.pairs,
            )
        summary = (
            f"nodes={len(document['nodes'])} pairs={kept} saved_at_s={now_s:.0f} "
            f"half_life_s={self.settings.half_life_s:g}"
        )
        return payload, summary


class _RewardCollector:
    """Scrape-time metrics of the reward source (`power_aware_extender_reward_*`)."""

    def __init__(self, source: RewardSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from extender.rewards.model import posterior_mean

        source = self._source
        status = source.status()
        outcomes = CounterMetricFamily(
            f"{PREFIX}_outcomes",
            "Outcomes learned from the pod watch, by kind (healthy and succeeded count for the "
            "node, the others against it)",
            labels=["kind", "verdict"],
        )
        for kind in OutcomeKind:
            verdict = "good" if kind.good else "bad"
            outcomes.add_metric([kind.value, verdict], status["outcomes"].get(kind.value, 0))
        yield outcomes
        ignored = CounterMetricFamily(
            f"{PREFIX}_ignored_signals",
            "Pod signals not counted against the node (image pulls, preemption, ...), by reason",
            labels=["reason"],
        )
        for reason, count in status["ignored"].items():
            ignored.add_metric([reason], count)
        yield ignored
        for name, help_text in (
            ("nodes", "Nodes with reward evidence"),
            ("workloads", "Workloads with reward evidence"),
            ("pairs", "Node x workload pairs with reward evidence"),
            ("tracked_pods", "Pods the reward source follows"),
        ):
            yield GaugeMetricFamily(f"{PREFIX}_{name}", help_text, value=status[name])
        evictions = CounterMetricFamily(
            f"{PREFIX}_evictions",
            "Evidence dropped for the memory caps (least recent first) or faded away",
            labels=["what"],
        )
        for what, count in status["evictions"].items():
            evictions.add_metric([what], count)
        yield evictions
        yield CounterMetricFamily(
            f"{PREFIX}_node_resets",
            "Nodes whose evidence was forgotten for their reward-reset-at annotation",
            value=status["node_resets_applied"],
        )
        snapshot = source.snapshot
        if snapshot is not None:
            good, bad = snapshot.node_counts(source.now())
            mean = posterior_mean(good, bad)
            reward = GaugeMetricFamily(
                f"{PREFIX}_node",
                "Posterior mean chance that a placement on the node goes well (all workloads)",
                labels=["node"],
            )
            evidence = GaugeMetricFamily(
                f"{PREFIX}_node_evidence",
                "Decayed outcomes behind the node's reward (good + bad)",
                labels=["node"],
            )
            for node, row in snapshot.node_rows.items():
                reward.add_metric([node], float(mean[row]))
                evidence.add_metric([node], float(good[row] + bad[row]))
            yield reward
            yield evidence
        persistence = status["persistence"]
        if isinstance(persistence, dict):
            yield CounterMetricFamily(
                f"{PREFIX}_saves",
                "Saves of the evidence to its ConfigMap",
                value=persistence["saves"],
            )
            yield CounterMetricFamily(
                f"{PREFIX}_save_failures",
                "Failed loads or saves of the evidence",
                value=persistence["failures"],
            )
            yield CounterMetricFamily(
                f"{PREFIX}_resets",
                "Times the evidence was forgotten because its ConfigMap was deleted",
                value=persistence["resets"],
            )
            if persistence["last_saved_at_s"] is not None:
                yield GaugeMetricFamily(
                    f"{PREFIX}_last_save_timestamp_seconds",
                    "When the evidence was last saved (Unix time)",
                    value=persistence["last_saved_at_s"],
                )
