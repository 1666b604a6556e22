"""Recorded answers: a corpus of extender requests and what a given version answered to them.

`tests/fixtures/recorded/` holds a copy of a bundle, a cluster snapshot, and `answers.json`:
for every request built by `recorded_requests()` (real kube-scheduler Pod and Node JSON from
`tests/fixtures/kube-scheduler-v1.28`, with varied CPU requests, candidate lists and node
labels, in both `nodeCacheCapable` modes), the body the extender answered to `/filter`,
`/prioritize` and `/explain`. The answers were recorded with the extender as it was before the
plugin restructuring (commit 9ea63ec), by running this module there:

    python -m tests.support.recorded tests/fixtures/recorded

It uses only the HTTP API and the service's start-up wiring, which both versions share, so
`tests/test_recorded.py` can replay the same requests against today's code and compare.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from fastapi.testclient import TestClient

from extender.app import create_app
from extender.config import ExtenderConfig
from extender.runtime import Runtime

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLES = REPO_ROOT / "tests" / "fixtures" / "kube-scheduler-v1.28"
RECORDED = REPO_ROOT / "tests" / "fixtures" / "recorded"
NODES = [f"node-{i:02d}" for i in range(1, 13)] + ["node-13", "node-14", "node-15"]
# Per-pod CPU: (container requests, init container request, overhead); None = not set.
PODS = [
    (["100m"], None, None),
    (["10m"], None, None),
    (["1"], None, None),
    (["250m", "750m"], None, None),
    (["2"], "4", None),
    (["500m"], None, "250m"),
    ([None], None, None),  # no requests: kube-scheduler's 100m default
    (["12"], None, None),
    (["40"], None, None),
]
CANDIDATE_LISTS = [
    NODES,
    NODES[:12],
    ["node-06", "node-07", "node-13", "node-14"],
    ["node-02", "ghost", "node-15", "node-09"],
    ["node-04"],
    [],
]
# Labels a request's own Node objects carry (nocache mode): they win over the snapshot's.
REQUEST_LABELS = [
    {},
    {"energy-status": "powerless"},
    {"energy-status": "low-powered"},
    {"energy-status": "solar-ish"},
]
REQUEST_ANNOTATIONS = [{}, {"power-aware-scheduler/max-power-w": "60"}, {}, {}]


def snapshot_document() -> dict:
    """The demo cluster plus nodes that exercise the edge cases."""
    demo = json.loads((REPO_ROOT / "extender" / "sources" / "demo_cluster.json").read_text())
    nodes = demo["nodes"] + [
        # Unknown energy label, a cap that every placement exceeds, no telemetry.
        {
            "name": "node-13",
            "allocatable_cpu": 16,
            "labels": {"energy-status": "solar-ish"},
            "annotations": {"power-aware-scheduler/max-power-w": "1"},
            "telemetry": {"cpu_util": 0.5, "ambient_temp_c": 22.0, "cpu1_temp_c": 55.0},
        },
        {"name": "node-14", "allocatable_cpu": 32, "labels": {}},
        {
            "name": "node-15",
            "allocatable_cpu": "7500m",
            "labels": {"energy-status": "vulnerable"},
            "annotations": {"power-aware-scheduler/max-power-w": "lots"},
            "telemetry": {"cpu_util": 0.95, "ambient_temp_c": 30.0, "cpu1_temp_c": 80.0},
        },
    ]
    return {"nodes": nodes}


def _pod(template: dict, index: int, requests: list, init: str | None, overhead: str | None):
    pod = copy.deepcopy(template)
    pod["metadata"]["name"] = f"recorded-{index}"
    pod["metadata"]["uid"] = f"00000000-0000-0000-0000-{index:012d}"
    container = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = []
    for i, cpu in enumerate(requests):
        c = copy.deepcopy(container)
        c["name"] = f"c{i}"
        c["resources"] = {"requests": {"cpu": cpu}} if cpu is not None else {}
        pod["spec"]["containers"].append(c)
    if init is not None:
        c = copy.deepcopy(container)
        c["name"] = "init"
        c["resources"] = {"requests": {"cpu": init}}
        pod["spec"]["initContainers"] = [c]
    if overhead is not None:
        pod["spec"]["overhead"] = {"cpu": overhead}
    return pod


def recorded_requests() -> Iterator[tuple[str, dict]]:
    """(case name, request body), deterministic: the same corpus in every version."""
    cached = json.loads((SAMPLES / "cache-capable" / "prioritize-request.json").read_text())
    objects = json.loads((SAMPLES / "nocache" / "prioritize-request.json").read_text())
    node_template = objects["Nodes"]["items"][0]
    snapshot = {node["name"]: node for node in snapshot_document()["nodes"]}
    for p, (requests, init, overhead) in enumerate(PODS):
        pod = _pod(cached["Pod"], p, requests, init, overhead)
        for c, names in enumerate(CANDIDATE_LISTS):
            yield f"pod{p}-names{c}", {"Pod": pod, "Nodes": None, "NodeNames": list(names)}
        # nodeCacheCapable false: Node objects whose labels differ from the snapshot's.
        items = []
        for i, name in enumerate([*NODES[:12], "ghost"]):
            node = copy.deepcopy(node_template)
            node["metadata"]["name"] = name
            labels = dict(node["metadata"].get("labels") or {})
            labels.update(REQUEST_LABELS[(i + p) % len(REQUEST_LABELS)])
            node["metadata"]["labels"] = labels
            node["metadata"]["annotations"] = dict(REQUEST_ANNOTATIONS[(i + p) % 4])
            cpu = snapshot.get(name, {}).get("allocatable_cpu", 4)
            node["status"]["allocatable"]["cpu"] = str(cpu)
            items.append(node)
        yield f"pod{p}-objects", {"Pod": pod, "Nodes": {"items": items}, "NodeNames": None}


def answer_all(
    bundle_dir: Path, snapshot_file: Path, *, fallback_core_scaling: bool = True
) -> dict[str, dict[str, object]]:
    """What this checkout's extender answers to every recorded request, per verb."""
    config = ExtenderConfig(
        bundle_dir=bundle_dir,
        cluster_file=snapshot_file,
        fallback_core_scaling=fallback_core_scaling,
    )
    runtime = Runtime(config.validate())
    runtime.load_cluster()
    if not runtime.load_bundle():
        raise RuntimeError(f"cannot load {bundle_dir}")
    answers: dict[str, dict[str, object]] = {}
    with TestClient(create_app(runtime)) as client:
        for case, body in recorded_requests():
            answers[case] = {
                verb: client.post(f"/{verb}", json=body).json()
                for verb in ("filter", "prioritize", "explain")
            }
    return answers


def main(out_dir: str) -> int:
    out = Path(out_dir)
    snapshot_file = out / "snapshot.json"
    snapshot_file.write_text(json.dumps(snapshot_document(), indent=1) + "\n")
    answers = answer_all(out / "bundle", snapshot_file)
    (out / "answers.json").write_text(json.dumps(answers, indent=None, sort_keys=True) + "\n")
    print(f"{len(answers)} cases recorded in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
