"""`python -m training.collect`: the command line of the collect step.

Reads node CPU utilisation, BMC temperatures and power from Prometheus over a time range and
writes the contract-1 metrics table (one file, or with `--nodes-per-file` a directory of
node-group Parquet files). The work is `training.collect.tables`; this module parses flags,
sets up logging, and turns failures into one-line errors and exit statuses (2: bad input,
1: Prometheus could not be read or had no data).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from livedata.collect_config import (
    CollectConfigError,
    load_collect_config,
    parse_duration_s,
    parse_time,
)
from livedata.metrics_table import NODE
from livedata.node_mapping import CollectStats
from livedata.prometheus import CollectError
from training.collect.tables import collect_metrics, collect_to_directory, empty_table
from training.dataset import write_metrics

log = logging.getLogger("training.collect")  # also when run as __main__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.collect",
        description=(
            "Read node CPU utilisation, BMC temperatures and power from Prometheus over a time "
            "range and write the contract-1 metrics table (the input of training.fit)."
        ),
    )
    parser.add_argument(
        "--prometheus",
        required=True,
        metavar="URL",
        help="Prometheus base URL, e.g. http://prometheus:9090 (required)",
    )
    parser.add_argument(
        "--start",
        required=True,
        metavar="TIME",
        help="range start: RFC 3339 (2026-01-05T00:00:00Z), Unix seconds, "
        "or relative to now (-7d, now-12h)",
    )
    parser.add_argument(
        "--end",
        default="now",
        metavar="TIME",
        help="range end, same forms as --start (default: now)",
    )
    parser.add_argument(
        "--step",
        default=None,
        metavar="DURATION",
        help="sample interval of the table in whole seconds: 60, 60s, 5m "
        "(default: 60s, or the config's step_s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="per-request timeout in seconds (default: 30 or the config's timeout_s)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML/JSON file of CollectConfig settings: queries, sensor_patterns, "
        "node_from (uname|label), instance_nodes... "
        "(default: built-in node_exporter + ipmi_exporter queries)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="FILE",
        help="output table, .parquet or .csv; with --nodes-per-file a directory (required)",
    )
    parser.add_argument(
        "--nodes-per-file",
        type=int,
        default=None,
        metavar="N",
        help="write --out as a directory of Parquet files of N nodes each, one time chunk at a "
        "time, so memory holds one chunk instead of the whole range; `python -m training.fit "
        "--input DIR` then reads it one file at a time (default: one table in memory)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar; log warnings only")
    parser.add_argument(
        "--verbose", action="store_true", help="also log the sensors chosen per node"
    )
    return parser


_TIME_FLAGS = ("--start", "--end")


def attach_relative_times(argv: Sequence[str]) -> list[str]:
    """`--start -7d` -> `--start=-7d`: argparse would take `-7d` for an unknown flag."""
    joined: list[str] = []
    items = list(argv)
    index = 0
    while index < len(items):
        item = items[index]
        following = items[index + 1] if index + 1 < len(items) else ""
        if item in _TIME_FLAGS and following.startswith("-") and following[1:2].isdigit():
            joined.append(f"{item}={following}")
            index += 2
            continue
        joined.append(item)
        index += 1
    return joined


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(attach_relative_times(argv))
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # urllib3 warns on every retry; the final CollectError says what went wrong, once.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    if args.nodes_per_file is None and args.out.suffix.lower() not in (".parquet", ".csv"):
        print(f"error: --out must end in .parquet or .csv, got {args.out.name!r}", file=sys.stderr)
        return 2
    try:
        step_s = parse_duration_s(args.step) if args.step is not None else None
        config = load_collect_config(
            args.config, url=args.prometheus, step_s=step_s, timeout_s=args.timeout
        )
        now = datetime.now(UTC)
        start = parse_time(args.start, now=now)
        end = parse_time(args.end, now=now)
        if end < start:
            raise CollectConfigError(
                f"--end ({end.isoformat()}) is before --start ({start.isoformat()})"
            )
    except CollectConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stats = CollectStats()
    try:
        if args.nodes_per_file is not None:
            files = collect_to_directory(
                config,
                start,
                end,
                args.out,
                nodes_per_file=args.nodes_per_file,
                progress=not args.quiet,
                stats=stats,
            )
            frame = empty_table() if not files else None
        else:
            frame = collect_metrics(config, start, end, progress=not args.quiet, stats=stats)
    except (CollectError, CollectConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if frame is None:  # written by collect_to_directory, which logged the summary
        return 0
    if frame.empty:
        print(
            f"error: Prometheus at {config.url} has no data for any node between "
            f"{start.isoformat()} and {end.isoformat()} "
            "(check the range, the queries and the node mapping)",
            file=sys.stderr,
        )
        return 1
    write_metrics(frame, args.out)
    log.info(
        "wrote %d rows for %d nodes to %s (%d unmapped series)",
        len(frame),
        frame[NODE].nunique(),
        args.out,
        sum(stats.unmapped_counts().values()),
    )
    return 0
