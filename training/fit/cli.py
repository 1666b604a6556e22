"""`python -m training.fit`: the command line of the fit step.

Reads the input (contract-1 files with `--input`, or a collection from Prometheus with
`--prometheus`, spilled to node-group Parquet files and streamed), turns the flags into
`FitSettings`, runs `training.fit.fleet.fit_fleet` (or, with `--dask`, plans node groups and
runs `training.fit.distributed.fit_fleet_on_dask`), and turns failures into one-line errors:
exit status 2 for bad input or a run that cannot give a trustworthy bundle, 1 when Prometheus
could not be read (unreachable, too slow, garbage: as `python -m training.collect`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from livedata.collect_config import load_collect_config, parse_time
from livedata.prometheus import CollectError
from training.collect import collect_to_directory
from training.collect.cli import attach_relative_times
from training.dataset import MetricsInputError, MetricsStream, stream_metrics
from training.export import ExportError
from training.families import DEFAULT_FAMILIES, FAMILIES, LAST_RESORT_FAMILIES, resolve_families
from training.fit.distributed import (
    DEFAULT_NODES_PER_GROUP,
    dask_client,
    fit_fleet_on_dask,
    plan_file_groups,
    plan_prometheus_groups,
)
from training.fit.fleet import FitRun, default_report_dir, fit_fleet
from training.fit.settings import (
    DEFAULT_MIN_ROWS,
    DEFAULT_TEST_FRACTION,
    FitError,
    FitSettings,
)

log = logging.getLogger("training.fit")  # the package's name: log lines read as they always have


class PrometheusUnreadable(FitError):
    """Prometheus could not be read (a runtime failure, exit 1; not the input's fault)."""


@contextlib.contextmanager
def _metrics_input(args: argparse.Namespace) -> Iterator[MetricsStream]:
    """The input as a stream of node groups: files as they are, or a Prometheus collection
    spilled to node-group Parquet files (a temporary directory unless --keep-collected), so
    that neither collecting nor fitting holds the whole fleet in memory."""
    if args.input is not None:
        yield stream_metrics(args.input, cpu_util_percent=args.cpu_util_percent)
        return
    overrides: dict[str, object] = {"url": args.prometheus}
    if args.step is not None:
        overrides["step_s"] = args.step
    start, end = _collect_range(args)
    config = load_collect_config(args.collect_config, **overrides)
    where = f"{config.url} [{start.isoformat()} .. {end.isoformat()}]"
    with contextlib.ExitStack() as cleanup:
        if args.keep_collected is not None:
            spill_dir = Path(args.keep_collected)
        else:
            spill_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="fit-")))
        try:
            files = collect_to_directory(
                config,
                start,
                end,
                spill_dir,
                progress=not args.quiet,
            )
        except CollectError as exc:  # a RuntimeError: say it as a user-facing failure
            raise PrometheusUnreadable(str(exc)) from None
        if not files:
            raise FitError(
                f"Prometheus at {where} has no data for any node "
                "(check the range, the queries and the node mapping)"
            )
        # Kept files are the input a refit would read: name them; temporary ones are not.
        yield stream_metrics(
            spill_dir,
            cpu_util_percent=args.cpu_util_percent,
            source=None if args.keep_collected is not None else where,
        )


def _collect_range(args: argparse.Namespace) -> tuple[datetime, datetime]:
    now = datetime.now(UTC)
    start, end = parse_time(args.start, now=now), parse_time(args.end, now=now)
    if end < start:
        raise FitError(f"--end ({end.isoformat()}) is before --start ({start.isoformat()})")
    return start, end


