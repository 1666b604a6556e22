"""Soak the running extender: sustained serial prioritize traffic with bundle swaps during it.

kube-scheduler calls its extender from one scheduling cycle at a time, so the highest rate it
can send is one request right after the previous answer. This bench does exactly that for
``--duration`` seconds (default 10 minutes) against ``python -m extender`` on 127.0.0.1, with a
5000-node cluster snapshot and a fleet bundle (real ONNX models), mounted the way kubelet mounts
a ConfigMap and swapped for another version every ``--swap-every`` seconds (each swap validates
every model and re-tabulates 5000 curves in the service's background). Each request is a real
kube-scheduler v1.28 Pod with a fresh name, uid and CPU request over ``--nodes`` NodeNames drawn
from the cluster, as the scheduler's feasible set changes from pod to pod.

Printed per window (``--window`` seconds, default 60): requests, errors, client latency
p50/p99/max, server latency p50/p99 (``Server-Timing``) and the service's resident memory (RSS,
from /proc). At the end: total errors (must be 0), the bundle swaps the service made, and
whether memory levelled off (RSS growth over the second half of the run against the first).
Exit status 1 when there were errors or memory kept growing.

    python3 -m bench.soak [--duration 600] [--window 60] [--swap-every 30] [--nodes 500]
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from tqdm import tqdm

from bench.curves import build_fleet_bundle
from bench.extender_latency import FIXTURES, cluster_snapshot, node_names
from bench.support.bundles import KubeletMount, edit_manifest
from bench.support.server import run_extender
from predictor.bundle import read_bundle

log = logging.getLogger("bench.soak")

SERVER_TIMING = re.compile(r"app;dur=([0-9.]+)")
CLIENT_TIMEOUT_S = 5.0
SWAP_POLL_INTERVAL_S = 0.5
# Memory "levelled off" when the second half of the run grew RSS by less than this share of
# the mid-run RSS (allocator noise and caches warming stay well below it; a leak of even a
# few hundred bytes per request does not).
MAX_LATE_GROWTH_SHARE = 0.05
MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass
class Window:
    started_s: float
    client_ms: list[float] = field(default_factory=list)
    server_ms: list[float] = field(default_factory=list)
    errors: int = 0
    rss_bytes: int = 0

    def row(self) -> str:
        client = np.asarray(self.client_ms) if self.client_ms else np.zeros(1)
        server = np.asarray(self.server_ms) if self.server_ms else np.zeros(1)
        return (
            f"{self.started_s:7.0f} {len(self.client_ms):8d} {self.errors:6d} "
            f"{np.percentile(client, 50):7.3f} {np.percentile(client, 99):7.3f} "
            f"{client.max():7.2f} {np.percentile(server, 50):7.3f} "
            f"{np.percentile(server, 99):7.3f} {self.rss_bytes / MIB:8.1f}"
        )


HEADER = (
    f"{'t_s':>7} {'requests':>8} {'errors':>6} {'p50_ms':>7} {'p99_ms':>7} {'max_ms':>7} "
    f"{'srv_p50':>7} {'srv_p99':>7} {'rss_MiB':>8}"
)


class RequestMaker:
    """kube-scheduler prioritize bodies: one Pod after another over changing feasible sets."""

    def __init__(self, nodes_per_request: int, seed: int = 11) -> None:
        self._template = json.loads(
            (FIXTURES / "cache-capable" / "prioritize-request.json").read_bytes()
        )
        self._names = np.asarray(node_names())
        self._count = nodes_per_request
        self._rng = np.random.default_rng(seed)
        self._serial = 0

    def next(self) -> tuple[bytes, list[str]]:
        self._serial += 1
        pod = self._template["Pod"]
        metadata = {
            **pod["metadata"],
            "name": f"soak-{self._serial}",
            "uid": f"soak-{self._serial}",
        }
        container = dict(pod["spec"]["containers"][0])
        cpu_m = int(self._rng.choice([50, 100, 250, 500, 1000, 2000]))
        container["resources"] = {"requests": {"cpu": f"{cpu_m}m", "memory": "64Mi"}}
        spec = {**pod["spec"], "containers": [container]}
        start = int(self._rng.integers(0, len(self._names) - self._count))
        names = self._names[start : start + self._count].tolist()
        body = {
            **self._template,
            "Pod": {**pod, "metadata": metadata, "spec": spec},
            "NodeNames": names,
        }
        return json.dumps(body).encode(), names


def answer_error(response: httpx.Response, names: list[str]) -> str | None:
    """Why an answer is not one kube-scheduler accepts for this request, or None."""
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    answer = response.json()
    if [entry["Host"] for entry in answer] != names:
        return "hosts differ from the requested NodeNames"
    if not all(type(e["Score"]) is int and 0 <= e["Score"] <= 10 for e in answer):
        return "a score outside the integers 0..10"
    return None


def swap_forever(
    mount: KubeletMount, bundles: tuple[Path, Path], every_s: float, stop: threading.Event
) -> None:
    turn = 0
    while not stop.wait(every_s):
        turn += 1
        mount.project_bundle(bundles[turn % 2])


def soak(
    client: httpx.Client, pid: int, args: argparse.Namespace, quiet: bool
) -> tuple[list[Window], dict[str, int]]:
    maker = RequestMaker(args.nodes)
    first_errors: dict[str, int] = {}
    started = time.monotonic()
    windows = [Window(0.0)]
    progress = tqdm(total=int(args.duration), desc="soak", unit="s", disable=quiet, file=sys.stderr)
    while (elapsed_s := time.monotonic() - started) < args.duration:
        if elapsed_s - windows[-1].started_s >= args.window:
            windows[-1].rss_bytes = rss_bytes(pid)
            progress.update(int(elapsed_s) - progress.n)
            windows.append(Window(windows[-1].started_s + args.window))
        window = windows[-1]
        body, names = maker.next()
        sent = time.perf_counter()
        try:
            response = client.post("/prioritize", content=body)
            problem = answer_error(response, names)
        except httpx.HTTPError as exc:
            response, problem = None, f"{type(exc).__name__}: {exc}"
        window.client_ms.append((time.perf_counter() - sent) * 1000.0)
        if response is not None and (
            timing := SERVER_TIMING.search(response.headers.get("server-timing", ""))
        ):
            window.server_ms.append(float(timing.group(1)))
        if problem is not None:
            window.errors += 1
            first_errors[problem] = first_errors.get(problem, 0) + 1
    windows[-1].rss_bytes = rss_bytes(pid)
    progress.update(int(args.duration) - progress.n)
    progress.close()
    return windows, first_errors


def memory_verdict(windows: list[Window]) -> tuple[bool, str]:
    rss = [w.rss_bytes for w in windows]
    if len(rss) < 3:
        return True, "too few windows to judge memory growth (need >= 3)"
    mid = rss[len(rss) // 2]
    early_growth = mid - rss[0]
    late_growth = rss[-1] - mid
    levelled = late_growth <= MAX_LATE_GROWTH_SHARE * mid
    return levelled, (
        f"RSS {rss[0] / MIB:.1f} MiB after the first window, {mid / MIB:.1f} MiB mid-run, "
        f"{rss[-1] / MIB:.1f} MiB at the end: first half +{early_growth / MIB:.1f} MiB, second "
        f"half {late_growth / MIB:+.1f} MiB ({'levelled off' if levelled else 'STILL GROWING'}; "
        f"limit {MAX_LATE_GROWTH_SHARE:.0%} of mid-run RSS)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per report row")
    parser.add_argument(
        "--swap-every", type=float, default=30.0, help="seconds between bundle swaps"
    )
    parser.add_argument("--nodes", type=int, default=500, help="NodeNames per request")
    parser.add_argument(
        "--own-models", type=int, default=300, help="nodes with their own model in the bundle"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if not (args.duration > 0 and args.window > 0 and args.swap_every > 0):
        parser.error("--duration, --window and --swap-every must be positive")
    if not 1 <= args.nodes <= len(node_names()) - 1 or args.own_models < 1:
        parser.error(f"--nodes must be 1..{len(node_names()) - 1}, --own-models >= 1")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    quiet = args.quiet or not sys.stderr.isatty()

    with tempfile.TemporaryDirectory() as tmp:
        bundle_a = Path(tmp) / "bundle-a"
        build_fleet_bundle(bundle_a, args.own_models, quiet)
        bundle_b = Path(tmp) / "bundle-b"
        shutil.copytree(bundle_a, bundle_b)
        edit_manifest(bundle_b, version=read_bundle(bundle_a).version + "-b")
        mount = KubeletMount(Path(tmp) / "mount")
        mount.project_bundle(bundle_a)
        snapshot = cluster_snapshot(Path(tmp) / "cluster.json")
        server_args = [
            "--bundle", str(mount.directory),
            "--cluster", str(snapshot),
            "--bundle-poll-interval", str(SWAP_POLL_INTERVAL_S),
        ]  # fmt: skip
        with (
            run_extender(server_args) as service,
            httpx.Client(base_url=service.url, timeout=CLIENT_TIMEOUT_S) as client,
        ):
            log.info(
                "soaking %s for %.0f s: prioritize over %d of 5000 nodes, serial; bundle swap "
                "every %.0f s",
                service.url, args.duration, args.nodes, args.swap_every,
            )  # fmt: skip
            swaps_before = client.get("/status").json()["bundle_swaps"]
            stop = threading.Event()
            swapper = threading.Thread(
                target=swap_forever,
                args=(mount, (bundle_a, bundle_b), args.swap_every, stop),
                daemon=True,
            )
            swapper.start()
            try:
                windows, problems = soak(client, service.process.pid, args, quiet)
            finally:
                stop.set()
                swapper.join()
            status = client.get("/status").json()
            swaps = status["bundle_swaps"] - swaps_before
            internal = sum(
                float(value)
                for value in re.findall(
                    r'request_errors_total\{[^}]*kind="internal"[^}]*\} (\S+)',
                    client.get("/metrics").text,
                )
            )

    print(HEADER)
    for window in windows:
        print(window.row())
    total = sum(len(w.client_ms) for w in windows)
    errors = sum(w.errors for w in windows)
    all_client = np.concatenate([np.asarray(w.client_ms) for w in windows if w.client_ms])
    print(
        f"\n{total} requests in {args.duration:.0f} s ({total / args.duration:.0f}/s), "
        f"{errors} errors, {internal:.0f} internal errors counted by the service; "
        f"client p50 {np.percentile(all_client, 50):.3f} ms, p99 "
        f"{np.percentile(all_client, 99):.3f} ms, max {all_client.max():.2f} ms"
    )
    for problem, count in problems.items():
        print(f"  {count} x {problem}")
    print(f"bundle swaps during the run: {swaps} (serving {status['bundle_version']})")
    levelled, verdict = memory_verdict(windows)
    print(verdict)
    return 0 if errors == 0 and internal == 0 and levelled else 1


if __name__ == "__main__":
    sys.exit(main())
