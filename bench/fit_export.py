"""Benchmark training: fit + export time per node and held-out accuracy on a synthetic fleet.

Generates a synthetic fleet (default 50 nodes x 7 days at 60 s, `training.synth`), runs the
same code path as `python -m training.fit` (clean -> per-node fit over all cores -> ONNX ->
parity -> bundle -> report) and prints:
- wall time for generation, cleaning and fit+export; fit+export time per node (wall, and wall x
  workers = core-seconds per node);
- median / p90 held-out MAPE of our models against the idle-to-max straight line fitted on the
  same training rows (the baseline, measured in the same run), and the ratio between them;
- the share of nodes whose ONNX passed the parity check, memory (resident before fitting,
  peak in this process and in the largest worker), the bundle size and where the report and
  plot went.

    python3 -m bench.fit_export [--nodes 50] [--hours 168] [--step 60] [--seed 7] [--jobs 0]
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import time
from pathlib import Path

from training.dataset import clean_metrics
from training.fit import FitSettings, default_report_dir, fit_fleet
from training.fit.cli import setup_logging
from training.synth import synth_fleet

log = logging.getLogger("bench.fit_export")


def status_mib(field: str, pid: int | str = "self") -> float:
    """A memory figure of a process (this one by default) from /proc/<pid>/status
    (VmRSS now, VmHWM peak)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> None:
    """Restart the kernel's peak-RSS count, so the fit's peak is not the generator's."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.fit_export", description=__doc__)
    parser.add_argument("--nodes", type=int, default=50, help="nodes in the fleet (default 50)")
    parser.add_argument("--hours", type=float, default=168, help="hours of data (default 168)")
    parser.add_argument("--step", type=float, default=60, help="seconds per sample (default 60)")
    parser.add_argument("--seed", type=int, default=7, help="synthetic fleet seed (default 7)")
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (0 = all cores)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("out/bench-fit-export/bundle"),
        help="bundle directory; the report goes beside it (default out/bench-fit-export/bundle)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or logs")
    args = parser.parse_args(argv)
    setup_logging(args.quiet)
    # the table goes to the log; this bench prints its own summary
    logging.getLogger("training.report").setLevel(logging.WARNING)
    jobs = args.jobs or os.cpu_count() or 1

    started = time.perf_counter()
    raw = synth_fleet(args.nodes, args.hours, args.step, args.seed)
    generated = time.perf_counter()
    cleaned = clean_metrics(
        raw, source=f"synth_fleet({args.nodes}, {args.hours}, seed={args.seed})"
    )
    cleaned_at = time.perf_counter()
    rows_generated = len(raw)
    del raw
    rss_before_fit_mib = status_mib("VmRSS")
    reset_peak_rss()
    run = fit_fleet(cleaned, args.out, settings=FitSettings(), jobs=jobs, progress=not args.quiet)
    finished = time.perf_counter()

    summary = run.report["summary"]
    fit_s = finished - cleaned_at
    bundle_bytes = sum(p.stat().st_size for p in args.out.iterdir())
    parity_share = summary["parity_pass"] / max(1, summary["parity_checked"])
    print(f"fleet: {args.nodes} nodes x {args.hours:g} h at {args.step:g} s, seed {args.seed}")
    print(f"rows: {rows_generated} generated, {cleaned.rows_kept} kept after cleaning")
    print(f"generate {generated - started:.1f} s, clean {cleaned_at - generated:.1f} s")
    print(f"fit + export: {fit_s:.1f} s total on {jobs} worker(s)")
    print(
        f"fit + export per node: {fit_s / args.nodes * 1000:.0f} ms wall, "
        f"{fit_s * jobs / args.nodes * 1000:.0f} ms core time"
    )
    print(f"families chosen: {summary['families_chosen']}")
    print(
        f"nodes on a fallback: {len(summary['nodes_fallback'])} "
        f"({summary['nodes_scaled_fallback']} scaled to their own power)"
    )
    print(
        f"held-out MAPE, all nodes:        median {summary['median_mape_pct']:.2f} %, "
        f"p90 {summary['p90_mape_pct']:.2f} %"
    )
    print(
        f"held-out MAPE, idle-to-max line: median {summary['baseline_median_mape_pct']:.2f} %, "
        f"p90 {summary['baseline_p90_mape_pct']:.2f} %"
    )
    print(
        f"line / ours (median MAPE): "
        f"{summary['baseline_median_mape_pct'] / summary['median_mape_pct']:.1f}x"
    )
    print(
        f"ONNX parity passed: {summary['parity_pass']} of {summary['parity_checked']} "
        f"({parity_share * 100:.0f} %); monotonic: {summary['monotonic_pass']} of "
        f"{summary['nodes_own_model']}; worse than the idle-to-max line: "
        f"{len(summary['nodes_worse_than_line'])}"
    )
    peak_parent_mib = status_mib("VmHWM")
    peak_worker_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        f"memory: {rss_before_fit_mib:.0f} MiB resident before fitting (the cleaned table), "
        f"peak {peak_parent_mib:.0f} MiB while fitting, {peak_worker_mib:.0f} MiB in the "
        "largest worker (shares the table's pages with this process)"
    )
    print(f"bundle: {args.out} ({bundle_bytes / 1024:.0f} KiB)")
    print(f"report and plot: {default_report_dir(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
