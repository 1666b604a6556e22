"""What every power driver offers, how it fails, and the bound on every call to a BMC.

A driver switches one node's power: `power_state()` ("on" or "off"), `request_power_off()`
(graceful, or `force=True`), `request_power_on()`. Requests return once the BMC accepted them;
the controller polls `power_state()` in later rounds until the change is visible, so no round
ever waits for a server to boot or shut down.

Every failure is a `DriverError` with a `kind` the metrics count and the backoff treats alike:

- `timeout`: the BMC did not answer within the bound (`bounded_call`);
- `unreachable`: the connection failed (refused, no route, TLS);
- `refused`: the BMC answered no (wrong credentials, action not allowed now, HTTP 4xx/5xx);
- `garbage`: the answer could not be understood (not JSON, an unknown power state...);
- `config`: our side is wrong (no credentials for the node, a system that does not exist).

A driver never logs or repeats a password: `BmcCredentials` hides it from `repr` and error
messages name the node and the BMC address only.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

POWER_STATE_ON = "on"
POWER_STATE_OFF = "off"

ERROR_KINDS = ("timeout", "unreachable", "refused", "garbage", "config")

T = TypeVar("T")


class DriverError(Exception):
    """A power action or query that failed; `kind` is one of `ERROR_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown driver error kind {kind!r}")
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class BmcCredentials:
    """How to reach one node's BMC (from the BMC Secret; see `drivers.secret`)."""

    node: str
    address: str  # Redfish: base URL (https://bmc-1.example); IPMI: host or host:port
    username: str = ""
    password: str = field(default="", repr=False)
    system: str = ""  # Redfish: system path, Id or Name ("" = the only one, or the node's name)
    verify_tls: bool | str = True  # Redfish: verify the BMC's certificate (or a CA bundle path)
    auth: str = "basic"  # Redfish: basic or session


def bounded_call(call: Callable[[], T], timeout_s: float, what: str) -> T:
    """`call()` in a worker thread, at most `timeout_s`; DriverError("timeout") past it.

    BMC libraries have their own timeouts, but not on every path (pyghmi retries a login for
    tens of seconds; a server trickling bytes keeps a read alive): this bound holds for all of
    them. A call that overruns is abandoned in its daemon thread and ends by its own timeout.
    """
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # handed to the caller's thread below
            outcome["error"] = error

    worker = threading.Thread(target=run, name=f"bmc-call {what}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise DriverError("timeout", f"{what}: no answer within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


class PowerDriver(abc.ABC):
    """One node's power switch."""

    kind: str = ""

    def __init__(self, credentials: BmcCredentials | None, node: str) -> None:
        self.credentials = credentials
        self.node = node

    @abc.abstractmethod
    def power_state(self) -> str:
        """POWER_STATE_ON or POWER_STATE_OFF as the BMC reports it now."""

    @abc.abstractmethod
    def request_power_off(self, *, force: bool = False) -> None:
        """Ask for the node to shut down (gracefully, or at once with `force`)."""

    @abc.abstractmethod
    def request_power_on(self) -> None:
        """Ask for the node to power on."""

    def describe(self) -> str:
        """For logs: the driver and the BMC address, never credentials."""
        where = self.credentials.address if self.credentials is not None else "no BMC"
        return f"{self.kind} ({where})"
