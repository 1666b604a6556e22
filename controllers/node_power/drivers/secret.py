"""BMC addresses and credentials, from a Secret mounted as files (never flags, never logs).

The Secret holds one key per node, named like the node, whose value is a small YAML mapping,
plus an optional `_defaults` key merged under every node's (a fleet with one BMC account):

```yaml
# key: node-a
address: https://10.0.8.11      # Redfish: the BMC's base URL; IPMI: host or host:port (623)
username: power-controller
password: s3cret
system: /redfish/v1/Systems/1   # Redfish, optional: path, Id or Name of the node's system
verify_tls: true                # Redfish, optional: false, or a CA bundle file path
auth: basic                     # Redfish, optional: basic (default) or session
```

Mounted with `volumes: - secret: {secretName: power-node-bmc}`, kubelet keeps the files current
when the Secret changes, and the controller reads them again whenever it builds a driver, so a
rotated password takes effect without a restart and no API right on Secrets is needed.

Every problem is a `DriverError` of kind `config` naming the file and the key at fault, never
the password.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from controllers.node_power.drivers.base import BmcCredentials, DriverError

DEFAULTS_KEY = "_defaults"
_FIELDS: Mapping[str, type | tuple[type, ...]] = {
    "address": str,
    "username": str,
    "password": str,
    "system": str,
    "verify_tls": (bool, str),
    "auth": str,
}
_AUTH_MODES = ("basic", "session")


class BmcSecret:
    """The mounted Secret directory: `credentials_for(node)` reads that node's entry."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    def credentials_for(self, node: str) -> BmcCredentials:
        if self.directory is None:
            raise DriverError(
                "config", f"node {node}: no BMC Secret directory configured (--bmc-secret-dir)"
            )
        entry = self._read(node, required=True)
        defaults = self._read(DEFAULTS_KEY, required=False)
        merged = {**defaults, **entry}
        where = f"BMC Secret {self.directory / node}"
        address = merged.get("address")
        if not address:
            raise DriverError("config", f"{where}: no 'address' (nor in {DEFAULTS_KEY})")
        auth = merged.get("auth", "basic")
        if auth not in _AUTH_MODES:
            raise DriverError("config", f"{where}: auth must be one of {_AUTH_MODES}, got {auth!r}")
        return BmcCredentials(
            node=node,
            address=address,
            username=merged.get("username", ""),
            password=merged.get("password", ""),
            system=merged.get("system", ""),
            verify_tls=merged.get("verify_tls", True),
            auth=auth,
        )

    def _read(self, key: str, *, required: bool) -> dict[str, Any]:
        assert self.directory is not None
        path = self.directory / key
        try:
            text = path.read_text()
        except FileNotFoundError:
            if required:
                raise DriverError(
                    "config", f"BMC Secret {self.directory}: no key {key!r} for this node"
                ) from None
            return {}
        except OSError as error:
            raise DriverError("config", f"BMC Secret {path}: cannot read ({error})") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            # The parser's message may quote the line; the line may hold the password.
            mark = getattr(error, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise DriverError("config", f"BMC Secret {path}: not valid YAML{at}") from None
        if not isinstance(data, dict):
            raise DriverError(
                "config", f"BMC Secret {path}: must be a mapping, got {type(data).__name__}"
            )
        for name, value in data.items():
            expected = _FIELDS.get(name)
            if expected is None:
                raise DriverError(
                    "config",
                    f"BMC Secret {path}: unknown field {name!r} (known: {', '.join(_FIELDS)})",
                )
            if not isinstance(value, expected):
                raise DriverError(
                    "config",
                    f"BMC Secret {path}: field {name!r} has the wrong type "
                    f"({type(value).__name__})",
                )
        return data
