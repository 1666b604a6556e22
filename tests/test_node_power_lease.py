"""Leader election on a Lease: two controller replicas never both lead.

Candidates talk to the fake API server (real HTTP, the official client, resourceVersion
conflicts as the real server answers them) and read time from clocks the test moves, so
"never both" is checked at every instant of a schedule, not by sleeping and hoping.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from controllers.node_power.lease import LeaderElector, LeaseSettings, micro_time
from tests.support.fake_kube import FakeKube

DURATION_S, DEADLINE_S, RETRY_S = 15.0, 10.0, 2.0


class Clock:
    """A monotonic clock the test moves; each candidate may see it from its own origin."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def advance(self, seconds: float) -> None:
        self.now_s += seconds

    def view(self, offset_s: float = 0.0):
        return lambda: self.now_s + offset_s


@pytest.fixture(scope="module")
def kube() -> Iterator[FakeKube]:
    with FakeKube() as server:
        yield server


def candidate(
    kube: FakeKube,
    identity: str,
    clock: Clock,
    lease: str,
    *,
    offset_s: float = 0.0,
    skew_s: float = 0.0,
    api: Any = None,
) -> LeaderElector:
    lease_settings = LeaseSettings(
        namespace="kube-system",
        name=lease,
        identity=identity,
        lease_duration_s=DURATION_S,
        renew_deadline_s=DEADLINE_S,
        retry_period_s=RETRY_S,
    )
    return LeaderElector(
        api or client.CoordinationV1Api(kube.api_client()),
        lease_settings,
        monotonic=clock.view(offset_s),
        wall_clock=lambda: 1.8e9 + clock.now_s + skew_s,
    )


def lease_spec(kube: FakeKube, name: str) -> dict[str, Any]:
    return kube.get("leases", name, "kube-system")["spec"]


def test_one_candidate_leads_and_the_other_takes_over_only_after_the_lease_expires(
    kube: FakeKube,
) -> None:
    clock, name = Clock(), f"lock-{uuid.uuid4().hex[:6]}"
    a, b = candidate(kube, "a", clock, name), candidate(kube, "b", clock, name)
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and b.holder == "a"
    for _ in range(5):  # a renews every retry period; b keeps waiting
        clock.advance(RETRY_S)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert lease_spec(kube, name)["holderIdentity"] == "a"

    # a stalls (stops renewing): it stops leading at its renew deadline...
    clock.advance(DEADLINE_S - 0.1)
    assert a.is_leader()
    clock.advance(0.2)
    assert not a.is_leader()
    # ...and b, which saw a's last renewal at the same moment, waits the whole lease duration.
    assert not b.try_acquire_or_renew()
    clock.advance(DURATION_S - DEADLINE_S - 0.2)
    assert not b.try_acquire_or_renew()
    clock.advance(0.2)
    assert b.try_acquire_or_renew() and b.is_leader()
    assert not a.try_acquire_or_renew() and not a.is_leader()
    spec = lease_spec(kube, name)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


def test_a_released_lease_is_taken_over_at_once(kube: FakeKube) -> None:
    clock, name = Clock(), f"lock-{uuid.uuid4().hex[:6]}"
    a, b = candidate(kube, "a", clock, name), candidate(kube, "b", clock, name)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release() and not a.is_leader()
    assert "holderIdentity" not in lease_spec(kube, name)
    assert b.try_acquire_or_renew() and b.is_leader()
    assert not a.try_acquire_or_renew() and not a.is_leader()
    assert not a.release()  # not the holder: nothing written
    assert lease_spec(kube, name)["holderIdentity"] == "b"


class RacingApi:
    """CoordinationV1Api for one candidate whose read lets another candidate write first."""

    def __init__(self, inner: client.CoordinationV1Api) -> None:
        self.inner = inner
        self.before_write: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def replace_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        if self.before_write is not None:
            run, self.before_write = self.before_write, None
            run()
        return self.inner.replace_namespaced_lease(*args, **kwargs)


