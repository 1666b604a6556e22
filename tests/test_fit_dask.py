"""`python -m training.fit --dask`: node groups read and fitted on a real Dask cluster.

A real `dask.distributed` LocalCluster (worker processes behind nannies, as in production)
and a real Prometheus holding a synthetic fleet's exporter series (backfilled with promtool, as
in tests/test_fit_prometheus.py). What must hold: the bundle is the in-process bundle, byte for
byte in its models and equal in its figures, fallbacks included (the fleet's shape from the
nodes' own curves, scaled to nodes without a model of their own on the workers that hold their
rows); only models, figures, curves and bounded fallback samples cross from the workers to the
client; a worker killed mid-run is replaced and its groups rerun; a group that keeps failing is
named with its nodes, and no bundle is written.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest

from bench.training_scale import backfill_prometheus
from livedata.collect_config import (
    DEFAULT_CPU_QUERY,
    CollectConfig,
    group_matcher,
    render_query,
)
from tests.support import fit_cli
from tests.support.prometheus import PrometheusServer, require_prometheus, start_prometheus
from training.collect import collect_to_directory
from training.dataset import stream_metrics
from training.fit import FitSettings, fit_fleet
from training.fit.distributed import (
    GroupSummary,
    fit_fleet_on_dask,
    fit_group,
    judge_group,
    plan_file_groups,
    plan_prometheus_groups,
    summary_bytes,
    summary_of,
)
from training.fit.fallback import fleet_fallback, fleet_shape
from training.fit.fleet import FallbackPool, FallbackSample, fallback_rows_per_node
from training.fit.node import NodeRows
from training.synth import node_names, write_fleet_files

NODES = 6
ROWS = 900  # 15 h at 60 s
MIN_ROWS = "300"


def run_fit(*args: str, tmpdir: Path) -> subprocess.CompletedProcess:
    return fit_cli.run_fit(*args, "--min-rows", MIN_ROWS, tmpdir=tmpdir)


def _report(bundle: Path) -> dict:
    return json.loads((bundle.parent / f"{bundle.name}-report" / "report.json").read_text())


def assert_same_bundle(expected: Path, got: Path) -> None:
    """Same models byte for byte, same manifest entries, same report (but its time and the
    Dask run's own section)."""
    manifests = [json.loads((b / "manifest.json").read_text()) for b in (expected, got)]
    assert manifests[0]["nodes"] == manifests[1]["nodes"]  # sha256, family, metrics, rows...
    assert manifests[0]["fallback"] == manifests[1]["fallback"]
    for name, entry in [*manifests[0]["nodes"].items(), ("fallback", manifests[0]["fallback"])]:
        assert (expected / entry["model"]).read_bytes() == (got / entry["model"]).read_bytes(), name
    reports = [_report(b) for b in (expected, got)]
    for report in reports:
        report.pop("created_at")
        report.pop("distributed", None)
    assert reports[0] == reports[1]


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    """A LocalCluster of 2 worker processes (with nannies, which restart a killed worker)."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as local,
        Client(local) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, str, str]]:
    """(Prometheus, --start, --end) serving NODES synthetic nodes x ROWS steps."""
    require_prometheus()
    work = tmp_path_factory.mktemp("fleet")
    loaded = backfill_prometheus(NODES, ROWS, str(work), seed=5)
    with start_prometheus(work) as prometheus:
        yield prometheus, fit_cli.iso(loaded["first_s"] + 300), fit_cli.iso(loaded["last_s"])


@pytest.fixture(scope="module")
def in_process_bundle(
    fleet: tuple[PrometheusServer, str, str], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    prometheus, start, end = fleet
    work = tmp_path_factory.mktemp("in-process")
    out = work / "bundle"
    done = run_fit(
        "--prometheus", prometheus.url, "--start", start, "--end", end, "--out", str(out),
        tmpdir=work,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


# --- the query narrowing ------------------------------------------------------------------------


def test_match_narrows_the_default_queries_and_vanishes_without_a_group() -> None:
    config = CollectConfig()
    assert render_query(DEFAULT_CPU_QUERY, config) == (
        'clamp(1 - avg by (instance) (rate(node_cpu_seconds_total{mode="idle"}[2m])), 0, 1)'
    )
    assert render_query(config.power_query, config) == "ipmi_dcmi_power_consumption_watts"
    matcher = group_matcher("instance", ["10.0.0.1:9100", 'odd"name', ""])
    assert matcher == r'instance=~"10\\.0\\.0\\.1:9100|odd\"name|"'
    assert render_query(config.temperature_query, config, matcher) == (
        f"ipmi_temperature_celsius{{{matcher}}}"
    )


def test_a_custom_query_without_match_is_refused_before_any_read() -> None:
    config = CollectConfig(power_query="sum by (instance) (dcmi_watts)")
    with pytest.raises(Exception, match=r"power_query lack \$match; put it inside"):
        plan_prometheus_groups(
            config,
            datetime(2026, 1, 1, tzinfo=UTC),
            datetime(2026, 1, 2, tzinfo=UTC),
            nodes_per_group=10,
            source="test",
        )


# --- the same bundle ----------------------------------------------------------------------------


@pytest.mark.prometheus
@pytest.mark.slow
def test_dask_from_prometheus_writes_the_in_process_bundle(
    fleet: tuple[PrometheusServer, str, str], in_process_bundle: Path, tmp_path: Path
) -> None:
    prometheus, start, end = fleet
    out = tmp_path / "bundle"
    done = run_fit(
        "--prometheus", prometheus.url, "--start", start, "--end", end, "--out", str(out),
        "--dask", "local:2", "--nodes-per-group", "2", tmpdir=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_same_bundle(in_process_bundle, out)

    run = _report(out)["distributed"]
    assert run["workers"] == 2 and run["node_groups"] == NODES // 2
    assert sorted(g["nodes"] for g in run["groups"]) == [2] * (NODES // 2)
    # What crossed to the client: the fallback's bounded held-out samples (at this small
    # fleet's share of 40,000 rows per node, every held-out row: see the next tests for a bound
    # that bites), the plot's held-out series, and per node only its ONNX, curve and figures
    # (32 bytes a sampled row).
    received = run["received"]
    cap = received["fallback_sample_rows_per_node"]
    assert cap == fallback_rows_per_node(FitSettings(), NODES)
    assert 0 < received["fallback_sample_rows"] <= NODES * cap
    assert received["fallback_answer_nodes"] == 0  # every node has a model of its own
    assert received["heldout_series_nodes"] <= 3
    per_node_bytes = received["group_summaries_bytes"] - 32 * received["fallback_sample_rows"]
    assert per_node_bytes / NODES < 10_000


def write_fleet_with_nodes_without_models(data: Path) -> tuple[str, str, str]:
    """13 nodes in files of 3: ten with models of their own (enough for the fleet's own shape,
    `training.fit.fallback.MIN_NODES_FOR_FLEET_SHAPE`), and three without: one with too few rows
    and one whose load never moved (both get the fleet's shape scaled to their power), and one
    with too few rows at ~19.95 kW (its scaled curve would pass the extender's 20 kW limit, so
    the fleet fallback serves it). Returns their names."""
    files = write_fleet_files(data, 13, 15, 60.0, seed=3, nodes_per_file=3)
    few, flat, huge = node_names(13)[10:]
    for path in files:
        table = pd.read_parquet(path)
        first_rows = table.groupby("node").cumcount() < 100
        table = table[~table["node"].isin([few, huge]) | first_rows]
        table.loc[table["node"] == flat, "cpu_util"] = 0.42
        is_huge = table["node"] == huge
        table.loc[is_huge, "power_w"] = 19_950.0 + np.arange(is_huge.sum()) % 7
        table.to_parquet(path)
    return few, flat, huge


@pytest.mark.slow
def test_dask_from_files_writes_the_in_process_bundle_fallbacks_included(
    cluster, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    few, flat, huge = write_fleet_with_nodes_without_models(data)
    settings = FitSettings(min_rows=300)
    expected = fit_fleet(stream_metrics(data), tmp_path / "in-process", settings=settings, jobs=2)
    stream = stream_metrics(data)
    got = fit_fleet_on_dask(
        cluster,
        plan_file_groups(stream),
        stream.n_nodes,
        tmp_path / "dask",
        report_dir=tmp_path / "dask-report",
        settings=settings,
        exact_node_count=True,
        progress=False,
    )
    assert got.report["distributed"]["node_groups"] == 5  # 3 + 3 + 3 + 3 + 1 nodes
    assert_same_bundle(expected.bundle_dir, got.bundle_dir)

    # Both fallbacks were built: the fleet's own shape (from ten nodes' curves, which crossed
    # in their outcomes), scaled on the workers to two nodes; the third judged there.
    fallback = got.report["fallback"]
    assert fallback["scaled_nodes"] == [few, flat] and fallback["nodes"] == [huge]
    entries = {e["node"]: e for e in got.report["nodes"]}
    assert entries[few]["scaled_fallback"]["shape_from"] == "10 own models"
    assert entries[huge]["family"] == "fleet" and entries[huge]["metrics"]["mae_w"] > 10_000
    manifest = json.loads((got.bundle_dir / "manifest.json").read_text())
    assert manifest["nodes"][flat]["family"] == "fleet-scaled"
    assert manifest["fallback"]["nodes"] == [huge]
    # Per node without a model, only a small answer came back (a scaled model's ONNX and
    # figures, or the fleet fallback's figures), never its rows.
    received = got.report["distributed"]["received"]
    assert received["fallback_answer_nodes"] == 3
    assert received["fallback_answers_bytes"] / 3 < 10_000


# --- what crosses the boundary ------------------------------------------------------------------


def _arrays_in(value: object) -> Iterator[tuple[str, np.ndarray]]:
    """Every numpy array reachable from a gathered object, with the path to it."""
    stack: list[tuple[str, object]] = [("summary", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, np.ndarray):
            yield path, item
        elif is_dataclass(item):
            stack += [(f"{path}.{f.name}", getattr(item, f.name)) for f in fields(item)]
        elif isinstance(item, dict):
            stack += [(f"{path}[{k!r}]", v) for k, v in item.items()]
        elif isinstance(item, list | tuple | set):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(item)]


def test_only_models_figures_and_bounded_samples_reach_the_client(cluster, tmp_path: Path) -> None:
    data = tmp_path / "data"
    [path] = write_fleet_files(data, 4, 60, 60.0, seed=4, nodes_per_file=4)  # 3,600 rows a node
    flat = node_names(4)[3]  # a load that never moved: no model of its own
    table = pd.read_parquet(path)
    table.loc[table["node"] == flat, "cpu_util"] = 0.5
    table.to_parquet(path)
    [group] = plan_file_groups(stream_metrics(data))
    rows_per_node = 50
    settings = FitSettings()
    result = cluster.submit(fit_group, group, settings, rows_per_node, "test", pure=False)
    summary: GroupSummary = cluster.submit(summary_of, result).result()  # what is gathered

    assert len(summary.outcomes) == 4
    assert all(
        o.heldout is None and o.eval_rows is None and o.rows is None for o in summary.outcomes
    )
    own = [o for o in summary.outcomes if o.fallback_reason is None]
    assert [o.node for o in own] == node_names(3) and all(o.onnx for o in own)
    # the fleet fallback's material: each own model's steady-state curve, 11 numbers
    assert all(len(o.steady_curve_w) == 11 for o in own)
    # Arrays only in the fallback samples, and those hold at most the bound per node.
    arrays = list(_arrays_in(summary))
    assert arrays and all(".fallback_samples[" in path for path, _ in arrays)
    assert len(summary.fallback_samples) == 4  # every node with enough rows lends rows
    for sample in summary.fallback_samples:
        assert isinstance(sample, FallbackSample) and isinstance(sample.test, NodeRows)
        assert len(sample.test) == rows_per_node < sample.test_rows
    rows_read = summary.account.tally.rows_read
    assert rows_read > 14_000
    assert sum(len(a) for _, a in arrays) <= 4 * 4 * rows_per_node  # 4 arrays per NodeRows
    assert summary_bytes(summary) < rows_read * 32 / 10  # a tenth of the rows as raw arrays
    # ... while the worker kept the group's held-out series for the plot, and the flat node's
    # rows for its fallback
    kept = cluster.submit(lambda r: sum(len(h[0]) for h in r.heldout.values()), result).result()
    assert kept == sum(o.rows_test for o in own)
    kept_rows = cluster.submit(lambda r: {n: len(k.rows) for n, k in r.kept.items()}, result)
    assert kept_rows.result() == {flat: summary.outcomes[3].rows_train}

    # The fallback step: the client sends the fleet's shape and the fleet fallback; the worker
    # scales the shape to the flat node's rows and sends back a model and figures, no rows.
    shape = fleet_shape([o.steady_curve_w for o in own], settings.shape_prior)
    pool = FallbackPool(rows_per_node)
    for sample in summary.fallback_samples:
        pool.add(sample)
    _, fleet_model = fleet_fallback(shape, pool.merged(), settings)
    answer = cluster.submit(judge_group, result, shape, fleet_model, [flat], settings).result()
    assert list(answer) == [flat] and answer[flat]["scaled"]["family"] == "fleet-scaled"
    assert onnx.load_from_string(answer[flat]["scaled"]["onnx"]).graph.node  # a real model
    assert list(_arrays_in(answer)) == []
    assert len(pickle.dumps(answer, protocol=5)) < 10_000


# --- failures -----------------------------------------------------------------------------------


def _worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


@pytest.mark.prometheus
@pytest.mark.slow
def test_a_worker_killed_mid_run_is_replaced_and_the_bundle_is_the_same(
    cluster,
    fleet: tuple[PrometheusServer, str, str],
    in_process_bundle: Path,
    tmp_path: Path,
) -> None:
    prometheus, start, end = fleet
    out = tmp_path / "bundle"
    killed: dict[str, object] = {}

    def kill_a_busy_worker() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for worker, keys in cluster.processing().items():
                busy = [k for k in keys if str(k).startswith("fit-group-")]
                if busy:
                    killed.update(worker=worker, keys=busy, pid=_worker_pids(cluster)[worker])
                    os.kill(killed["pid"], signal.SIGKILL)
                    return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_a_busy_worker)
    killer.start()
    done = run_fit(
        "--prometheus", prometheus.url, "--start", start, "--end", end, "--out", str(out),
        "--dask", cluster.scheduler.address, "--nodes-per-group", "1", tmpdir=tmp_path,
    )  # fmt: skip
    killer.join()
    assert killed, "no fit-group task was ever seen running"
    assert done.returncode == 0, done.stderr
    assert_same_bundle(in_process_bundle, out)
    # The groups the dead worker held were finished by a living one.
    groups = {g["index"]: g["worker"] for g in _report(out)["distributed"]["groups"]}
    lost = [int(str(key).rsplit("-", 1)[1]) for key in killed["keys"]]
    assert all(groups[index] != killed["worker"] for index in lost)
    cluster.wait_for_workers(2, timeout=60)  # the nanny restarted it for the next tests


def test_a_group_that_keeps_failing_is_named_and_no_bundle_is_written(
    cluster, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    files = write_fleet_files(data, 6, 15, 60.0, seed=6, nodes_per_file=2)
    bad = files[1]
    table = pd.read_parquet(bad)
    table["power_w"] = "watts?"  # the wrong column: refused as a whole, in that group only
    table.to_parquet(bad)
    out = tmp_path / "bundle"
    done = run_fit(
        "--input", str(data), "--out", str(out), "--dask", cluster.scheduler.address,
        tmpdir=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "1 of 3 node groups failed after 2 retries" in message
    assert f"node group 1 ({bad})" in message
    assert "power_w" in message and "is not a number" in message
    assert not out.exists()


@pytest.mark.prometheus
@pytest.mark.slow
def test_a_planned_node_without_data_gets_exact_fallback_samples_by_a_second_read(
    cluster,
    fleet: tuple[PrometheusServer, str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """node-01 is in Prometheus's index and has a node_uname_info, so the plan counts it, but
    these queries leave its series out: the fleet has one node fewer than planned, every node
    must give the fallback more rows than the workers sampled, and the groups are read again
    for exact samples. The bundle is still the in-process one."""
    prometheus, start, end = fleet
    skip = 'instance!~"node-01:.*",$match'
    config = CollectConfig(
        url=prometheus.url,
        cpu_query=DEFAULT_CPU_QUERY.replace("$match", skip),
        temperature_query=f"ipmi_temperature_celsius{{{skip}}}",
        power_query=f"ipmi_dcmi_power_consumption_watts{{{skip}}}",
    )
    begin, finish = datetime.fromisoformat(start), datetime.fromisoformat(end)
    where = f"{config.url} [{begin.isoformat()} .. {finish.isoformat()}]"
    # 100 held-out rows a node planned, 120 needed (each node has ~180)
    settings = FitSettings(min_rows=300, fallback_max_rows=600)

    spill = tmp_path / "spill"
    collect_to_directory(config, begin, finish, spill, progress=False)
    in_process = stream_metrics(spill, source=where)
    expected = fit_fleet(in_process, tmp_path / "in-process", settings=settings)
    assert in_process.n_nodes == NODES - 1
    assert "node-01" not in [entry["node"] for entry in expected.report["nodes"]]

    groups, planned = plan_prometheus_groups(config, begin, finish, nodes_per_group=2, source=where)
    assert planned == NODES and groups[0].nodes == ("node-01", "node-02")
    with caplog.at_level("WARNING", logger="training.fit"):
        got = fit_fleet_on_dask(
            cluster,
            groups,
            planned,
            tmp_path / "dask",
            report_dir=tmp_path / "dask-report",
            settings=settings,
            exact_node_count=False,
            progress=False,
        )
    assert "reading 3 node group(s) again" in caplog.text
    assert got.report["fallback"]["rows_test"] == (NODES - 1) * 120
    assert_same_bundle(expected.bundle_dir, got.bundle_dir)
