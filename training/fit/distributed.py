"""Fitting a fleet on a Dask cluster (`python -m training.fit --dask`): node groups read and
fitted on workers, one bundle written by the client.

In one process the fleet is bound by one Python decoding Prometheus's JSON, and time grows
with the fleet. Every node's fit is independent, so the fleet is split into node groups and each
group is one task on a `dask.distributed` worker:

1. plan (client, cheap): `plan_file_groups` takes `--input DIR`'s groups of files that share no
   node (`training.dataset.stream_metrics`); `plan_prometheus_groups` lists the exporter
   `instance`s of the range from Prometheus's index (one label-values call and one
   `node_uname_info` read), maps them to nodes as a collection does, and cuts the sorted nodes
   into groups of `--nodes-per-group`, each with a label matcher naming its instances;
2. on a worker, `fit_group` reads its group (its files, or its own range queries with the
   matcher in the collect queries' `$match`, chunked as any collection), cleans it, fits every
   node (`training.fit.node.fit_node`) and keeps a `GroupResult`; what crosses back to the
   client is its `GroupSummary`: the nodes' `FitOutcome`s (ONNX bytes and figures, with each
   node's steady-state curve: 11 numbers, the fleet fallback's material), the input account,
   and a bounded held-out sample per node to judge the fleet fallback on (`FallbackSample`: at
   most `fallback_rows_per_node` rows, the rows the in-process run pools too). Raw rows,
   held-out series and the rows of nodes without a model of their own stay on the worker;
3. the client builds the fleet's shape from those curves and the fleet fallback from it, judged
   on the pooled samples; the workers then scale the shape to each node without a model of its
   own (or judge the fleet fallback on it) where its rows are, and send back per node only the
   scaled model's ONNX and figures (`training.fit.fleet.fallback_for_node`); the client fetches
   the held-out series of the plot's three nodes and writes the report and the bundle with the
   same code as the in-process run (`training.fit.fleet.finish_run`): the same bundle, byte for
   byte in its models.

A group whose task raises is retried (`GROUP_RETRIES`); a group whose worker dies is rerun
elsewhere by the scheduler (up to its `allowed-failures`). A group that still fails is named in
the error with its nodes or files, and no bundle is written: a node is never silently dropped.
Progress is a tqdm bar in the client counting nodes fitted on every worker (workers publish
each node on the `PROGRESS_TOPIC` event topic).

The fallback's test pools an equal share of held-out rows per node, which depends on how many
nodes the fleet has; from Prometheus that is known only once every group is read. Workers sample
for the planned count; should the collection find another count (an instance with no data), the
groups whose samples would differ are read again for exact samples, so the result stays
identical.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import resource
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from livedata.collect_config import (
    CollectConfig,
    group_matcher,
    queries_without_match,
    uname_query,
)
from livedata.metrics_table import AMBIENT_TEMP_C, CPU1_TEMP_C, NODE
from livedata.node_mapping import CollectStats, host_nodes_from_uname, node_of
from livedata.prometheus import PrometheusReader
from training.collect.tables import iter_collected
from training.dataset import (
    CleanedMetrics,
    MetricsStream,
    clean_metrics,
    nothing_left_error,
)
from training.fit.fallback import FleetShape
from training.fit.fleet import (
    FallbackPool,
    FallbackSample,
    FitRun,
    FleetFits,
    InputAccount,
    NodeRowsKept,
    check_settings,
    fallback_for_node,
    fallback_rows_per_node,
    finish_run,
    gives_fallback_rows,
    keep_fallback_rows,
)
from training.fit.node import FitOutcome, fit_node
from training.fit.settings import FitError, FitSettings

log = logging.getLogger("training.fit")  # the package's name: log lines read as they always have

LOCAL_PREFIX = "local:"  # `--dask local:N`: a LocalCluster of N worker processes
DEFAULT_NODES_PER_GROUP = 100  # ~1 M rows at a week of 60 s samples: one worker holds that
GROUP_RETRIES = 2  # a group task that raises is run up to 3 times (Prometheus hiccups)
CONNECT_TIMEOUT_S = 300.0  # a scheduler pod just scaled up from zero may need minutes
PROGRESS_TOPIC = "training.fit/node-fitted"


# --- the cluster ------------------------------------------------------------------------------


@contextlib.contextmanager
def dask_client(address: str) -> Iterator[object]:
    """A `distributed.Client` on `address`: `local:N` starts a LocalCluster of N worker
    processes (one thread each) on 127.0.0.1 for the run; anything else is a scheduler address
    (`tcp://host:8786`). FitError when the cluster cannot be had."""
    from distributed import Client, LocalCluster

    # Dask's own INFO lines (cluster start, every worker's registration) are its internals;
    # the run logs the scheduler and the number of workers itself.
    logging.getLogger("distributed").setLevel(logging.WARNING)
    if address.startswith(LOCAL_PREFIX):
        count = address.removeprefix(LOCAL_PREFIX)
        if not count.isdigit() or int(count) < 1:
            raise FitError(f"--dask {address}: expected local:N with N >= 1 worker processes")
        with (
            LocalCluster(
                n_workers=int(count),
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
            ) as cluster,
            Client(cluster) as client,
        ):
            client.wait_for_workers(int(count), timeout=CONNECT_TIMEOUT_S)
            yield client
        return
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        raise FitError(f"--dask {address}: cannot reach the Dask scheduler ({exc})") from None
    with client:
        yield client


# --- node groups --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileGroup:
    """`--input DIR`: files holding every row of their nodes, read by the worker that fits them
    (the files must be at the same path on the workers: a shared volume)."""

    index: int
    files: tuple[str, ...]
    cpu_util_percent: bool = False
    source: str | None = None

    def describe(self) -> str:
        return f"node group {self.index} ({', '.join(self.files)})"

    def read(self, stats: CollectStats) -> tuple[list[CleanedMetrics], set[str]]:
        stream = MetricsStream(
            groups=(), n_nodes=0, cpu_util_percent=self.cpu_util_percent, source=self.source
        )
        return [stream.read_group([Path(f) for f in self.files])], set()


@dataclass(frozen=True)
class PrometheusGroup:
    """`--prometheus`: the planned nodes of one group and the matcher naming their series."""

    index: int
    nodes: tuple[str, ...]
    matcher: str
    config: CollectConfig
    start: datetime
    end: datetime
    source: str  # names the input in the report, as the in-process run does
    cpu_util_percent: bool = False

    def describe(self) -> str:
        span = self.nodes[0] if len(self.nodes) == 1 else f"{self.nodes[0]} .. {self.nodes[-1]}"
        return f"node group {self.index} ({len(self.nodes)} nodes: {span})"

    def read(self, stats: CollectStats) -> tuple[list[CleanedMetrics], set[str]]:
        """The group's rows from its own range queries, cleaned as the in-process run cleans
        its spilled collection; also the node names collected (before cleaning)."""
        frames = list(
            iter_collected(
                self.config, self.start, self.end, progress=False, stats=stats, match=self.matcher
            )
        )
        frames = [frame for frame in frames if not frame.empty]
        if not frames:
            return [], set()
        frame = pd.concat(frames, ignore_index=True)
        names = {str(name) for name in frame[NODE].unique()}
        batch = clean_metrics(
            frame,
            source=self.source,
            cpu_util_percent=self.cpu_util_percent,
            allow_empty=True,
            log_summary=False,
        )
        return [batch], names


NodeGroup = FileGroup | PrometheusGroup


def plan_file_groups(stream: MetricsStream) -> list[FileGroup]:
    """One task per group of files that share no node (`stream_metrics` made the groups)."""
    return [
        FileGroup(index, tuple(str(f) for f in files), stream.cpu_util_percent, stream.source)
        for index, files in enumerate(stream.groups)
    ]


def plan_prometheus_groups(
    config: CollectConfig,
    start: datetime,
    end: datetime,
    *,
    nodes_per_group: int,
    source: str,
    cpu_util_percent: bool = False,
) -> tuple[list[PrometheusGroup], int]:
    """Node groups for a collection from Prometheus, and the number of nodes planned.

    With `node_from: uname` the groups are cut over the values of the instance label (each host's
    instances go with the node `node_uname_info` or `instance_nodes` names); with
    `node_from: label`, over the node label itself. Instances that map to no node are spread
    over the groups, so their series are still read and reported as unmapped, and series
    without the label go to group 0: every series a collection would read is in one group.
    """
    if nodes_per_group < 1:
        raise FitError(f"--nodes-per-group must be at least 1, got {nodes_per_group}")
    lacking = queries_without_match(config)
    if lacking:
        raise FitError(
            f"--dask has each worker read only its node group, but the collect config's "
            f"{', '.join(lacking)} lack $match; put it inside each selector's braces, e.g. "
            '`node_cpu_seconds_total{mode="idle",$match}` or `ipmi_temperature_celsius{$match}`'
        )
    start_s, end_s = start.timestamp(), end.timestamp()
    uname = config.node_from == "uname"
    label = config.instance_label if uname else config.node_label
    with PrometheusReader(config) as reader:
        values = reader.label_values(label, start_s - config.uname_lookback_s, end_s)
        host_nodes: Mapping[str, str] = {}
        if uname:
            window_s = end_s - start_s + config.uname_lookback_s
            host_nodes = host_nodes_from_uname(
                reader.instant(uname_query(config, window_s), end_s), config
            )
    node_of_value = {
        value: node_of({config.instance_label: value}, config, host_nodes) if uname else value
        for value in sorted(set(values) - {""})
    }
    nodes = sorted({node for node in node_of_value.values() if node})
    if not nodes:
        raise FitError(
            f"Prometheus at {source} has no data for any node "
            "(check the range, the queries and the node mapping)"
        )
    group_nodes = [nodes[i : i + nodes_per_group] for i in range(0, len(nodes), nodes_per_group)]
    group_of = {node: i // nodes_per_group for i, node in enumerate(nodes)}
    group_values: list[list[str]] = [[] for _ in group_nodes]
    group_values[0].append("")  # series without the label: still read, reported if unmapped
    unmapped = [value for value, node in node_of_value.items() if not node]
    for value, node in node_of_value.items():
        if node:
            group_values[group_of[node]].append(value)
    for turn, value in enumerate(unmapped):
        group_values[turn % len(group_values)].append(value)
    log.info(
        "planned %d node groups of up to %d nodes: %d nodes, %d %s values (%d map to no node)",
        len(group_nodes),
        nodes_per_group,
        len(nodes),
        len(node_of_value),
        label,
        len(unmapped),
    )
    groups = [
        PrometheusGroup(
            index=index,
            nodes=tuple(names),
            matcher=group_matcher(label, group_values[index]),
            config=config,
            start=start,
            end=end,
            source=source,
            cpu_util_percent=cpu_util_percent,
        )
        for index, names in enumerate(group_nodes)
    ]
    return groups, len(nodes)


# --- on a worker --------------------------------------------------------------------------------


@dataclass
class GroupSummary:
    """What one node group sends back to the client: small, whatever the group's rows."""

    index: int
    outcomes: list[FitOutcome]  # no held-out series, no rows
    fallback_samples: list[FallbackSample]  # at most the planned held-out rows per node
    account: InputAccount
    nodes_collected: set[str]  # node names read before cleaning (Prometheus groups)
    collect_stats: dict  # unmapped series, averaged duplicates, missing sensors
    worker: str
    read_s: float
    fit_s: float


