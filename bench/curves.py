"""Benchmark the predictor: session memory, curve builds, and the request-path lookup.

Prints, for a fleet bundle built here (real scikit-learn models through skl2onnx):
- resident memory per onnxruntime session (loading a bundle of per-node models) and the
  time the model swap's probe-grid validation takes,
- full and incremental ``CurveBuilder.build`` times,
- ``CurveTable.power_increase_w`` (with ``index_of``) for 100, 500 and 5000 nodes, against the
  naive design measured in the same run: one onnxruntime call per node per request.

    python3 -m bench.curves [--own-models 300] [--nodes 5000] [--repeats 200]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.support.bundles import DEFAULT_FEATURES, DEFAULT_FILL, PowerCurveSpec, fit_curve_model
from predictor.bundle import write_bundle
from predictor.curves import CurveBuilder
from predictor.model import Predictor
from predictor.validation import validate_predictor

log = logging.getLogger("bench.curves")


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def percentiles_us(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    p50, p99 = np.percentile(samples, [50, 99]) * 1e6
    return float(p50), float(p99)


def build_fleet_bundle(directory: Path, own_models: int, quiet: bool) -> None:
    rng = np.random.default_rng(1)
    node_models = {}
    for i in tqdm(range(own_models), desc="fitting models", disable=quiet, file=sys.stderr):
        spec = PowerCurveSpec(
            idle_w=float(rng.uniform(50, 150)),
            max_w=float(rng.uniform(250, 600)),
            exponent=int(rng.integers(1, 4)),
            temp_w_per_c=float(rng.uniform(0, 1)),
        )
        node_models[f"node-{i:05d}"] = fit_curve_model(spec)
    write_bundle(
        directory,
        features=DEFAULT_FEATURES,
        node_models=node_models,
        node_info={},
        fallback_model=fit_curve_model(PowerCurveSpec(80.0, 300.0, exponent=2)),
        fallback_info=None,
        feature_fill=DEFAULT_FILL,
        extra={},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--own-models", type=int, default=300, help="nodes with their own model (default 300)"
    )
    parser.add_argument(
        "--nodes", type=int, default=5000, help="nodes with telemetry in total (default 5000)"
    )
    parser.add_argument(
        "--repeats", type=int, default=200, help="timed repetitions per lookup (default 200)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet = args.quiet or not sys.stderr.isatty()
    if args.own_models < 1 or args.nodes < args.own_models:
        parser.error("need 1 <= --own-models <= --nodes")

    with tempfile.TemporaryDirectory() as tmp:
        bundle_dir = Path(tmp) / "bundle"
        build_fleet_bundle(bundle_dir, args.own_models, quiet)
        before = rss_bytes()
        start = time.perf_counter()
        predictor = Predictor.load(bundle_dir)
        load_s = time.perf_counter() - start
        sessions = len(predictor.model_keys)
        per_session_kib = (rss_bytes() - before) / sessions / 1024
        print(
            f"load: {sessions} sessions in {load_s:.2f} s, "
            f"{load_s / sessions * 1e3:.2f} ms and {per_session_kib:.0f} KiB RSS per session"
        )

        start = time.perf_counter()
        validate_predictor(predictor)
        print(f"validate (probe grid, every model): {time.perf_counter() - start:.2f} s")

        rng = np.random.default_rng(2)
        names = [f"node-{i:05d}" for i in range(args.nodes)]
        telemetry = {
            name: {
                "cpu_util": float(rng.uniform(0, 0.9)),
                "ambient_temp_c": float(rng.uniform(18, 30)),
                "cpu1_temp_c": float(rng.uniform(35, 80)),
            }
            for name in names
        }
        builder = CurveBuilder()
        start = time.perf_counter()
        table = builder.build(predictor, telemetry, None)
        full_s = time.perf_counter() - start
        changed = dict(telemetry)
        for name in names[::10]:
            changed[name] = {**telemetry[name], "cpu_util": telemetry[name]["cpu_util"] + 0.01}
        start = time.perf_counter()
        incremental = builder.build(predictor, changed, table)
        incr_s = time.perf_counter() - start
        start = time.perf_counter()
        builder.build(predictor, changed, incremental)
        same_s = time.perf_counter() - start
        print(
            f"curves: full build of {len(table)} nodes {full_s * 1e3:.0f} ms; "
            f"10% changed {incr_s * 1e3:.0f} ms ({incremental.computed_rows} recomputed); "
            f"nothing changed {same_s * 1e3:.0f} ms"
        )

        for count in (100, 500, 5000):
            subset = names[: min(count, args.nodes)]
            util = np.array([telemetry[n]["cpu_util"] for n in subset])

            def lookup(subset: list[str] = subset, util: np.ndarray = util) -> np.ndarray:
                return table.power_increase_w(table.index_of(subset), util, 0.05)

            p50, p99 = percentiles_us(lookup, args.repeats)
            print(f"lookup {len(subset):5d} nodes: p50 {p50:8.1f} us  p99 {p99:8.1f} us")

        subset = names[:500]
        rows = {
            n: np.array([predictor.feature_row(telemetry[n])] * 2, dtype=np.float32) for n in subset
        }
        for n in subset:
            rows[n][1, 0] += 0.05

        def naive() -> None:
            for n in subset:
                predictor.predict_w(n, rows[n])

        def tabled() -> np.ndarray:
            return table.power_increase_w(
                table.index_of(subset), np.array([telemetry[n]["cpu_util"] for n in subset]), 0.05
            )

        naive_p50, _ = percentiles_us(naive, max(5, args.repeats // 20))
        table_p50, _ = percentiles_us(tabled, args.repeats)
        print(
            f"500 nodes: naive one-call-per-node {naive_p50 / 1e3:.1f} ms, table "
            f"{table_p50 / 1e3:.3f} ms -> {naive_p50 / table_p50:.0f}x faster"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