def test_two_candidates_racing_for_an_expired_lease_cannot_both_win(kube: FakeKube) -> None:
    clock, name = Clock(), f"lock-{uuid.uuid4().hex[:6]}"
    old = candidate(kube, "old", clock, name)
    assert old.try_acquire_or_renew()
    racing = RacingApi(client.CoordinationV1Api(kube.api_client()))
    a = candidate(kube, "a", clock, name)
    b = candidate(kube, "b", clock, name, api=racing)
    assert not a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock.advance(DURATION_S + 1)  # the old holder is gone; both see the record expired
    won_by_a: list[bool] = []
    # b reads the expired record; a reads it too and writes first; b's write carries a stale
    # resourceVersion.
    racing.before_write = lambda: won_by_a.append(a.try_acquire_or_renew())
    assert not b.try_acquire_or_renew()
    assert won_by_a == [True]
    assert a.is_leader() and not b.is_leader()
    assert "Conflict" in (b.last_error or "")
    assert lease_spec(kube, name)["holderIdentity"] == "a"


def test_lease_times_are_microtimes_the_api_server_accepts(kube: FakeKube) -> None:
    assert micro_time(1.8e9) == "2027-01-15T08:00:00.000001Z"  # never a whole second
    assert micro_time(1.8e9 + 0.25) == "2027-01-15T08:00:00.250000Z"
    clock, name = Clock(), f"lock-{uuid.uuid4().hex[:6]}"
    clock.now_s = 0.0  # wall clock lands on a whole second
    assert candidate(kube, "a", clock, name).try_acquire_or_renew()
    assert "T08:00:00.000001" in lease_spec(kube, name)["renewTime"]


def test_an_unreachable_api_server_ends_leadership_at_the_renew_deadline(kube: FakeKube) -> None:
    clock, name = Clock(), f"lock-{uuid.uuid4().hex[:6]}"
    a = candidate(kube, "a", clock, name)
    assert a.try_acquire_or_renew()
    kube.failing = True
    try:
        for _ in range(4):
            clock.advance(RETRY_S)
            assert a.try_acquire_or_renew()  # still within the deadline of the last renewal
        clock.advance(RETRY_S + 0.1)
        assert not a.try_acquire_or_renew()
        assert "HTTP 500" in (a.last_error or "")
    finally:
        kube.failing = False
    assert a.try_acquire_or_renew()  # its own record: renewed without waiting


def test_settings_must_order_retry_deadline_and_duration() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaseSettings("ns", "lock", "a", lease_duration_s=10, renew_deadline_s=10)
    with pytest.raises(ValueError, match="identity"):
        LeaseSettings("ns", "lock", "")


# Steps of a schedule: (who, what, seconds to move the clock first).
STEP = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["try", "try", "try", "race", "release"]),
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 2.0, 3.0, 5.0, 9.0]),
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(STEP, min_size=5, max_size=30),
    offsets=st.lists(st.floats(-1e6, 1e6), min_size=3, max_size=3),
    skews=st.lists(st.floats(-600, 600), min_size=3, max_size=3),
)
def test_never_two_leaders_whatever_the_schedule_and_clock_skew(
    kube: FakeKube, steps: list[tuple[str, str, float]], offsets: list[float], skews: list[float]
) -> None:
    clock, name = Clock(), f"lock-{uuid.uuid4().hex[:8]}"
    apis = {who: RacingApi(client.CoordinationV1Api(kube.api_client())) for who in "abc"}
    electors = {
        who: candidate(kube, who, clock, name, offset_s=off, skew_s=skew, api=apis[who])
        for who, off, skew in zip("abc", offsets, skews, strict=True)
    }

    def check() -> None:
        leaders = [who for who, e in electors.items() if e.is_leader()]
        assert len(leaders) <= 1, f"both lead at t={clock.now_s}: {leaders}"
        if leaders:  # the one who thinks it leads is the one the Lease names
            lease = kube.get("leases", name, "kube-system")
            assert lease is not None and lease["spec"].get("holderIdentity") == leaders[0]

    for who, what, advance_s in steps:
        clock.advance(advance_s)
        check()
        if what == "try":
            electors[who].try_acquire_or_renew()
        elif what == "race":  # the next candidate reads and writes between our read and write
            other = electors["abc"[("abc".index(who) + 1) % 3]]
            apis[who].before_write = lambda other=other: (
                other.try_acquire_or_renew(),
                check(),
            )
            electors[who].try_acquire_or_renew()
            apis[who].before_write = None
        else:
            electors[who].release()
        check()
