"""Model swap against kubelet's exact ConfigMap volume layout: good bundles swap in, bad ones
(bad sha256, truncated ONNX, NaN, decreasing, implausible, vanished) are refused and the old
one keeps serving."""

from __future__ import annotations

import json
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from predictor.bundle import MANIFEST_NAME
from predictor.model import Predictor
from predictor.reload import BundleWatcher, ModelHolder
from predictor.validation import validate_predictor
from tests.support.bundles import (
    KubeletMount,
    PowerCurveSpec,
    corrupt_model_bytes,
    make_bundle,
    truncate_model,
)

GOOD_V1 = {"node-a": PowerCurveSpec(100.0, 300.0)}
GOOD_V2 = {"node-a": PowerCurveSpec(120.0, 420.0, exponent=2)}
FLEET = PowerCurveSpec(80.0, 250.0)


class Recorder:
    """on_swap target: what the service would hold, plus every version handed over."""

    def __init__(self) -> None:
        self.current: Predictor | None = None
        self.versions: list[str] = []
        self.swapped = threading.Event()

    def __call__(self, predictor: Predictor) -> None:
        self.current = predictor
        self.versions.append(predictor.version)
        self.swapped.set()


@pytest.fixture
def build(tmp_path: Path) -> Callable[..., Path]:
    counter = iter(range(1000))

    def _build(
        curves: dict,
        breaker: Callable[[Path], None] | None = None,
        fallback: PowerCurveSpec = FLEET,
    ) -> Path:
        directory = tmp_path / f"src-{next(counter)}"
        make_bundle(directory, curves, fallback=fallback)
        if breaker is not None:
            breaker(directory)
        return directory

    return _build


@pytest.fixture
def mounted(
    tmp_path: Path, build: Callable[..., Path]
) -> tuple[KubeletMount, BundleWatcher, Recorder]:
    mount = KubeletMount(tmp_path / "models")
    mount.project_bundle(build(GOOD_V1))
    recorder = Recorder()
    watcher = BundleWatcher(mount.directory, recorder)
    assert watcher.check_now()
    return mount, watcher, recorder


def test_initial_load_and_good_swap(
    mounted: tuple[KubeletMount, BundleWatcher, Recorder], build: Callable[..., Path]
) -> None:
    mount, watcher, recorder = mounted
    v1 = recorder.versions[0]
    assert watcher.current_version == v1
    assert not watcher.check_now()  # nothing changed: no reload
    source = build(GOOD_V2)
    mount.project_bundle(source)
    assert watcher.check_now()
    assert recorder.versions == [v1, Predictor.load(source).version]
    watts = recorder.current.predict_w("node-a", np.array([[1.0, 24.0, 50.0, 50.0]], np.float32))
    assert watts[0] == pytest.approx(420.0, abs=0.05)  # the new bundle's curve
    assert watcher.counters.swaps == 2 and watcher.counters.refusals == 0
    assert watcher.last_refused is None


def _bad_sha(directory: Path) -> None:
    corrupt_model_bytes(directory, "node-a")


def _truncated(directory: Path) -> None:
    truncate_model(directory, "node-a")


