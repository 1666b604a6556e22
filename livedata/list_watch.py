"""List + watch one Kubernetes resource in a thread: client-go's reflector, shared by every reader.

The extender's cluster watch (`extender.sources.kube_watch`: Nodes and Pods into its state)
and the node power controller's caches (`controllers.node_power.kube.Informer`: Nodes, Pods,
PodDisruptionBudgets) both keep a resource current the same way, so they share this loop:

- **list**, then **watch** from the list's resourceVersion with a server-side timeout
  (`watch_timeout_s`), asking for bookmarks so the version keeps moving on quiet resources;
- when a watch ends, **resume** from the last version seen (the server replays what came
  after it); on `410 Gone` the version fell out of the server's history: **relist**, at once
  the first time, with backoff if the server keeps answering 410;
- every other failure (refused connections, dropped streams, 5xx, bad JSON) is retried with
  exponential backoff from `backoff_s` to `max_backoff_s`, logged once per streak;
- one object that its handler cannot take is logged and skipped, so it cannot stall the stream
  by being retried forever.

The reader gives two callbacks: `on_list(items)` with every object of a (re)list, which
replaces what it held, and `on_event(type, object)` for each ADDED, MODIFIED or DELETED. Both
run on the loop's thread with raw JSON dicts (`return_type="object"`: no model
deserialisation per event). `LoopStatus` says whether the view can be trusted (`synced`: listed
and no failure since) for readiness probes, /status and metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes import watch
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

HTTP_GONE = 410
CONNECT_TIMEOUT_S = 10.0
# Slack on top of the server-side watch timeout before the client gives up on a silent socket.
READ_TIMEOUT_SLACK_S = 30.0
DEFAULT_LIST_TIMEOUT_S = 60.0
DEFAULT_WATCH_TIMEOUT_S = 300
DEFAULT_BACKOFF_S = 1.0
DEFAULT_MAX_BACKOFF_S = 30.0

Clock = Callable[[], float]


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


@dataclass
class LoopStatus:
    """Health of one list+watch loop, for /readyz, /status and /metrics."""

    synced: bool = False  # listed successfully and no error since
    last_ok_at_s: float | None = None  # last successful list, watch event or clean watch end
    consecutive_failures: int = 0
    failures_total: int = 0
    relists_total: int = 0
    events_total: int = 0
    last_error: str = ""  # the latest failure, in words ("" after none)


class ListWatchLoop:
    """List, then watch from the list's resourceVersion; resume, relist on 410, back off."""

    def __init__(
        self,
        *,
        name: str,
        list_func: Callable[..., Any],
        list_kwargs: Mapping[str, Any],
        on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        stop_event: threading.Event | None = None,
        clock: Clock = time.time,
        backoff_s: float = DEFAULT_BACKOFF_S,
        max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
        watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
        list_timeout_s: float = DEFAULT_LIST_TIMEOUT_S,
    ) -> None:
        self.name = name
        self.status = LoopStatus()
        self._list_func = list_func
        self.list_kwargs = dict(list_kwargs)
        self._on_list = on_list
        self._on_event = on_event
        self._stop = stop_event or threading.Event()
        self._clock = clock
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._watch_timeout_s = watch_timeout_s
        self._list_timeout_s = list_timeout_s
        self._watch: watch.Watch | None = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"kube-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop (and every loop sharing its stop event) and wait for its thread."""
        self._stop.set()
        self.interrupt()
        if self.thread.is_alive():
            self.thread.join(timeout=timeout_s)

    def interrupt(self) -> None:
        """Unblock a watch in progress (used by stop)."""
        with self._lock:
            current = self._watch
        if current is not None:
            current.stop()

    def _run(self) -> None:
        # None means "list first"; after an error the watch resumes from the last version seen.
        resource_version: str | None = None
        delay_s = self._backoff_s
        relisted_for_gone = False
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list()
                resource_version = self._watch_from(resource_version)
                delay_s = self._backoff_s
                relisted_for_gone = False
                continue
            except ApiException as error:
                if error.status == HTTP_GONE:
                    # Our resourceVersion fell out of the server's history: start over, at once
                    # the first time; a server that keeps answering 410 gets the backoff.
                    log.info("%s watch expired (410 Gone); relisting", self.name)
                    resource_version = None
                    if not relisted_for_gone:
                        relisted_for_gone = True
                        continue
                self._failed(f"API error {error.status} {error.reason}".strip())
            except Exception as error:  # dropped streams, refused connections, bad JSON...
                if self._stop.is_set():
                    break
                self._failed(f"{type(error).__name__}: {error}")
            if self._stop.wait(delay_s):
                break
            delay_s = min(delay_s * 2, self._max_backoff_s)

    def _list(self) -> str:
        response = self._list_func(
            **self.list_kwargs,
            _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT_S, self._list_timeout_s),
        )
        try:
            body = orjson.loads(response.data)
        finally:
            response.release_conn()
        items = body.get("items") or []
        self._on_list(items)
        resource_version = (body.get("metadata") or {}).get("resourceVersion") or "0"
        self._succeeded()
        self.status.relists_total += 1
        log.info(
            "%s listed: %d objects at resourceVersion %s", self.name, len(items), resource_version
        )
        return resource_version

    def _connect_watch(self, **kwargs: Any) -> Any:
        """Open the watch request; the server answering 200 counts as back in sync."""
        response = self._list_func(**kwargs)
        self._succeeded()
        return response

    def _watch_from(self, resource_version: str) -> str:
        """Stream events until the server-side timeout ends the watch; the last version seen."""
        # return_type "object" keeps raw JSON dicts: no model deserialisation per event.
        stream_watch = watch.Watch(return_type="object")
        with self._lock:
            self._watch = stream_watch
        try:
            for event in stream_watch.stream(
                self._connect_watch,
                **self.list_kwargs,
                resource_version=resource_version,
                timeout_seconds=self._watch_timeout_s,
                allow_watch_bookmarks=True,
                _request_timeout=(CONNECT_TIMEOUT_S, self._watch_timeout_s + READ_TIMEOUT_SLACK_S),
            ):
                if self._stop.is_set():
                    break
                obj = event["raw_object"]
                resource_version = _resource_version(obj) or resource_version
                if event["type"] != "BOOKMARK":
                    self.status.events_total += 1
                    try:
                        self._on_event(event["type"], obj)
                    except Exception:
                        # One odd object must not stall the stream by being retried forever.
                        log.exception("%s: skipped a %s event", self.name, event["type"])
                self._succeeded()
        finally:
            with self._lock:
                self._watch = None
        if not self._stop.is_set():
            self._succeeded()
        return resource_version

    def _succeeded(self) -> None:
        if self.status.consecutive_failures:
            log.info(
                "%s watch recovered after %d failed attempts",
                self.name,
                self.status.consecutive_failures,
            )
            self.status.consecutive_failures = 0
        # Only reached after a list: a resumed watch continues from a consistent state.
        self.status.synced = True
        self.status.last_ok_at_s = self._clock()

    def _failed(self, what: str) -> None:
        status = self.status
        if status.consecutive_failures == 0:
            log.warning("%s list/watch failed (%s); retrying with backoff", self.name, what)
        status.consecutive_failures += 1
        status.failures_total += 1
        status.synced = False
        status.last_error = what
