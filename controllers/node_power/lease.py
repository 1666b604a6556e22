"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Two controller replicas run for availability; only the one holding the Lease may act. Every
`retry_period_s` each candidate reads the Lease and then:

- creates it, holding it, when it does not exist (a racing create loses with 409);
- leaves it alone while another holder's record is fresh: a record counts as expired only
  `lease_duration_s` after this candidate *saw it change*, on its own monotonic clock (never by
  comparing the holder's wall-clock `renewTime` with ours, so clock skew cannot elect two);
- otherwise writes itself in as holder (renewing, or taking over an expired or released
  record) with a replace that carries the resourceVersion it read: when another candidate
  wrote in between, the API server answers 409 Conflict and nothing changes.

The holder counts as leader only until `renew_deadline_s` after the start of its last
successful renewal. That is shorter than the `lease_duration_s` any other candidate waits
after seeing that renewal, so the old leader has stopped acting before anyone else may take
over, even when its renewals fail silently (API server unreachable, process stalled).
When the holder cannot renew within its renew deadline it stops acting and logs "stopped
leading" once; it leads again only after it has re-acquired the Lease.

Failures are told apart as client-go's leader election and cluster-autoscaler do: the API
server unreachable, timing out, answering 5xx or 429 (`kube.api_unavailable`) is expected and
passing, logged as one line per attempt (what failed, the server's address, when the next try
is) with no traceback; while not leading the tries back off exponentially from the retry period
to the lease duration, while leading they stay at the retry period (the renewal must land
within the deadline). Any other API answer (403, 409) is one line per distinct message;
anything else is a bug, logged with its traceback once per distinct error.

`release()` ends the candidate (on a clean shutdown, client-go's ReleaseOnCancel): it waits for
an attempt in flight, never tries again, and clears the holder (leaseDurationSeconds 1) so
that another replica takes over at once instead of waiting out the lease.

Not `kubernetes.leaderelection` from the official client: it compares wall-clock times across
machines and its renew loop does not bound leadership by a deadline. Lease times are written
as metav1.MicroTime (six fractional digits; see `micro_time`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from controllers.node_power.kube import api_unavailable

log = logging.getLogger(__package__)

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
# `last_error` of a failure that `api_unavailable` classed as expected starts with this.
UNAVAILABLE = "API server unavailable:"


@dataclass(frozen=True)
class LeaseSettings:
    """kube-scheduler's --leader-elect-* flags and defaults."""

    namespace: str
    name: str
    identity: str
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    request_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("the leader election identity must not be empty")
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period_s:g} s, {self.renew_deadline_s:g} s, "
                f"{self.lease_duration_s:g} s"
            )


def micro_time(wall_s: float) -> str:
    """A metav1.MicroTime string (UTC, six fractional digits) for Unix seconds.

    The official client turns body times into datetimes and writes them back with
    `isoformat()`, which drops the fraction when it is zero; the API server's MicroTime parser
    then refuses the request. A time never falls on a whole second here: at most 1 us later.
    """
    stamp = datetime.fromtimestamp(wall_s, UTC)
    if stamp.microsecond == 0:
        stamp = stamp.replace(microsecond=1)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    """The spec fields that say who leads; what a candidate compares to see a change."""

    holder: str
    renew_time: str
    lease_duration_s: float
    acquire_time: str
    transitions: int

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            renew_time=spec.get("renewTime") or "",
            lease_duration_s=float(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime") or "",
            transitions=int(spec.get("leaseTransitions") or 0),
        )


class LeaderElector:
    """One candidate: `try_acquire_or_renew()` every retry period, `is_leader()` before acting."""

    def __init__(
        self,
        coordination: client.CoordinationV1Api,
        settings: LeaseSettings,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.api = coordination
        self.settings = settings
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._on_change = on_change
        self._observed: LeaseRecord | None = None
        self._observed_at_s = 0.0  # our monotonic clock when the record last changed
        self._leader_until_s: float | None = None
        self._was_leader = False
        self.last_error: str | None = None
        self.failures = 0  # consecutive failed attempts
        self.next_retry_s = settings.retry_period_s  # wait before the next attempt
        self._unexpected_seen: set[str] = set()
        self._note_lock = threading.Lock()
        # Held through each attempt and the release: a release waits for the attempt in
        # flight, and no attempt starts after it.
        self._attempt_lock = threading.Lock()
        self._released = False

    # ---- the answer the controller asks before every write ----------------------------------

    def is_leader(self) -> bool:
        until = self._leader_until_s
        leader = until is not None and self._monotonic() < until
        self._note(leader)
        return leader

    @property
    def holder(self) -> str:
        """Who holds the Lease as last seen ("" when nobody or not read yet)."""
        return self._observed.holder if self._observed is not None else ""

    # ---- one attempt --------------------------------------------------------------------------

    @property
    def server(self) -> str:
        """The API server's address, for the logs."""
        api_client = getattr(self.api, "api_client", None)
        return str(getattr(getattr(api_client, "configuration", None), "host", "") or "?")

    @property
    def lease_name(self) -> str:
        return f"{self.settings.namespace}/{self.settings.name}"

    def try_acquire_or_renew(self) -> bool:
        """Read the Lease and take or renew it when allowed; True when we hold it now.

        Raises only for a bug; API failures are logged and counted (`failures`, `last_error`,
        `next_retry_s`). After `release()` it does nothing and answers False.
        """
        with self._attempt_lock:
            if self._released:
                return False
            return self._attempt()

    def _attempt(self) -> bool:
        started_s = self._monotonic()
        try:
            lease = self._read()
        except ApiException as error:
            if error.status != HTTP_NOT_FOUND:
                return self._failed("reading", error)
            return self._create(started_s)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            return self._failed("reading", error)

        record = LeaseRecord.from_lease(lease)
        if record != self._observed:
            self._observed, self._observed_at_s = record, started_s
        me = self.settings.identity
        if record.holder and record.holder != me:
            expires_s = self._observed_at_s + (record.lease_duration_s or 0.0)
            if started_s < expires_s:
                self._leader_until_s = None
                self._answered()
                return self.is_leader()
        now = micro_time(self._wall_clock())
        taking_over = record.holder != me
        spec = dict(lease.get("spec") or {})
        spec.update(
            holderIdentity=me,
            leaseDurationSeconds=round(self.settings.lease_duration_s),
            renewTime=now,
        )
        if taking_over:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = record.transitions + 1
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": lease["metadata"],  # carries the resourceVersion we read
            "spec": spec,
        }
        try:
            written = self._replace(body)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            return self._failed("writing", error)
        return self._succeeded(written, started_s, "acquired" if taking_over else None)

    def _create(self, started_s: float) -> bool:
        now = micro_time(self._wall_clock())
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
            "spec": {
                "holderIdentity": self.settings.identity,
                "leaseDurationSeconds": round(self.settings.lease_duration_s),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            response = self.api.create_namespaced_lease(
                self.settings.namespace,
                body,
                _preload_content=False,
                _request_timeout=self.settings.request_timeout_s,
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            # 409 AlreadyExists: another candidate created it first
            return self._failed("creating", error)
        return self._succeeded(json.loads(response.data), started_s, "created")

    def _succeeded(self, lease: Mapping[str, Any], started_s: float, how: str | None) -> bool:
        self._observed, self._observed_at_s = LeaseRecord.from_lease(lease), started_s
        # Counted from before the read: anyone who saw this renewal saw it after that.
        self._leader_until_s = started_s + self.settings.renew_deadline_s
        self._answered()
        if how is not None:
            log.info(
                "leader election: %s Lease %s/%s as %s",
                how,
                self.settings.namespace,
                self.settings.name,
                self.settings.identity,
            )
        return self.is_leader()

    def _answered(self) -> None:
        """The API server answered as expected: no failure streak, the plain retry period."""
        if self.failures and (self.last_error or "").startswith(UNAVAILABLE):
            log.info("leader election: the API server at %s answers again", self.server)
        self.last_error = None
        self.failures = 0
        self.next_retry_s = self.settings.retry_period_s

    def _failed(self, doing: str, error: BaseException) -> bool:
        """Log a failed API call (see the module docstring for which way), plan the next try."""
        self.failures += 1
        unavailable = api_unavailable(error)
        if unavailable is not None:
            why = f"{UNAVAILABLE} {doing} Lease {self.lease_name}: {unavailable}"
        elif isinstance(error, ApiException):
            what = "Conflict" if error.status == HTTP_CONFLICT else f"HTTP {error.status}"
            why = f"{doing} Lease {self.lease_name}: {what} {error.reason}"
        else:
            why = f"{doing} Lease {self.lease_name}: {type(error).__name__}: {error}"
        repeated, self.last_error = why == self.last_error, why
        # Leadership is not dropped here: it lapses by itself at the renew deadline (and this
        # says so, once, with `last_error` as the cause).
        leading = self.is_leader()
        if unavailable is None:
            self.next_retry_s = self.settings.retry_period_s
            if not repeated:
                log.warning("leader election (%s): %s", self.settings.identity, why)
            return leading
        # Leading, the renewal must land before the deadline: keep the retry period. Not
        # leading, back off: trying less often loses nothing but log lines.
        backoff = 1 if leading else 2 ** min(self.failures - 1, 16)
        self.next_retry_s = min(
            self.settings.retry_period_s * backoff,
            max(self.settings.lease_duration_s, self.settings.retry_period_s),
        )
        log.warning(
            "leader election (%s): cannot reach the API server at %s (%s Lease %s: %s); "
            "next retry in %g s",
            self.settings.identity,
            self.server,
            doing,
            self.lease_name,
            unavailable,
            self.next_retry_s,
        )
        return leading

    def _unexpected(self, error: Exception) -> None:
        """A bug in an attempt: its traceback once per distinct error, then one line."""
        self.failures += 1
        self.next_retry_s = self.settings.retry_period_s
        key = f"{type(error).__name__}: {error}"
        self.last_error = f"unexpected error: {key}"
        if key not in self._unexpected_seen:
            self._unexpected_seen.add(key)
            log.error("leader election: unexpected error", exc_info=error)
        else:
            log.warning(
                "leader election: unexpected error again (traceback above): %s; next retry in %g s",
                key,
                self.next_retry_s,
            )
        self.is_leader()

    def _note(self, leader: bool, *, shutting_down: bool = False) -> None:
        with self._note_lock:
            if leader == self._was_leader:
                return
            self._was_leader = leader
            if leader:
                log.info("leader election: %s started leading", self.settings.identity)
            elif not shutting_down:
                log.warning(
                    "leader election: %s stopped leading: no renewal of Lease %s within the "
                    "%g s renew deadline%s; acting stops until it is re-acquired",
                    self.settings.identity,
                    self.lease_name,
                    self.settings.renew_deadline_s,
                    f" (last error: {self.last_error})" if self.last_error else "",
                )
        if self._on_change is not None:
            self._on_change(leader)

    # ---- API calls ----------------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        response = self.api.read_namespaced_lease(
            self.settings.name,
            self.settings.namespace,
            _preload_content=False,
            _request_timeout=self.settings.request_timeout_s,
        )
        return json.loads(response.data)

    def _replace(self, body: Mapping[str, Any]) -> dict[str, Any]:
        response = self.api.replace_namespaced_lease(
            self.settings.name,
            self.settings.namespace,
            body,
            _preload_content=False,
            _request_timeout=self.settings.request_timeout_s,
        )
        return json.loads(response.data)

    # ---- running ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Try until `stop` is set (client-go's acquire and renew loops): every retry period,
        backing off while the API server is unreachable and we do not lead."""
        while not stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception as error:  # never let the elector die silently: leadership lapses
                self._unexpected(error)
            stop.wait(self.next_retry_s)

    def release(self) -> bool:
        """End this candidate: no attempt after this one; clear the holder if it is us
        (client-go's ReleaseOnCancel). True when the Lease was released.

        Waits for an attempt in flight (bounded by the request timeout), so the election
        thread cannot take the Lease back after it. Logs only a failure: the caller says it
        stopped.
        """
        with self._attempt_lock:
            was_released, self._released = self._released, True
            self._leader_until_s = None
            self._note(False, shutting_down=True)
            if was_released or self.holder != self.settings.identity:
                return False  # the last record seen names someone else: nothing of ours
            return self._clear_holder()

    def _clear_holder(self) -> bool:
        try:
            lease = self._read()
            if LeaseRecord.from_lease(lease).holder != self.settings.identity:
                return False
            spec = dict(lease.get("spec") or {})
            spec.update(
                holderIdentity=None,
                leaseDurationSeconds=1,
                renewTime=micro_time(self._wall_clock()),
            )
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": lease["metadata"],
                "spec": spec,
            }
            self._replace(body)
        except ApiException as error:
            why = "not found" if error.status == HTTP_NOT_FOUND else f"HTTP {error.status}"
            log.warning("leader election: cannot release Lease %s: %s", self.lease_name, why)
            return False
        except (urllib3.exceptions.HTTPError, OSError) as error:
            log.warning(
                "leader election: cannot release Lease %s: the API server at %s: %s; the other "
                "replica takes over when the lease expires",
                self.lease_name,
                self.server,
                api_unavailable(error),
            )
            return False
        return True