# case -> (node curves, fallback curve, what breaks the written bundle, expected error)
BAD_CASES = {
    "bad sha256": (GOOD_V2, FLEET, _bad_sha, r"field 'sha256': the file's hash"),
    "truncated onnx": (GOOD_V2, FLEET, _truncated, r"onnxruntime cannot load the model"),
    "nan model": (
        {"node-a": PowerCurveSpec(100.0, 300.0, nan_output=True)},
        FLEET,
        None,
        r"node 'node-a' model at ambient 18 C, cpu 43 C at u=0\.5: "
        r"predicts a non-finite value at u=0",
    ),
    "decreasing model": (
        {"node-a": PowerCurveSpec(300.0, 100.0)},
        FLEET,
        None,
        r"node 'node-a' model .*: power decreases with utilisation, 300\.0 W at u=0 to 280\.0 W",
    ),
    "implausible watts": (
        {"node-a": PowerCurveSpec(30_000.0, 40_000.0)},
        FLEET,
        None,
        r"predicts 30000\.0 W at u=0, outside the plausible \(0, 20000\) W",
    ),
    "decreasing fallback": (
        GOOD_V2,
        PowerCurveSpec(250.0, 80.0),
        None,
        r"node '\(fallback\)' model",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_bundle_is_refused_and_old_one_kept(
    case: str,
    mounted: tuple[KubeletMount, BundleWatcher, Recorder],
    build: Callable[..., Path],
) -> None:
    mount, watcher, recorder = mounted
    curves, fallback, breaker, message = BAD_CASES[case]
    source = build(curves, breaker, fallback)
    bad_version = json.loads((source / MANIFEST_NAME).read_text())["version"]
    v1 = watcher.current_version

    mount.project_bundle(source)
    assert not watcher.check_now()
    assert recorder.versions == [v1]  # on_swap never saw the bad bundle
    assert watcher.current_version == v1
    refused = watcher.last_refused
    assert refused is not None and refused.version == bad_version
    assert re.search(message, refused.error), refused.error
    assert watcher.counters.refusals == 1
    status = watcher.status()
    assert status["bundle_version"] == v1
    assert status["last_refused"]["version"] == bad_version
    assert status["bundle_refusals"] == 1

    assert not watcher.check_now()  # the same bad bundle is not re-tried every poll
    assert watcher.counters.refusals == 1

    mount.project_bundle(build(GOOD_V2))  # the next good bundle swaps in
    assert watcher.check_now()
    assert len(recorder.versions) == 2


def test_vanished_directory_keeps_old_bundle(
    mounted: tuple[KubeletMount, BundleWatcher, Recorder], build: Callable[..., Path]
) -> None:
    mount, watcher, recorder = mounted
    v1 = watcher.current_version
    shutil.rmtree(mount.directory)
    assert not watcher.check_now()
    assert watcher.current_version == v1 and recorder.versions == [v1]
    assert watcher.last_refused.version is None
    assert watcher.last_refused.error.endswith("models: bundle directory is missing")
    assert watcher.counters.refusals == 1
    # kubelet remounts: the watcher picks it up again
    KubeletMount(mount.directory).project_bundle(build(GOOD_V2))
    assert watcher.check_now()
    assert len(recorder.versions) == 2


def test_dangling_data_link_is_a_refusal(
    mounted: tuple[KubeletMount, BundleWatcher, Recorder],
) -> None:
    mount, watcher, recorder = mounted
    shutil.rmtree(mount.directory / mount.data_target)
    assert not watcher.check_now()
    assert "bundle directory is missing" in watcher.last_refused.error
    assert len(recorder.versions) == 1


# kubelet's swap seen half-way: the flaky extra refusal of the swap test under CPU load.
# A watcher that reads `..data`, loses the CPU while kubelet renames `..data` and deletes the
# old payload, then looks at (or loads from) that deleted payload must read what is mounted
# now instead of refusing a bundle that is no longer there.


def test_a_swap_between_reading_the_link_and_the_payload_is_not_a_refusal(
    mounted: tuple[KubeletMount, BundleWatcher, Recorder],
    build: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import predictor.reload as reload

    mount, watcher, recorder = mounted
    v2, v3 = build(GOOD_V2), build(GOOD_V1, fallback=PowerCurveSpec(70.0, 260.0))
    mount.project_bundle(v2)
    real_readlink = reload.os.readlink
    swaps = iter([v3])

    def readlink_then_kubelet_swaps(path):  # the watcher's read, then kubelet's whole swap
        target = real_readlink(path)
        for source in swaps:
            mount.project_bundle(source)  # renames ..data and deletes the payload just read
        return target

    monkeypatch.setattr(reload.os, "readlink", readlink_then_kubelet_swaps)
    assert watcher.check_now()
    assert watcher.counters.refusals == 0, watcher.last_refused
    assert watcher.current_version == Predictor.load(v3).version
    assert recorder.versions[-1] == Predictor.load(v3).version


def test_a_swap_while_the_payload_is_being_loaded_is_not_a_refusal(
    tmp_path: Path, build: Callable[..., Path]
) -> None:
    from predictor.validation import load_validated

    mount = KubeletMount(tmp_path / "models")
    mount.project_bundle(build(GOOD_V1))
    v2, v3 = build(GOOD_V2), build(GOOD_V1, fallback=PowerCurveSpec(70.0, 260.0))
    swaps: list[Path] = []

    def load_while_kubelet_swaps(path: Path) -> Predictor:
        while swaps:
            mount.project_bundle(swaps.pop())  # deletes `path` before it is read
        return load_validated(path)

    recorder = Recorder()
    watcher = BundleWatcher(mount.directory, recorder, loader=load_while_kubelet_swaps)
    assert watcher.check_now()
    mount.project_bundle(v2)
    swaps.append(v3)
    assert watcher.check_now()
    assert watcher.counters.refusals == 0, watcher.last_refused
    assert recorder.versions[-1] == Predictor.load(v3).version


def test_refusals_are_logged_for_a_person(
    mounted: tuple[KubeletMount, BundleWatcher, Recorder],
    build: Callable[..., Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    mount, watcher, _ = mounted
    serving = watcher.current_version
    bad = build(GOOD_V2, _truncated)
    bad_version = json.loads((bad / MANIFEST_NAME).read_text())["version"]
    mount.project_bundle(bad)
    with caplog.at_level("ERROR", logger="predictor.reload"):
        assert not watcher.check_now()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "predictor.reload"]
    assert line.startswith(
        f"refused version {bad_version} of the model bundle in {mount.directory}: "
    )
    assert "onnxruntime cannot load the model" in line
    assert line.endswith(f". Version {serving} keeps serving.")

    caplog.clear()
    empty = BundleWatcher(tmp_path_of(mount) / "nothing-here", Recorder())
    with caplog.at_level("ERROR", logger="predictor.reload"):
        assert not empty.check_now()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "predictor.reload"]
    assert "None" not in line and "version" not in line
    assert line.endswith(
        "bundle directory is missing. No bundle is serving: the extender is not ready until a "
        "valid one appears."
    )


def tmp_path_of(mount: KubeletMount) -> Path:
    return mount.directory.parent


def test_plain_directory_rewritten_by_write_bundle(tmp_path: Path) -> None:
    directory = tmp_path / "plain"
    make_bundle(directory, GOOD_V1, fallback=FLEET)
    recorder = Recorder()
    watcher = BundleWatcher(directory, recorder)
    assert watcher.check_now()
    assert not watcher.check_now()
    make_bundle(directory, GOOD_V2, fallback=FLEET)
    assert watcher.check_now()
    assert len(set(recorder.versions)) == 2


def test_background_thread_notices_a_swap(tmp_path: Path, build: Callable[..., Path]) -> None:
    mount = KubeletMount(tmp_path / "models")
    mount.project_bundle(build(GOOD_V1))
    recorder = Recorder()
    watcher = BundleWatcher(mount.directory, recorder, poll_interval_s=0.05)
    watcher.start()
    try:
        assert recorder.swapped.wait(30)
        recorder.swapped.clear()
        mount.project_bundle(build(GOOD_V2))
        assert recorder.swapped.wait(30)
    finally:
        watcher.stop()
    assert len(recorder.versions) == 2
    assert watcher._thread is None


def test_good_bundles_pass_validation(build: Callable[..., Path]) -> None:
    validate_predictor(Predictor.load(build(GOOD_V2)))  # raises on failure


def test_model_holder_stamps_curves_with_the_callers_clock(build: Callable[..., Path]) -> None:
    now_s = [1000.0]
    holder = ModelHolder(lambda: {}, clock=lambda: now_s[0])
    holder.install(Predictor.load(build(GOOD_V1)))
    assert holder.state.built_at_s == 1000.0
    now_s[0] = 1015.0
    holder.refresh()
    assert holder.state.built_at_s == 1015.0


def test_model_holder_swaps_predictor_and_curves_together(
    tmp_path: Path, build: Callable[..., Path]
) -> None:
    telemetry = {
        "node-a": {"cpu_util": 0.5, "ambient_temp_c": 24.0, "cpu1_temp_c": 50.0},
        "node-b": {"cpu_util": 0.2, "ambient_temp_c": 24.0, "cpu1_temp_c": 45.0},
    }
    holder = ModelHolder(lambda: telemetry)
    assert holder.state is None and holder.refresh() is None
    sources = [build(GOOD_V1), build(GOOD_V2)]
    predictors = [Predictor.load(s) for s in sources]
    holder.install(predictors[0])

    mismatches: list[str] = []
    reads = 0
    stop = threading.Event()

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            state = holder.state
            if state.curves.version != state.predictor.version:
                mismatches.append(state.curves.version)
            reads += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(20):
            holder.install(predictors[i % 2])
            telemetry["node-a"] = {**telemetry["node-a"], "cpu_util": 0.3 + i / 100}
            holder.refresh()
    finally:
        stop.set()
        thread.join()
    assert reads > 0 and mismatches == []
    state = holder.state
    assert state.predictor is predictors[1]
    assert state.curves.util_now[state.curves.row_of("node-a")] == pytest.approx(0.49)


def test_failing_on_swap_is_a_refusal(tmp_path: Path, build: Callable[..., Path]) -> None:
    source = build(GOOD_V1)

    def on_swap(predictor: Predictor) -> None:
        raise RuntimeError("curve build exploded")

    watcher = BundleWatcher(source, on_swap)
    assert not watcher.check_now()
    assert watcher.current_version is None
    assert watcher.last_refused.version == Predictor.load(source).version
    assert "installing failed: curve build exploded" in watcher.last_refused.error


@pytest.mark.slow
def test_a_bundle_trained_by_training_fit_is_accepted(tmp_path: Path) -> None:
    """The probe grid must not refuse what our own training produces from sane data.

    Smooth families only: they are the ones whose P(u) stays monotone when the CPU temperature
    moves along the thermal slope (a fleet-wide tree fallback keyed on temperature may not,
    and is then rightly refused).
    """
    from training.dataset import clean_metrics
    from training.fit import FitSettings, fit_fleet
    from training.synth import synth_fleet

    raw = synth_fleet(n_nodes=6, hours=24, step_s=60, seed=11)
    settings = FitSettings(families=("poly3", "poly5", "poly5t2"))
    fit_fleet(
        clean_metrics(raw, source="synth"),
        tmp_path / "trained",
        settings=settings,
        jobs=1,
        progress=False,
    )
    mount = KubeletMount(tmp_path / "models")
    mount.project_bundle(tmp_path / "trained")
    recorder = Recorder()
    watcher = BundleWatcher(mount.directory, recorder)
    assert watcher.check_now(), watcher.last_refused
    assert recorder.current.bundle.fallback is not None
    assert len(recorder.current.bundle.nodes) >= 1


# --- the running service, requests flowing while kubelet swaps bundles underneath ---------


def _top_host(answer: list[dict]) -> str:
    return max(answer, key=lambda entry: entry["Score"])["Host"]


@pytest.mark.slow
def test_service_keeps_answering_through_swaps(tmp_path: Path, build: Callable[..., Path]) -> None:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from extender.metrics import PREFIX
    from tests.support.server import extender_service, write_snapshot

    fixtures = Path(__file__).parent / "fixtures" / "kube-scheduler-v1.28" / "cache-capable"
    prioritize = (fixtures / "prioritize-request.json").read_bytes()
    filter_body = (fixtures / "filter-request.json").read_bytes()
    names = json.loads(prioritize)["NodeNames"]  # node-a, node-b, node-c
    telemetry = {"cpu_util": 0.4, "ambient_temp_c": 22.0, "cpu1_temp_c": 50.0}
    snapshot = write_snapshot(
        tmp_path / "cluster.json",
        [{"name": n, "allocatable_cpu": 8, "telemetry": telemetry} for n in names],
    )
    cheap, dear = PowerCurveSpec(100.0, 150.0), PowerCurveSpec(100.0, 500.0)
    a_cheapest = build({"node-a": cheap, "node-b": dear, "node-c": dear})
    b_cheapest = build({"node-a": dear, "node-b": cheap, "node-c": dear})
    version_of = {path: Predictor.load(path).version for path in (a_cheapest, b_cheapest)}
    steps: list[tuple[str, Path]] = [
        ("good", b_cheapest),
        ("bad", build({"node-a": dear, "node-b": dear, "node-c": cheap}, _bad_sha)),
        ("bad", build({"node-a": dear, "node-b": dear, "node-c": cheap}, _truncated)),
        ("bad", build({"node-c": PowerCurveSpec(100.0, 150.0, nan_output=True)})),
        ("good", a_cheapest),
        ("good", b_cheapest),
    ]
    mount = KubeletMount(tmp_path / "models")
    mount.project_bundle(a_cheapest)

    with (
        extender_service(mount.directory, snapshot, bundle_poll_interval_s=0.05) as (url, _rt),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        failures: list[str] = []
        answered = 0
        stop = threading.Event()

        def keep_scheduling() -> None:
            nonlocal answered
            with httpx.Client(base_url=url, timeout=30) as own:
                while not stop.is_set():
                    try:
                        scores = own.post("/prioritize", content=prioritize)
                        passing = own.post("/filter", content=filter_body)
                    except httpx.HTTPError as exc:
                        failures.append(f"{type(exc).__name__}: {exc}")
                        return
                    if scores.status_code != 200 or passing.status_code != 200:
                        failures.append(f"HTTP {scores.status_code}/{passing.status_code}")
                        continue
                    answer = scores.json()
                    if sorted(e["Host"] for e in answer) != sorted(names) or not all(
                        type(e["Score"]) is int and 0 <= e["Score"] <= 10 for e in answer
                    ):
                        failures.append(f"bad answer {answer}")
                    if _top_host(answer) not in ("node-a", "node-b"):
                        failures.append(f"top host from a refused bundle: {answer}")
                    answered += 1

        scheduler = threading.Thread(target=keep_scheduling)
        scheduler.start()
        try:
            serving = a_cheapest
            for kind, source in steps:
                before = answered
                refusals_before = client.get("/status").json()["bundle_refusals"]
                mount.project_bundle(source)
                expected = json.loads((source / MANIFEST_NAME).read_text())["version"]
                for _ in range(1200):  # the watcher polls every 0.05 s; generous bound
                    status = client.get("/status").json()
                    refused = status["last_refused"] or {}
                    if kind == "good" and status["bundle_version"] == expected:
                        break
                    # Two bad bundles may share a version: wait for this refusal, not the last.
                    if (
                        kind == "bad"
                        and status["bundle_refusals"] > refusals_before
                        and refused.get("version") == expected
                    ):
                        break
                    stop.wait(0.05)
                else:
                    pytest.fail(f"the service never took up {kind} bundle {expected}: {status}")
                if kind == "good":
                    serving = source
                assert status["bundle_version"] == version_of[serving]
                top = _top_host(client.post("/prioritize", content=prioritize).json())
                assert top == ("node-a" if serving == a_cheapest else "node-b")
                # requests kept flowing across the change
                while answered < before + 3 and scheduler.is_alive():
                    stop.wait(0.01)
        finally:
            stop.set()
            scheduler.join()

        assert failures == []
        assert answered >= 3 * len(steps)
        status = client.get("/status").json()
        assert status["bundle_version"] == version_of[b_cheapest]
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for s in family.samples
        }
        assert samples[(f"{PREFIX}_bundle_reload_refusals_total", ())] == 3
        internal = [k for k, v in samples.items() if ("kind", "internal") in k[1] and v > 0]
        assert internal == []
