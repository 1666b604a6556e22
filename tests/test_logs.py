"""livedata.logs: configure_logging can be called again (tests call main() many times)."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from livedata.logs import FailureStreak, configure_logging


def test_configure_logging_is_idempotent_and_keeps_foreign_handlers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()
    foreign = logging.NullHandler()
    root.addHandler(foreign)
    saved_level = root.level
    try:
        configure_logging("info", "json")
        configure_logging("info", "json")
        ours = [h for h in root.handlers if type(h).__name__ == "_ServiceHandler"]
        assert len(ours) == 1
        assert foreign in root.handlers
        # Writes go to the stderr of the moment, so a swapped and closed stderr is harmless.
        # A logger of its own: earlier tests may have quietened "extender" loggers.
        probe = logging.getLogger("test_logs.probe")
        probe.disabled = False
        first = io.StringIO()
        monkeypatch.setattr(sys, "stderr", first)
        probe.warning("hello", extra={"node": "n1"})
        first.close()
        second = io.StringIO()
        monkeypatch.setattr(sys, "stderr", second)
        probe.warning("again")
        assert json.loads(second.getvalue())["msg"] == "again", second.getvalue()
    finally:
        for handler in [h for h in root.handlers if type(h).__name__ == "_ServiceHandler"]:
            root.removeHandler(handler)
        root.removeHandler(foreign)
        root.setLevel(saved_level)


def test_a_failure_streak_logs_each_cause_once_and_the_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("tests.streak")
    streak = FailureStreak(log, "pass failed: %s", "passes succeed again after %d failed")
    with caplog.at_level(logging.INFO, logger="tests.streak"):
        streak.succeeded()  # nothing failed: nothing to say
        for cause in ("down", "down", "down", "timeout", "timeout"):
            streak.failed(cause)
        assert (streak.cause, streak.count) == ("timeout", 5)
        streak.succeeded()
        streak.failed("down")  # a new streak names its cause again
    assert [r.getMessage() for r in caplog.records] == [
        "pass failed: down",
        "pass failed: timeout",
        "passes succeed again after 5 failed",
        "pass failed: down",
    ]
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING", "INFO", "WARNING"]
