"""Logging set-up for our processes (the extender, the controllers): JSON lines or plain text.

Each runs as a pod whose logs are collected by the cluster's log pipeline, so the
default is one JSON object per line with stable keys (``ts``, ``level``, ``logger``, ``msg``
plus any ``extra={...}`` fields a caller passes). ``--log-format text`` gives a readable line
for a developer's terminal. Per-request lines are logged at DEBUG only: at hundreds of pods
per second an INFO line per request would cost more than the scoring itself.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

LOG_FORMATS = ("json", "text")

# Attributes every LogRecord carries; anything else on a record came from ``extra=`` and is
# written as a field of its own.
_STANDARD_RECORD_KEYS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "color_message"}
)


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object: time, level, logger, message, extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _rfc3339_utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_extra_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """A readable line for a terminal: time, level, logger, message, then key=value extras."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extra_fields(record)
        if extras:
            line += "  " + " ".join(f"{key}={value}" for key, value in extras.items())
        return line


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _STANDARD_RECORD_KEYS and not key.startswith("_")
    }


def _rfc3339_utc(epoch_s: float) -> str:
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_s))
    return f"{whole}.{int((epoch_s % 1) * 1000):03d}Z"


class _ServiceHandler(logging.StreamHandler):
    """The stderr handler ``configure_logging`` installs; marked so a second call finds it.

    It writes to whatever ``sys.stderr`` is at emit time, not the stream of the moment it was
    made: a test harness that swaps stderr and closes its replacement must not leave a handler
    writing to a closed file ("--- Logging error ---").
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass  # always the current sys.stderr


def configure_logging(level: str = "info", log_format: str = "json") -> None:
    """Send the root logger to stderr in the chosen format.

    Idempotent: a second call replaces only the handler an earlier call installed, and leaves
    handlers others attached (pytest's log capture, an embedding application) in place.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = _ServiceHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _ServiceHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())
    # uvicorn's access log would write one INFO line per request; our own request log is
    # at DEBUG and carries the timing, so keep uvicorn's quiet unless debugging.
    quiet_level = logging.DEBUG if level.lower() == "debug" else logging.WARNING
    logging.getLogger("uvicorn.access").setLevel(quiet_level)
    # uvicorn's lifecycle lines ("Started server process", "Application startup complete",
    # "Shutting down", ...) repeat the service's own "listening" and "stopped" lines; its
    # warnings and errors (a malformed request, an exception in the app) still come through.
    logging.getLogger("uvicorn.error").setLevel(quiet_level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


class FailureStreak:
    """A loop's failures in a row, logged as an operator wants to read them: a cause once when
    it starts or changes, not at every pass while it lasts, and one line when a pass succeeds
    again saying how many failed (an hour without the API server is two lines, not one per
    interval). `cause` is the current failure's, None while passes succeed: what /readyz shows.
    """

    def __init__(self, logger: logging.Logger, failed: str, recovered: str) -> None:
        self._log = logger
        self._failed = failed  # %-format with the cause
        self._recovered = recovered  # %-format with the number of failures
        self.cause: str | None = None
        self.count = 0

    def failed(self, cause: str) -> None:
        if cause != self.cause:
            self._log.warning(self._failed, cause)
        self.cause = cause
        self.count += 1

    def succeeded(self) -> None:
        if self.count:
            self._log.info(self._recovered, self.count)
        self.cause, self.count = None, 0
