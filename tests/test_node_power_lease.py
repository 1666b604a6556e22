"""Leader election on a Lease: two controller replicas never both lead, and neither hangs on.

Candidates talk to the real API server (`control_plane`: real HTTP, the official client,
resourceVersion conflicts as kube-apiserver answers them), each test on Leases of its own
namespace, and read time from clocks the test moves, so "never both" is checked at every
instant of a schedule, not by sleeping and hoping. An unreachable API server is a `FaultProxy`
in front of the real one, cut.

The real controller process (`python -m controllers.node_power`) is run as users run it: against
a closed port (the API server unreachable from the start), and on the real control plane
(`control_plane`, as its own ServiceAccount) behind a TCP proxy the test cuts (the API server
gone mid-run), or beside a second replica that must take over at once when it is stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.rest import ApiException

from controllers.node_power.controller import NodePowerController
from controllers.node_power.lease import UNAVAILABLE, LeaderElector, LeaseSettings, micro_time
from envtest import ControlPlane
from envtest.ports import free_port
from tests.support.fault_proxy import FaultProxy, kubeconfig_through
from tests.support.power_cluster import (
    PowerCluster,
    controller_api_client,
    wait_until,
)
from tests.support.power_cluster import settings as controller_settings
from tests.support.processes import ControllerProcess, write_kubeconfig

DURATION_S, DEADLINE_S, RETRY_S = 15.0, 10.0, 2.0


class Clock:
    """A monotonic clock the test moves; each candidate may see it from its own origin."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def advance(self, seconds: float) -> None:
        self.now_s += seconds

    def view(self, offset_s: float = 0.0):
        return lambda: self.now_s + offset_s


class LeaseStore:
    def __init__(self, api: client.CoordinationV1Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace

    def spec(self, name: str) -> dict[str, Any]:
        """The Lease's spec as the API server sent it (its JSON, times as it stored them)."""
        answer = self.api.read_namespaced_lease(name, self.namespace, _preload_content=False)
        return json.loads(answer.data)["spec"]


@pytest.fixture
def leases(kube_api: client.ApiClient, namespace: str) -> LeaseStore:
    """The Leases of this test's own namespace on the real API server (admin)."""
    return LeaseStore(client.CoordinationV1Api(kube_api), namespace)


def candidate(
    leases: LeaseStore,
    identity: str,
    clock: Clock,
    lease: str,
    *,
    offset_s: float = 0.0,
    skew_s: float = 0.0,
    api: Any = None,
) -> LeaderElector:
    lease_settings = LeaseSettings(
        namespace=leases.namespace,
        name=lease,
        identity=identity,
        lease_duration_s=DURATION_S,
        renew_deadline_s=DEADLINE_S,
        retry_period_s=RETRY_S,
    )
    return LeaderElector(
        api or leases.api,
        lease_settings,
        monotonic=clock.view(offset_s),
        wall_clock=lambda: 1.8e9 + clock.now_s + skew_s,
    )


def test_one_candidate_leads_and_the_other_takes_over_only_after_the_lease_expires(
    leases: LeaseStore,
) -> None:
    clock, name = Clock(), "lock"
    a, b = candidate(leases, "a", clock, name), candidate(leases, "b", clock, name)
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and b.holder == "a"
    for _ in range(5):  # a renews every retry period; b keeps waiting
        clock.advance(RETRY_S)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert leases.spec(name)["holderIdentity"] == "a"

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
    spec = leases.spec(name)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


def test_a_released_lease_is_taken_over_at_once(leases: LeaseStore) -> None:
    clock, name = Clock(), "lock"
    a, b = candidate(leases, "a", clock, name), candidate(leases, "b", clock, name)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release() and not a.is_leader()
    assert "holderIdentity" not in leases.spec(name)
    assert b.try_acquire_or_renew() and b.is_leader()
    assert not a.try_acquire_or_renew() and not a.is_leader()
    assert not a.release()  # not the holder: nothing written
    assert leases.spec(name)["holderIdentity"] == "b"


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


def test_two_candidates_racing_for_an_expired_lease_cannot_both_win(leases: LeaseStore) -> None:
    clock, name = Clock(), "lock"
    old = candidate(leases, "old", clock, name)
    assert old.try_acquire_or_renew()
    racing = RacingApi(leases.api)
    a = candidate(leases, "a", clock, name)
    b = candidate(leases, "b", clock, name, api=racing)
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
    assert leases.spec(name)["holderIdentity"] == "a"


def test_lease_times_are_microtimes_the_api_server_accepts(leases: LeaseStore) -> None:
    assert micro_time(1.8e9) == "2027-01-15T08:00:00.000001Z"  # never a whole second
    assert micro_time(1.8e9 + 0.25) == "2027-01-15T08:00:00.250000Z"
    clock, name = Clock(), "lock"
    clock.now_s = 0.0  # wall clock lands on a whole second
    assert candidate(leases, "a", clock, name).try_acquire_or_renew()
    spec = leases.spec(name)
    assert spec["renewTime"] == spec["acquireTime"] == "2027-01-15T08:00:00.000001Z"


def test_an_unreachable_api_server_ends_leadership_at_the_renew_deadline(
    control_plane: ControlPlane, leases: LeaseStore, tmp_path: Path
) -> None:
    clock, name = Clock(), "lock"
    port = int(control_plane.server.rsplit(":", 1)[1])
    with FaultProxy("127.0.0.1", port) as proxy:
        through = control_plane.api_client(
            kubeconfig_through(control_plane.kubeconfig, proxy.port, tmp_path / "kubeconfig")
        )
        through.configuration.retries = 0
        a = candidate(leases, "a", clock, name, api=client.CoordinationV1Api(through))
        assert a.try_acquire_or_renew()
        proxy.cut()
        try:
            for _ in range(4):
                clock.advance(RETRY_S)
                assert a.try_acquire_or_renew()  # still within the deadline of the last renewal
            clock.advance(RETRY_S + 0.1)
            assert not a.try_acquire_or_renew()
            assert (a.last_error or "").startswith(UNAVAILABLE), a.last_error
        finally:
            proxy.resume()
        assert a.try_acquire_or_renew()  # its own record: renewed without waiting
    assert leases.spec(name)["holderIdentity"] == "a"


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
    leases: LeaseStore,
    steps: list[tuple[str, str, float]],
    offsets: list[float],
    skews: list[float],
) -> None:
    clock, name = Clock(), f"lock-{uuid.uuid4().hex[:8]}"  # one Lease per example
    apis = {who: RacingApi(leases.api) for who in "abc"}
    electors = {
        who: candidate(leases, who, clock, name, offset_s=off, skew_s=skew, api=apis[who])
        for who, off, skew in zip("abc", offsets, skews, strict=True)
    }

    def check() -> None:
        leaders = [who for who, e in electors.items() if e.is_leader()]
        assert len(leaders) <= 1, f"both lead at t={clock.now_s}: {leaders}"
        if leaders:  # the one who thinks it leads is the one the Lease names
            assert leases.spec(name).get("holderIdentity") == leaders[0]

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


