"""sushy-tools' Redfish emulator (`sushy-emulator`, fake driver) with a chosen power delay.

    python -m bench.support.redfish_bmc --power-delay 0:0 --config emulator.conf

This is the real `sushy-emulator` program, started from its own `main()`: only the fake
driver's delay before a requested power state shows (a random 1-11 s, hard-coded) is replaced
by `--power-delay LOW:HIGH` seconds, so tests that power nodes off and on do not wait 11 s for
each change. Configuration (systems, listen address, auth file, state directory) is the
emulator's own config file; see `bench.support.bmc.RedfishEmulator`.
"""

from __future__ import annotations

import random
import sys
import types


def main(argv: list[str]) -> int:
    delay = "1:11"
    if argv[:1] == ["--power-delay"]:
        delay, argv = argv[1], argv[2:]
    low, high = (int(part) for part in delay.split(":"))
    from sushy_tools.emulator import main as emulator
    from sushy_tools.emulator.resources.systems import fakedriver

    rng = random.Random(7)
    fakedriver.random = types.SimpleNamespace(randint=lambda _a, _b: rng.randint(low, high))
    sys.argv = ["sushy-emulator", *argv]
    emulator.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
