"""Model swap through the running service, with kubelet's exact ConfigMap volume layout.

The bundle directory is a kubelet mount (``..<timestamp>/`` with the files, ``..data`` symlink
renamed atomically, top-level symlinks into ``..data``). While a client thread sends requests
without pause, the test swaps between two bundles whose curves rank the nodes in opposite
orders, several times; every request must succeed, and every explained answer must rank the
nodes as the bundle version it names says (never half of two bundles). Then corrupt bundles
(bad sha256, truncated ONNX, a model predicting NaN) are mounted: each is refused, shown in
``/status`` and counted, and the last good bundle keeps serving.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.support.bundles import (
    KubeletMount,
    PowerCurveSpec,
    corrupt_model_bytes,
    make_bundle,
    truncate_model,
)
from tests.support.server import extender_service, write_snapshot

FIXTURE = Path(__file__).parent / "fixtures" / "kube-scheduler-v1.28" / "cache-capable"
NODES = ("node-a", "node-b", "node-c")
SLOPES_W = (50.0, 200.0, 300.0)  # power per unit of utilisation, cheapest first
WAIT_S = 60.0  # upper bound for the watcher to notice a swap (it polls every 50 ms here)


def curves(cheapest_first: tuple[str, ...]) -> dict[str, PowerCurveSpec]:
    return {
        name: PowerCurveSpec(idle_w=100.0, max_w=100.0 + slope)
        for name, slope in zip(cheapest_first, SLOPES_W, strict=True)
    }


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("swap")
    forward = make_bundle(root / "forward", curves(NODES))
    backward = make_bundle(root / "backward", curves(tuple(reversed(NODES))))
    return {"root": root, "forward": forward, "backward": backward}


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


class Traffic:
    """Sends prioritize and explain requests back to back until stopped; keeps every answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.body = (FIXTURE / "prioritize-request.json").read_bytes()
        self.failures: list[str] = []
        self.explained: list[tuple[str, str]] = []  # (bundle version, top node)
        self.prioritized = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self._stop.is_set():
                try:
                    self._one(client)
                except Exception as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")

    def _one(self, client: httpx.Client) -> None:
        answer = client.post("/prioritize", content=self.body)
        if answer.status_code != 200:
            self.failures.append(f"prioritize HTTP {answer.status_code}: {answer.text}")
            return
        scores = {e["Host"]: e["Score"] for e in answer.json()}
        if sorted(scores) != sorted(NODES) or max(scores.values()) != 10:
            self.failures.append(f"prioritize answer {scores}")
        self.prioritized += 1
        explain = client.post("/explain", content=self.body)
        if explain.status_code != 200:
            self.failures.append(f"explain HTTP {explain.status_code}: {explain.text}")
            return
        report = explain.json()
        rows = report["nodes"]
        top = max(rows, key=lambda row: (row["score"], -row["increase_w"]))["node"]
        self.explained.append((report["bundle_version"], top))


def test_swaps_under_traffic_and_corrupt_bundles_are_refused(bundles, tmp_path: Path) -> None:
    forward, backward = bundles["forward"], bundles["backward"]
    mount = KubeletMount(tmp_path / "mount")
    mount.project_bundle(forward.directory)
    assert (mount.directory / "..data").is_symlink()
    assert (mount.directory / "manifest.json").is_symlink()
    telemetry = {"cpu_util": 0.3, "ambient_temp_c": 22.0, "cpu1_temp_c": 50.0}
    snapshot = write_snapshot(
        tmp_path / "cluster.json",
        [{"name": n, "allocatable_cpu": 8, "telemetry": telemetry} for n in NODES],
    )
    expected_top = {forward.version: NODES[0], backward.version: NODES[-1]}
    with (
        extender_service(mount.directory, snapshot, bundle_poll_interval_s=0.05) as (url, runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):

        def serving() -> str | None:
            return client.get("/status").json()["bundle_version"]

        assert serving() == forward.version
        with Traffic(url) as traffic:
            for bundle in (backward, forward, backward, forward, backward):
                seen_before = len(traffic.explained)
                mount.project_bundle(bundle.directory)
                wait_for(lambda b=bundle: serving() == b.version, f"bundle {bundle.version}")
                wait_for(lambda n=seen_before: len(traffic.explained) > n + 3, "traffic")
        assert traffic.failures == []
        assert traffic.prioritized > 20
        versions_seen = {version for version, _ in traffic.explained}
        assert versions_seen == {forward.version, backward.version}
        for version, top in traffic.explained:
            assert top == expected_top[version], f"bundle {version} answered as the other one"
        assert runtime.watcher.counters.swaps == 6  # the first load and five swaps

        # Corrupt bundles: refused one after another, the good one keeps serving.
        good = backward.version

        def refusal() -> tuple[int, str | None]:
            status = client.get("/status").json()
            return status["bundle_refusals"], (status["last_refused"] or {}).get("version")

        nan_specs = {**curves(NODES), "node-c": PowerCurveSpec(100, 400, nan_output=True)}
        bad_bundles = {
            "sha256": (curves(NODES), lambda d: corrupt_model_bytes(d, "node-a")),
            "truncated": (curves(NODES), lambda d: truncate_model(d, "node-b")),
            "nan": (nan_specs, lambda d: None),
        }
        with Traffic(url) as traffic:
            for label, (specs, breaker) in bad_bundles.items():
                bad = make_bundle(bundles["root"] / f"bad-{label}", specs)
                breaker(bad.directory)
                seen_before = len(traffic.explained)
                refusals_before, _ = refusal()
                mount.project_bundle(bad.directory)
                # Two bad bundles may share a version: wait for this refusal, not the last.
                wait_for(
                    lambda n=refusals_before, v=bad.version: refusal() == (n + 1, v),
                    f"{label} refused",
                )
                wait_for(lambda n=seen_before: len(traffic.explained) > n + 3, "traffic")
        assert traffic.failures == []
        status = client.get("/status").json()
        assert status["bundle_version"] == good
        assert "non-finite" in status["last_refused"]["error"]
        assert status["bundle_refusals"] == 3
        assert all(version == good for version, _ in traffic.explained)
        metrics = client.get("/metrics").text
        assert "power_aware_extender_bundle_reload_refusals_total 3.0" in metrics
        assert f'version="{good}"' in metrics
        assert json.loads(client.get("/readyz").text)["ready"] is True
