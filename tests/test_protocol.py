"""The extender v1 wire format, checked against bodies a real kube-scheduler v1.28 sent."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import orjson
import pytest

from extender.protocol import (
    ExtenderArgs,
    PrioritizeAnswers,
    ProtocolError,
    encode,
    filter_result,
    node_info_from_object,
    parse_extender_args,
    pod_key,
    prioritize_result,
    prioritize_result_arrays,
)
from extender.state import NodeInfo
from livedata.pod_resources import pod_cpu_demand_cores

SAMPLES = Path(__file__).parent / "fixtures" / "kube-scheduler-v1.28"
NAMES = ["node-a", "node-b", "node-c"]


def sample(mode: str, verb: str = "filter") -> bytes:
    return (SAMPLES / mode / f"{verb}-request.json").read_bytes()


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_cache_capable_bodies_parse_to_names(verb: str) -> None:
    args = parse_extender_args(sample("cache-capable", verb))
    assert args.node_names == NAMES
    assert args.nodes is None
    assert args.candidate_names == NAMES
    assert args.candidates == NAMES
    assert args.pod["metadata"]["name"] == "pa-pod-1"
    assert pod_key(args.pod) == "default/pa-pod-1"
    assert pod_cpu_demand_cores(args.pod) == 0.1


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_nocache_bodies_parse_to_node_objects(verb: str) -> None:
    args = parse_extender_args(sample("nocache", verb))
    assert args.node_names is None
    assert [node["metadata"]["name"] for node in args.nodes] == NAMES
    assert args.candidate_names == NAMES
    infos = args.candidates
    assert [info.name for info in infos] == NAMES
    assert all(info.allocatable_cpu == 8.0 for info in infos)
    assert infos[1].labels["poke"] == "1"
    assert "kubectl.kubernetes.io/last-applied-configuration" in infos[0].annotations


def test_filter_answer_in_names_mode_has_the_go_shape() -> None:
    args = parse_extender_args(sample("cache-capable"))
    answer = orjson.loads(encode(filter_result(args, {"node-b": "energy-status is powerless"})))
    assert answer == {
        "NodeNames": ["node-a", "node-c"],
        "FailedNodes": {"node-b": "energy-status is powerless"},
        "Error": "",
    }


def test_filter_answer_in_nodes_mode_echoes_the_original_objects() -> None:
    body = sample("nocache")
    args = parse_extender_args(body)
    answer = orjson.loads(encode(filter_result(args, {"node-a": "too hot"})))
    assert set(answer) == {"Nodes", "FailedNodes", "Error"}
    original = orjson.loads(body)["Nodes"]["items"]
    assert answer["Nodes"]["items"] == [original[1], original[2]]
    assert answer["FailedNodes"] == {"node-a": "too hot"}
    assert answer["Error"] == ""


def test_filter_never_names_a_node_outside_the_request() -> None:
    args = parse_extender_args(sample("cache-capable"))
    answer = filter_result(args, {"node-zz": "not asked about", "node-c": "powerless"})
    assert answer["NodeNames"] == ["node-a", "node-b"]
    assert answer["FailedNodes"] == {"node-c": "powerless"}


def test_null_nodes_and_null_names_mean_every_node_fails() -> None:
    args = parse_extender_args(b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": null}')
    assert args.candidate_names == []
    assert args.candidates == []
    assert filter_result(args, {}) == {"NodeNames": [], "FailedNodes": {}, "Error": ""}


def test_prioritize_answer_is_a_bare_list_of_integer_scores() -> None:
    body = encode(prioritize_result([("node-a", 10), ("node-b", 0), ("node-c", 7)]))
    assert body == (
        b'[{"Host":"node-a","Score":10},{"Host":"node-b","Score":0},{"Host":"node-c","Score":7}]'
    )


def test_prioritize_refuses_what_go_would_reject() -> None:
    with pytest.raises(TypeError):
        prioritize_result([("node-a", 7.0)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="node-a must be an int, got bool"):
        prioritize_result([("node-a", True)])
    with pytest.raises(ValueError, match=r"node-b must be 0\.\.10, got 11"):
        prioritize_result([("node-b", 11)])


def test_numpy_integer_scores_become_json_integers() -> None:
    body = encode(prioritize_result([("node-a", np.int64(3))]))
    assert body == b'[{"Host":"node-a","Score":3}]'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "request body is not readable JSON"),
        (b'{"Pod": ', "request body is not readable JSON"),
        (b"[1, 2]", "request body must be a JSON object (ExtenderArgs), got array"),
        (b'"hello"', "request body must be a JSON object (ExtenderArgs), got string"),
        (b'{"NodeNames": ["a"]}', "request has no Pod (missing or null)"),
        (b'{"Pod": null, "NodeNames": ["a"]}', "request has no Pod (missing or null)"),
        (b'{"Pod": 3}', "Pod must be a JSON object, got number"),
        (b'{"Pod": {}, "NodeNames": "node-a"}', "NodeNames must be a list of strings, got string"),
        (b'{"Pod": {}, "NodeNames": ["a", 7]}', "NodeNames[1] must be a non-empty string, got 7"),
        (b'{"Pod": {}, "NodeNames": ["a", ""]}', "NodeNames[1] must be a non-empty string"),
        (b'{"Pod": {}, "Nodes": []}', "Nodes must be a NodeList object with items, got array"),
        (b'{"Pod": {}, "Nodes": {"items": {}}}', "Nodes.items must be a list, got object"),
        (b'{"Pod": {}, "Nodes": {"items": [5]}}', "Nodes.items[0] must be a Node object"),
        (
            b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": null}}]}}',
            "Nodes.items[0]: metadata.name must be a non-empty string, got None",
        ),
        (
            b'{"Pod": {}, "Nodes": {"items": [{"spec": {}}]}}',
            "Nodes.items[0]: metadata is missing or not an object",
        ),
        (
            b'{"Pod": {}, "Nodes": {"items": []}, "NodeNames": []}',
            "both Nodes and NodeNames are set",
        ),
    ],
)
def test_malformed_bodies_say_what_is_wrong(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_extender_args(body)
    assert message in str(caught.value)


def test_bad_node_objects_name_the_node_and_field() -> None:
    document = orjson.loads(sample("nocache"))
    broken = copy.deepcopy(document)
    broken["Nodes"]["items"][2]["status"]["allocatable"]["cpu"] = "eight"
    with pytest.raises(ProtocolError) as caught:
        parse_extender_args(orjson.dumps(broken))
    assert str(caught.value) == (
        "Nodes.items[2] (node-c): status.allocatable.cpu: CPU quantity 'eight' is not a "
        "Kubernetes quantity"
    )
    missing = copy.deepcopy(document)
    missing["Nodes"]["items"][1]["status"] = None
    with pytest.raises(ProtocolError, match=r"Nodes.items\[1\] \(node-b\): status.allocatable"):
        parse_extender_args(orjson.dumps(missing))
    labels = copy.deepcopy(document)
    labels["Nodes"]["items"][0]["metadata"]["labels"] = ["x"]
    with pytest.raises(ProtocolError, match=r"\(node-a\): metadata.labels must be an object"):
        parse_extender_args(orjson.dumps(labels))


def test_node_info_from_a_node_object() -> None:
    node = {
        "metadata": {
            "name": "edge-1",
            "labels": {"energy-status": "vulnerable"},
            "annotations": None,
        },
        "spec": {},
        "status": {"allocatable": {"cpu": "3910m", "memory": "8Gi"}},
    }
    assert node_info_from_object(node) == NodeInfo(
        "edge-1", 3.91, {"energy-status": "vulnerable"}, {}
    )


def test_args_built_directly_derive_their_candidate_names() -> None:
    args = ExtenderArgs(pod={}, node_names=["x", "y"], nodes=None)
    assert args.candidate_names == ["x", "y"]
    assert filter_result(args, {"y": "no"}) == {
        "NodeNames": ["x"],
        "FailedNodes": {"y": "no"},
        "Error": "",
    }


def test_prioritize_from_arrays_matches_and_checks() -> None:
    hosts = ["node-a", "node-b", "node-c"]
    scores = np.array([10, 0, 7], dtype=np.int64)
    assert prioritize_result_arrays(hosts, scores) == prioritize_result(
        [("node-a", 10), ("node-b", 0), ("node-c", 7)]
    )
    assert encode(prioritize_result_arrays(hosts, scores)).count(b".") == 0
    assert prioritize_result_arrays([], np.array([], dtype=np.int64)) == []
    with pytest.raises(TypeError, match="dtype float64"):
        prioritize_result_arrays(hosts, np.array([10.0, 0.0, 7.0]))
    with pytest.raises(ValueError, match=r"0\.\.10, got -1\.\.7"):
        prioritize_result_arrays(hosts, np.array([-1, 0, 7]))
    with pytest.raises(ValueError, match="3 hosts but 2 scores"):
        prioritize_result_arrays(hosts, np.array([1, 2]))


def test_prioritize_answers_encode_any_candidates_byte_for_byte() -> None:
    hosts = (*(f"node-{i}" for i in range(40)), 'quote"and\\slash', "ünïcode")
    answers = PrioritizeAnswers(hosts)
    rng = np.random.default_rng(11)
    for size in (0, 1, 7, len(hosts), 60):  # 60: a name sent twice is answered twice
        positions = rng.integers(0, len(hosts), size)
        scores = rng.integers(0, 11, size)
        expected = prioritize_result(
            zip([hosts[p] for p in positions], scores.tolist(), strict=True)
        )
        assert answers.json(positions, scores) == encode(expected)
    with pytest.raises(ValueError, match="3 hosts but 2 scores"):
        answers.json(np.array([0, 1, 2]), np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match=r"0\.\.10, got 0\.\.12"):
        answers.json(np.array([0, 1]), np.array([0, 12]))
    with pytest.raises(TypeError, match="dtype float64"):
        answers.json(np.array([0, 1]), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"positions must be 0\.\.41"):
        answers.json(np.array([0, 42]), np.array([0, 1]))


def test_unresolvable_failures_are_repeated_in_their_own_field() -> None:
    args = parse_extender_args(sample("cache-capable"))
    answer = filter_result(
        args,
        {"node-a": "powerless", "node-b": "over max power"},
        unresolvable={"node-a", "node-zz", "node-c"},
    )
    assert answer == {
        "NodeNames": ["node-c"],
        "FailedNodes": {"node-a": "powerless", "node-b": "over max power"},
        "FailedAndUnresolvableNodes": {"node-a": "powerless"},
        "Error": "",
    }
    nodes_args = parse_extender_args(sample("nocache"))
    nodes_answer = filter_result(nodes_args, {"node-b": "powerless"}, unresolvable={"node-b"})
    assert nodes_answer["FailedAndUnresolvableNodes"] == {"node-b": "powerless"}
    assert [n["metadata"]["name"] for n in nodes_answer["Nodes"]["items"]] == ["node-a", "node-c"]


def test_prioritize_from_arrays_answers_a_repeated_candidate_list_from_its_table() -> None:
    hosts = tuple(f"node-{i}" for i in range(50))
    rng = np.random.default_rng(5)
    for _ in range(4):  # the first answer is built plainly, the later ones from the table
        scores = rng.integers(0, 11, len(hosts))
        expected = [{"Host": h, "Score": int(s)} for h, s in zip(hosts, scores, strict=True)]
        answer = prioritize_result_arrays(hosts, scores)
        assert answer == expected
        assert encode(answer) == encode(expected)  # byte for byte, integer literals
        assert all(type(entry["Score"]) is int for entry in answer)
    # Another list with the same contents is its own key; a wrong length is still refused.
    assert prioritize_result_arrays(list(hosts), np.zeros(50, dtype=np.int64))[3] == {
        "Host": "node-3",
        "Score": 0,
    }
    with pytest.raises(ValueError, match="50 hosts but 49 scores"):
        prioritize_result_arrays(hosts, np.zeros(49, dtype=np.int64))
    with pytest.raises(ValueError, match=r"0\.\.10, got 0\.\.11"):
        prioritize_result_arrays(hosts, np.array([0] * 49 + [11]))


def test_prioritize_answers_from_a_previous_node_set_are_the_same_bytes() -> None:
    hosts = tuple(f"node-{i}" for i in range(30))
    previous = PrioritizeAnswers(hosts)
    same = PrioritizeAnswers(hosts, previous)
    assert same._entries is previous._entries  # nothing rebuilt
    rng = np.random.default_rng(5)
    for changed in (
        (*hosts[:10], "new-node", *hosts[10:]),  # a node came
        hosts[1:],  # one went: every row moves
        tuple(reversed(hosts)),
        ("only-new-1", "only-new-2"),
    ):
        carried = PrioritizeAnswers(changed, previous)
        fresh = PrioritizeAnswers(changed)
        positions = rng.integers(0, len(changed), 50)
        scores = rng.integers(0, 11, 50)
        assert carried.json(positions, scores) == fresh.json(positions, scores)
        expected = prioritize_result(
            zip([changed[p] for p in positions], scores.tolist(), strict=True)
        )
        assert carried.json(positions, scores) == encode(expected)
