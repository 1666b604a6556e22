"""Benchmark training at fleet scale: collect, fit and export time and peak memory vs fleet size.

Fit and export, for every (nodes, rows per node) case (default 100 and 1000 nodes x 1k and 10k
rows at 60 s):

1. a synthetic fleet is written as a directory of per-rack Parquet files
   (`training.synth.write_fleet_files`, `--nodes-per-file` nodes each; not timed as training);
2. a fresh Python process runs what `python -m training.fit --input DIR` runs: the directory is
   streamed (`training.dataset.stream_metrics`: read and cleaned one file at a time), every
   node is fitted over all cores, converted to ONNX, checked, and the bundle and report are
   written. It reports its wall time, CPU time, and the kernel's peak-RSS counts of itself and
   of its largest worker (`getrusage` SELF and CHILDREN: honest high-water marks, no sampling);
3. the bundle's size per node and per family is read back.

End to end, for the `--end-to-end` cases (default 100 and 1000 nodes x 10k rows; the latter is
the 5-minute target): the fleet's node_exporter / ipmi_exporter series (6 per node) are
backfilled into a real Prometheus with `promtool tsdb create-blocks-from openmetrics` (not
timed), then `python -m training.fit --prometheus URL --start --end --out DIR` runs as a user
would run it, default settings, in a fresh process: collected (spilled to node-group files one
time chunk at a time), fitted and exported, timed from start to exit, with its peak memory and
the server's; ratios against the smallest end-to-end case show whether memory grows.

Printed: one row per case with per-node costs, ratios against the smallest case measured in the
same run (time per node should stay flat; peak memory should not grow with nodes), the bundle
size by family with the ConfigMap limit, and the end-to-end runs against the 5-minute target.

    python3 -m bench.training_scale            # default cases, ~9 minutes on 2 cores
    python3 -m bench.training_scale --nodes 20,100 --rows 1000 --end-to-end 100x1000   # quick
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
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from bench.fit_export import status_mib
from bench.support.prometheus import backfill, openmetrics_series, start_prometheus
from predictor.bundle import read_bundle
from training.dataset import read_metrics
from training.fit.cli import setup_logging
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


# (family, type) in the order written: OpenMetrics wants each family's samples together
EXPORTER_FAMILIES = (
    ("node_cpu_seconds", "counter"),
    ("node_uname_info", "gauge"),
    ("ipmi_temperature_celsius", "gauge"),
    ("ipmi_dcmi_power_consumption_watts", "gauge"),
)


def _exporter_series(
    frame: pd.DataFrame, step_s: float, family: str
) -> Iterator[tuple[str, dict, list]]:
    """(sample name, labels, [(timestamp_s, value)]) per series of one `EXPORTER_FAMILIES`
    family for a contract-1 table, as Prometheus would have scraped it: node_exporter idle-CPU
    counters, node_uname_info, ipmi temperatures (missing ones not scraped), DCMI power."""
    for node, rows in frame.groupby("node", sort=True):
        times_s = (rows["timestamp"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
        host = {"instance": f"{node}:9100", "job": "node"}
        bmc = {"instance": f"{node}:9290", "job": "ipmi"}
        if family == "node_cpu_seconds":
            idle_s = 10_000.0 + np.cumsum((1.0 - rows["cpu_util"].to_numpy()) * step_s)
            idle = {**host, "cpu": "0", "mode": "idle"}
            yield "node_cpu_seconds_total", idle, list(zip(times_s, idle_s, strict=True))
        elif family == "node_uname_info":
            yield "node_uname_info", {**host, "nodename": node}, [(t, 1.0) for t in times_s]
        elif family == "ipmi_temperature_celsius":
            for column, name, sensor_id in (
                ("ambient_temp_c", "Inlet Temp", "1"),
                ("cpu1_temp_c", "CPU1 Temp", "2"),
                ("cpu2_temp_c", "CPU2 Temp", "3"),
            ):
                values = rows[column].to_numpy()
                points = [(t, v) for t, v in zip(times_s, values, strict=True) if not math.isnan(v)]
                yield family, {**bmc, "name": name, "id": sensor_id}, points
        elif family == "ipmi_dcmi_power_consumption_watts":
            power_w = rows["power_w"].to_numpy()
            yield family, bmc, list(zip(times_s, power_w, strict=True))
        else:
            raise ValueError(f"unknown exporter family {family!r}")


def write_exporter_openmetrics(files: list[Path], path: Path, step_s: float) -> int:
    """`_exporter_series` of a fleet's node-group files, streamed into an OpenMetrics file too
    large to build in memory. OpenMetrics wants each family's samples together, so each file is
    read once per family (only that family's series are built). Returns the samples written."""
    samples = 0
    with path.open("w") as out:
        for family, kind in EXPORTER_FAMILIES:
            out.write(f"# TYPE {family} {kind}\n")
            for file in files:
                for name, labels, points in _exporter_series(read_metrics(file), step_s, family):
                    out.write(openmetrics_series(name, labels, points))
                    samples += len(points)
        out.write("# EOF\n")
    return samples


def backfill_prometheus(
    n_nodes: int, rows: int, work_dir: str | Path, seed: int, nodes_per_file: int = 10
) -> dict:
    """A synthetic fleet's exporter series in a Prometheus data directory (promtool, one block),
    for `start_prometheus(work_dir)` to serve. Streamed through files: 1000 nodes fit."""
    work = Path(work_dir)
    started = time.perf_counter()
    files = write_fleet_files(
        work / "data", n_nodes, rows * STEP_S / 3600.0, STEP_S, seed, nodes_per_file
    )
    stamps = read_metrics(files[0])["timestamp"]
    first_s, last_s = stamps.min().timestamp(), stamps.max().timestamp()
    source = work / "backfill.om"
    samples = write_exporter_openmetrics(files, source, STEP_S)
    shutil.rmtree(work / "data")
    written = time.perf_counter()
    log.info(
        "%d x %d: %d samples (%.2f GiB of OpenMetrics) in %.0f s; backfilling",
        n_nodes, rows, samples, source.stat().st_size / 2**30, written - started,
    )  # fmt: skip
    hours = _one_block_hours(first_s, last_s)
    backfill(
        source,
        work / "prometheus" / "data",
        extra_args=[f"--max-block-duration={hours}h"],
        timeout_s=3600,
    )
    source.unlink()
    return {
        "samples": samples,
        "openmetrics_s": written - started,
        "backfill_s": time.perf_counter() - written,
        "first_s": first_s,
        "last_s": last_s,
    }


def _one_block_hours(first_s: float, last_s: float) -> int:
    """A promtool block duration (whole hours, >= 2) whose aligned window holds the whole
    range: one block, so the server has nothing to compact while it is measured."""
    hours = max(2, math.ceil((last_s - first_s) / 3600) + 1)
    while int(first_s // (hours * 3600)) != int(last_s // (hours * 3600)):
        hours += 1
    return hours


def _log_time_s(line: str) -> float | None:
    """The Unix time of a `training.fit` log line (its asctime is local time, milliseconds)."""
    try:
        stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None
    return stamp.timestamp()


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


IN_PROCESS = "in-process"


def measure_end_to_end(
    n_nodes: int,
    rows: int,
    work: Path,
    seed: int,
    jobs: int,
    nodes_per_file: int,
    modes: list[str] | None = None,
) -> list[dict]:
    """What a user runs, for real, at fleet scale: the fleet is backfilled into a real
    Prometheus (not timed), then `python -m training.fit --prometheus URL --start --end --out`
    runs in a fresh process with its default collect settings, timed from start to exit, once
    per mode: `in-process` (`--jobs`), or a `--dask` address (`local:N`). Peak memory is the
    kernel's high-water RSS of the largest single process among fit and its workers (`wait4`);
    a Dask run's report adds the client's and each worker's; Prometheus's own peak and CPU are
    read from /proc before it stops."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    loaded = backfill_prometheus(n_nodes, rows, work, seed, nodes_per_file)
    runs = []
    with start_prometheus(work, ready_timeout_s=600) as prometheus:
        for mode in modes or [IN_PROCESS]:
            log.info(
                "%d x %d: backfilled; running training.fit --prometheus (%s)", n_nodes, rows, mode
            )
            run = _fit_end_to_end(prometheus, loaded, work / mode.replace(":", "-"), jobs, mode)
            runs.append(
                {
                    "nodes": n_nodes,
                    "rows_per_node": rows,
                    "samples": loaded["samples"],
                    "prepare_s": loaded["openmetrics_s"] + loaded["backfill_s"],
                    **run,
                }
            )
    return runs


def _fit_end_to_end(prometheus, loaded: dict, work: Path, jobs: int, mode: str) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    fit_log = work / "fit.log"
    command = [
        sys.executable, "-m", "training.fit",
        "--prometheus", prometheus.url,
        "--start", f"{loaded['first_s']:.0f}", "--end", f"{loaded['last_s']:.0f}",
        "--out", str(work / "bundle"),
    ]  # fmt: skip
    command += ["--jobs", str(jobs)] if mode == IN_PROCESS else ["--dask", mode]
    server_cpu_before_s = _proc_cpu_s(prometheus.process.pid)
    with fit_log.open("w") as log_file:
        started_s = time.time()
        started = time.perf_counter()
        fit = subprocess.Popen(command, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(fit.pid, 0)  # reaped here: its rusage is the point
        wall_s = time.perf_counter() - started
        fit.returncode = os.waitstatus_to_exitcode(status)
    server_cpu_s = _proc_cpu_s(prometheus.process.pid) - server_cpu_before_s
    server_peak_mib = status_mib("VmHWM", prometheus.process.pid)
    if fit.returncode != 0:
        tail = "\n".join(fit_log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"{' '.join(command)} failed; {fit_log} ends:\n{tail}")
    # where the minutes went: the collector logs when the collection is on disk
    collected_at_s = [
        _log_time_s(line)
        for line in fit_log.read_text(errors="replace").splitlines()
        if "training.collect: collected" in line
    ]
    collect_s = collected_at_s[-1] - started_s if collected_at_s and collected_at_s[-1] else None
    report = json.loads((work / "bundle-report" / "report.json").read_text())
    distributed = report.get("distributed")
    if distributed:  # the client's own phases, from its log: start + plan, then finish
        distributed = {**distributed, **_client_phases_s(fit_log, started_s)}
    return {
        "mode": mode,
        "workers": distributed["workers"] if distributed else jobs,
        "wall_s": wall_s,
        "collect_s": collect_s,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_mib": usage.ru_maxrss / 1024,  # Linux reports KiB
        "server_cpu_s": server_cpu_s,
        "server_peak_mib": server_peak_mib,
        "load_avg_1m": os.getloadavg()[0],  # other work on the machine stretches the wall time
        "rows_used": report["input"]["rows_used"],
        "nodes_own": report["summary"]["nodes_own_model"],
        "median_mape_pct": report["summary"]["median_mape_pct"],
        "distributed": distributed,
        "bundle": str(work / "bundle"),
        "log": str(fit_log),
    }


def _client_phases_s(fit_log: Path, started_s: float) -> dict:
    """A Dask run's client time outside the workers' work, from its log lines: until the
    groups are submitted (interpreter, cluster start, plan) and after the last one came back
    (fallback, report, plot, bundle)."""
    marks: dict[str, float] = {}
    for line in fit_log.read_text(errors="replace").splitlines():
        for key, text in (
            ("submitted", "planned nodes in"),
            ("gathered", "node group(s); dropped"),
            ("written", "bundle written to"),
        ):
            if text in line and "training.fit:" in line:
                at_s = _log_time_s(line)
                if at_s is not None:
                    marks.setdefault(key, at_s)
    if len(marks) < 3:
        return {}
    return {
        "client_start_s": marks["submitted"] - started_s,
        "client_finish_s": marks["written"] - marks["gathered"],
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


# --- printing -----------------------------------------------------------------------------------


def print_results(cases: list[Case], end_to_end: list[list[dict]], jobs: int) -> None:
    if cases:
        print_file_cases(cases, jobs)
    print_end_to_end_cases(end_to_end)


def print_file_cases(cases: list[Case], jobs: int) -> None:
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


def print_end_to_end_cases(end_to_end: list[list[dict]]) -> None:
    for case_runs in end_to_end:
        print_end_to_end(case_runs[0])
        if len(case_runs) > 1 or case_runs[0]["distributed"]:
            print_dask_comparison(case_runs)
    firsts = [case_runs[0] for case_runs in end_to_end]
    if len(firsts) > 1:
        base = min(firsts, key=lambda r: (r["rows_per_node"], r["nodes"]))
        print(
            f"\nend to end, ratios against {base['nodes']} x {base['rows_per_node']} (ideal: "
            "per node 1.0 at the same rows; peak 1.0 = memory does not grow with the fleet)"
        )
        for run in firsts:
            scale = run["nodes"] / base["nodes"]
            wall = run["wall_s"] / base["wall_s"]
            print(
                f"  {run['nodes']:>6} x {run['rows_per_node']:<6}: x nodes {scale:.1f}, "
                f"x wall {wall:.2f}, x wall/node {wall / scale:.2f}, "
                f"x peak {run['peak_mib'] / base['peak_mib']:.2f}, "
                f"x server peak {run['server_peak_mib'] / base['server_peak_mib']:.2f}"
            )


def print_end_to_end(run: dict) -> None:
    nodes, rows = run["nodes"], run["rows_per_node"]
    collect_s = run["collect_s"]
    split = (
        f"collect {collect_s:.0f} s ({collect_s / run['rows_used'] * 1e6:.1f} us/row) + "
        f"fit/export {run['wall_s'] - collect_s:.0f} s"
        if collect_s is not None
        else "no split: on Dask each worker collects and fits its groups in turn"
        if run["mode"] != IN_PROCESS
        else "split unknown (no collect line in the log)"
    )
    verdict = ""
    if nodes >= 1000 and rows >= 10_000:
        verdict = f"; target < {TARGET_S:.0f} s: {'met' if run['wall_s'] < TARGET_S else 'NOT met'}"
    print(
        f"\ncollected + fitted + exported, measured end to end: `training.fit --prometheus` "
        f"({run['mode']}) on {nodes} nodes x {rows} rows ({run['samples']:,} samples backfilled in "
        f"{run['prepare_s']:.0f} s, not counted)"
    )
    print(
        f"  {run['wall_s']:.0f} s wall = {split}; {run['wall_s'] / nodes * 1000:.0f} ms/node"
        f"{verdict}"
    )
    print(
        f"  {run['cpu_s']:.0f} s cpu (fit and its workers); peak {run['peak_mib']:.0f} MiB "
        f"(largest single process); Prometheus: {run['server_cpu_s']:.0f} s cpu, peak "
        f"{run['server_peak_mib']:.0f} MiB; load average {run.get('load_avg_1m', 0):.1f}; "
        f"{run['rows_used']:,} rows used, "
        f"{run['nodes_own']} own models, median held-out MAPE {run['median_mape_pct']:.2f} %"
    )
    print(f"  log: {run['log']}")


EXTRAPOLATE_NODES = 10_000
EXTRAPOLATE_WORKERS = (2, 8, 16, 32, 64)


def same_models(expected: str, got: str) -> bool:
    """Do two bundles hold the same ONNX bytes for every node and the fallback?"""
    manifests = [json.loads((Path(b) / "manifest.json").read_text()) for b in (expected, got)]
    entries = [{**m["nodes"], "(fallback)": m["fallback"]} for m in manifests]
    if entries[0].keys() != entries[1].keys():
        return False
    return all(
        (Path(expected) / e["model"]).read_bytes()
        == (Path(got) / entries[1][node]["model"]).read_bytes()
        for node, e in entries[0].items()
    )


def print_dask_comparison(runs: list[dict]) -> None:
    """One fleet, one Prometheus, each mode: time, memory per process, throughput per worker,
    the scaling from 1 to N workers, and the measured per-node costs extrapolated."""
    nodes, rows = runs[0]["nodes"], runs[0]["rows_per_node"]
    base = runs[0]
    print(f"\nend to end on one Prometheus: {nodes} nodes x {rows} rows, by mode")
    print(
        f"{'mode':>11} {'workers':>7} {'wall s':>7} {'nodes/s':>8} {'/worker':>8} "
        f"{'peak MiB':>8} {'client':>7} {'worker':>7} {'busy s/node':>11} {'Prom cpu s':>10} "
        f"{'same models':>11} {'load':>5}"
    )
    for run in runs:
        dist = run["distributed"]
        client = f"{dist['client_peak_mib']:.0f}" if dist else "-"
        worker = f"{max(dist['worker_peak_mib'].values()):.0f}" if dist else "-"
        busy = f"{sum(dist['worker_busy_s'].values()) / nodes * 1000:.0f} ms" if dist else "-"
        rate = nodes / run["wall_s"]
        print(
            f"{run['mode']:>11} {run['workers']:>7} {run['wall_s']:>7.1f} {rate:>8.1f} "
            f"{rate / run['workers']:>8.1f} {run['peak_mib']:>8.0f} {client:>7} {worker:>7} "
            f"{busy:>11} {run['server_cpu_s']:>10.0f} "
            f"{'yes' if same_models(base['bundle'], run['bundle']) else 'NO':>11} "
            f"{run.get('load_avg_1m', 0):>5.1f}"
        )
    print(
        "peak MiB: the largest single process (wait4); client/worker: the Dask run's own "
        "high-water RSS (report's `distributed`); busy s/node: worker time reading and fitting "
        "its groups, summed over workers, per node; same models: ONNX bytes equal to the first "
        "run's for every node and the fallback; load: 1-minute load average at the end (above "
        f"{os.cpu_count()}: other work shared the cores)"
    )
    dask_runs = sorted((r for r in runs if r["distributed"]), key=lambda r: r["workers"])
    one = next((r for r in dask_runs if r["workers"] == 1), None)
    if one is None:
        return
    for run in dask_runs[1:]:
        speedup = one["wall_s"] / run["wall_s"]
        print(
            f"scaling 1 -> {run['workers']} workers: {speedup:.2f}x faster, efficiency "
            f"{speedup / run['workers'] * 100:.0f} % (this machine has {os.cpu_count()} cores, "
            "shared with Prometheus and the client)"
        )
    dist = one["distributed"]
    worker_s_per_node = sum(dist["worker_busy_s"].values()) / nodes
    start_s = dist.get("client_start_s", 0.0)
    client_s_per_node = dist.get("client_finish_s", 0.0) / nodes
    server_s_per_node = one["server_cpu_s"] / nodes
    print(
        f"\nmeasured with 1 worker, per node at {rows} rows: {worker_s_per_node * 1000:.0f} ms of "
        f"worker time (collect + fit), {client_s_per_node * 1000:.1f} ms in the client after "
        f"the workers (fallback, report, bundle), {server_s_per_node * 1000:.1f} ms of "
        f"Prometheus CPU; once per run: {start_s:.1f} s to start, connect and plan"
    )
    print(
        f"extrapolated to {EXTRAPOLATE_NODES:,} nodes x {rows} rows (workers on their own cores, "
        "ideal scaling; Prometheus must then serve the workers' queries at the rate shown):"
    )
    for workers in EXTRAPOLATE_WORKERS:
        wall_s = start_s + EXTRAPOLATE_NODES * (worker_s_per_node / workers + client_s_per_node)
        server_cores = EXTRAPOLATE_NODES * server_s_per_node / wall_s
        print(
            f"  {workers:>3} workers: {wall_s / 60:6.1f} min; Prometheus busy "
            f"{server_cores:4.1f} cores"
        )


def parse_ints(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive integers separated by commas: {text!r}"
        )
    return values


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """`1000x10000,100x1000` -> [(1000, 10000), (100, 1000)]; `none` -> []."""
    if text.strip().lower() == "none":
        return []
    sizes = []
    for part in text.split(","):
        nodes, _, rows = part.strip().partition("x")
        try:
            sizes.append((int(nodes), int(rows)))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected NODESxROWS, comma-separated, or 'none': {part.strip()!r} in {text!r}"
            ) from None
        if min(sizes[-1]) < 1:
            raise argparse.ArgumentTypeError(f"sizes must be positive: {part.strip()!r}")
    return sizes


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
        "--end-to-end", type=parse_sizes, default=[(100, 10_000), (1000, 10_000)],
        metavar="NODESxROWS",
        help="fleets backfilled into a real Prometheus and run through `training.fit "
        "--prometheus` end to end, comma-separated, or 'none' (default 100x10000,1000x10000: "
        "~8 minutes, ~7 GiB of scratch files at the peak)",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=int, default=0, help="fit worker processes (default 0 = all cores)"
    )
    parser.add_argument(
        "--dask", metavar="ADDRESS",
        help="also run each end-to-end case with `training.fit --dask ADDRESS` (local:N: and "
        "with local:1 for the scaling from 1 to N workers), beside the in-process run, on the "
        "same Prometheus; prints time and memory per process, throughput per worker, scaling "
        "efficiency and the per-node costs extrapolated to 10,000 nodes",
    )  # fmt: skip
    parser.add_argument(
        "--dask-only", action="store_true",
        help="with --dask: run the end-to-end cases only with --dask ADDRESS (no in-process or "
        "local:1 run; for fleets too large to run three times)",
    )  # fmt: skip
    parser.add_argument(
        "--no-file-cases", action="store_true",
        help="skip the fit-from-files cases (--nodes x --rows): end-to-end runs only",
    )  # fmt: skip
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


def end_to_end_modes(args: argparse.Namespace) -> list[str]:
    """in-process, then local:1 (the 1-worker baseline of a local:N), then the --dask address."""
    if args.dask is None:
        return [IN_PROCESS]
    if args.dask_only:
        return [args.dask]
    local_one = ["local:1"] if args.dask.startswith("local:") and args.dask != "local:1" else []
    return [IN_PROCESS, *local_one, args.dask]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.quiet)
    args.jobs = args.jobs or os.cpu_count() or 1
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cases = [] if args.no_file_cases else [
        Case(n, r) for r in sorted(args.rows) for n in sorted(args.nodes)
    ]  # fmt: skip
    for case in cases:
        run_case(case, args)
    end_to_end = [
        measure_end_to_end(
            nodes, rows, args.work / f"end-to-end-{nodes}x{rows}", args.seed, args.jobs,
            args.nodes_per_file, end_to_end_modes(args),
        )
        for nodes, rows in args.end_to_end
    ]  # fmt: skip
    print_results(cases, end_to_end, args.jobs)
    print(f"\nbench wall time {time.perf_counter() - started:.0f} s (data generation included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
