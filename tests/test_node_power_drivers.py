"""Power drivers against real BMC servers: sushy-tools' Redfish emulator, pyghmi's IPMI BMC.

And against BMCs that hang, answer garbage or refuse: each failure is a `DriverError` of the
right kind within the driver's timeout, and the password never shows in a message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controllers.node_power.drivers import (
    POWER_STATE_OFF,
    POWER_STATE_ON,
    BmcCredentials,
    BmcSecret,
    DriverError,
    DryRunDriver,
    bounded_call,
    driver_kind,
    make_driver,
)
from controllers.node_power.drivers.ipmi import IpmiDriver, split_address
from controllers.node_power.drivers.redfish import RedfishDriver
from tests.support.bmc import (
    GarbageHttpServer,
    IpmiBmc,
    RedfishEmulator,
    SilentTcpServer,
    SilentUdpServer,
)

PASSWORD = "correct-horse-battery"


def wait_for(check, timeout_s: float = 20.0, every_s: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll `check()` until it returns a truthy value (a BMC applies changes later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every_s)


@pytest.fixture(scope="module")
def redfish(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedfishEmulator]:
    workdir = tmp_path_factory.mktemp("redfish")
    with RedfishEmulator(workdir, ["node-a", "node-b"], auth=("admin", PASSWORD)) as emulator:
        yield emulator


def redfish_driver(emulator: RedfishEmulator, node: str, **overrides: str) -> RedfishDriver:
    fields = {"username": "admin", "password": PASSWORD, **overrides}
    credentials = BmcCredentials(node=node, address=emulator.url, **fields)  # type: ignore[arg-type]
    return RedfishDriver(credentials, node, timeout_s=5.0)


def test_redfish_powers_a_system_off_and_on(redfish: RedfishEmulator) -> None:
    driver = redfish_driver(redfish, "node-a")  # found by its name, no `system` needed
    assert driver.power_state() == POWER_STATE_ON
    driver.request_power_off()
    assert wait_for(lambda: driver.power_state() == POWER_STATE_OFF)
    assert redfish.power_state("node-a") == "Off"
    assert redfish.power_state("node-b") == "On"  # the other system is untouched
    driver.request_power_off()  # already off: nothing to do, no error
    driver.request_power_on()
    assert wait_for(lambda: driver.power_state() == POWER_STATE_ON)
    assert redfish.power_state("node-a") == "On"


def test_redfish_system_by_path_and_unknown_system(redfish: RedfishEmulator) -> None:
    by_path = redfish_driver(redfish, "other-name", system=redfish.system_path("node-b"))
    assert by_path.power_state() == POWER_STATE_ON
    missing = redfish_driver(redfish, "node-z")
    with pytest.raises(DriverError) as raised:
        missing.power_state()
    assert raised.value.kind == "config"
    assert "node-z" in str(raised.value)


def test_redfish_wrong_password_is_refused_and_not_repeated(redfish: RedfishEmulator) -> None:
    driver = redfish_driver(redfish, "node-a", password="wrong-password-123")
    with pytest.raises(DriverError) as raised:
        driver.request_power_off()
    assert raised.value.kind == "refused"
    assert "401" in str(raised.value)
    assert "wrong-password-123" not in str(raised.value)
    assert "wrong-password-123" not in repr(driver.credentials)
    assert redfish.power_state("node-a") == "On"


def test_a_hung_redfish_bmc_times_out_within_the_bound() -> None:
    with SilentTcpServer() as hung:
        credentials = BmcCredentials(node="n", address=hung.url, username="u", password="p")
        driver = RedfishDriver(credentials, "n", timeout_s=1.0)
        started = time.monotonic()
        with pytest.raises(DriverError) as raised:
            driver.power_state()
        assert raised.value.kind == "timeout"
        # The bound holds (generously: the machine is shared); not a speed check.
        assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        ((200, "text/html", b"<html>we are rebooting</html>"), "garbage"),
        ((200, "application/json", b'{"@odata.id": "/redfish/v1/", "Systems": 7}'), "garbage"),
        ((503, "text/plain", b"busy"), "refused"),
    ],
    ids=["html", "nonsense-json", "503"],
)
def test_a_redfish_bmc_answering_garbage_is_a_driver_error(
    answer: tuple[int, str, bytes], kind: str
) -> None:
    with GarbageHttpServer(lambda _path: answer) as server:
        credentials = BmcCredentials(node="n", address=server.url, username="u", password="p")
        driver = RedfishDriver(credentials, "n", timeout_s=5.0)
        for operation in (driver.power_state, driver.request_power_off, driver.request_power_on):
            with pytest.raises(DriverError) as raised:
                operation()
            assert raised.value.kind == kind, raised.value
        assert not [p for p in server.paths if "Actions" in p]  # no reset was ever sent


def test_a_redfish_system_with_an_unknown_power_state_is_garbage() -> None:
    systems = "/redfish/v1/Systems"
    bodies = {
        "/redfish/v1/": {
            "@odata.id": "/redfish/v1/",
            "Id": "RootService",
            "Name": "Root Service",
            "RedfishVersion": "1.6.0",
            "UUID": "c4b8ee52-0e36-4b6f-9ad3-27c4a7fbc3b0",
            "Systems": {"@odata.id": systems},
        },
        systems: {"Members": [{"@odata.id": f"{systems}/1"}], "Members@odata.count": 1},
        f"{systems}/1": {"@odata.id": f"{systems}/1", "Id": "1", "PowerState": "Sleepy"},
    }

    def answer(path: str) -> tuple[int, str, bytes]:
        body = bodies.get(path.rstrip("/") if path != "/redfish/v1/" else path)
        if body is None:
            return 404, "application/json", b"{}"
        return 200, "application/json", json.dumps(body).encode()

    with GarbageHttpServer(answer) as server:
        credentials = BmcCredentials(node="n", address=server.url)
        with pytest.raises(DriverError) as raised:
            RedfishDriver(credentials, "n", timeout_s=5.0).power_state()
        assert raised.value.kind == "garbage"
        assert "Sleepy" in str(raised.value) or "PowerState" in str(raised.value)


# ---- IPMI ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ipmi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpmiBmc]:
    with IpmiBmc(tmp_path_factory.mktemp("ipmi"), password=PASSWORD, delay_s=0.3) as server:
        yield server


def ipmi_driver(server: IpmiBmc, password: str = PASSWORD, user: str = "admin") -> IpmiDriver:
    credentials = BmcCredentials(
        node="node-i", address=server.address, username=user, password=password
    )
    return IpmiDriver(credentials, "node-i", timeout_s=15.0)


def test_ipmi_powers_the_chassis_off_softly_and_on(ipmi: IpmiBmc) -> None:
    driver = ipmi_driver(ipmi)
    assert driver.power_state() == POWER_STATE_ON
    driver.request_power_off()
    assert wait_for(lambda: driver.power_state() == POWER_STATE_OFF)
    driver.request_power_off()  # already off: not sent again (soft off of an off chassis fails)
    driver.request_power_on()
    assert wait_for(lambda: driver.power_state() == POWER_STATE_ON)
    driver.request_power_off(force=True)
    assert wait_for(lambda: driver.power_state() == POWER_STATE_OFF)
    driver.request_power_on()
    assert wait_for(lambda: driver.power_state() == POWER_STATE_ON)
    # "shutdown" is chassis control "soft", "off" the hard power off.
    assert ipmi.requests == ["soft-off", "on", "off", "on"]


def test_ipmi_refusals_are_refused_errors(ipmi: IpmiBmc) -> None:
    with pytest.raises(DriverError) as raised:
        ipmi_driver(ipmi, password="not-the-password").power_state()
    assert raised.value.kind == "refused"
    assert "not-the-password" not in str(raised.value)
    with pytest.raises(DriverError) as raised:
        ipmi_driver(ipmi, user="nobody").power_state()
    assert raised.value.kind == "refused"


def test_a_silent_ipmi_bmc_times_out() -> None:
    with SilentUdpServer() as silent:
        credentials = BmcCredentials(node="n", address=silent.address, username="a", password="b")
        with pytest.raises(DriverError) as raised:
            IpmiDriver(credentials, "n", timeout_s=2.0).request_power_off()
        assert raised.value.kind == "timeout"
        assert silent.datagrams > 0


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.0.0.5", ("10.0.0.5", 623)),
        ("bmc-1.example:6230", ("bmc-1.example", 6230)),
        ("[fd00::5]", ("fd00::5", 623)),
        ("[fd00::5]:624", ("fd00::5", 624)),
    ],
)
def test_ipmi_addresses(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address) == expected


def test_bad_ipmi_address_is_a_config_error() -> None:
    with pytest.raises(DriverError) as raised:
        IpmiDriver(BmcCredentials(node="n", address="bmc:port"), "n", timeout_s=1)
    assert raised.value.kind == "config"


# ---- the Secret, the choice of driver, the bound ------------------------------------------


def test_bmc_secret_entries_merge_defaults_and_name_the_bad_field(tmp_path: Path) -> None:
    (tmp_path / "_defaults").write_text("username: power\npassword: fleet-secret\n")
    (tmp_path / "node-a").write_text("address: https://10.0.8.11\nsystem: /redfish/v1/Systems/1\n")
    (tmp_path / "node-b").write_text("address: 10.0.8.12\npasswrd: typo-secret\n")
    (tmp_path / "node-c").write_text("address: [unclosed\n  password: leaked-secret\n")
    secret = BmcSecret(tmp_path)
    credentials = secret.credentials_for("node-a")
    assert (credentials.address, credentials.username, credentials.password) == (
        "https://10.0.8.11",
        "power",
        "fleet-secret",
    )
    assert credentials.system == "/redfish/v1/Systems/1"
    assert "fleet-secret" not in repr(credentials)
    with pytest.raises(DriverError, match="unknown field 'passwrd'") as raised:
        secret.credentials_for("node-b")
    assert raised.value.kind == "config"
    with pytest.raises(DriverError, match="not valid YAML") as raised:
        secret.credentials_for("node-c")
    assert "leaked-secret" not in str(raised.value)
    with pytest.raises(DriverError, match="no key 'node-d'"):
        secret.credentials_for("node-d")
    with pytest.raises(DriverError, match="--bmc-secret-dir"):
        BmcSecret(None).credentials_for("node-a")


def test_driver_kind_from_label_or_annotation_else_default() -> None:
    key = "power-aware-scheduler/power-driver"
    assert driver_kind({"metadata": {"labels": {key: "ipmi"}}}, "dry-run") == "ipmi"
    assert driver_kind({"metadata": {"annotations": {key: "redfish"}}}, "dry-run") == "redfish"
    assert driver_kind({"metadata": {}}, "dry-run") == "dry-run"
    with pytest.raises(DriverError, match="wol") as raised:
        make_driver("wol", "node-a", BmcSecret(None), timeout_s=1)
    assert raised.value.kind == "config"


def test_dry_run_driver_switches_nothing_but_remembers() -> None:
    driver = make_driver("dry-run", "node-a", BmcSecret(None), timeout_s=1)
    assert isinstance(driver, DryRunDriver)
    assert driver.power_state() == POWER_STATE_ON
    driver.request_power_off()
    assert driver.power_state() == POWER_STATE_OFF
    driver.request_power_on()
    assert driver.power_state() == POWER_STATE_ON


def test_bounded_call_returns_raises_or_gives_up() -> None:
    assert bounded_call(lambda: 42, 1.0, "answer") == 42
    with pytest.raises(KeyError):
        bounded_call(lambda: {}["missing"], 1.0, "lookup")
    with pytest.raises(DriverError, match=r"no answer within 0\.2 s") as raised:
        bounded_call(lambda: time.sleep(5), 0.2, "sleepy BMC")
    assert raised.value.kind == "timeout"