def _fit_on_dask(args: argparse.Namespace, settings: FitSettings) -> FitRun:
    """`--dask`: plan node groups here, read and fit them on the cluster's workers."""
    report_dir = args.report_dir or default_report_dir(args.out)
    with dask_client(args.dask) as client:
        if args.input is not None:
            stream = stream_metrics(args.input, cpu_util_percent=args.cpu_util_percent)
            groups: list = plan_file_groups(stream)
            n_nodes, exact = stream.n_nodes, True
        else:
            overrides: dict[str, object] = {"url": args.prometheus}
            if args.step is not None:
                overrides["step_s"] = args.step
            start, end = _collect_range(args)
            config = load_collect_config(args.collect_config, **overrides)
            try:
                groups, n_nodes = plan_prometheus_groups(
                    config,
                    start,
                    end,
                    nodes_per_group=args.nodes_per_group,
                    source=f"{config.url} [{start.isoformat()} .. {end.isoformat()}]",
                    cpu_util_percent=args.cpu_util_percent,
                )
            except CollectError as exc:
                raise PrometheusUnreadable(str(exc)) from None
            exact = False
        return fit_fleet_on_dask(
            client,
            groups,
            n_nodes,
            args.out,
            report_dir=report_dir,
            settings=settings,
            exact_node_count=exact,
            progress=not args.quiet,
        )


