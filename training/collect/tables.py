"""Collect node metrics from Prometheus over a time range into contract-1 tables (pandas).

This is the first step of the pipeline: node_exporter gives each node's CPU busy share,
ipmi_exporter its BMC temperatures and DCMI input power. We read them over a time range and
build one row per node per step:
`node, timestamp, cpu_util, ambient_temp_c, cpu1_temp_c, cpu2_temp_c, power_w`, followed by
the node facts Prometheus has (`cpu_model`, `cpu_cores`, `cpu_sockets`, `bmc_max_power_w`,
`psu_rating_w`: `training.collect.facts`), the same on every row of a node.

What to ask and how answers map to nodes and columns is the shared live-data layer's
(`livedata.collect_config`, `livedata.node_mapping`), and so is talking to Prometheus
(`livedata.prometheus`: bounded time, `CollectError` naming the URL, the query and the
problem): the extender's live telemetry reads the same way. What is training's own is the time
range and the pandas tables.

Long ranges are read in time chunks: Prometheus refuses range queries of more than 11,000
points per series, and memory holds one chunk, so a chunk spans as many steps as keep its
samples within a budget (`max_samples_per_chunk`): fewer steps for a larger fleet, so memory
does not grow with the number of nodes. `collect_metrics` gathers the chunks into one table;
`collect_to_directory` spills them to node-group Parquet files that `training.fit` streams.
`collect_instant` is the same read at one instant, as a table (the live poller takes the
plain readings from `livedata.instant` instead).
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from livedata.collect_config import (
    CollectConfig,
    CollectConfigError,
    SensorRules,
    collect_queries,
    compile_sensor_rules,
    uname_query,
)
from livedata.instant import read_instant
from livedata.metrics_table import (
    AMBIENT_TEMP_C,
    CPU1_TEMP_C,
    NODE,
    TIMESTAMP,
    VALUE_COLUMNS,
)
from livedata.node_mapping import CollectStats, host_nodes_from_uname, node_samples
from livedata.prometheus import PrometheusReader, Series
from training.collect.facts import join_facts, read_node_facts

# The package's name, not this module's: log lines read `training.collect: ...` (the training
# scale bench times the collection by its "collected" line).
log = logging.getLogger("training.collect")

# Before the first answer the fleet's size is unknown: the first chunk is short, and later ones
# are sized from the series it returned (see chunk_steps).
FIRST_CHUNK_STEPS = 120


def chunk_steps(config: CollectConfig, series_per_step: int) -> int:
    """Steps in the next time chunk: as many as keep `series_per_step` x steps within
    `max_samples_per_chunk`, at least one, at most `max_points_per_series` (Prometheus's
    limit). `series_per_step` is the most series a chunk has returned so far, 0 before any."""
    if series_per_step <= 0:
        return min(FIRST_CHUNK_STEPS, config.max_points_per_series)
    return max(
        1, min(config.max_points_per_series, config.max_samples_per_chunk // series_per_step)
    )


# --------------------------------------------------------------------------------------------
# Answers -> tables (pure)


def build_table(
    answers: Mapping[str, Sequence[Series]],
    config: CollectConfig,
    host_nodes: Mapping[str, str],
    stats: CollectStats,
    rules: SensorRules | None = None,
) -> pd.DataFrame:
    """Contract-1 rows from query answers keyed `cpu_util`, `temperature`, `power_w`.

    Several series for one node and column (say two scrape jobs) are averaged and noted in
    `stats.duplicates`; series that map to no node are noted in `stats.unmapped_series`.
    """
    parts = node_samples(answers, config, host_nodes, stats, rules)
    if not parts:
        return empty_table()
    # one frame per chunk, not per node: a DataFrame per node costs more than its rows
    return _contract_frame(
        np.repeat([part.node for part in parts], [len(part.timestamps_s) for part in parts]),
        np.concatenate([part.timestamps_s for part in parts]),
        {
            column: np.concatenate(
                [part.values.get(column, np.full(len(part.timestamps_s), np.nan)) for part in parts]
            )
            for column in VALUE_COLUMNS
        },
    )


def _contract_frame(
    nodes: np.ndarray, timestamps_s: np.ndarray, values: Mapping[str, np.ndarray]
) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            NODE: pd.array(nodes, dtype="str"),
            TIMESTAMP: pd.to_datetime(np.asarray(timestamps_s, dtype=float), unit="s", utc=True),
        }
    )
    for column in VALUE_COLUMNS:
        frame[column] = values[column] if column in values else np.full(len(frame), np.nan)
    return frame


def empty_table() -> pd.DataFrame:
    """A contract-1 table with no rows (the right columns and dtypes)."""
    return _contract_frame(np.array([], dtype=object), np.array([], dtype=float), {})


# --------------------------------------------------------------------------------------------
# Reading a range


def _log_summary(frame: pd.DataFrame, stats: CollectStats) -> None:
    log.info(
        "collected %d rows for %d nodes in %d chunk(s)",
        len(frame),
        frame[NODE].nunique(),
        stats.chunks,
    )
    unmapped = stats.unmapped_counts()
    if any(unmapped.values()):
        instances = stats.unmapped_instances()
        log.warning(
            "%d series map to no node (by metric: %s); instances: %s",
            sum(unmapped.values()),
            unmapped,
            ", ".join(instances[:10]) + (" ..." if len(instances) > 10 else ""),
        )
    for node, columns in sorted(stats.duplicates.items()):
        log.warning("node %s: several series for %s were averaged", node, sorted(columns))
    for node, chosen in sorted(stats.sensors.items()):
        missing = [c for c in (AMBIENT_TEMP_C, CPU1_TEMP_C) if c not in chosen]
        if missing:
            log.warning("node %s: no BMC sensor matched %s (check sensor_patterns)", node, missing)
        log.debug("node %s sensors: %s", node, chosen)


def iter_collected(
    config: CollectConfig,
    start: datetime,
    end: datetime,
    *,
    progress: bool = True,
    stats: CollectStats | None = None,
    match: str = "",
) -> Iterator[pd.DataFrame]:
    """Contract-1 rows for `[start, end]`, one time chunk at a time (every node, as many steps
    as `chunk_steps` allows): what is held at once is one chunk, not the range.

    `match` (`livedata.collect_config.group_matcher`) narrows every query to one node group:
    how a `training.fit --dask` worker reads only its own nodes."""
    stats = stats if stats is not None else CollectStats()
    step_s = int(config.step_s)
    start_s = math.floor(start.timestamp())
    end_s = math.floor(end.timestamp())
    if end_s < start_s:
        raise CollectConfigError(f"end ({end_s}) is before start ({start_s})")
    rules = compile_sensor_rules(config)
    show = progress and sys.stderr.isatty()
    queries = collect_queries(config, match)
    facts: pd.DataFrame | None = None  # read once the first chunk has answered
    series_per_step = 0
    chunk_start_s = start_s
    with (
        contextlib.ExitStack() as open_readers,
        # A chunk's range queries run at once, each on its own connection: the server
        # evaluates one while this process decodes another (a fifth less wall time at 1,000
        # nodes on 2 cores; asking for the next chunk early gained nothing more).
        ThreadPoolExecutor(len(queries), thread_name_prefix="collect") as pool,
        tqdm(
            total=(end_s - start_s) // step_s + 1,
            desc="collect",
            unit="step",
            file=sys.stderr,
            disable=not show,
        ) as bar,
    ):
        # a reader per query and one for node names: a reader (session, last response for
        # error messages) is used by one thread only
        readers = {key: open_readers.enter_context(PrometheusReader(config)) for key in queries}
        uname_reader = open_readers.enter_context(PrometheusReader(config))
        while chunk_start_s <= end_s:
            steps = chunk_steps(config, series_per_step)
            chunk_end_s = min(chunk_start_s + (steps - 1) * step_s, end_s)
            pending = {
                key: pool.submit(readers[key].range, query, chunk_start_s, chunk_end_s)
                for key, query in queries.items()
            }
            host_nodes: dict[str, str] = {}
            if config.node_from == "uname":
                window_s = chunk_end_s - chunk_start_s + config.uname_lookback_s
                host_nodes = host_nodes_from_uname(
                    uname_reader.instant(uname_query(config, window_s, match), chunk_end_s), config
                )
            answers = {key: answer.result() for key, answer in pending.items()}
            if facts is None:
                facts = read_node_facts(config, start_s, end_s, match)
                if len(facts):
                    log.info(
                        "node facts for %d node(s): %s",
                        len(facts),
                        ", ".join(c for c in facts.columns if c != NODE),
                    )
            series_per_step = max(series_per_step, sum(map(len, answers.values())))
            stats.chunks += 1
            stats.largest_chunk_samples = max(
                stats.largest_chunk_samples,
                sum(len(one.values) for found in answers.values() for one in found),
            )
            yield join_facts(build_table(answers, config, host_nodes, stats, rules), facts)
            bar.update((chunk_end_s - chunk_start_s) // step_s + 1)
            chunk_start_s = chunk_end_s + step_s


def collect_metrics(
    config: CollectConfig,
    start: datetime,
    end: datetime,
    *,
    progress: bool = True,
    stats: CollectStats | None = None,
) -> pd.DataFrame:
    """Contract-1 rows for every node and step in `[start, end]`, read from Prometheus.

    Pass a `CollectStats` to learn what was unmapped or ambiguous (also logged). The whole
    range is held in memory (~0.8 KiB per row while collecting); for fleets, see
    `collect_to_directory`.
    """
    stats = stats if stats is not None else CollectStats()
    frames = list(iter_collected(config, start, end, progress=progress, stats=stats))
    frame = pd.concat(frames, ignore_index=True) if frames else empty_table()
    frame = frame.sort_values([NODE, TIMESTAMP], kind="stable").reset_index(drop=True)
    _log_summary(frame, stats)
    return frame


def collect_to_directory(
    config: CollectConfig,
    start: datetime,
    end: datetime,
    out_dir: str | Path,
    *,
    nodes_per_file: int = 10,
    progress: bool = True,
    stats: CollectStats | None = None,
) -> list[Path]:
    """Collect into a directory of Parquet files of `nodes_per_file` nodes each.

    Each time chunk is split by node group and appended to the group's file as a row group,
    so memory holds one chunk (lower `max_samples_per_chunk` for smaller chunks), and the
    directory streams into `training.fit --input DIR` one file at a time. Nodes are numbered
    in the order they are first seen. Returns the files written, in group order.
    """
    if nodes_per_file < 1:
        raise CollectConfigError(f"nodes_per_file must be at least 1, got {nodes_per_file}")
    stats = stats if stats is not None else CollectStats()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    group_of: dict[str, int] = {}
    writers: dict[int, pq.ParquetWriter] = {}
    files: dict[int, Path] = {}
    rows = 0
    try:
        for chunk in iter_collected(config, start, end, progress=progress, stats=stats):
            for node in chunk[NODE].unique():
                group_of.setdefault(str(node), len(group_of) // nodes_per_file)
            groups = chunk[NODE].map(group_of).to_numpy()
            for group in np.unique(groups):
                part = chunk[groups == group].sort_values([NODE, TIMESTAMP], kind="stable")
                table = pa.Table.from_pandas(part, preserve_index=False)
                if group not in writers:
                    files[group] = out_dir / f"nodes-{group:05d}.parquet"
                    writers[group] = pq.ParquetWriter(files[group], table.schema)
                writers[group].write_table(table.cast(writers[group].schema))
                rows += len(part)
    finally:
        for writer in writers.values():
            writer.close()
    log.info(
        "collected %d rows for %d nodes into %d file(s) in %s (%d unmapped series)",
        rows,
        len(group_of),
        len(files),
        out_dir,
        sum(stats.unmapped_counts().values()),
    )
    return [files[group] for group in sorted(files)]


def collect_instant(
    config: CollectConfig,
    *,
    at: datetime | None = None,
    stats: CollectStats | None = None,
) -> pd.DataFrame:
    """One contract-1 row per node, as Prometheus sees it at `at` (default: now).

    `livedata.instant.read_instant` as a table: one instant query per metric for all nodes;
    `timestamp` is the evaluation time. A node without a power reading has `power_w` NaN;
    without a sensor, that temperature is NaN. The node facts follow, as for a range.
    """
    readings = read_instant(config, at_s=at.timestamp() if at is not None else None, stats=stats)
    if not readings:
        return empty_table()
    at_s = max(reading.observed_at_s for reading in readings)
    facts = read_node_facts(config, at_s, at_s)
    table = _contract_frame(
        np.array([reading.node for reading in readings]),
        np.array([reading.observed_at_s for reading in readings]),
        {
            column: np.array([reading.values[column] for reading in readings])
            for column in VALUE_COLUMNS
        },
    )
    return join_facts(table, facts)
