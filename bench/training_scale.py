"""Benchmark training at fleet scale: collect, fit and export time and peak memory vs fleet size.

For every (nodes, rows per node) case (default 100 and 1000 nodes x 1k and 10k rows at 60 s):

1. a synthetic fleet is written as a directory of per-rack Parquet files
   (`training.synth.write_fleet_files`, `--nodes-per-file` nodes each; not timed as training);
2. a fresh Python process runs what `python -m training.fit --input DIR` runs: the directory is
   streamed (`training.dataset.stream_metrics`: read and cleaned one file at a time), every
   node is fitted over all cores, converted to ONNX, checked, and the bundle and report are
   written. It reports its wall time, CPU time, and the kernel's peak-RSS counts of itself and
   of its largest worker (`getrusage` SELF and CHILDREN: honest high-water marks, no sampling);
3. the bundle's size per node and per family is read back.

Collection from Prometheus is measured for real, at sizes that fit the time budget: a fleet is
turned into node_exporter / ipmi_exporter series, backfilled into a real Prometheus with
`promtool tsdb create-blocks-from openmetrics`, and read back in a fresh process with
`training.collect.collect_to_directory` (node-group Parquet files written one time chunk at a
time, what `python -m training.collect --nodes-per-file` does), so memory holds one chunk.
Two sizes give a cost per collected row (the slope, which leaves out fixed costs such as the
server's start); the collection time of the large cases is that slope times their rows:
EXTRAPOLATED, and printed as such.

Printed: one row per case with per-node costs, ratios against the smallest case measured in the
same run (time per node should stay flat; peak memory should not grow with nodes), the bundle
size by family with the ConfigMap limit, and the 5-minute target for 1000 nodes x 10k rows.

    python3 -m bench.training_scale            # default cases, ~6 minutes on 2 cores
    python3 -m bench.training_scale --nodes 20,100 --rows 1000 --collect-nodes 4,8   # quick
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.fit_export import status_mib
from predictor.bundle import read_bundle
from training.fit import setup_logging
from training.synth import write_fleet_files

log = logging.getLogger("bench.training_scale")

STEP_S = 60.0
CONFIGMAP_LIMIT_BYTES = 1024 * 1024  # Kubernetes refuses larger ConfigMaps (etcd value limit)
TARGET_S = 300.0  # issue 5: 1000 nodes x 10k rows collected, fitted and exported in 5 minutes
REPO = Path(__file__).resolve().parents[1]


# --- measurements, each in a fresh process ----------------------------------------------------


def _peak_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux reports KiB


def _cpu_s() -> float:
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _cpu_s_self() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def measure_fit(data_dir: str, out_dir: str, jobs: int) -> dict:
    """Stream, fit and export `data_dir` to `out_dir`; runs inside a fresh child process."""

    # the run's own log, with times, beside the bundle: where the minutes went
    handler = logging.FileHandler(f"{out_dir}.log", mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    training_log = logging.getLogger("training")
    training_log.addHandler(handler)
    level = training_log.level
    training_log.setLevel(logging.INFO)  # setLevel, not .level =: it clears isEnabledFor caches
    try:
        return _fit_and_measure(data_dir, out_dir, jobs)
    finally:
        training_log.removeHandler(handler)
        training_log.setLevel(level)
        handler.close()


def _fit_and_measure(data_dir: str, out_dir: str, jobs: int) -> dict:
    from training.dataset import stream_metrics
    from training.fit import FitSettings, fit_fleet

    baseline_mib = _peak_mib(resource.RUSAGE_SELF)  # interpreter + training imports
    cpu_before_s = _cpu_s()
    started = time.perf_counter()
    stream = stream_metrics(data_dir)
    planned = time.perf_counter()
    run = fit_fleet(stream, Path(out_dir), settings=FitSettings(), jobs=jobs, progress=False)
    finished = time.perf_counter()
    summary = run.report["summary"]
    return {
        "wall_s": finished - started,
        "plan_s": planned - started,
        "cpu_s": _cpu_s() - cpu_before_s,
        "workers_cpu_s": _cpu_s() - _cpu_s_self(),
        "load_avg_1m": os.getloadavg()[0],  # other work on the machine slows the wall time
        "baseline_mib": baseline_mib,
        "peak_self_mib": _peak_mib(resource.RUSAGE_SELF),
        "peak_worker_mib": _peak_mib(resource.RUSAGE_CHILDREN),
        "rows_used": run.report["input"]["rows_used"],
        "nodes_own": summary["nodes_own_model"],
        "median_mape_pct": summary["median_mape_pct"],
        "families": run.report["settings"]["families"],
    }


def _exporter_samples(frame, step_s: float) -> list:
    """node_exporter idle-CPU counters, node_uname_info, ipmi temperatures and DCMI power for a
    contract-1 table, as Prometheus would have scraped them."""
    samples: list = []
    for node, rows in frame.groupby("node", sort=True):
        times_s = (rows["timestamp"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
        util = rows["cpu_util"].to_numpy()
        idle_s = 10_000.0 + np.cumsum((1.0 - util) * step_s)
        cpu = {"instance": f"{node}:9100", "job": "node", "cpu": "0", "mode": "idle"}
        samples += [
            ("node_cpu_seconds_total", cpu, t, v) for t, v in zip(times_s, idle_s, strict=True)
        ]
        uname = {"instance": f"{node}:9100", "job": "node", "nodename": node}
        samples += [("node_uname_info", uname, t, 1.0) for t in times_s]
        ipmi = {"instance": f"{node}:9290", "job": "ipmi"}
        for column, name, sensor_id in (
            ("ambient_temp_c", "Inlet Temp", "1"),
            ("cpu1_temp_c", "CPU1 Temp", "2"),
            ("cpu2_temp_c", "CPU2 Temp", "3"),
        ):
            labels = {**ipmi, "name": name, "id": sensor_id}
            values = rows[column].to_numpy()
            samples += [
                ("ipmi_temperature_celsius", labels, t, v)
                for t, v in zip(times_s, values, strict=True)
                if not math.isnan(v)
            ]
        power = rows["power_w"].to_numpy()
        samples += [
            ("ipmi_dcmi_power_consumption_watts", ipmi, t, v)
            for t, v in zip(times_s, power, strict=True)
        ]
    return samples


def backfill_prometheus(n_nodes: int, rows: int, work_dir: str, seed: int) -> dict:
    """Write `n_nodes` x `rows` exporter samples into a Prometheus data directory with promtool
    (a server is started once to check the blocks load, then stopped). Runs in its own child,
    so the memory of making the test data is not counted as the collector's."""
    from tests.support.prometheus import start_prometheus, write_openmetrics
    from training.synth import synth_fleet

    frame = synth_fleet(n_nodes, rows * STEP_S / 3600.0, STEP_S, seed)
    started = time.perf_counter()
    samples = _exporter_samples(frame, STEP_S)
    text = write_openmetrics(samples)
    written = time.perf_counter()
    with start_prometheus(Path(work_dir), openmetrics_text=text):
        loaded = time.perf_counter()
    return {
        "samples": len(samples),
        "openmetrics_s": written - started,
        "backfill_and_start_s": loaded - written,
        "first_s": frame["timestamp"].min().timestamp(),
        "last_s": frame["timestamp"].max().timestamp(),
    }