def setup_logging(quiet: bool) -> None:
    """Log to stderr: INFO normally, warnings and errors only with --quiet."""
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.fit",
        description=(
            "Fit one power model per node from collected metrics (contract 1), check them, and "
            "write an ONNX model bundle (contract 2) plus a training report beside it."
        ),
        epilog="model families: "
        + "; ".join(f"{f.name} ({f.kind}): {f.description}" for f in FAMILIES.values()),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--input",
        type=Path,
        help="contract-1 metrics: a CSV or Parquet file, or a directory of them. A directory "
        "is read and cleaned one group of files at a time (files sharing a node form one "
        "group), so per-node or per-rack files keep memory flat however large the fleet",
    )
    source.add_argument(
        "--prometheus",
        metavar="URL",
        help="collect from this Prometheus first (needs --start and --end), then fit. The "
        "collection is spilled to node-group Parquet files in a temporary directory ($TMPDIR, "
        "about 40 bytes per row; or --keep-collected) and fitted group by group, so memory "
        "stays flat however large the fleet",
    )
    parser.add_argument("--out", type=Path, required=True, help="bundle directory to write")
    parser.add_argument(
        "--start", help="collection start: RFC 3339, Unix seconds, or relative like -7d"
    )
    parser.add_argument(
        "--end", help="collection end: RFC 3339, Unix seconds, now, or relative like -1h"
    )
    parser.add_argument(
        "--step",
        type=float,
        help="collection resolution in seconds (default: the collect config's, 60 s)",
    )
    parser.add_argument(
        "--keep-collected",
        type=Path,
        metavar="DIR",
        help="with --prometheus: keep the collected metrics in DIR (node-group Parquet files, "
        "what `training.collect --nodes-per-file` writes) to refit later with --input DIR",
    )
    parser.add_argument(
        "--collect-config",
        type=Path,
        help="collect settings file (queries, sensor names, instance->node mapping)",
    )
    parser.add_argument(
        "--report-dir",
        type=Path,
        help="where report.json, report.txt and the plot go "
        "(default: <out's parent>/<out's name>-report, outside the bundle)",
    )
    parser.add_argument(
        "--test-fraction",
        type=float,
        default=DEFAULT_TEST_FRACTION,
        help="newest share of each node's rows held out for choosing and scoring models, "
        "split by time, never shuffled (default %(default)s)",
    )
    parser.add_argument(
        "--min-rows",
        type=int,
        default=DEFAULT_MIN_ROWS,
        help="nodes with fewer clean rows get no model of their own: the fleet's curve shape "
        "scaled to the power they were measured at, or the fleet fallback model when they have "
        "no power readings (default %(default)s, about 8 h at 60 s)",
    )
    parser.add_argument(
        "--families",
        default=",".join(DEFAULT_FAMILIES),
        help="comma-separated model families to fit per node (default %(default)s, monotone in "
        "utilisation by construction, with a shape prior for loads the node has not shown); "
        "every family given is fitted and the one with the lowest held-out MAE that passes the "
        "checks (never falling along utilisation, plausible on the extender's probe grid) is "
        f"kept; a node where none passes tries {', '.join(LAST_RESORT_FAMILIES)} before the "
        "fleet fallback. The families are listed below",
    )
    parser.add_argument(
        "--max-model-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="largest ONNX file a node's model may have; a family over it is passed over for "
        "the next-ranked one, and a node with none within it uses the fleet fallback. Size a "
        "fleet bundle for ConfigMaps (1 MiB): monoshape is ~1.4 KiB, the other smooth families "
        "~1-3 KiB, rfmono ~15-60 KiB (default: no limit)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="worker processes fitting nodes in parallel (default 0 = all cores)",
    )
    parser.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="fit on a Dask cluster: a scheduler address (tcp://scheduler:8786), or local:N for "
        "N worker processes on this machine. The fleet is split into node groups; each worker "
        "reads its groups (its own Prometheus queries, or its own files: with --input, a path "
        "every worker sees) and fits them; only the fitted models, their figures and curves "
        "and a bounded sample of held-out rows per node (to judge the fleet fallback on) come "
        "back, and nodes without a model of their own get the fleet's shape scaled to their "
        "power on the worker. Same bundle as without it",
    )
    parser.add_argument(
        "--nodes-per-group",
        type=int,
        default=DEFAULT_NODES_PER_GROUP,
        metavar="N",
        help="with --dask and --prometheus: nodes per node group, the unit of work a worker "
        "collects, holds and fits at once (default %(default)s; with --input the groups are "
        "the input's groups of files)",
    )
    parser.add_argument(
        "--cpu-util-percent",
        action="store_true",
        help="the input's cpu_util is in percent (0..100), not a fraction: divide by 100",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed for row subsampling and the tree families (default 0)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bar, warnings and errors only"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # `--start -7d`: argparse would read `-7d` as a flag; collect's CLI has the same fix.
    args = parser.parse_args(attach_relative_times(sys.argv[1:] if argv is None else argv))
    setup_logging(args.quiet)
    if args.prometheus is not None and (args.start is None or args.end is None):
        parser.error("--prometheus needs --start and --end")
    if args.prometheus is None and (
        args.start or args.end or args.collect_config or args.step or args.keep_collected
    ):
        parser.error(
            "--start, --end, --step, --collect-config and --keep-collected only apply with "
            "--prometheus"
        )
    if args.dask is None and args.nodes_per_group != DEFAULT_NODES_PER_GROUP:
        parser.error("--nodes-per-group only applies with --dask")
    if args.dask is not None and (args.jobs or args.keep_collected):
        parser.error(
            "--jobs and --keep-collected do not apply with --dask (the cluster's workers are "
            "the parallelism, and they collect into memory)"
        )
    settings = FitSettings(
        families=tuple(name.strip() for name in args.families.split(",") if name.strip()),
        test_fraction=args.test_fraction,
        min_rows=args.min_rows,
        seed=args.seed,
        max_model_bytes=args.max_model_bytes,
    )
    try:
        resolve_families(settings.families)
        if args.dask is not None:
            run = _fit_on_dask(args, settings)
        else:
            with _metrics_input(args) as metrics:
                run = fit_fleet(
                    metrics,
                    args.out,
                    report_dir=args.report_dir,
                    settings=settings,
                    jobs=args.jobs or None,
                    progress=not args.quiet,
                )
    except (MetricsInputError, FitError, ExportError, ValueError, OSError) as exc:
        # Said once, where argparse says its errors; not also as a log line.
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, PrometheusUnreadable) else 2
    summary = run.report["summary"]
    log.info(
        "bundle written to %s; report in %s; median held-out MAPE %s %% over all %d nodes "
        "(%d with a model of their own)",
        run.bundle_dir,
        run.report_dir,
        summary["median_mape_pct"],
        summary["nodes"],
        summary["nodes_own_model"],
    )
    return 0
