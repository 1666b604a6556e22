"""Benchmark the running extender: latency and throughput as kube-scheduler sees them.

Starts ``python -m extender`` as a subprocess on 127.0.0.1 with a fleet bundle (real
scikit-learn models through skl2onnx) and a 5000-node cluster snapshot, then sends requests
built the way kube-scheduler builds them (the real Pod JSON captured from kube-scheduler v1.28;
``NodeNames`` lists of 100, 500 and 5000 nodes; a full 500-node ``Nodes`` list of real Node
objects), one at a time like the serial scheduling cycle. Prints per scenario:

- server-side latency p50/p99 (``Server-Timing``'s ``app`` part: body in hand to answer built),
- client-observed latency p50/p99 and requests per second,

a scenario where each request names a different window of 500 of the 5000 nodes (as
kube-scheduler's sampling does below ``percentageOfNodesToScore: 100``: no cached candidate
list helps), and a last one with 500 names while the bundle is swapped kubelet-style every
1.5 s (each swap validates every model and tabulates 5000 curves in the background).

In the same run, the baselines:
- ``GET /healthz``, the HTTP floor of this server;
- the naive design through the same server (``bench.naive_extender``: the real service with
  one onnxruntime call per candidate node per request in place of the curve tables), 500 names;
- both designs in-process without HTTP (parse, score, answer, encode), and the naive design's
  model calls alone on the served bundle, the shipped bundle's trained models and a
  boosted-trees model;
- in process through the app's ASGI entry, a 500-name prioritize right after one node's
  annotations change: as served (the new node layout carries what the previous one derived
  for the unchanged nodes), against every node-derived table built from scratch, and against
  no change at all.

Targets on a 2-core machine: 500 names p99 <= 2 ms, 5000 names p99 <= 10 ms, and >= 50x
faster than naive at 500 nodes, read as server-side p50 of the naive service over the served
one (same server, parsing and encoding: only the design differs) for requests written in one
piece as kube-scheduler's transport writes them (``OneWriteClient``). The httpx figures are
printed next to it: httpx writes headers and body separately, and the server's clock, which
starts before the body is read, also counts the gap between the two writes.

    python3 -m bench.extender_latency [--requests 300] [--own-models 300] [--quiet]
    python3 -m bench.extender_latency --baseline REV   # today's code against REV's, side by side
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import numpy as np
from tqdm import tqdm

from bench.curves import build_fleet_bundle, percentiles_us
from bench.extender_baseline import compare, print_comparison
from bench.naive_extender import NaiveRuntime, run_naive_extender
from bench.support.bundles import DEFAULT_FEATURES, DEFAULT_FILL, KubeletMount, edit_manifest
from bench.support.http import OneWriteClient, Result, measure
from bench.support.server import REPO_ROOT, run_extender, write_snapshot
from extender.app import ExtenderApp, create_app
from extender.config import DEFAULT_BUNDLE_DIR as SHIPPED_BUNDLE
from extender.config import ExtenderConfig
from extender.protocol import encode, parse_extender_args, prioritize_result_arrays
from extender.runtime import Runtime
from extender.scoring import assess
from extender.sources.snapshot import DEMO_CLUSTER_FILE
from livedata.pod_resources import pod_cpu_demand_cores
from predictor.bundle import read_bundle, write_bundle
from predictor.model import Predictor
from training.export import model_to_onnx
from training.families import FAMILIES, fit_family

log = logging.getLogger("bench.extender_latency")

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "kube-scheduler-v1.28"
CLUSTER_NODES = 5000
TARGET_P99_MS = {"prioritize NodeNames 500": 2.0, "prioritize NodeNames 5000": 10.0}
TARGET_NAIVE_RATIO = 50.0
SWAP_POLL_INTERVAL_S = 0.2
SWAP_EVERY_S = 1.5
SWAP_REQUEST_FACTOR = 15  # enough requests to span several swaps
ROTATING_WINDOWS = 64  # distinct 500-name lists: more than any cache of candidate lists holds
NAIVE_REQUEST_DIVISOR = 5  # the naive service takes ~10 ms a request: fewer requests suffice
ONE_WRITE_500 = "prioritize 500, one write"
NAIVE_500 = "naive: prioritize 500"
NAIVE_ONE_WRITE_500 = "naive: prioritize 500, 1 write"


def node_names() -> list[str]:
    return [f"node-{i:05d}" for i in range(CLUSTER_NODES)]


def cluster_snapshot(path: Path) -> Path:
    rng = np.random.default_rng(3)
    energy = ["well-powered", "vulnerable", "low-powered", None, None]
    nodes = []
    for name in node_names():
        level = energy[int(rng.integers(len(energy)))]
        nodes.append(
            {
                "name": name,
                "allocatable_cpu": int(rng.choice([8, 16, 32, 64])),
                "labels": {"energy-status": level} if level else {},
                "telemetry": {
                    "cpu_util": float(rng.uniform(0.0, 0.9)),
                    "ambient_temp_c": float(rng.uniform(18, 30)),
                    "cpu1_temp_c": float(rng.uniform(35, 80)),
                    "cpu2_temp_c": float(rng.uniform(35, 80)),
                },
            }
        )
    return write_snapshot(path, nodes)


def scheduler_bodies() -> dict[str, bytes]:
    """Request bodies as kube-scheduler builds them, from its captured requests."""
    names = node_names()
    cached = json.loads((FIXTURES / "cache-capable" / "prioritize-request.json").read_bytes())
    bodies = {}
    for count in (100, 500, 5000):
        bodies[f"prioritize NodeNames {count}"] = json.dumps(
            {**cached, "NodeNames": names[:count]}
        ).encode()
    bodies["filter NodeNames 500"] = bodies["prioritize NodeNames 500"]
    full = json.loads((FIXTURES / "nocache" / "prioritize-request.json").read_bytes())
    template = full["Nodes"]["items"][0]
    items = []
    for name in names[:500]:
        node = copy.deepcopy(template)
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        items.append(node)
    bodies["prioritize Nodes 500"] = json.dumps(
        {**full, "Nodes": {**full["Nodes"], "items": items}}
    ).encode()
    return bodies


def rotating_bodies() -> list[bytes]:
    """500-name bodies, each a different window of the cluster (kube-scheduler's sampling)."""
    names = node_names()
    cached = json.loads((FIXTURES / "cache-capable" / "prioritize-request.json").read_bytes())
    bodies = []
    for window in range(ROTATING_WINDOWS):
        start = window * 97  # windows overlap but no two are the same list
        picked = [names[(start + i) % len(names)] for i in range(500)]
        bodies.append(json.dumps({**cached, "NodeNames": picked}).encode())
    return bodies


def one_write_scenario(url: str, name: str, body: bytes, count: int) -> Result:
    """Prioritize requests sent as kube-scheduler's transport sends them (one write each)."""
    client = OneWriteClient(url)
    try:
        return measure(client, name, lambda: client.post("/prioritize", body), len(body), count)
    finally:
        client.close()


def naive_request_ms(predictor: Predictor, nodes: list[dict], repeats: int) -> float:
    """p50 of one request done the naive way: one onnxruntime call per candidate node.

    Each call predicts the node at u and at u + d (a 100m pod), as a naive extender must.
    """
    pairs = []
    for node in nodes:
        row = predictor.feature_row(node["telemetry"])
        pair = np.array([row, row], dtype=np.float32)
        pair[1, 0] += 0.1 / node["allocatable_cpu"]
        pairs.append((node["name"], pair))

    def one_request() -> None:
        for name, pair in pairs:
            watts = predictor.predict_w(name, pair)
            float(watts[1] - watts[0])

    p50_us, _ = percentiles_us(one_request, repeats)
    return p50_us / 1e3


def in_process_request_us(runtime: Runtime, body: bytes, repeats: int) -> float:
    """p50 of one prioritize request's work without HTTP: parse, score, answer, encode (us)."""

    def one_request() -> None:
        args = parse_extender_args(body)
        now_s = runtime.clock()
        model = runtime.model
        assessment = assess(
            runtime.state.view(now_s),
            model.curves if model is not None else None,
            args.candidates,
            pod_cpu_demand_cores(args.pod),
            runtime.profile,
            now_s=now_s,
            telemetry_ttl_s=runtime.telemetry_ttl_s,
        )
        encode(prioritize_result_arrays(assessment.names, assessment.score))

    for _ in range(min(20, repeats)):  # warm-up, as for the served requests
        one_request()
    p50_us, _ = percentiles_us(one_request, repeats)
    return p50_us


def asgi_prioritize(loop: asyncio.AbstractEventLoop, app: ExtenderApp, body: bytes) -> bytes:
    """One POST /prioritize through the app's ASGI entry on `loop` (no server, no HTTP)."""
    answer: dict[str, bytes] = {}

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.body":
            answer["body"] = message["body"]  # type: ignore[assignment]

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/prioritize",
        "query_string": b"",
        "headers": [(b"content-length", str(len(body)).encode())],
    }
    loop.run_until_complete(app(scope, receive, send))  # type: ignore[arg-type]
    return answer["body"]