def measure_collect(work_dir: str, first_s: float, last_s: float, chunk_points: int) -> dict:
    """Serve a backfilled data directory and collect it into node-group files
    (`collect_to_directory`), `chunk_points` steps at a time, in a fresh process."""
    from datetime import UTC, datetime

    from tests.support.prometheus import start_prometheus
    from training.collect import collect_to_directory, load_collect_config
    from training.dataset import stream_metrics

    with start_prometheus(Path(work_dir)) as prometheus:
        config = load_collect_config(
            None,
            url=prometheus.url,
            step_s=STEP_S,
            timeout_s=120,
            max_points_per_series=chunk_points,
        )
        before_mib = status_mib("VmRSS")
        client_cpu_before_s = _cpu_s_self()
        started = time.perf_counter()
        collect_to_directory(
            config,
            datetime.fromtimestamp(first_s + 5 * STEP_S, tz=UTC),
            datetime.fromtimestamp(last_s, tz=UTC),
            Path(work_dir) / "collected",
            progress=False,
        )
        done = time.perf_counter()
        client_cpu_s = _cpu_s_self() - client_cpu_before_s
        peak_mib = status_mib("VmHWM")
        children_before_s = _cpu_s() - _cpu_s_self()
    # stopped and waited for: the server's CPU (its start included) is now in RUSAGE_CHILDREN
    server_cpu_s = _cpu_s() - _cpu_s_self() - children_before_s
    collected = Path(work_dir) / "collected"
    return {
        "collect_s": done - started,
        "client_cpu_s": client_cpu_s,
        "server_cpu_s": server_cpu_s,
        "rows_collected": sum(len(batch.frame) for batch in stream_metrics(collected)),
        "collect_peak_mib": peak_mib,
        "before_collect_mib": before_mib,
    }


