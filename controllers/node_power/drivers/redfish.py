"""The Redfish driver: a node's ComputerSystem through its BMC, with the `sushy` client.

Power off is the system's `Reset` action with `GracefulShutdown` (the OS stops kubelet and
its containers cleanly), or `ForceOff` when forced or when the BMC offers no graceful
shutdown; power on is `On` (or `ForceOn`). The state is the system's `PowerState`: only `Off`
counts as off (`PoweringOff` still draws power).

The system is found by the Secret's `system` (a path like /redfish/v1/Systems/1, an Id or a
Name), else as the only system of the BMC, else as the one named like the node. Every request
is bounded by the driver's timeout, and sushy's own retries are off (one attempt): the
controller retries, with backoff, on its own schedule. A failed call drops the connection so
that the next one starts afresh (a BMC that rebooted, a rotated password).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import requests
import sushy
from sushy import exceptions as sushy_errors
from sushy.auth import BasicAuth, SessionAuth

from controllers.node_power.drivers.base import (
    POWER_STATE_OFF,
    POWER_STATE_ON,
    BmcCredentials,
    DriverError,
    PowerDriver,
    bounded_call,
)
from livedata.labels import POWER_DRIVER_REDFISH

T = TypeVar("T")

# Everything that is not Off still draws power.
_STATES = {
    sushy.PowerState.ON: POWER_STATE_ON,
    sushy.PowerState.POWERING_ON: POWER_STATE_ON,
    sushy.PowerState.POWERING_OFF: POWER_STATE_ON,
    sushy.PowerState.PAUSED: POWER_STATE_ON,
    sushy.PowerState.OFF: POWER_STATE_OFF,
}


class RedfishDriver(PowerDriver):
    kind = POWER_DRIVER_REDFISH

    def __init__(self, credentials: BmcCredentials, node: str, *, timeout_s: float) -> None:
        super().__init__(credentials, node)
        self.timeout_s = timeout_s
        self._root: sushy.Sushy | None = None
        self._system_path: str | None = None

    # ---- the three operations ----------------------------------------------------------

    def power_state(self) -> str:
        def query() -> str:
            raw = self._system().power_state
            state = _STATES.get(raw)
            if state is None:
                raise DriverError("garbage", f"{self._where()}: PowerState {raw!r} is not known")
            return state

        return self._call(query, "power state")

    def request_power_off(self, *, force: bool = False) -> None:
        def reset() -> None:
            system = self._system()
            allowed = _allowed_resets(system)
            graceful = sushy.ResetType.GRACEFUL_SHUTDOWN
            value = sushy.ResetType.FORCE_OFF if force or graceful not in allowed else graceful
            system.reset_system(value)

        self._call(reset, "power off")

    def request_power_on(self) -> None:
        def reset() -> None:
            system = self._system()
            allowed = _allowed_resets(system)
            value = (
                sushy.ResetType.ON if sushy.ResetType.ON in allowed else sushy.ResetType.FORCE_ON
            )
            system.reset_system(value)

        self._call(reset, "power on")

    # ---- plumbing ----------------------------------------------------------------------

    def _where(self) -> str:
        assert self.credentials is not None
        return f"node {self.node}: Redfish BMC {self.credentials.address}"

    def _call(self, operation: Callable[[], T], what: str) -> T:
        try:
            return bounded_call(operation, self.timeout_s, f"{self._where()}: {what}")
        except DriverError:
            self._root = None
            raise
        except Exception as error:
            self._root = None
            raise _driver_error(error, f"{self._where()}: {what}") from None

    def _connect(self) -> sushy.Sushy:
        if self._root is None:
            credentials = self.credentials
            assert credentials is not None
            auth_class = SessionAuth if credentials.auth == "session" else BasicAuth
            # The constructor reads the service root: a dead BMC fails here, within the timeout.
            self._root = sushy.Sushy(
                credentials.address,
                auth=auth_class(username=credentials.username, password=credentials.password),
                verify=credentials.verify_tls,
                read_timeout=self.timeout_s,
                connect_timeout=self.timeout_s,
                # One attempt per request: sushy reads 0 as "its default" (3 attempts, 2 s apart).
                server_side_retries=1,
                server_side_retries_delay=0.1,
            )
        return self._root

    def _system(self) -> Any:
        root = self._connect()
        if self._system_path is None:
            self._system_path = self._find_system(root)
        return root.get_system(self._system_path)

    def _find_system(self, root: sushy.Sushy) -> str:
        assert self.credentials is not None
        wanted = self.credentials.system
        if wanted.startswith("/"):
            return wanted
        members = list(root.get_system_collection().members_identities)
        if not wanted and len(members) == 1:
            return members[0]
        for path in members:
            system = root.get_system(path)
            if wanted and wanted in (system.identity, system.name):
                return path
            if not wanted and system.name == self.node:
                return path
        raise DriverError(
            "config",
            f"{self._where()}: no system "
            + (f"with Id or Name {wanted!r}" if wanted else f"named {self.node!r}")
            + f" among {len(members)} (set 'system' in the BMC Secret)",
        )


def _allowed_resets(system: Any) -> set[Any]:
    allowed = system.get_allowed_reset_system_values()
    if not allowed:
        raise DriverError("garbage", "the system offers no Reset values")
    return set(allowed)


def _driver_error(error: Exception, where: str) -> DriverError:
    """sushy's and requests' exceptions as our kinds; anything else is an answer not understood."""
    text = str(error)
    if isinstance(error, sushy_errors.ConnectionError | requests.ConnectionError):
        kind = "timeout" if "timed out" in text.lower() else "unreachable"
        return DriverError(kind, f"{where}: {type(error).__name__}: {text}")
    if isinstance(error, requests.Timeout):
        return DriverError("timeout", f"{where}: {text}")
    if isinstance(error, sushy_errors.ResourceNotFoundError):
        return DriverError("config", f"{where}: {text}")
    if isinstance(error, sushy_errors.AccessError | sushy_errors.HTTPError):
        return DriverError("refused", f"{where}: {text}")
    if isinstance(
        error,
        sushy_errors.SushyError | json.JSONDecodeError | ValueError | KeyError | TypeError,
    ):
        return DriverError(
            "garbage", f"{where}: answer not understood: {type(error).__name__}: {text}"
        )
    return DriverError("garbage", f"{where}: {type(error).__name__}: {text}")