# ---- the real controller process: API failures and stopping -------------------------------

NAMESPACE = "power-aware-scheduler"
LEASE = "power-node-controller"
# Short election times so a run shows several retries and a lapsed renewal within seconds.
FAST_ELECTION = [
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
]


def test_an_unreachable_api_server_is_one_line_per_retry_without_traceback(
    tmp_path: Path,
) -> None:
    port = free_port()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    controller = ControllerProcess([f"--kubeconfig={kubeconfig}", "--identity=a", *FAST_ELECTION])
    try:
        controller.wait_for("node power controller a:")
        started = time.monotonic()
        time.sleep(10)
        elapsed_s = time.monotonic() - started + 1
        code = controller.stop(signal.SIGTERM)
    finally:
        controller.kill()
    log = controller.log()
    text = "\n".join(log)
    assert code == 0, text
    assert "Traceback" not in text and "unexpected error" not in text, text
    retries = controller.matching("leader election (a): cannot reach the API server")
    # One line per attempt, each naming the server, what failed and when it tries next; the
    # tries back off (1, 2, 4, 4... s) while this replica does not lead.
    assert 2 <= len(retries) <= elapsed_s / 1.0, text
    for line in retries:
        assert f"http://127.0.0.1:{port}" in line, line
        assert f"reading Lease {NAMESPACE}/{LEASE}: connection refused" in line, line
        assert re.search(r"next retry in \d+ s$", line), line
    assert [float(re.findall(r"in (\d+) s", line)[0]) for line in retries[:3]] == [1, 2, 4]
    assert "urllib3" not in text  # no "Retrying (Retry(total=2...))" triplets
    assert not controller.matching("leading")  # it never led: nothing to stop
    assert len(log) <= 12, text  # the informers say once that they retry; nothing more
    assert log[-1].endswith("node power controller a stopped on SIGTERM"), text