def run_child(call: str) -> dict:
    """Run `bench.training_scale.<call>` in a fresh interpreter; its peaks are its own."""
    code = (
        "import json, logging, sys; logging.basicConfig(level=logging.WARNING); "
        "import bench.training_scale as b; "
        f"print('RESULT ' + json.dumps(b.{call}))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{call} failed:\n{completed.stderr.strip()[-3000:]}")
    line = next(x for x in completed.stdout.splitlines()[::-1] if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


# --- the cases ----------------------------------------------------------------------------------


@dataclass
class Case:
    nodes: int
    rows: int
    generate_s: float = 0.0
    fit: dict | None = None
    bundle_bytes: int = 0
    by_family: dict | None = None  # family -> (models, total bytes, largest bytes)


def bundle_sizes(bundle_dir: Path) -> tuple[int, dict[str, tuple[int, int, int]]]:
    """Total bytes of a bundle and, per family, (models, bytes, largest model's bytes)."""
    bundle = read_bundle(bundle_dir)
    total = sum(p.stat().st_size for p in bundle_dir.iterdir() if p.is_file())
    by_family: dict[str, tuple[int, int, int]] = {}
    for entry in bundle.nodes.values():
        size = bundle.model_path(entry).stat().st_size
        count, summed, largest = by_family.get(entry.info["family"], (0, 0, 0))
        by_family[entry.info["family"]] = (count + 1, summed + size, max(largest, size))
    return total, by_family


def run_case(case: Case, args: argparse.Namespace) -> None:
    data_dir = args.work / f"data-{case.nodes}x{case.rows}"
    out_dir = args.work / f"bundle-{case.nodes}x{case.rows}"
    shutil.rmtree(data_dir, ignore_errors=True)
    started = time.perf_counter()
    write_fleet_files(
        data_dir, case.nodes, case.rows * STEP_S / 3600.0, STEP_S, args.seed, args.nodes_per_file
    )
    case.generate_s = time.perf_counter() - started
    log.info("case %d x %d: data written in %.1f s", case.nodes, case.rows, case.generate_s)
    case.fit = run_child(f"measure_fit({str(data_dir)!r}, {str(out_dir)!r}, {args.jobs})")
    case.bundle_bytes, case.by_family = bundle_sizes(out_dir)
    log.info("case %d x %d: %s", case.nodes, case.rows, case.fit)
    if not args.keep_data:
        shutil.rmtree(data_dir, ignore_errors=True)


@dataclass
class CollectCost:
    """Per collected row, from the difference between two measured sizes."""

    measured: list[tuple[int, dict]]
    wall_s: float
    client_cpu_s: float  # training.collect: one Python thread
    server_cpu_s: float  # Prometheus (its start-up included)
    mib: float  # per row of one chunk (what collect_to_directory holds at once)


def collect_slope(args: argparse.Namespace) -> CollectCost:
    """Collect two fleet sizes from a real Prometheus; the slope between them is per-row cost."""
    measured = []
    for n_nodes in args.collect_nodes:
        work = args.work / f"prometheus-{n_nodes}"
        shutil.rmtree(work, ignore_errors=True)
        made = run_child(
            f"backfill_prometheus({n_nodes}, {args.collect_rows}, {str(work)!r}, {args.seed})"
        )
        result = made | run_child(
            f"measure_collect({str(work)!r}, {made['first_s']}, {made['last_s']}, "
            f"{args.chunk_points})"
        )
        result["chunk_rows"] = n_nodes * args.chunk_points
        shutil.rmtree(work, ignore_errors=True)
        log.info("collect %d x %d: %s", n_nodes, args.collect_rows, result)
        measured.append((n_nodes, result))
    (_, small), (_, large) = measured[0], measured[-1]
    rows = large["rows_collected"] - small["rows_collected"]
    rows = max(1, rows)

    def slope(key: str) -> float:
        return max(0.0, (large[key] - small[key]) / rows)

    # memory holds one chunk: the growth while collecting, per row of a chunk, as a slope too
    growth_mib = [r["collect_peak_mib"] - r["before_collect_mib"] for r in (small, large)]
    chunk_rows = max(1, large["chunk_rows"] - small["chunk_rows"])
    per_chunk_row_mib = max(0.0, (growth_mib[1] - growth_mib[0]) / chunk_rows)
    return CollectCost(
        measured,
        slope("collect_s"),
        slope("client_cpu_s"),
        slope("server_cpu_s"),
        per_chunk_row_mib,
    )


# --- printing -----------------------------------------------------------------------------------


def cpu_bound_s(cpu_s: float, parent_cpu_s: float, jobs: int) -> float:
    """Wall time the same work would take with the cores to itself: the workers' CPU shared
    over `jobs` cores, but never less than the one-threaded parent's own CPU."""
    return max(parent_cpu_s, cpu_s / jobs)


def print_results(cases: list[Case], collect: CollectCost, jobs: int, chunk_points: int) -> None:
    families = ",".join(cases[0].fit["families"])
    print(
        f"\nfit + export (streamed from per-rack Parquet files, {jobs} worker(s), fresh process, "
        f"families {families})"
    )
    print(
        f"{'nodes':>6} {'rows/node':>9} {'rows':>10} {'wall s':>7} {'cpu s':>7} {'load':>5} "
        f"{'ms/node':>8} {'cpu ms/node':>11} {'peak MiB':>9} {'worker MiB':>10} {'MAPE %':>7} "
        f"{'B/node':>7}"
    )
    for case in cases:
        fit = case.fit
        print(
            f"{case.nodes:>6} {case.rows:>9} {fit['rows_used']:>10} {fit['wall_s']:>7.1f} "
            f"{fit['cpu_s']:>7.1f} {fit['load_avg_1m']:>5.1f} "
            f"{fit['wall_s'] / case.nodes * 1000:>8.1f} {fit['cpu_s'] / case.nodes * 1000:>11.1f} "
            f"{fit['peak_self_mib']:>9.0f} {fit['peak_worker_mib']:>10.0f} "
            f"{fit['median_mape_pct']:>7.2f} {case.bundle_bytes / case.nodes:>7.0f}"
        )
    floor_mib = cases[0].fit["baseline_mib"]
    print(
        f"cpu s: this process and its workers; load: 1-minute load average at the end (above "
        f"{jobs} means other work shared the cores and stretched the wall time); peak MiB: "
        f"high-water RSS (a fresh interpreter with the training modules imported: "
        f"{floor_mib:.0f} MiB)"
    )

    print("\nratios against the same rows per node at the fewest nodes (ideal: per node 1.0;")
    print("peak 1.0 = memory does not grow with the number of nodes)")
    print(
        f"{'nodes':>6} {'rows/node':>9} {'x nodes':>8} {'x wall':>7} {'x wall/node':>11} "
        f"{'x cpu/node':>10} {'x peak':>7} {'x worker':>8}"
    )
    for case in cases:
        base = min((c for c in cases if c.rows == case.rows), key=lambda c: c.nodes)
        scale = case.nodes / base.nodes
        wall = case.fit["wall_s"] / base.fit["wall_s"]
        cpu = case.fit["cpu_s"] / base.fit["cpu_s"]
        print(
            f"{case.nodes:>6} {case.rows:>9} {scale:>8.1f} {wall:>7.2f} {wall / scale:>11.2f} "
            f"{cpu / scale:>10.2f} {case.fit['peak_self_mib'] / base.fit['peak_self_mib']:>7.2f} "
            f"{case.fit['peak_worker_mib'] / base.fit['peak_worker_mib']:>8.2f}"
        )

    print("\nbundle size by family (node models; one ConfigMap holds 1 MiB)")
    for case in cases:
        parts = ", ".join(
            f"{family} {count} x {summed / count / 1024:.1f} KiB (max {largest / 1024:.1f})"
            for family, (count, summed, largest) in sorted(case.by_family.items())
        )
        fits = "fits" if case.bundle_bytes <= CONFIGMAP_LIMIT_BYTES else "TOO LARGE for"
        print(
            f"{case.nodes:>6} x {case.rows:<6}: {case.bundle_bytes / 1024:.0f} KiB, "
            f"{fits} one ConfigMap; {parts}"
        )

    print("\ncollection from a real Prometheus (promtool backfill, then training.collect)")
    for n_nodes, result in collect.measured:
        print(
            f"  measured {n_nodes} nodes: {result['rows_collected']} rows "
            f"({result['samples']} samples): backfill + start "
            f"{result['backfill_and_start_s']:.1f} s; collect {result['collect_s']:.2f} s wall, "
            f"{result['client_cpu_s']:.2f} s client "
            f"cpu, {result['server_cpu_s']:.2f} s server cpu (start included); peak "
            f"{result['collect_peak_mib']:.0f} MiB while collecting (from "
            f"{result['before_collect_mib']:.0f})"
        )
    print(
        f"  per collected row (slope between the two sizes): {collect.wall_s * 1e6:.1f} us wall, "
        f"{collect.client_cpu_s * 1e6:.1f} us client cpu, {collect.server_cpu_s * 1e6:.1f} us "
        f"server cpu; memory holds one chunk (nodes x chunk points), "
        f"{collect.mib * 1024:.2f} KiB per row of it"
    )

    print("\ncollected + fitted + exported; collection EXTRAPOLATED from the slope above")
    print("  (cpu-bound: the same CPU seconds with both cores to ourselves)")
    for case in cases:
        fit, rows = case.fit, case.fit["rows_used"]
        parent_cpu_s = fit["cpu_s"] - fit["workers_cpu_s"]
        fit_bound_s = cpu_bound_s(fit["cpu_s"], parent_cpu_s, jobs)
        # Collection is one client thread and the server, each on its own core.
        collect_bound_s = max(collect.client_cpu_s, collect.server_cpu_s) * rows
        collect_s = collect.wall_s * rows
        measured_s = collect_s + fit["wall_s"]
        bound_s = collect_bound_s + fit_bound_s
        verdict = ""
        if case.nodes >= 1000 and case.rows >= 10_000:
            if measured_s < TARGET_S:
                verdict = f"; target < {TARGET_S:.0f} s: met"
            elif bound_s < TARGET_S:
                verdict = f"; target < {TARGET_S:.0f} s: met only cpu-bound"
            else:
                verdict = f"; target < {TARGET_S:.0f} s: NOT met"
        print(
            f"{case.nodes:>6} x {case.rows:<6}: collect ~{collect_s:.0f} s + fit/export "
            f"{fit['wall_s']:.0f} s = ~{measured_s:.0f} s as measured, ~{bound_s:.0f} s cpu-bound "
            f"(collect ~{collect_bound_s:.0f} + fit ~{fit_bound_s:.0f}); collecting holds "
            f"~{collect.mib * case.nodes * chunk_points:.0f} MiB per {chunk_points}-step chunk"
            f"{verdict}"
        )


def parse_ints(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive integers separated by commas: {text!r}"
        )
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.training_scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nodes", type=parse_ints, default=[100, 1000],
        help="fleet sizes, comma-separated (default 100,1000)",
    )  # fmt: skip
    parser.add_argument(
        "--rows", type=parse_ints, default=[1000, 10_000],
        help="rows per node at 60 s steps, comma-separated (default 1000,10000 = ~17 h, ~7 days)",
    )  # fmt: skip
    parser.add_argument(
        "--nodes-per-file", type=int, default=10,
        help="nodes per Parquet file of the input directory (default 10)",
    )  # fmt: skip
    parser.add_argument(
        "--collect-nodes", type=parse_ints, default=[20, 100],
        help="fleet sizes collected from a real Prometheus to measure the cost per row; "
        "at least two (default 20,100)",
    )  # fmt: skip
    parser.add_argument(
        "--collect-rows", type=int, default=1000,
        help="rows per node of those collections (default 1000)",
    )  # fmt: skip
    parser.add_argument(
        "--chunk-points", type=int, default=250,
        help="steps per collection chunk (collect's max_points_per_series): memory while "
        "collecting holds nodes x this many rows (default 250)",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=int, default=0, help="fit worker processes (default 0 = all cores)"
    )
    parser.add_argument("--seed", type=int, default=7, help="synthetic fleet seed (default 7)")
    parser.add_argument(
        "--work", type=Path, default=Path("out/bench-training-scale"),
        help="scratch directory for data, bundles and reports (default out/bench-training-scale)",
    )  # fmt: skip
    parser.add_argument(
        "--keep-data", action="store_true", help="keep the generated metrics directories"
    )
    parser.add_argument("--quiet", action="store_true", help="warnings only in the log")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.quiet)
    if len(args.collect_nodes) < 2:
        print("error: --collect-nodes needs at least two sizes for a slope", file=sys.stderr)
        return 2
    args.jobs = args.jobs or os.cpu_count() or 1
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cases = [Case(n, r) for r in sorted(args.rows) for n in sorted(args.nodes)]
    for case in cases:
        run_case(case, args)
    print_results(cases, collect_slope(args), args.jobs, args.chunk_points)
    print(f"\nbench wall time {time.perf_counter() - started:.0f} s (data generation included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
