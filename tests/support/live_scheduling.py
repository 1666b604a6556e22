"""What a scheduling test on the real control plane needs around it: node telemetry through a
real Prometheus and the extender as `python -m extender` in live mode (a slow extender is a
`tests.support.fault_proxy.FaultProxy` with `answer_delay_s` in front of it).

- `node_telemetry(tmp_path, {"node-a": 0.1, ...})`: one tiny exporter per node
  (`tests.support.exporters.FakeHost`, CPU counters advancing at that utilisation, BMC
  temperatures) scraped every second by a real Prometheus, and the collect settings file that
  maps each exporter's `instance` to its node (all exporters share 127.0.0.1, so the
  `node_uname_info` join cannot tell them apart).
- `live_extender(...)`: `python -m extender --kubeconfig ... --prometheus ...` on a given port
  (`bench.support.server.run_extender`), yielded once `/readyz` answers 200 and every named
  node has fresh telemetry; stopped with SIGTERM on exit.
- `explain(url, pod, nodes)`: the extender's `/explain` for a pod over candidate names, as
  kube-scheduler would ask (`nodeCacheCapable`: names only).
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.support.server import ExtenderProcess, run_extender
from tests.support.exporters import Exporter, FakeHost, serve, wait_until
from tests.support.prometheus import PrometheusServer, start_prometheus

# What ipmi_exporter shows of a two-socket server at rest; the power curves of the tests' bundles
# do not depend on temperature, the model only needs the features present.
TEMPERATURES_C = {"Inlet Temp": 22.0, "CPU1 Temp": 50.0, "CPU2 Temp": 50.0}
HTTP_TIMEOUT_S = 10.0
# How far the utilisation the extender reads may be from the exporter's (scrape jitter on a
# busy machine moves a 5 s rate by a few hundredths).
UTIL_TOLERANCE = 0.05


@dataclass
class NodeTelemetry:
    prometheus: PrometheusServer
    exporters: dict[str, Exporter]  # node -> its exporter
    collect_config: Path  # the extender's --collect-config


@contextlib.contextmanager
def node_telemetry(tmp_path: Path, utilisation: Mapping[str, float]) -> Iterator[NodeTelemetry]:
    """Exporters for `utilisation`'s nodes (CPU busy share 0..1) and a Prometheus scraping them."""
    exporters: dict[str, Exporter] = {}
    prometheus: PrometheusServer | None = None
    try:
        for node, util in utilisation.items():
            host = FakeHost(cpu_util=util, temperatures_c=dict(TEMPERATURES_C), power_w=200.0)
            exporters[node] = serve(host)
        prometheus = start_prometheus(
            tmp_path, scrape_targets=[e.target for e in exporters.values()]
        )
        collect_config = tmp_path / "collect.yaml"
        collect_config.write_text(
            yaml.safe_dump(
                {
                    # Five 1 s scrapes: the rate is there within seconds of the first scrape.
                    "cpu_rate_window": "5s",
                    "instance_nodes": {e.target: node for node, e in exporters.items()},
                }
            )
        )
        yield NodeTelemetry(prometheus, exporters, collect_config)
    finally:
        if prometheus is not None:
            prometheus.stop()
        for exporter in exporters.values():
            exporter.stop()


def http_json(url: str, body: object | None = None) -> tuple[int, Any]:
    """(status, parsed JSON) of a GET (no body) or POST; status 0 when nothing answers."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None


def explain(url: str, pod: Mapping[str, Any], nodes: Sequence[str]) -> dict[str, dict]:
    """The extender's `/explain` records for `pod` over `nodes`, by node name."""
    status, answer = http_json(f"{url}/explain", {"Pod": pod, "Nodes": None, "NodeNames": nodes})
    if status != 200:
        raise AssertionError(f"/explain answered {status}: {answer}")
    return {record["node"]: record for record in answer["nodes"]}


def top_choice(records: Mapping[str, dict]) -> tuple[str, int]:
    """The node the extender ranks first among those passing its filters, and the score lead
    it has over the next one (0: a tie, no choice)."""
    passing = sorted(
        ((r["score"], name) for name, r in records.items() if r["passes"]), reverse=True
    )
    if not passing:
        raise AssertionError(f"no node passes the extender's filters: {records}")
    lead = passing[0][0] - (passing[1][0] if len(passing) > 1 else 0)
    return passing[0][1], lead


@contextlib.contextmanager
def live_extender(
    *,
    port: int,
    kubeconfig: Path,
    telemetry: NodeTelemetry,
    bundle: Path,
    profile: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[ExtenderProcess]:
    """`python -m extender` in live mode on `port`, ready and with every node's telemetry."""
    args = [
        "--port",
        str(port),
        "--kubeconfig",
        str(kubeconfig),
        "--prometheus",
        telemetry.prometheus.url,
        "--collect-config",
        str(telemetry.collect_config),
        "--refresh-interval",
        "1",
        "--bundle",
        str(bundle),
    ]
    if profile is not None:
        args += ["--config", str(profile)]
    with run_extender(args, env=dict(env or {})) as extender:

        def ready() -> bool:
            if extender.process.poll() is not None:
                raise AssertionError("the extender exited:\n" + "\n".join(extender.log_lines[-20:]))
            return http_json(f"{extender.url}/readyz")[0] == 200

        wait_until(ready, "the extender's /readyz to answer 200")
        nodes = list(telemetry.exporters)
        probe = {"metadata": {"name": "probe", "namespace": "default"}, "spec": {}}

        def settled() -> bool:
            # Until the rate window holds enough scrapes Prometheus extrapolates the CPU rate
            # from two or three samples, far from the exporter's utilisation; and a node's
            # curve is tabulated a moment after its first telemetry.
            records = explain(extender.url, probe, nodes)
            return all(
                record["u"] is not None
                and abs(record["u"] - telemetry.exporters[name].host.cpu_util) <= UTIL_TOLERANCE
                and record["increase_w"] is not None
                for name, record in records.items()
            )

        wait_until(settled, "every node's telemetry and power curve in the extender")
        yield extender


def stop_extender(extender: ExtenderProcess, timeout_s: float = 20.0) -> int:
    """SIGTERM, as Kubernetes stops a pod; its exit status."""
    extender.process.terminate()
    return extender.process.wait(timeout=timeout_s)