@pytest.fixture
def controller_kubeconfig(
    control_plane: ControlPlane, kube_api: client.ApiClient, tmp_path: Path
) -> Iterator[Path]:
    """A kubeconfig of the real control plane as the controller's own ServiceAccount (the
    manifests' RBAC is what it gets), and no Lease left over from another test."""
    leases = client.CoordinationV1Api(kube_api)

    def delete_lease() -> None:
        with contextlib.suppress(ApiException):
            leases.delete_namespaced_lease(LEASE, NAMESPACE)

    delete_lease()
    yield control_plane.service_account_kubeconfig(
        NAMESPACE, "power-node-controller", tmp_path / "controller.kubeconfig"
    )
    delete_lease()


def lease_holder(kube_api: client.ApiClient) -> str | None:
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease(LEASE, NAMESPACE)
    return lease.spec.holder_identity


def test_a_leader_cut_off_from_the_api_server_stops_leading_once(
    controller_kubeconfig: Path, kube_api: client.ApiClient, tmp_path: Path
) -> None:
    upstream = yaml.safe_load(controller_kubeconfig.read_text())["clusters"][0]["cluster"]
    proxy = FaultProxy("127.0.0.1", int(upstream["server"].rsplit(":", 1)[1])).start()
    kubeconfig = kubeconfig_through(
        controller_kubeconfig, proxy.port, tmp_path / "proxied.kubeconfig"
    )
    controller = ControllerProcess([f"--kubeconfig={kubeconfig}", "--identity=a", *FAST_ELECTION])
    try:
        controller.wait_for("a started leading")
        assert lease_holder(kube_api) == "a"
        proxy.cut()
        cut_at = time.monotonic()
        controller.wait_for("a stopped leading", timeout_s=15)
        assert time.monotonic() - cut_at < 3 + 2 + 1  # the renew deadline, one retry late
        time.sleep(6)
        elapsed_s = time.monotonic() - cut_at
        code = controller.stop(signal.SIGTERM)
    finally:
        controller.kill()
        proxy.stop()
    text = "\n".join(controller.log())
    assert code == 0, text
    assert "Traceback" not in text and "unexpected error" not in text, text
    stopped = controller.matching("stopped leading")
    assert len(stopped) == 1, text
    assert "renew deadline" in stopped[0] and "last error" in stopped[0], stopped[0]
    retries = controller.matching("cannot reach the API server")
    assert 2 <= len(retries) <= elapsed_s / 1.0 + 1, text
    for line in retries:
        assert f"https://127.0.0.1:{proxy.port}" in line and "next retry in" in line, line
    # Cut off, it could not clear the Lease: the other replica waits out the 4 s duration.
    assert controller.matching("cannot release Lease"), text


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_leader_hands_the_lease_to_the_other_replica_at_once(
    controller_kubeconfig: Path, kube_api: client.ApiClient, stop_signal: int
) -> None:
    # The default lease duration (15 s): a replica that waited it out would take over late.
    common = [f"--kubeconfig={controller_kubeconfig}", "--leader-elect-retry-period=1s"]
    first = ControllerProcess([*common, "--identity=a"])
    second = None
    try:
        first.wait_for("a started leading")
        second = ControllerProcess([*common, "--identity=b"])
        second.wait_for("node power controller b:")
        time.sleep(2)  # b has read the Lease held by a, and waits
        assert not second.matching("started leading")
        stopped_at = time.monotonic()
        code = first.stop(stop_signal)
        second.wait_for("b started leading", timeout_s=10)
        takeover_s = time.monotonic() - stopped_at
        time.sleep(1.5)  # a could not take it back: it has exited, its election first
        assert lease_holder(kube_api) == "b"
        second.stop(signal.SIGTERM)
        assert lease_holder(kube_api) is None  # b released it too
    finally:
        first.kill()
        if second is not None:
            second.kill()
    text = "\n".join(first.log())
    assert code == 0, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    name = signal.Signals(stop_signal).name
    shutdown = first.matching(f"stopped on {name}")
    assert len(shutdown) == 1 and f"released Lease {NAMESPACE}/{LEASE}" in shutdown[0], text
    assert first.log()[-1] == shutdown[0], text  # one line, the last
    assert takeover_s < 5, f"b took over {takeover_s:.1f} s after a stopped"


