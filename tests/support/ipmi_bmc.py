"""A real IPMI 2.0 endpoint for tests: pyghmi's own BMC server with a chassis that powers.

    python -m tests.support.ipmi_bmc --port 9623 --user admin --password-file FILE \
        [--power on|off] [--delay 0.5] [--ignore-soft-off]

Run it in a subprocess (`tests.support.bmc.IpmiBmc`): pyghmi's server and client share
module-level session tables and one I/O thread, and a BMC served from a thread of the test
process makes clients in that process flaky. The chassis reports a new power state `--delay`
seconds after a request, like a server that takes time to shut down or start; with
`--ignore-soft-off` it accepts a soft (ACPI) power off and stays on, like a hung OS.

Two pyghmi 1.6 server bugs are worked around, so that the pyghmi *client* (the controller's
IPMI driver) logs in as it would to a real BMC:

- the client proposes RAKP-HMAC-SHA256 first and falls back to SHA1 only on an error status;
  the server ignores the proposal and answers "cipher suite 3 (SHA1)", and the client then
  fails on a 20-byte HMAC. A SHA1-only BMC answers "0x11 no matching cipher suite": so do we;
- the server drops RAKP1 for an unknown user, and the client logs in again forever. A real
  BMC answers RAKP2 with status 0x0d "unauthorized name": so do we.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

import pyghmi.ipmi.bmc as bmc
import pyghmi.ipmi.private.serversession as serversession
import pyghmi.ipmi.private.session as ipmisession

_original_open_session = serversession.ServerSession.create_open_session_response
_original_rakp1 = serversession.ServerSession._got_rakp1

SHA1 = 1
NO_MATCHING_CIPHER_SUITE = 0x11
UNAUTHORIZED_NAME = 0x0D
NOT_IN_PRESENT_STATE = 0xD5


def _open_session_sha1_only(self, request):  # type: ignore[no-untyped-def]
    if len(request) > 12 and request[12] != SHA1:
        return bytearray([request[0], NO_MATCHING_CIPHER_SUITE, 0, 0]) + bytes(request[4:8])
    return _original_open_session(self, request)


def _rakp1_rejecting_unknown_users(self, data):  # type: ignore[no-untyped-def]
    name_length = data[27] if len(data) > 27 else 0
    name = bytes(data[28 : 28 + name_length]).decode("utf-8", "replace")
    if name_length and self.authdata.get(name) is None:
        answer = bytearray([data[0], UNAUTHORIZED_NAME, 0, 0]) + self.clientsessionid
        self.send_payload(answer, ipmisession.constants.payload_types["rakp2"], retry=False)
        return None
    return _original_rakp1(self, data)


serversession.ServerSession.create_open_session_response = _open_session_sha1_only
serversession.ServerSession._got_rakp1 = _rakp1_rejecting_unknown_users


class ChassisBmc(bmc.Bmc):
    """A BMC whose chassis takes `delay_s` to reach a requested power state."""

    def __init__(
        self,
        users: dict[str, str],
        port: int,
        power: str,
        delay_s: float,
        *,
        ignore_soft_off: bool = False,
    ) -> None:
        super().__init__(users, port=port, address="127.0.0.1")
        self._lock = threading.Lock()
        self._power = power
        self._pending: tuple[str, float] | None = None
        self.delay_s = delay_s
        # An OS that ignores the ACPI power button: a soft off is accepted and nothing happens.
        self.ignore_soft_off = ignore_soft_off
        self.stopping = threading.Event()

    def _request(self, target: str, what: str | None = None) -> None:
        with self._lock:
            self._pending = (target, time.monotonic() + self.delay_s)
        print(f"request {what or target}", flush=True)

    def get_power_state(self) -> str:
        with self._lock:
            if self._pending is not None and time.monotonic() >= self._pending[1]:
                self._power, self._pending = self._pending[0], None
            return self._power

    def power_on(self) -> None:
        self._request("on")

    def power_off(self) -> None:
        self._request("off")

    def power_shutdown(self) -> int | None:
        if self.get_power_state() == "off":
            return NOT_IN_PRESENT_STATE
        if self.ignore_soft_off:
            print("request soft-off (ignored)", flush=True)
            return None
        self._request("off", "soft-off")
        return None

    def power_cycle(self) -> None:
        self._request("on")

    def power_reset(self) -> None:
        self._request("on")

    def is_active(self) -> bool:
        return self.get_power_state() == "on"

    def get_boot_device(self) -> str:
        return "default"

    def serve(self) -> None:
        """Bmc.listen() without its `while True`: stops on SIGTERM."""
        while not self.stopping.is_set():
            ipmisession.Session.wait_for_rsp(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.ipmi_bmc")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password-file", type=Path, required=True)
    parser.add_argument("--power", choices=("on", "off"), default="on")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--ignore-soft-off", action="store_true")
    args = parser.parse_args(argv)
    password = args.password_file.read_text().strip()
    server = ChassisBmc(
        {args.user: password},
        args.port,
        args.power,
        args.delay,
        ignore_soft_off=args.ignore_soft_off,
    )
    signal.signal(signal.SIGTERM, lambda *_: server.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: server.stopping.set())
    print(f"listening on udp 127.0.0.1:{args.port}", flush=True)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