@dataclass
class GroupResult:
    """A group's full result, kept on the worker that made it: the summary, plus the rows the
    client asks about later (held-out series for the plot, the rows of nodes without a model of
    their own: their fallbacks are scaled to and judged on them)."""

    summary: GroupSummary
    heldout: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    kept: dict[str, NodeRowsKept] = field(default_factory=dict)


def fit_group(
    group: NodeGroup, settings: FitSettings, fallback_rows: int, run_id: str
) -> GroupResult:
    """Read, clean and fit one node group (a Dask task)."""
    _limit_threads()
    worker = _worker_address()
    stats = CollectStats()
    started = time.perf_counter()
    batches, collected = group.read(stats)
    read_s = time.perf_counter() - started
    account = InputAccount()
    result = GroupResult(
        GroupSummary(
            index=group.index,
            outcomes=[],
            fallback_samples=[],
            account=account,
            nodes_collected=collected,
            collect_stats=_stats_summary(stats),
            worker=worker,
            read_s=read_s,
            fit_s=0.0,
        )
    )
    summary = result.summary
    for rows in account.node_rows(batches):
        outcome = fit_node(rows, settings)
        if gives_fallback_rows(rows, settings):
            sample = FallbackSample.take(rows, settings.test_fraction, settings.seed, fallback_rows)
            summary.fallback_samples.append(sample)
        if outcome.heldout is not None:
            result.heldout[outcome.node], outcome.heldout = outcome.heldout, None
        kept = keep_fallback_rows(outcome)
        if kept is not None:
            result.kept[outcome.node] = kept
        summary.outcomes.append(outcome)
        _publish_progress(run_id, outcome.node)
    summary.fit_s = time.perf_counter() - started - read_s
    return result


