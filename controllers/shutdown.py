"""Stopping on SIGTERM and Ctrl-C (SIGINT), shared by the controllers' command lines.

The kubelet stops a pod with SIGTERM and waits its grace period; a developer presses Ctrl-C.
Either sets the controller's stop event, so its loop ends where it would wait next, it stops
acting and releases what it holds (the node power controller's Lease), and the process exits 0
with no traceback. A second signal while stopping ends the process at once with status 1, as
client-go's `SetupSignalHandler` does, for a stop that hangs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Which stop signal arrived (None until one does)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.received: str | None = None

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            os.write(2, b"second stop signal: exiting at once\n")
            os._exit(1)
        self.received = signal.Signals(signum).name
        # Not `stop.set()` here: the handler runs on the main thread between two bytecodes, and
        # that thread may be inside `stop.wait()` holding the event's (non-reentrant) lock.
        threading.Thread(target=self.stop.set, name="stop-signal", daemon=True).start()


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[StopSignals]:
    """Within the block, SIGTERM and SIGINT set `stop` instead of killing the process or
    raising KeyboardInterrupt; the previous handlers come back after it."""
    signals = StopSignals(stop)
    previous = {sig: signal.signal(sig, signals.handle) for sig in STOP_SIGNALS}
    try:
        yield signals
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