NO_CHANGE = "no node changed"
CHANGE_CARRIED = "one node changed (as served)"
CHANGE_REBUILT = "one node changed, built from scratch"


def node_change_us(runtime: Runtime, bodies: list[bytes], repeats: int) -> dict[str, float]:
    """p50 (us) of a 500-name prioritize through the app, in-process, in three situations.

    A node's info changing (a label, an annotation the controllers write) makes a new node
    layout. As served, the new layout takes what the previous one derived for the unchanged
    nodes; the baseline drops the previous layout first, so that everything the nodes alone
    decide (attributes, answer entries, lookups) is built from scratch for the request.
    """
    app = create_app(runtime)
    state = runtime.state
    nodes = list(state.view(runtime.clock())._layout.nodes)
    loop = asyncio.new_event_loop()
    for body in bodies:  # warm-up: every node-derived table exists
        asgi_prioritize(loop, app, body)
    figures = {}
    for situation in (NO_CHANGE, CHANGE_CARRIED, CHANGE_REBUILT):
        samples = []
        for turn in range(repeats):
            if situation != NO_CHANGE:
                node = nodes[turn % len(nodes)]
                changed = {**node.annotations, "bench/turn": f"{situation}-{turn}"}
                state.upsert_node(replace(node, annotations=changed))
            if situation == CHANGE_REBUILT:
                state._node_arrays = None  # the baseline: no previous layout to carry from
            start = time.perf_counter()
            asgi_prioritize(loop, app, bodies[turn % len(bodies)])
            samples.append(time.perf_counter() - start)
        figures[situation] = float(np.percentile(samples, 50)) * 1e6
    loop.close()
    return figures