def summary_of(result: GroupResult) -> GroupSummary:
    return result.summary


def judge_group(
    result: GroupResult,
    shape: FleetShape,
    fleet_model: object,
    nodes: Sequence[str],
    settings: FitSettings,
) -> dict[str, dict]:
    """The group's nodes without a model of their own: the fleet's shape scaled to each, or the
    fleet fallback judged on it, where their rows are (`fallback_for_node`: small answers)."""
    outcomes = {o.node: o for o in result.summary.outcomes}
    return {
        node: fallback_for_node(outcomes[node], result.kept[node], shape, fleet_model, settings)
        for node in nodes
    }


def heldout_of(result: GroupResult, node: str) -> dict[str, np.ndarray] | None:
    series = result.heldout.get(node)
    if series is None:
        return None
    time_s, measured_w, predicted_w = series
    return {"time_s": time_s, "measured_w": measured_w, "predicted_w": predicted_w}


def peak_rss_mib() -> float:
    """This process's high-water resident memory (the kernel's count), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


_threads_limited = False


def _limit_threads() -> None:
    # One BLAS/OpenMP thread per task, as in-process workers have: the cluster's workers are
    # the parallelism, and the same thread count gives the same floating-point sums.
    global _threads_limited
    if not _threads_limited:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
        _threads_limited = True


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except ValueError:  # called outside a worker (tests call tasks directly)
        return "local"


def _publish_progress(run_id: str, node: str) -> None:
    with contextlib.suppress(ValueError):
        from distributed import get_worker

        get_worker().log_event(PROGRESS_TOPIC, {"run": run_id, "node": node})


def _stats_summary(stats: CollectStats) -> dict:
    """The collection's findings as plain data (CollectStats holds lambdas: not picklable)."""
    return {
        "chunks": stats.chunks,
        "unmapped": stats.unmapped_counts(),
        "unmapped_instances": stats.unmapped_instances(),
        "duplicates": {node: sorted(columns) for node, columns in stats.duplicates.items()},
        "sensors_missing": {
            node: [c for c in (AMBIENT_TEMP_C, CPU1_TEMP_C) if c not in chosen]
            for node, chosen in stats.sensors.items()
            if AMBIENT_TEMP_C not in chosen or CPU1_TEMP_C not in chosen
        },
    }