@pytest.fixture
def cluster(control_plane: ControlPlane, namespace: str) -> Iterator[PowerCluster]:
    with PowerCluster(control_plane, namespace) as power_cluster:
        yield power_cluster


def writes_by(cluster: PowerCluster, manager: str) -> list[str]:
    """This test's nodes that `manager` (a client's user agent) has written a field of."""
    return [
        name
        for name in cluster.agent.node_names
        for entry in cluster.node(cluster.short(name))["metadata"].get("managedFields") or []
        if entry["manager"] == manager
    ]


def test_a_leader_that_cannot_renew_decides_nothing_until_it_holds_the_lease_again(
    control_plane: ControlPlane,
    cluster: PowerCluster,
    controller_kubeconfig: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster.add_node("busy")
    empty = cluster.add_node("empty")
    cluster.wait_ready("busy", "empty")
    cluster.deployment("web", "12", on="busy")
    # The elector's way to the API server (the shipped Lease, as the controller's account).
    port = int(control_plane.server.rsplit(":", 1)[1])
    proxy = FaultProxy("127.0.0.1", port).start()
    through = control_plane.api_client(
        kubeconfig_through(controller_kubeconfig, proxy.port, tmp_path / "proxied.kubeconfig")
    )
    through.configuration.retries = 0
    clock = Clock()
    elector = LeaderElector(
        client.CoordinationV1Api(through),
        LeaseSettings(
            namespace=NAMESPACE,
            name=LEASE,
            identity="a",
            lease_duration_s=DURATION_S,
            renew_deadline_s=DEADLINE_S,
            retry_period_s=RETRY_S,
        ),
        monotonic=clock.view(),
        wall_clock=lambda: time.time() + clock.now_s,
    )
    api = controller_api_client(control_plane)
    api.user_agent = manager = f"controller-{uuid.uuid4().hex[:6]}"  # its writes' field manager
    controller = NodePowerController(controller_settings(), api, elector=elector)
    controller.start()
    try:
        wait_until(lambda: controller.synced, what="caches synced")
        cluster.caught_up(controller)
        assert elector.try_acquire_or_renew()
        proxy.cut()
        clock.advance(DEADLINE_S + 0.1)
        with caplog.at_level(logging.INFO, logger="controllers.node_power"):
            assert not elector.try_acquire_or_renew()  # no exception: an expected failure
            assert not elector.try_acquire_or_renew()
        stopped = [r for r in caplog.records if "stopped leading" in r.getMessage()]
        assert len(stopped) == 1 and not any(r.exc_info for r in caplog.records)
        result = controller.run_round(time.time())
        assert not result.leader and result.decisions is None and result.acted == []
        assert writes_by(cluster, manager) == []
        assert cluster.state_of("empty") == (None, False, "")
        proxy.resume()
        assert elector.try_acquire_or_renew()  # its own record: re-acquired at once
        assert controller.run_round(time.time()).acted == [f"power_off {empty}"]
        assert writes_by(cluster, manager) == [empty]
        assert cluster.state_of("empty")[0] == "off"
    finally:
        controller.stop()
        proxy.stop()


class BrokenApi:
    """A CoordinationV1Api whose reads hit a bug (not an API failure): `errors` in turn."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.calls = 0

    def read_namespaced_lease(self, *_args: Any, **_kwargs: Any) -> Any:
        error = self.errors[min(self.calls, len(self.errors) - 1)]
        self.calls += 1
        raise error


def test_an_unexpected_error_shows_its_traceback_once_then_one_line_per_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = BrokenApi([KeyError("spec")] * 5 + [TypeError("bad record")] * 5)
    elector = LeaderElector(
        api,  # type: ignore[arg-type]
        LeaseSettings(
            "ns", "lock", "a", lease_duration_s=0.3, renew_deadline_s=0.2, retry_period_s=0.01
        ),
    )
    stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(stop,))
    with caplog.at_level(logging.INFO, logger="controllers.node_power"):
        thread.start()
        wait_until(lambda: api.calls >= 12, what="a dozen attempts")
        stop.set()
        thread.join(5)
    assert not thread.is_alive()  # the elector outlives its bugs
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert [type(r.exc_info[1]).__name__ for r in tracebacks] == ["KeyError", "TypeError"]  # type: ignore[index]
    again = [r.getMessage() for r in caplog.records if "unexpected error again" in r.getMessage()]
    assert len(again) == api.calls - 2 and all("next retry in" in line for line in again)