def in_process_runtime(runtime_class: type[Runtime], bundle_dir: Path, snapshot: Path) -> Runtime:
    """A service runtime without its HTTP server or background threads."""
    config = ExtenderConfig(bundle_dir=bundle_dir, cluster_file=snapshot, port=0).validate()
    runtime = runtime_class(config)
    runtime.load_cluster()
    if not runtime.load_bundle():
        raise RuntimeError(f"cannot load the bundle at {bundle_dir}")
    return runtime


def shipped_candidates(predictor: Predictor, count: int) -> list[dict]:
    """The demo cluster's nodes cycled to ``count`` candidates (the shipped models' nodes)."""
    demo = {n["name"]: n for n in json.loads(DEMO_CLUSTER_FILE.read_text())["nodes"]}
    names = [n for n in predictor.bundle.nodes if n in demo]
    return [demo[names[i % len(names)]] for i in range(count)]


def gbr_bundle(directory: Path) -> Path:
    """A bundle whose fallback is the boosted-trees family (100 x depth 3) training offers."""
    rng = np.random.default_rng(4)
    rows = np.column_stack(
        [rng.uniform(0, 1, 4000), rng.uniform(18, 30, 4000), *rng.uniform(35, 80, (2, 4000))]
    ).astype(np.float32)
    power_w = 90 + 250 * rows[:, 0] ** 1.5 + 0.4 * rows[:, 2] + rng.normal(0, 2, 4000)
    model = fit_family(FAMILIES["gbr"], rows, power_w, seed=4)
    write_bundle(
        directory,
        features=DEFAULT_FEATURES,
        node_models={},
        node_info={},
        fallback_model=model_to_onnx(model, rows.shape[1]),
        fallback_info={"family": "gbr"},
        feature_fill=DEFAULT_FILL,
        extra={},
    )
    return directory