# --- the client ---------------------------------------------------------------------------------


class _NodeProgress:
    """The client's tqdm bar, fed by the workers' per-node events (distinct nodes counted, so
    a rerun group does not count its nodes twice)."""

    def __init__(self, total: int, run_id: str, show: bool) -> None:
        self.run_id = run_id
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.bar = tqdm(
            total=total,
            desc="fitting nodes (dask)",
            unit="node",
            disable=not show or not sys.stderr.isatty(),
        )

    def on_event(self, event: tuple[float, dict]) -> None:
        message = event[1]
        if not isinstance(message, dict) or message.get("run") != self.run_id:
            return
        with self.lock:
            if message["node"] not in self.seen:
                self.seen.add(message["node"])
                self.bar.update(1)

    def group_done(self, outcomes: Sequence[FitOutcome]) -> None:
        with self.lock:  # events may lag behind the results; the bar never does
            fresh = {o.node for o in outcomes} - self.seen
            self.seen |= fresh
            self.bar.update(len(fresh))

    def close(self) -> None:
        self.bar.close()


def fit_fleet_on_dask(
    client,
    groups: Sequence[NodeGroup],
    n_nodes_planned: int,
    out_dir: Path,
    *,
    report_dir: Path,
    settings: FitSettings,
    exact_node_count: bool,
    progress: bool = True,
) -> FitRun:
    """Fit every node group on the cluster behind `client`, then write one report and bundle.

    `n_nodes_planned` sizes the fleet fallback's per-node sample; `exact_node_count` says it is
    the fleet's true count (files), not an estimate (Prometheus's index). Raises FitError
    naming every node group that failed after its retries (no bundle is written then).
    """
    from distributed import as_completed

    check_settings(settings)
    if not groups:
        raise FitError("nothing to fit: no node groups were planned")
    run_id = uuid.uuid4().hex[:8]
    planned_rows = fallback_rows_per_node(settings, n_nodes_planned)
    workers = len(client.scheduler_info().get("workers", {}))
    log.info(
        "fitting %d planned nodes in %d node groups on %d Dask worker(s) at %s, families %s",
        n_nodes_planned,
        len(groups),
        workers,
        client.scheduler.address,
        ", ".join(settings.families),
    )
    by_index = {group.index: group for group in groups}
    results = {
        group.index: client.submit(
            fit_group,
            group,
            settings,
            planned_rows,
            run_id,
            key=f"fit-group-{run_id}-{group.index:05d}",
            retries=GROUP_RETRIES,
            pure=False,
        )
        for group in groups
    }
    summaries = {
        client.submit(summary_of, future, key=f"summary-{run_id}-{index:05d}"): index
        for index, future in results.items()
    }
    bar = _NodeProgress(n_nodes_planned, run_id, progress)
    client.subscribe_topic(PROGRESS_TOPIC, bar.on_event)
    gathered: dict[int, GroupSummary] = {}
    failed: dict[int, str] = {}
    try:
        for future in as_completed(list(summaries)):
            index = summaries[future]
            try:
                summary = future.result()
            except Exception as exc:  # the task's error, or KilledWorker after reruns
                failed[index] = f"{type(exc).__name__}: {exc}"
                log.error("%s failed: %s", by_index[index].describe(), failed[index])
                continue
            gathered[index] = summary
            bar.group_done(summary.outcomes)
    finally:
        client.unsubscribe_topic(PROGRESS_TOPIC)
        bar.close()
    try:
        if failed:
            raise FitError(_failure_message(failed, by_index, len(groups)))
        fits, node_group, summaries_sorted = _merge(gathered, by_index)
        pool_rows = planned_rows
        if not exact_node_count:
            collected = set().union(*(s.nodes_collected for s in summaries_sorted))
            pool_rows = fallback_rows_per_node(settings, len(collected))
        _fill_pool(client, fits, summaries_sorted, by_index, settings, pool_rows, run_id)

        # What crossed from the workers to this process, in the report: models, figures and
        # bounded samples, never a group's rows.
        received = {
            "group_summaries_bytes": sum(summary_bytes(s) for s in summaries_sorted),
            "fallback_sample_rows": sum(
                len(x.test) for s in summaries_sorted for x in s.fallback_samples
            ),
            "fallback_sample_rows_per_node": planned_rows,
            "fallback_answer_nodes": 0,  # nodes without a model of their own
            "fallback_answers_bytes": 0,  # their scaled models or judgements
            "heldout_series_nodes": 0,
        }

        def judge_on_workers(
            shape: FleetShape, fleet_model: object, nodes: list[FitOutcome]
        ) -> Mapping[str, dict]:
            by_group: dict[int, list[str]] = defaultdict(list)
            for outcome in nodes:
                by_group[node_group[outcome.node]].append(outcome.node)
            if not by_group:
                return {}
            shared_shape, shared_model = client.scatter([shape, fleet_model], hash=False)
            futures = [
                client.submit(
                    judge_group,
                    results[i],
                    shared_shape,
                    shared_model,
                    names,
                    settings,
                    pure=False,
                )
                for i, names in sorted(by_group.items())
            ]
            judged: dict[str, dict] = {}
            for part in client.gather(futures):
                received["fallback_answers_bytes"] += len(pickle.dumps(part, protocol=5))
                received["fallback_answer_nodes"] += len(part)
                judged.update(part)
            return judged

        def heldout_series(node: str) -> dict[str, np.ndarray] | None:
            received["heldout_series_nodes"] += 1
            return client.submit(heldout_of, results[node_group[node]], node, pure=False).result()

        run_summary = _run_summary(client, summaries_sorted, by_index, n_nodes_planned)
        run_summary["received"] = received
        return finish_run(
            fits,
            out_dir,
            report_dir=report_dir,
            settings=settings,
            judge=judge_on_workers,
            heldout_series=heldout_series,
            report_extra={"distributed": run_summary},
        )
    finally:
        client.cancel(list(results.values()) + list(summaries))


