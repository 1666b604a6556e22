"""The scoring profile: plugins enabled by configuration, weights, arguments, and its errors."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import httpx
import numpy as np
import pytest
import yaml

from extender.config import DEFAULT_BUNDLE_DIR
from extender.cycle import Cycle
from extender.plugins.base import FilterVerdict, LiveSource, Plugin, SourceContext
from extender.profile import DEFAULT_PROFILE, ProfileError, build_profile, builtin_plugins
from extender.profile import load_profile as load
from tests.support.manifests import find_object
from tests.support.server import REPO_ROOT, extender_service, run_extender, write_snapshot

SAMPLES = REPO_ROOT / "tests" / "fixtures" / "kube-scheduler-v1.28"


@dataclass(frozen=True)
class PreferNamesArgs:
    # Points for a node whose name ends with `suffix`; others get 0.
    suffix: str = "-01"
    points: float = 10.0


class PreferNames(Plugin):
    """A tiny plugin, the whole of it: prefers nodes by name suffix, fails one name."""

    name = "PreferNames"
    Args = PreferNamesArgs

    def filter(self, cycle: Cycle) -> FilterVerdict:
        return FilterVerdict(
            {i: "the test said so" for i, n in enumerate(cycle.names) if n == "node-03"}
        )

    def score(self, cycle: Cycle) -> np.ndarray:
        return np.array([self.args.points * n.endswith(self.args.suffix) for n in cycle.names])

    def explain(self, cycle: Cycle) -> Mapping[str, Sequence[object]]:
        return {"suffix_match": [n.endswith(self.args.suffix) for n in cycle.names]}


class BonusSource:
    """A background source as a plugin would have one: publishes a snapshot, then stops."""

    def __init__(self, context: SourceContext) -> None:
        self.context = context

    def start(self) -> None:
        self.context.state.set_signal("bonus", MappingProxyType({"node-01": 10.0}))

    def stop(self, timeout_s: float = 5.0) -> None:
        pass


class Bonus(Plugin):
    """Scores from a signal its own background source publishes."""

    name = "Bonus"

    def background(self, context: SourceContext) -> Sequence[LiveSource]:
        return [BonusSource(context)]

    def score(self, cycle: Cycle) -> np.ndarray:
        bonus = cycle.view.signal("bonus") or {}
        return np.array([bonus.get(name, np.nan) for name in cycle.names])

    def status(self) -> Mapping[str, object]:
        return {"note": "bonus points from a background source"}


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_the_defaults_are_todays_scoring() -> None:
    described = DEFAULT_PROFILE.describe()
    assert described["filter"] == ["EnergyLevel", "PowerCap", "PowerState"]
    assert described["score"] == [
        {"name": "PowerIncrease", "weight": 0.6},
        {"name": "EnergyLevel", "weight": 0.4},
    ]
    assert {"PowerIncrease", "EnergyLevel", "PowerCap", "PowerState", "Consolidation"} <= set(
        builtin_plugins()
    )


def test_a_new_plugin_needs_only_its_module_and_a_line_of_configuration(tmp_path: Path) -> None:
    config = write(
        tmp_path / "profile.yaml",
        """
        apiVersion: power-aware-scheduler/v1alpha1
        kind: ExtenderConfiguration
        plugins:
          filter:
            enabled:
              - name: tests.test_profile:PreferNames
          score:
            enabled:
              - name: tests.test_profile:PreferNames
                weight: 0.5
        pluginConfig:
          - name: tests.test_profile:PreferNames
            args: {suffix: "-02"}
        """,
    )
    request = json.loads((SAMPLES / "cache-capable" / "prioritize-request.json").read_text())
    request["NodeNames"] = ["node-01", "node-02", "node-03"]
    with extender_service(DEFAULT_BUNDLE_DIR, config_file=config) as (url, _):
        explain = httpx.post(f"{url}/explain", json=request, timeout=10).json()
        failed = httpx.post(f"{url}/filter", json=request, timeout=10).json()["FailedNodes"]
    rows = {row["node"]: row for row in explain["nodes"]}
    assert explain["weights"] == {"PowerIncrease": 0.6, "EnergyLevel": 0.4, "PreferNames": 0.5}
    # contribution: weight x points / total weight (0.6 + 0.4 + 0.5)
    assert rows["node-02"]["plugins"]["PreferNames"] == {
        "raw": 10.0,
        "points": 10.0,
        "weight": 0.5,
        "contribution": pytest.approx(0.5 * 10.0 / 1.5),
    }
    assert rows["node-01"]["plugins"]["PreferNames"]["points"] == 0.0
    assert rows["node-02"]["suffix_match"] is True and rows["node-01"]["suffix_match"] is False
    assert failed == {"node-03": "the test said so"}


def test_a_plugins_background_source_feeds_it_through_the_state(tmp_path: Path) -> None:
    config = write(
        tmp_path / "bonus.yaml",
        "plugins:\n  score:\n    enabled: [{name: 'tests.test_profile:Bonus', weight: 1}]\n",
    )
    request = json.loads((SAMPLES / "cache-capable" / "prioritize-request.json").read_text())
    request["NodeNames"] = ["node-01", "node-02"]
    with extender_service(DEFAULT_BUNDLE_DIR, config_file=config) as (url, _):
        rows = httpx.post(f"{url}/explain", json=request, timeout=10).json()["nodes"]
        status = httpx.get(f"{url}/status", timeout=10).json()
    bonus = {row["node"]: row["plugins"]["Bonus"] for row in rows}
    # Bonus weighs 1 beside the defaults' 0.6 + 0.4: half the score.
    assert bonus["node-01"] == {"raw": 10.0, "points": 10.0, "weight": 1.0, "contribution": 5.0}
    assert bonus["node-02"] == {"raw": None, "points": 0.0, "weight": 1.0, "contribution": 0.0}
    assert status["plugins"] == {"Bonus": {"note": "bonus points from a background source"}}


def test_weights_and_arguments_change_the_answer(tmp_path: Path) -> None:
    profile = load(
        write(
            tmp_path / "p.yaml",
            """
            plugins:
              score:
                enabled: [{name: EnergyLevel, weight: 3}]
                disabled: [{name: PowerIncrease}]
              filter:
                disabled: [{name: "*"}]
            """,
        )
    )
    assert profile.weights == {"EnergyLevel": 3.0}
    assert profile.filters == ()
    tuned = build_profile(
        {"pluginConfig": [{"name": "PowerIncrease", "args": {"pointsPerDoubling": 2}}]}
    )
    assert tuned.plugin("PowerIncrease").args.points_per_doubling == 2.0
    # A re-enabled default keeps its place and takes the new weight.
    reweighted = build_profile(
        {"plugins": {"score": {"enabled": [{"name": "PowerIncrease", "weight": 2}]}}}
    )
    assert reweighted.weights == {"PowerIncrease": 2.0, "EnergyLevel": 0.4}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"plugin": {}},
            r"^plugin: unknown key; expected one of apiVersion, kind, pluginConfig, plugins",
        ),
        ({"kind": "KubeSchedulerConfiguration"}, r"^kind: expected 'ExtenderConfiguration'"),
        (
            {"plugins": {"score": {"enabled": [{"name": "PowerIncrese"}]}}},
            r"^plugins.score.enabled\[0\]: unknown plugin 'PowerIncrese'; known: .*PowerIncrease",
        ),
        (
            {"plugins": {"score": {"enabled": [{"name": "PowerCap"}]}}},
            r"^plugins.score.enabled\[0\]: plugin PowerCap is not a score plugin",
        ),
        (
            {"plugins": {"score": {"enabled": [{"name": "EnergyLevel", "weight": "heavy"}]}}},
            r"^plugins.score.enabled\[0\].weight: must be a number",
        ),
        (
            {"plugins": {"score": {"enabled": [{"name": "EnergyLevel", "weight": -1}]}}},
            r"^plugins.score.enabled\[0\].weight: must be finite and >= 0",
        ),
        (
            {
                "plugins": {
                    "score": {
                        "enabled": [
                            {"name": "EnergyLevel", "weight": 0},
                            {"name": "PowerIncrease", "weight": 0},
                        ]
                    }
                }
            },
            r"weights must not all be 0",
        ),
        (
            {"plugins": {"score": {"enabled": [{"name": "EnergyLevel", "wieght": 1}]}}},
            r"^plugins.score.enabled\[0\].wieght: unknown key",
        ),
        (
            {"pluginConfig": [{"name": "PowerIncrease", "args": {"pointsPerDubling": 2}}]},
            r"^pluginConfig\[0\].args.pointsPerDubling: unknown argument of PowerIncrease; "
            r"known: pointsPerDoubling, minIncreaseW",
        ),
        (
            {"pluginConfig": [{"name": "PowerIncrease", "args": {"pointsPerDoubling": "two"}}]},
            r"^pluginConfig\[0\].args.pointsPerDoubling: must be a number",
        ),
        (
            {"pluginConfig": [{"name": "PowerIncrease", "args": {"pointsPerDoubling": 0}}]},
            r"^pluginConfig\[0\].args: pointsPerDoubling must be > 0",
        ),
        (
            {
                "pluginConfig": [{"name": "PowerCap", "args": {}}],
                "plugins": {"filter": {"disabled": [{"name": "PowerCap"}]}},
            },
            r"^pluginConfig\[0\].args: plugin PowerCap is configured but not enabled",
        ),
        (
            {"plugins": {"score": {"enabled": [{"name": "no.such.module:Plugin"}]}}},
            r"cannot load plugin 'no.such.module:Plugin'",
        ),
    ],
)
def test_errors_name_the_key_at_fault(document: dict, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        build_profile(document)


def test_a_bad_file_stops_the_service_with_the_file_and_key(tmp_path: Path) -> None:
    config = write(tmp_path / "bad.yaml", "plugins:\n  score:\n    enabled: [{name: Cheerful}]\n")
    snapshot = write_snapshot(
        tmp_path / "cluster.json", [{"name": "node-01", "allocatable_cpu": 4}]
    )
    arguments = ["--config", str(config), "--cluster", str(snapshot)]
    with pytest.raises(RuntimeError) as failure, run_extender(arguments):
        pass
    assert f"{config}: plugins.score.enabled[0]: unknown plugin 'Cheerful'" in str(failure.value)


def test_the_shipped_configuration_is_the_default() -> None:
    configmap = find_object("ConfigMap", "power-extender-config", "power-aware-scheduler")
    shipped = build_profile(yaml.safe_load(configmap["data"]["profile.yaml"]))
    assert shipped.describe() | {"source": ""} == DEFAULT_PROFILE.describe() | {"source": ""}
    deployment = find_object("Deployment", "power-extender", "power-aware-scheduler")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--config=/etc/power-aware-scheduler/profile.yaml" in container["args"]