@dataclass
class SwapRun:
    result: Result
    swaps: int


def swapping_scenario(
    client: httpx.Client,
    mount: KubeletMount,
    bundle_dirs: tuple[Path, Path],
    bodies: dict[str, bytes],
    args: argparse.Namespace,
) -> SwapRun:
    """500-name prioritize requests while kubelet-style swaps alternate two bundle versions."""
    stop = threading.Event()

    def swap_forever() -> None:
        turn = 0
        while not stop.wait(SWAP_EVERY_S):
            turn += 1
            mount.project_bundle(bundle_dirs[turn % 2])

    body = bodies["prioritize NodeNames 500"]
    swaps_before = client.get("/status").json()["bundle_swaps"]
    swapper = threading.Thread(target=swap_forever, daemon=True)
    swapper.start()
    try:
        result = measure(
            client,
            "prioritize 500 during swaps",
            lambda: client.post("/prioritize", content=body),
            len(body),
            args.requests * SWAP_REQUEST_FACTOR,
        )
    finally:
        stop.set()
        swapper.join()
    return SwapRun(result, client.get("/status").json()["bundle_swaps"] - swaps_before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--requests", type=int, default=300, help="timed requests per scenario (default 300)"
    )
    parser.add_argument(
        "--own-models", type=int, default=300, help="nodes with their own model (default 300)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        default=None,
        help="instead of the full run, serve today's code and git revision REV's side by side "
        "on the same bundle and cluster and compare their server-side latency "
        "(bench.extender_baseline)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    for name in ("extender", "predictor"):  # the in-process runtimes' startup lines
        logging.getLogger(name).setLevel(logging.WARNING)
    quiet = args.quiet or not sys.stderr.isatty()
    if args.requests < 10 or args.own_models < 1:
        parser.error("need --requests >= 10 and --own-models >= 1")

    with tempfile.TemporaryDirectory() as tmp:
        bundle_dir = Path(tmp) / "bundle"
        build_fleet_bundle(bundle_dir, args.own_models, quiet)
        snapshot = cluster_snapshot(Path(tmp) / "cluster.json")
        bodies = scheduler_bodies()
        if args.baseline is not None:
            figures = compare(
                args.baseline,
                ["--bundle", str(bundle_dir), "--cluster", str(snapshot)],
                {**bodies, "prioritize 500, new list": rotating_bodies()[0]},
                args.requests,
                quiet=quiet,
            )
            print_comparison(args.baseline, figures)
            return 0
        body_500 = bodies["prioritize NodeNames 500"]
        windows = rotating_bodies()
        results: list[Result] = []
        # Served from a kubelet-style ConfigMap mount, so that the last scenario can swap it.
        mount = KubeletMount(Path(tmp) / "mount")
        mount.project_bundle(bundle_dir)
        other_dir = Path(tmp) / "bundle-b"
        shutil.copytree(bundle_dir, other_dir)
        edit_manifest(other_dir, version=read_bundle(bundle_dir).version + "-b")
        server_args = [
            "--bundle",
            str(mount.directory),
            "--cluster",
            str(snapshot),
            "--bundle-poll-interval",
            str(SWAP_POLL_INTERVAL_S),
        ]
        with run_extender(server_args) as service, httpx.Client(base_url=service.url) as client:
            scenarios: list[tuple[str, Callable[[], httpx.Response], int, int]] = [
                ("GET /healthz (HTTP floor)", lambda: client.get("/healthz"), 0, args.requests)
            ]
            for name, body in bodies.items():
                verb = name.split()[0]
                count = args.requests if len(body) < 1_000_000 else max(10, args.requests // 3)

                def send(verb: str = verb, body: bytes = body) -> httpx.Response:
                    return client.post(f"/{verb}", content=body)

                scenarios.append((name, send, len(body), count))
            turn = iter(range(10**9))

            def send_window() -> httpx.Response:
                return client.post("/prioritize", content=windows[next(turn) % len(windows)])

            scenarios.append(
                ("prioritize 500, new list each", send_window, len(windows[0]), args.requests)
            )
            for name, send, size, count in tqdm(
                scenarios, desc="scenarios", disable=quiet, file=sys.stderr
            ):
                results.append(measure(client, name, send, size, count))
            results.append(one_write_scenario(service.url, ONE_WRITE_500, body_500, args.requests))
            swaps = swapping_scenario(client, mount, (bundle_dir, other_dir), bodies, args)
            results.append(swaps.result)

        log.info("serving the naive design (one onnxruntime call per node) for the same requests")
        naive_args = ["--bundle", str(bundle_dir), "--cluster", str(snapshot)]
        naive_count = max(20, args.requests // NAIVE_REQUEST_DIVISOR)
        with (
            run_naive_extender(naive_args, Path(tmp) / "naive.log") as naive_url,
            httpx.Client(base_url=naive_url, timeout=30) as naive_client,
        ):
            naive_served = measure(
                naive_client,
                NAIVE_500,
                lambda: naive_client.post("/prioritize", content=body_500),
                len(body_500),
                naive_count,
            )
            results.append(naive_served)
            results.append(
                one_write_scenario(naive_url, NAIVE_ONE_WRITE_500, body_500, naive_count)
            )

        log.info("timing both designs in-process (no HTTP)")
        in_process_us = {
            "served design": in_process_request_us(
                in_process_runtime(Runtime, bundle_dir, snapshot), body_500, args.requests
            ),
            "naive design": in_process_request_us(
                in_process_runtime(NaiveRuntime, bundle_dir, snapshot), body_500, 20
            ),
        }
        log.info("timing the first request after one node changes, in-process")
        node_change = node_change_us(
            in_process_runtime(Runtime, bundle_dir, snapshot), windows, args.requests
        )
        log.info("timing the naive design's model calls alone")
        cluster = json.loads(snapshot.read_text())["nodes"][:500]
        naive = {"fleet bundle (served)": naive_request_ms(Predictor.load(bundle_dir), cluster, 10)}
        if SHIPPED_BUNDLE.is_dir():
            shipped = Predictor.load(SHIPPED_BUNDLE)
            naive["shipped bundle"] = naive_request_ms(
                shipped, shipped_candidates(shipped, 500), 10
            )
        log.info("fitting a boosted-trees model for the third naive baseline")
        gbr = Predictor.load(gbr_bundle(Path(tmp) / "gbr"))
        naive["boosted trees (gbr)"] = naive_request_ms(gbr, cluster, 5)

    print(f"\nextender latency, {CLUSTER_NODES}-node snapshot, {args.own_models} own models")
    print(
        f"{'scenario':<31} {'body KiB':>9} {'server ms p50/p99':>15}  "
        f"{'client ms p50/p99':>15} {'req/s':>8}"
    )
    for result in results:
        print(result.row())
    print(
        f"(during the swap scenario the service swapped bundles {swaps.swaps} times: each swap "
        f"validates {args.own_models + 1} models and tabulates {CLUSTER_NODES} curves)"
    )
    by_name = {r.name: r for r in results}
    floor = by_name["GET /healthz (HTTP floor)"]
    served_500 = by_name["prioritize NodeNames 500"]

    def p50(samples: np.ndarray) -> float:
        return float(np.percentile(samples, 50))

    naive_one_write = by_name[NAIVE_ONE_WRITE_500]
    served_one_write = by_name[ONE_WRITE_500]
    server_ratio = p50(naive_served.server_ms) / p50(served_500.server_ms)
    one_write_ratio = p50(naive_one_write.server_ms) / p50(served_one_write.server_ms)
    client_ratio = p50(naive_served.client_ms) / p50(served_500.client_ms)
    compute_ratio = in_process_us["naive design"] / in_process_us["served design"]
    print("\nnaive design (one onnxruntime call per candidate node per request), 500 names:")
    print(
        f"  same server, requests in one write (as kube-scheduler sends them): server p50 "
        f"{p50(naive_one_write.server_ms):.2f} ms vs {p50(served_one_write.server_ms):.3f} ms "
        f"served -> {one_write_ratio:.0f}x (the target's ratio)"
    )
    print(
        f"  same server, httpx requests (headers and body in two writes): server p50 "
        f"{p50(naive_served.server_ms):.2f} ms vs {p50(served_500.server_ms):.3f} ms served -> "
        f"{server_ratio:.0f}x"
    )
    print(
        f"  as an httpx client sees it: client p50 {p50(naive_served.client_ms):.2f} ms vs "
        f"{p50(served_500.client_ms):.3f} ms served -> {client_ratio:.0f}x (HTTP included)"
    )
    print(
        f"  in-process, no HTTP (parse, score, answer, encode): naive "
        f"{in_process_us['naive design'] / 1e3:.2f} ms vs served "
        f"{in_process_us['served design']:.0f} us -> {compute_ratio:.0f}x"
    )
    served_server_p50 = p50(served_500.server_ms)
    for label, naive_ms in naive.items():
        print(
            f"  model calls alone, {label}: {naive_ms:.1f} ms per request -> "
            f"{naive_ms / served_server_p50:.0f}x the served server p50"
        )
    print("\na node's labels or annotations changing, 500 names, in-process (p50):")
    for situation, micros in node_change.items():
        print(f"  {situation:<38} {micros / 1e3:6.2f} ms")
    print(
        f"  a change costs the request after it "
        f"{(node_change[CHANGE_CARRIED] - node_change[NO_CHANGE]) / 1e3:.2f} ms as served, "
        f"{(node_change[CHANGE_REBUILT] - node_change[NO_CHANGE]) / 1e3:.2f} ms built from "
        f"scratch ({CLUSTER_NODES} nodes)"
    )
    floor_p50 = p50(floor.client_ms)
    print(
        f"HTTP floor (GET /healthz) client p50 {floor_p50:.3f} ms: prioritize 500 names costs "
        f"{p50(served_500.client_ms) / floor_p50:.1f}x the floor"
    )
    nodes_500 = by_name["prioritize Nodes 500"]
    print(
        f"a full 500-node Nodes body is {nodes_500.body_bytes / 1024:.0f} KiB "
        f"({nodes_500.body_bytes / 500:.0f} bytes per bare node)"
    )
    for name, target in TARGET_P99_MS.items():
        p99 = float(np.percentile(by_name[name].server_ms, 99))
        verdict = "ok" if p99 <= target else "MISSED"
        print(f"target {name}: server p99 {p99:.3f} ms <= {target} ms: {verdict}")
    for label, ratio in (
        ("server-side p50, same server, one-write requests", one_write_ratio),
        ("server-side p50, same server, httpx requests", server_ratio),
    ):
        print(
            f"target naive / served at 500 nodes >= {TARGET_NAIVE_RATIO:.0f}x ({label}): "
            f"{ratio:.0f}x: {'ok' if ratio >= TARGET_NAIVE_RATIO else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