def _failure_message(failed: Mapping[int, str], by_index: Mapping[int, NodeGroup], total: int):
    lines = [
        f"{len(failed)} of {total} node groups failed after {GROUP_RETRIES} retries (or lost "
        "their workers too often), so their nodes have no model and no bundle was written:"
    ]
    for index in sorted(failed):
        group = by_index[index]
        nodes = f"; nodes {', '.join(group.nodes)}" if isinstance(group, PrometheusGroup) else ""
        lines.append(f"  {group.describe()}{nodes}: {failed[index]}")
    return "\n".join(lines)


def _merge(
    gathered: Mapping[int, GroupSummary], by_index: Mapping[int, NodeGroup]
) -> tuple[FleetFits, dict[str, int], list[GroupSummary]]:
    """Every group's account and outcomes in group order, as the in-process run sums them."""
    account = InputAccount()
    outcomes: dict[str, FitOutcome] = {}
    node_group: dict[str, int] = {}
    ordered = [gathered[index] for index in sorted(gathered)]
    for summary in ordered:
        account.merge(summary.account, by_index[summary.index].describe())
        for outcome in summary.outcomes:
            outcomes[outcome.node] = outcome
            node_group[outcome.node] = summary.index
    if account.tally.rows_kept == 0:
        raise nothing_left_error(account.tally)
    log.info(
        "kept %d of %d rows in %d node group(s); dropped %d",
        account.tally.rows_kept,
        account.tally.rows_read,
        len(ordered),
        account.tally.rows_read - account.tally.rows_kept,
    )
    _log_collect_findings(ordered)
    return FleetFits(outcomes, FallbackPool(0), account), node_group, ordered


