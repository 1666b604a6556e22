"""The dry-run driver: switches nothing, only remembers what it was asked.

For nodes labelled `power-aware-scheduler/power-driver=dry-run` (and the default for nodes
without the label): the controller cordons, drains and records `off` on the node as it would
for a real driver, but the machine keeps running. It shows what powering nodes off would do
(which nodes, how often, how long pods wait) before any BMC is trusted with it.
"""

from __future__ import annotations

import logging

from controllers.node_power.drivers.base import (
    POWER_STATE_OFF,
    POWER_STATE_ON,
    BmcCredentials,
    PowerDriver,
)
from livedata.labels import POWER_DRIVER_DRY_RUN

log = logging.getLogger("controllers.node_power")


class DryRunDriver(PowerDriver):
    kind = POWER_DRIVER_DRY_RUN

    def __init__(
        self, credentials: BmcCredentials | None, node: str, state: str = POWER_STATE_ON
    ) -> None:
        super().__init__(credentials, node)
        self._state = state

    def power_state(self) -> str:
        return self._state

    def request_power_off(self, *, force: bool = False) -> None:
        log.info("dry-run driver: would power off node %s%s", self.node, " (forced)" * force)
        self._state = POWER_STATE_OFF

    def request_power_on(self) -> None:
        log.info("dry-run driver: would power on node %s", self.node)
        self._state = POWER_STATE_ON
