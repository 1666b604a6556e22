"""The IPMI driver: chassis power control over IPMI 2.0 (RMCP+), with the `pyghmi` client.

Power off is "chassis power soft" (ACPI shutdown: the OS stops kubelet cleanly) or, forced,
"chassis power off"; power on is "chassis power on"; the state is the chassis power status.
Each operation opens its own session and closes it (power actions are minutes apart, and a
session kept open would need keepalives to a BMC that may reboot), all within the driver's
timeout: pyghmi retries a login for tens of seconds on its own, and a BMC that never answers
must not hold a controller round that long.

The address is `host` or `host:port` (`[v6addr]:port`), port 623 by default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from pyghmi import exceptions as ipmi_errors
from pyghmi.ipmi import command

from controllers.node_power.drivers.base import (
    POWER_STATE_OFF,
    POWER_STATE_ON,
    BmcCredentials,
    DriverError,
    PowerDriver,
    bounded_call,
)
from livedata.labels import POWER_DRIVER_IPMI

T = TypeVar("T")
IPMI_PORT = 623


def split_address(address: str) -> tuple[str, int]:
    """("host", port) from `host`, `host:port`, `[v6]` or `[v6]:port`; ValueError if bad."""
    text = address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"IPMI address {address!r} has no host")
    try:
        port = int(port_text) if port_text else IPMI_PORT
    except ValueError:
        raise ValueError(f"IPMI address {address!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"IPMI address {address!r}: port {port} out of range")
    return host, port


class IpmiDriver(PowerDriver):
    kind = POWER_DRIVER_IPMI

    def __init__(self, credentials: BmcCredentials, node: str, *, timeout_s: float) -> None:
        super().__init__(credentials, node)
        self.timeout_s = timeout_s
        try:
            self.host, self.port = split_address(credentials.address)
        except ValueError as error:
            raise DriverError("config", f"node {node}: {error}") from None

    def power_state(self) -> str:
        return self._session(lambda session: _power_of(session.get_power()), "power state")

    def request_power_off(self, *, force: bool = False) -> None:
        def off(session: command.Command) -> None:
            if _power_of(session.get_power()) == POWER_STATE_OFF:
                return  # a soft off of an off chassis is an error to IPMI
            _check(session.set_power("off" if force else "shutdown", wait=False))

        self._session(off, "power off")

    def request_power_on(self) -> None:
        self._session(lambda session: _check(session.set_power("on", wait=False)), "power on")

    def _where(self) -> str:
        return f"node {self.node}: IPMI BMC {self.host}:{self.port}"

    def _session(self, operation: Callable[[command.Command], T], what: str) -> T:
        credentials = self.credentials
        assert credentials is not None

        def run() -> T:
            # Bytes, not str: pyghmi 1.6 files a session being set up under the credentials
            # as given but removes it under their UTF-8 bytes, so with str the next session to
            # the same BMC finds the old, logged-out one and fails.
            session = command.Command(
                bmc=self.host,
                userid=credentials.username.encode(),
                password=credentials.password.encode(),
                port=self.port,
                keepalive=False,
            )
            try:
                return operation(session)
            finally:
                # The answer is what matters; a logout that gets lost times out on the BMC.
                with contextlib.suppress(Exception):
                    session.ipmi_session.logout()

        where = f"{self._where()}: {what}"
        try:
            return bounded_call(run, self.timeout_s, where)
        except DriverError:
            raise
        except Exception as error:
            raise _driver_error(error, where) from None


def _power_of(answer: Any) -> str:
    state = answer.get("powerstate") if isinstance(answer, dict) else None
    if state not in (POWER_STATE_ON, POWER_STATE_OFF):
        raise DriverError("garbage", f"chassis power status not understood: {answer!r}")
    return state


def _check(answer: Any) -> None:
    if not isinstance(answer, dict) or "error" in answer:
        raise DriverError("refused", f"power control not accepted: {answer!r}")


def _driver_error(error: Exception, where: str) -> DriverError:
    text = str(error) or "no answer"
    if isinstance(error, ipmi_errors.InvalidParameterValue):
        return DriverError("config", f"{where}: {text}")
    if isinstance(error, ipmi_errors.IpmiException):
        lowered = text.lower()
        if any(
            word in lowered for word in ("password", "unauthorized", "privilege", "not supported")
        ):
            return DriverError("refused", f"{where}: {text}")
        if text == "no answer" or "timeout" in lowered or "no longer connected" in lowered:
            return DriverError("timeout", f"{where}: {text}")
        return DriverError("refused", f"{where}: {text}")
    if isinstance(error, OSError):
        return DriverError("unreachable", f"{where}: {text}")
    return DriverError("garbage", f"{where}: answer not understood: {type(error).__name__}: {text}")