def _fill_pool(
    client,
    fits: FleetFits,
    summaries: list[GroupSummary],
    by_index: Mapping[int, NodeGroup],
    settings: FitSettings,
    pool_rows: int,
    run_id: str,
) -> None:
    """Pool every node's fallback sample at the exact rows per node; groups whose samples were
    taken for another count of nodes than the collection found, and would differ, are read
    again with the exact size."""
    samples = {s.index: s.fallback_samples for s in summaries}
    differing = sorted(
        s.index for s in summaries if any(not x.fits(pool_rows) for x in s.fallback_samples)
    )
    if differing:
        log.warning(
            "the plan counted another number of nodes than Prometheus had data for, so the "
            "fleet fallback takes %d held-out rows per node, not the %d sampled: reading %d "
            "node group(s) again",
            pool_rows,
            next(x.rows_per_node for i in differing for x in samples[i]),
            len(differing),
        )
        again = {
            index: client.submit(
                fit_group,
                by_index[index],
                settings,
                pool_rows,
                run_id,
                key=f"fit-group-again-{run_id}-{index:05d}",
                retries=GROUP_RETRIES,
                pure=False,
            )
            for index in differing
        }
        for index, future in again.items():  # only the summary crosses, as the first time
            samples[index] = client.submit(summary_of, future).result().fallback_samples
            future.cancel()
    fits.pool = FallbackPool(pool_rows)
    for index in sorted(samples):
        for sample in samples[index]:
            fits.pool.add(sample)


