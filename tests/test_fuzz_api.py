"""Property-based attacks on /filter, /prioritize and /explain through a real uvicorn server.

Hypothesis builds request bodies from kube-scheduler v1.28's own requests with one value
replaced anywhere in the tree by something of the wrong type, from unicode and duplicate node
names, from absurd CPU quantities, and from arbitrary JSON or raw bytes. Whatever it sends, the
service must answer within the client timeout with either

- 200 and an answer kube-scheduler can decode: prioritize a list of ``{"Host", "Score"}`` with
  integer scores 0..10 for exactly the requested names, filter only requested names, explain
  one record per requested name; or
- 400 (413 for a body over the size cap) with a non-empty ``Error`` saying what was wrong;

never a 500, and never the neutral answer kept for internal errors (the internal-error counter
must stay at zero). ``/healthz`` must still answer afterwards. The input limits
(``extender.limits``) are tested at their edges, and the depth scan against a recursive count.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.app import WarningThrottle
from extender.config import parse_config
from extender.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_NODES,
    LimitError,
    check_json_depth,
    json_depth,
)
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.server import extender_service, write_snapshot

FIXTURES = Path(__file__).parent / "fixtures" / "kube-scheduler-v1.28"
NODES = ("node-a", "node-b", "node-c")
MAX_NODES = 300
MAX_DEPTH = 40
MAX_BODY_BYTES = 256 * 1024
CLIENT_TIMEOUT_S = 10.0
VERBS = ("/filter", "/prioritize", "/explain")
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)

SAMPLES = {
    (mode, verb): orjson.loads((FIXTURES / mode / f"{verb}-request.json").read_bytes())
    for mode in ("cache-capable", "nocache")
    for verb in ("filter", "prioritize")
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Any]]:
    root = tmp_path_factory.mktemp("fuzz")
    bundle = make_bundle(
        root / "bundle",
        {
            name: PowerCurveSpec(idle_w=90.0 + i, max_w=300.0, exponent=1 + i)
            for i, name in enumerate(NODES)
        },
    )
    telemetry = {"cpu_util": 0.3, "ambient_temp_c": 22.0, "cpu1_temp_c": 50.0, "cpu2_temp_c": 50.0}
    snapshot = write_snapshot(
        root / "cluster.json",
        [{"name": name, "allocatable_cpu": 8.0, "telemetry": telemetry} for name in NODES],
    )
    with (
        extender_service(
            bundle.directory,
            snapshot,
            max_body_bytes=MAX_BODY_BYTES,
            max_nodes=MAX_NODES,
            max_json_depth=MAX_DEPTH,
        ) as (url, runtime),
        httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S) as client,
    ):
        yield client, runtime
        # The server outlived everything sent to it, and never fell back to the neutral answer.
        assert client.get("/healthz").status_code == 200
        assert internal_errors(client) == 0


def internal_errors(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    pattern = r'power_aware_extender_request_errors_total\{[^}]*kind="internal"[^}]*\} (\S+)'
    return sum(float(value) for value in re.findall(pattern, text))


# ---- what a decodable answer is --------------------------------------------------------------


def strings_in(value: object) -> set[str]:
    """Every string anywhere in a JSON value (keys too): a superset of the requested names."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.add(item)
        elif isinstance(item, dict):
            found.update(k for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def requested_names(document: object) -> list[str] | None:
    """The candidates in request order when the request is well formed, else None."""
    if not isinstance(document, dict):
        return None
    names = document.get("NodeNames")
    if isinstance(names, list) and all(isinstance(n, str) and n for n in names):
        return names
    return None


def is_score(value: object) -> bool:
    return type(value) is int and 0 <= value <= 10


def check_answer(path: str, document: object, response: httpx.Response) -> None:
    assert response.status_code in (200, 400, 413), (path, response.status_code, response.text)
    answer = response.json()
    if response.status_code != 200:
        assert isinstance(answer["Error"], str) and answer["Error"], answer
        return
    allowed = strings_in(document)
    expected = requested_names(document)
    if path == "/prioritize":
        assert isinstance(answer, list)
        assert all(set(entry) == {"Host", "Score"} for entry in answer), answer
        assert all(is_score(entry["Score"]) for entry in answer), answer
        hosts = [entry["Host"] for entry in answer]
        assert set(hosts) <= allowed
        if expected is not None:
            assert hosts == expected
    elif path == "/filter":
        assert isinstance(answer, dict) and answer["Error"] == "", answer
        failed = answer["FailedNodes"]
        assert isinstance(failed, dict) and set(failed) <= allowed
        assert all(isinstance(reason, str) for reason in failed.values())
        if "NodeNames" in answer:
            passing = answer["NodeNames"]
            assert set(passing) <= allowed
            if expected is not None:
                assert set(passing) | set(failed) == set(expected)
                assert not set(passing) & set(failed)
        else:
            items = answer["Nodes"]["items"]
            assert all(item["metadata"]["name"] in allowed for item in items)
    else:
        assert isinstance(answer, dict)
        rows = answer["nodes"]
        assert all(row["node"] in allowed and is_score(row["score"]) for row in rows)
        if expected is not None:
            assert [row["node"] for row in rows] == expected


def send(client: httpx.Client, path: str, document: object) -> httpx.Response:
    raw = orjson.dumps(document)
    response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    check_answer(path, document, response)
    return response


# ---- strategies -------------------------------------------------------------------------------

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
cpu_quantities = (
    st.sampled_from(
        [
            "1e30",
            "-5",
            "abc",
            "",
            "0",
            "-0.5",
            "1e-30",
            "9" * 40,
            "100m",
            "1Ki",
            "1e3m",
            "NaN",
            "Infinity",
            "-1e309",
            "1.5.5",
            "2 ",
            " 2",
            "0x10",
            "1n",
            "1E",
            "+1",
            "٣",
        ]
    )
    | st.text(max_size=12)
    | json_leaves
)
node_names = st.sampled_from(NODES) | st.text(min_size=0, max_size=30)


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys and indices) into a JSON value, the root included."""
    paths = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            paths.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths.extend(_paths(item, (*prefix, index)))
    return paths


def _replaced(document: object, path: tuple, new_value: object) -> object:
    if not path:
        return new_value
    document = copy.deepcopy(document)
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = new_value
    return document


@st.composite
def mutated_samples(draw: st.DrawFn) -> object:
    """A real kube-scheduler body with one value anywhere replaced (or deleted)."""
    sample = SAMPLES[draw(st.sampled_from(sorted(SAMPLES)))]
    path = draw(st.sampled_from(_paths(sample)))
    if path and draw(st.booleans()) and isinstance(path[-1], str):
        document = copy.deepcopy(sample)
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        del parent[path[-1]]  # a missing field
        return document
    return _replaced(sample, path, draw(json_values))


@st.composite
def pods_with_quantities(draw: st.DrawFn) -> object:
    """A cache-capable request whose containers ask for absurd CPU, over random node names."""
    document = copy.deepcopy(SAMPLES[("cache-capable", "prioritize")])
    spec = document["Pod"]["spec"]
    spec["containers"][0]["resources"] = {
        draw(st.sampled_from(["requests", "limits"])): {"cpu": draw(cpu_quantities)}
    }
    if draw(st.booleans()):
        spec["initContainers"] = [
            {"name": "init", "resources": {"requests": {"cpu": draw(cpu_quantities)}}}
        ]
    if draw(st.booleans()):
        spec["overhead"] = {"cpu": draw(cpu_quantities)}
    document["NodeNames"] = draw(st.lists(node_names, max_size=12))
    return document


# ---- properties ------------------------------------------------------------------------------


@FUZZ
@given(document=mutated_samples(), path=st.sampled_from(VERBS))
def test_real_bodies_with_a_value_replaced_anywhere(service, document: object, path: str) -> None:
    client, _ = service
    send(client, path, document)


@FUZZ
@given(document=pods_with_quantities(), path=st.sampled_from(VERBS))
def test_absurd_cpu_quantities_and_odd_node_names(service, document: object, path: str) -> None:
    client, _ = service
    response = send(client, path, document)
    if response.status_code == 400:
        assert "Pod" in response.json()["Error"] or "NodeNames" in response.json()["Error"]


@FUZZ
@given(
    names=st.lists(st.text(min_size=1, max_size=40) | st.sampled_from(NODES), max_size=40),
    path=st.sampled_from(VERBS),
)
def test_unicode_and_duplicate_node_names_answer_per_candidate(
    service, names: list[str], path: str
) -> None:
    client, _ = service
    document = copy.deepcopy(SAMPLES[("cache-capable", "prioritize")])
    document["NodeNames"] = names + names[:3]  # duplicates on purpose
    response = send(client, path, document)
    assert response.status_code == 200


@FUZZ
@given(document=json_values, path=st.sampled_from(VERBS))
def test_arbitrary_json(service, document: object, path: str) -> None:
    client, _ = service
    send(client, path, document)


@FUZZ
@given(raw=st.binary(max_size=300), path=st.sampled_from(VERBS))
def test_arbitrary_bytes_get_400(service, raw: bytes, path: str) -> None:
    client, _ = service
    response = client.post(path, content=raw)
    assert response.status_code in (200, 400), response.text
    if response.status_code == 200:  # bytes that happen to be a valid request
        check_answer(path, orjson.loads(raw), response)
    else:
        assert response.json()["Error"]


# ---- the limits at their edges -----------------------------------------------------------------


def test_deep_nesting_is_refused_before_parsing_and_the_server_survives(service) -> None:
    client, _ = service
    # 100k levels (a million, 2 MB, crash orjson with a segmentation fault: see below).
    levels = 100_000
    raw = b'{"Pod":' + b"[" * levels + b"]" * levels + b"}"
    for path in VERBS:
        response = client.post(path, content=raw)
        assert response.status_code == 400
        error = response.json()["Error"]
        assert f"nests {levels + 1} levels" in error and f"limit is {MAX_DEPTH}" in error
        assert "--max-json-depth" in error
    # At the limit it parses (and is refused for what it is: a Pod that is not an object).
    at_limit = b'{"Pod":' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}"
    response = client.post("/prioritize", content=at_limit)
    assert response.status_code == 400 and "Pod must be a JSON object" in response.json()["Error"]
    # Brackets inside strings are not nesting: a node name made of them is fine.
    document = copy.deepcopy(SAMPLES[("cache-capable", "prioritize")])
    document["NodeNames"] = ["[" * 500 + '\\"{' * 100, "node-a"]
    assert send(client, "/prioritize", document).status_code == 200
    assert client.get("/healthz").status_code == 200


def test_a_million_levels_are_refused_without_parsing() -> None:
    levels = 1_000_000
    raw = b'{"Pod":' + b"[" * levels + b"]" * levels + b"}"
    assert len(raw) < DEFAULT_MAX_BODY_BYTES  # under the size cap: the depth check must catch it
    assert json_depth(raw) == levels + 1
    with pytest.raises(LimitError, match=f"nests {levels + 1} levels"):
        check_json_depth(raw, DEFAULT_MAX_JSON_DEPTH)


def test_node_count_limit_names_the_limit_and_the_count(service) -> None:
    client, _ = service
    document = copy.deepcopy(SAMPLES[("cache-capable", "prioritize")])
    document["NodeNames"] = [f"n{i}" for i in range(MAX_NODES)]
    assert send(client, "/prioritize", document).status_code == 200
    document["NodeNames"].append("one-more")
    for path in VERBS:
        response = client.post(path, content=orjson.dumps(document))
        assert response.status_code == 400
        error = response.json()["Error"]
        assert f"{MAX_NODES + 1} candidate nodes" in error and f"limit is {MAX_NODES}" in error
    nodes = copy.deepcopy(SAMPLES[("nocache", "filter")])
    nodes["Nodes"]["items"] = [
        {"metadata": {"name": f"n{i}"}, "status": {"allocatable": {"cpu": "8"}}}
        for i in range(MAX_NODES + 5)
    ]
    response = client.post("/filter", content=orjson.dumps(nodes))
    assert response.status_code == 400
    assert f"{MAX_NODES + 5} candidate nodes" in response.json()["Error"]


def test_huge_array_over_the_body_cap_gets_413(service) -> None:
    client, _ = service
    document = copy.deepcopy(SAMPLES[("cache-capable", "prioritize")])
    document["NodeNames"] = ["x" * 64] * (MAX_BODY_BYTES // 64)
    response = client.post("/filter", content=orjson.dumps(document))
    assert response.status_code == 413
    assert f"limit of {MAX_BODY_BYTES} bytes" in response.json()["Error"]


def test_limit_flags_and_documented_defaults() -> None:
    defaults = parse_config([])
    assert defaults.max_nodes == DEFAULT_MAX_NODES >= 5000
    assert defaults.max_json_depth == DEFAULT_MAX_JSON_DEPTH
    assert defaults.max_body_bytes == DEFAULT_MAX_BODY_BYTES
    # 5000 NodeNames and 5000 sampled Node objects fit under the defaults.
    node = SAMPLES[("nocache", "filter")]["Nodes"]["items"][0]
    assert len(orjson.dumps(node)) * 5000 < DEFAULT_MAX_BODY_BYTES
    assert json_depth(orjson.dumps(SAMPLES[("nocache", "filter")])) < DEFAULT_MAX_JSON_DEPTH
    config = parse_config(["--max-nodes", "7", "--max-json-depth", "9", "--max-body-bytes", "99"])
    assert (config.max_nodes, config.max_json_depth, config.max_body_bytes) == (7, 9, 99)


# ---- the depth scan against a recursive count ----------------------------------------------------


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


tricky_text = st.text(alphabet=st.sampled_from('[]{}"\\/abc\n\u00e9\u2028'), max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    value=st.recursive(
        st.none() | st.integers(-(2**63), 2**63 - 1) | tricky_text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
        max_leaves=25,
    ),
    python_json=st.booleans(),
)
def test_json_depth_matches_the_parsed_structure(value: object, python_json: bool) -> None:
    raw = json.dumps(value).encode() if python_json else orjson.dumps(value)
    assert json_depth(raw) == _depth(value)


def test_bad_requests_are_logged_at_a_bounded_rate(
    service, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = service

    def refused() -> float:
        text = client.get("/metrics").text
        labels = r'(?=[^}]*kind="bad_request")(?=[^}]*verb="filter")'
        found = re.findall(r"request_errors_total\{" + labels + r"[^}]*\} (\S+)", text)
        return sum(float(value) for value in found)

    before = refused()
    with caplog.at_level(logging.WARNING, logger="extender.app"):
        for i in range(50):
            assert (
                client.post("/filter", content=b"{not json " + str(i).encode()).status_code == 400
            )
    lines = [r for r in caplog.records if "unreadable request" in r.getMessage()]
    assert len(lines) <= 1  # one line per 10 s for this verb and kind, however many arrive
    assert refused() - before == 50  # every refusal still counted


def test_warning_throttle_says_how_many_lines_it_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now_s = [0.0]
    throttle = WarningThrottle(interval_s=10.0, clock=lambda: now_s[0])
    with caplog.at_level(logging.WARNING, logger="extender.app"):
        for step in range(25):  # one refusal per second for 25 s
            now_s[0] = float(step)
            throttle.warn("filter", "bad_request", f"unreadable request #{step}")
        throttle.warn("prioritize", "bad_request", "another verb has its own budget")
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        "filter: unreadable request #0",
        "filter: unreadable request #10 (9 more bad_request requests since the last such line)",
        "filter: unreadable request #20 (9 more bad_request requests since the last such line)",
        "prioritize: another verb has its own budget",
    ]
