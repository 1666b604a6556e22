"""Node facts from Prometheus: the optional columns of contract 1 (`training.node_facts`).

Read once per collection, at the end of its range (looking back `facts_lookback`, at least the
range), and joined to every row of the node:

- `cpu_model`, `cpu_sockets`, `cpu_cores`: node_exporter's `node_cpu_info` (one series per
  logical CPU, labels `model_name`, `package`, `core`): the most common model name, the
  distinct packages, the distinct (package, core) pairs. A node without it may have Node
  Feature Discovery's `feature.node.kubernetes.io/cpu-model.*` labels, exported by
  kube-state-metrics' `kube_node_labels` when allow-listed
  (`--metric-labels-allowlist=nodes=[feature.node.kubernetes.io/cpu-model.vendor_id,...]`):
  written `GenuineIntel family 6 model 143` (`training.node_facts.nfd_cpu_model`).
- `bmc_max_power_w`: the highest reading of the power query in the `facts_lookback` window
  (30 days by default) before the end of the range, so more than the collected rows show.
- `psu_rating_w`: the configured `psu_rating_query` (e.g. a Redfish exporter's power-supply
  capacity), when set.

A fact Prometheus does not have is simply absent: a fleet without them still trains.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from livedata.collect_config import CollectConfig, parse_duration_s, render_query, uname_query
from livedata.metrics_table import (
    BMC_MAX_POWER_W,
    CPU_CORES,
    CPU_MODEL,
    CPU_SOCKETS,
    FACT_COLUMNS,
    NODE,
    PSU_RATING_W,
)
from livedata.node_mapping import host_nodes_from_uname, node_of
from livedata.prometheus import PrometheusReader, Series
from training.node_facts import nfd_cpu_model

# kube-state-metrics turns a node label into a Prometheus label: prefix, non-word chars to _
_KSM_LABEL_PREFIX = "label_"
_PLAIN_SELECTOR = re.compile(r"[A-Za-z_:][\w:]*(\{[^{}]*\})?")
_NFD_LABELS = tuple(
    f"feature.node.kubernetes.io/cpu-model.{key}" for key in ("vendor_id", "family", "id")
)


def _ksm_label(label: str) -> str:
    return _KSM_LABEL_PREFIX + "".join(c if c.isalnum() else "_" for c in label)


def _with_match(metric: str, match: str) -> str:
    return f"{metric}{{{match}}}" if match else metric


def _last_value(series: Series) -> float:
    return float(series.values[-1]) if len(series.values) else math.nan


def facts_from_answers(
    answers: Mapping[str, Sequence[Series]],
    config: CollectConfig,
    host_nodes: Mapping[str, str],
) -> pd.DataFrame:
    """One row per node with any fact: `node` and the `FACT_COLUMNS` it has (pure).

    `answers` keys: `cpu_info` (node_cpu_info series), `node_labels` (kube_node_labels),
    `bmc_max_power_w` and `psu_rating_w` (one value per series)."""
    models: dict[str, Counter] = defaultdict(Counter)
    packages: dict[str, set] = defaultdict(set)
    cores: dict[str, set] = defaultdict(set)
    for one in answers.get("cpu_info", ()):
        node = node_of(one.labels, config, host_nodes)
        if node is None:
            continue
        if one.labels.get("model_name"):
            models[node][one.labels["model_name"].strip()] += 1
        package = one.labels.get("package", "")
        packages[node].add(package)
        cores[node].add((package, one.labels.get("core", one.labels.get("cpu", ""))))
    facts: dict[str, dict[str, object]] = defaultdict(dict)
    for node, counts in models.items():
        facts[node][CPU_MODEL] = counts.most_common(1)[0][0]
    for node in packages:
        facts[node][CPU_SOCKETS] = float(len(packages[node]))
        facts[node][CPU_CORES] = float(len(cores[node]))
    for one in answers.get("node_labels", ()):
        node = one.labels.get("node")
        labels = {label: one.labels.get(_ksm_label(label), "") for label in _NFD_LABELS}
        model = nfd_cpu_model(labels)
        if node and model and CPU_MODEL not in facts.get(node, {}):
            facts[node][CPU_MODEL] = model
    for key, column in (("bmc_max_power_w", BMC_MAX_POWER_W), ("psu_rating_w", PSU_RATING_W)):
        for one in answers.get(key, ()):
            node = node_of(one.labels, config, host_nodes)
            value = _last_value(one)
            if node is not None and math.isfinite(value) and value > 0:
                facts[node][column] = max(value, float(facts[node].get(column, 0.0)))
    if not facts:
        return pd.DataFrame(columns=[NODE])
    present = [c for c in FACT_COLUMNS if any(c in f for f in facts.values())]
    return pd.DataFrame(
        [{NODE: node, **{c: f.get(c) for c in present}} for node, f in sorted(facts.items())],
        columns=[NODE, *present],
    )


def _over_window(query: str, function: str, window_s: int) -> str:
    """`function` over the last `window_s` of `query`: a range vector for a plain selector,
    else a subquery of at most ~1000 steps (a month at scrape resolution would be costly)."""
    if _PLAIN_SELECTOR.fullmatch(query):
        return f"{function}({query}[{window_s}s])"
    return f"{function}(({query})[{window_s}s:{max(60, window_s // 1000)}s])"


def read_node_facts(
    config: CollectConfig, start_s: float, end_s: float, match: str = ""
) -> pd.DataFrame:
    """The node facts Prometheus has, read at `end_s` over the `facts_lookback` window before
    it (at least the collected range): one row per node with any, `node` and the fact columns
    found (see the module docstring)."""
    window_s = max(1, math.ceil(max(end_s - start_s, parse_duration_s(config.facts_lookback))))
    queries = {
        "cpu_info": _over_window(
            _with_match(config.cpu_info_metric, match), "last_over_time", window_s
        ),
        "node_labels": _over_window(config.node_labels_metric, "last_over_time", window_s),
        "bmc_max_power_w": _over_window(
            render_query(config.power_query, config, match), "max_over_time", window_s
        ),
    }
    if config.psu_rating_query:
        queries["psu_rating_w"] = _over_window(
            render_query(config.psu_rating_query, config, match), "max_over_time", window_s
        )
    with PrometheusReader(config) as reader:
        answers = {key: reader.instant(query, end_s) for key, query in queries.items()}
        host_nodes: dict[str, str] = {}
        if config.node_from == "uname":
            host_nodes = host_nodes_from_uname(
                reader.instant(uname_query(config, window_s, match), end_s), config
            )
    return facts_from_answers(answers, config, host_nodes)


def join_facts(table: pd.DataFrame, facts: pd.DataFrame) -> pd.DataFrame:
    """`table` with each node's facts on every one of its rows (the columns `facts` has; a
    node without a fact gets an empty cell)."""
    if facts.empty or len(facts.columns) <= 1:
        return table
    columns = [c for c in facts.columns if c != NODE]
    by_node = facts.set_index(NODE)
    nodes = table[NODE].to_numpy()
    extra = {}
    for column in columns:
        mapping = by_node[column].to_dict()
        values = [mapping.get(node) for node in nodes]
        if column == CPU_MODEL:
            extra[column] = pd.array(values, dtype="string")
        else:
            extra[column] = np.array(
                [np.nan if v is None or pd.isna(v) else float(v) for v in values], dtype=float
            )
    return table.assign(**extra)