def _log_collect_findings(summaries: Sequence[GroupSummary]) -> None:
    """The collection's warnings, fleet-wide, as the in-process collection logs them."""
    unmapped: dict[str, int] = defaultdict(int)
    instances: set[str] = set()
    for summary in summaries:
        found = summary.collect_stats
        for metric, count in found.get("unmapped", {}).items():
            unmapped[metric] += count
        instances.update(found.get("unmapped_instances", []))
        for node, columns in found.get("duplicates", {}).items():
            log.warning("node %s: several series for %s were averaged", node, columns)
        for node, missing in found.get("sensors_missing", {}).items():
            log.warning("node %s: no BMC sensor matched %s (check sensor_patterns)", node, missing)
    if any(unmapped.values()):
        names = sorted(instances)
        log.warning(
            "%d series map to no node (by metric: %s); instances: %s",
            sum(unmapped.values()),
            dict(unmapped),
            ", ".join(names[:10]) + (" ..." if len(names) > 10 else ""),
        )


def _run_summary(
    client,
    summaries: Sequence[GroupSummary],
    by_index: Mapping[int, NodeGroup],
    n_nodes_planned: int,
) -> dict:
    """The report's `distributed` section: where each group ran and what it cost."""
    worker_peaks = client.run(peak_rss_mib)
    busy_s: dict[str, float] = defaultdict(float)
    for summary in summaries:
        busy_s[summary.worker] += summary.read_s + summary.fit_s
    return {
        "scheduler": client.scheduler.address,
        "workers": len(worker_peaks),
        "node_groups": len(by_index),
        "nodes_planned": n_nodes_planned,
        "client_peak_mib": round(peak_rss_mib(), 1),
        "worker_peak_mib": {w: round(m, 1) for w, m in sorted(worker_peaks.items())},
        "worker_busy_s": {w: round(s, 2) for w, s in sorted(busy_s.items())},
        "groups": [
            {
                "index": s.index,
                "nodes": len(s.outcomes),
                "worker": s.worker,
                "read_s": round(s.read_s, 3),
                "fit_s": round(s.fit_s, 3),
            }
            for s in summaries
        ],
    }


def summary_bytes(summary: GroupSummary) -> int:
    """The pickled size of what a group sends back (the tests' and the bench's measure)."""
    return len(pickle.dumps(summary, protocol=5))
