"""The reward model: decay towards neutral, no leak between workloads, exploration, memory
caps, and the saved document."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from extender.rewards.model import (
    RewardModel,
    ScoringConstants,
    pair_evidence,
    posterior_mean,
    reward_index,
)
from extender.rewards.outcomes import Outcome, OutcomeKind

HOUR = 3600.0
CONSTANTS = ScoringConstants()


def index(good: float, bad: float, in_flight: float = 0.0) -> float:
    return float(
        reward_index(np.array([good]), np.array([bad]), np.array([in_flight]), CONSTANTS)[0]
    )


def pair_reward(model: RewardModel, now_s: float, workload: str, node: str) -> float:
    """The reward the plugin would give `workload` on `node` (pair + node's other evidence)."""
    snapshot = model.snapshot(now_s)
    row = snapshot.node_rows.get(node, -1)
    node_good, node_bad = snapshot.node_counts(now_s)
    good, bad = snapshot.pair_counts(workload, node, now_s)
    zero = np.zeros(1)
    good_, bad_ = pair_evidence(
        np.array([good]),
        np.array([bad]),
        node_good[[row]] if row >= 0 else zero,
        node_bad[[row]] if row >= 0 else zero,
        CONSTANTS,
    )
    return float(reward_index(good_, bad_, zero, CONSTANTS)[0])


def node_bad(model: RewardModel, node: str, now_s: float) -> float:
    snapshot = model.snapshot(now_s)
    return float(snapshot.node_counts(now_s)[1][snapshot.node_rows[node]])


def failures(model: RewardModel, node: str, workload: str | None, count: int, at_s: float) -> None:
    for _ in range(count):
        model.record(Outcome(node, workload, OutcomeKind.RESTART, at_s, "ns/pod"))


def successes(model: RewardModel, node: str, workload: str | None, count: int, at_s: float) -> None:
    for _ in range(count):
        model.record(Outcome(node, workload, OutcomeKind.HEALTHY, at_s, "ns/pod"))


def test_no_evidence_is_no_penalty_and_failures_lower_the_reward() -> None:
    assert index(0, 0) == 1.0
    assert index(20, 0) == 1.0
    rewards = [index(0, bad) for bad in range(8)]
    assert rewards[0] == 1.0 and all(a > b for a, b in pairwise(rewards))
    assert rewards[7] < 0.35
    # A rare failure among many good outcomes costs little.
    assert index(90, 10) > 0.95


def test_in_flight_pods_shrink_the_bonus_not_the_mean() -> None:
    assert index(1, 3, in_flight=4) < index(1, 3)
    assert posterior_mean(np.array([1.0]), np.array([3.0]))[0] == pytest.approx(2 / 6)


def test_evidence_halves_every_half_life_and_the_node_recovers() -> None:
    model = RewardModel(half_life_s=HOUR)
    failures(model, "node-a", "shop/Deployment/web", 8, at_s=0.0)
    assert node_bad(model, "node-a", HOUR) == pytest.approx(4.0)
    snapshot = model.snapshot(0.0)  # a snapshot decays to the time it is read at
    assert snapshot.pair_counts("shop/Deployment/web", "node-a", HOUR) == (0.0, pytest.approx(4))
    assert snapshot.pair_counts("shop/Deployment/web", "node-a", 2 * HOUR)[1] == pytest.approx(2)
    rewards = [pair_reward(model, k * HOUR, "shop/Deployment/web", "node-a") for k in range(8)]
    assert rewards[0] < 0.3
    assert all(b >= a for a, b in pairwise(rewards))  # recovering
    assert rewards[-1] > 0.95  # back to neutral within a few half-lives


def test_an_outcome_dated_in_the_past_weighs_what_it_would_by_now() -> None:
    model = RewardModel(half_life_s=HOUR)
    failures(model, "node-a", None, 1, at_s=2 * HOUR)
    failures(model, "node-a", None, 1, at_s=HOUR)  # arrives later, happened earlier
    assert node_bad(model, "node-a", 2 * HOUR) == pytest.approx(1.5)


def test_a_workloads_failures_do_not_leak_to_another_workload() -> None:
    model = RewardModel(half_life_s=6 * HOUR)
    failures(model, "node-x", "shop/Deployment/web", 10, at_s=0.0)
    successes(model, "node-x", "shop/Deployment/api", 10, at_s=0.0)
    successes(model, "node-y", "shop/Deployment/web", 10, at_s=0.0)
    now_s = 60.0
    assert pair_reward(model, now_s, "shop/Deployment/web", "node-x") < 0.4
    assert pair_reward(model, now_s, "shop/Deployment/web", "node-y") == 1.0
    # The other workload on the same node keeps (nearly) full marks: the node's other evidence
    # reaches it as one observation at most.
    assert pair_reward(model, now_s, "shop/Deployment/api", "node-x") > 0.97
    # A workload new to either node: no reason for doubt (half of node-x's outcomes are good;
    # a node that crashes everything is below).
    assert pair_reward(model, now_s, "shop/Deployment/new", "node-x") > 0.95
    assert pair_reward(model, now_s, "shop/Deployment/new", "node-y") == 1.0


def test_a_busy_healthy_node_does_not_drown_a_workloads_failures() -> None:
    # Thousands of healthy pods of other workloads on the node count as one observation at
    # most for the workload that keeps failing there.
    model = RewardModel(half_life_s=6 * HOUR)
    successes(model, "node-x", "shop/Deployment/api", 5000, at_s=0.0)
    failures(model, "node-x", "shop/Deployment/web", 14, at_s=0.0)
    assert pair_reward(model, 60.0, "shop/Deployment/web", "node-x") < 0.3
    assert pair_reward(model, 60.0, "shop/Deployment/api", "node-x") == 1.0
    # A node that crashes everything is suspect to a new workload, but one observation's worth.
    model = RewardModel(half_life_s=6 * HOUR)
    failures(model, "node-y", "shop/Deployment/web", 500, at_s=0.0)
    assert 0.75 < pair_reward(model, 60.0, "shop/Deployment/new", "node-y") < 0.85


def test_memory_caps_hold_and_the_least_recent_goes_first() -> None:
    model = RewardModel(half_life_s=HOUR, max_nodes=3, max_workloads=2, max_pairs=4)
    for i in range(5):
        failures(model, f"node-{i}", "ns/Deployment/a", 1, at_s=float(i))
    assert model.nodes == 3 and model.evictions.nodes == 2
    assert set(model.snapshot(10.0).node_rows) == {"node-2", "node-3", "node-4"}
    assert model.pairs == 3  # the evicted nodes' pairs went with them

    for workload in ("ns/Deployment/b", "ns/Deployment/c"):
        failures(model, "node-4", workload, 1, at_s=20.0)
    assert model.workloads == 2 and model.evictions.workloads == 1
    assert set(model.snapshot(30.0).workloads) == {"ns/Deployment/b", "ns/Deployment/c"}

    for i, workload in enumerate(("ns/Deployment/b", "ns/Deployment/c")):
        for node in ("node-2", "node-3"):
            failures(model, node, workload, 1, at_s=40.0 + i)
    assert model.pairs == 4 and model.evictions.pairs == 2
    # The two oldest pairs went: b and c on node-4.
    snapshot = model.snapshot(45.0)
    kept = {
        (workload, snapshot.node_names[row])
        for workload, pairs in snapshot.workloads.items()
        for row in pairs.rows.tolist()
    }
    assert kept == {
        (w, n) for w in ("ns/Deployment/b", "ns/Deployment/c") for n in ("node-2", "node-3")
    }
    for _ in range(500):  # many more outcomes on the same keys change nothing in size
        successes(model, "node-4", "ns/Deployment/c", 1, at_s=50.0)
    assert (model.nodes, model.workloads, model.pairs) == (3, 2, 4)


def test_faded_evidence_is_forgotten() -> None:
    model = RewardModel(half_life_s=HOUR)
    failures(model, "node-a", "ns/Deployment/a", 1, at_s=0.0)
    assert model.snapshot(6 * HOUR).pairs == 1
    snapshot = model.snapshot(7 * HOUR)
    assert snapshot.pairs == 0 and model.nodes == 0 and not snapshot.node_rows


def test_the_saved_document_restores_the_same_rewards_and_keeps_fading() -> None:
    model = RewardModel(half_life_s=HOUR)
    failures(model, "node-a", "shop/Deployment/web", 6, at_s=0.0)
    successes(model, "node-b", "shop/Deployment/web", 4, at_s=0.0)
    document = model.to_document(HOUR)
    restored = RewardModel(half_life_s=HOUR)
    restored.merge_document(document, where="test")
    for when in (HOUR, 3 * HOUR):
        before, after = model.snapshot(when), restored.snapshot(when)
        assert after.node_rows.keys() == before.node_rows.keys()
        for node in ("node-a", "node-b"):
            for reading in (before, after):
                assert reading.node_counts(when)[0][reading.node_rows[node]] == pytest.approx(
                    before.node_counts(when)[0][before.node_rows[node]], rel=1e-4
                )
            assert after.pair_counts("shop/Deployment/web", node, when) == pytest.approx(
                before.pair_counts("shop/Deployment/web", node, when), rel=1e-4
            )
    # The most recent pairs only, when asked.
    assert document["workloads"] and model.to_document(HOUR, max_pairs=0)["workloads"] == {}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"format": "other"}, "not a rewards document"),
        (
            {"format": "power-aware-scheduler/rewards/v1", "saved_at_s": "yesterday"},
            "saved_at_s: expected a finite number",
        ),
        (
            {"format": "power-aware-scheduler/rewards/v1", "saved_at_s": 1.0, "nodes": {"a": [1]}},
            "nodes['a']: expected [good, bad]",
        ),
        (
            {
                "format": "power-aware-scheduler/rewards/v1",
                "saved_at_s": 1.0,
                "nodes": {"a": [1, 0]},
                "workloads": {"w": {"a": [-1, 0]}},
            },
            "workloads['w']['a']: counts must be >= 0",
        ),
        (
            {"format": "power-aware-scheduler/rewards/v1", "saved_at_s": 1.0, "node_resets": []},
            "node_resets must be a mapping",
        ),
        (
            {
                "format": "power-aware-scheduler/rewards/v1",
                "saved_at_s": 1.0,
                "node_resets": {"a": "noon"},
            },
            "node_resets['a']: expected a finite number",
        ),
    ],
)
def test_a_bad_document_says_what_is_wrong_and_adds_nothing(document: dict, message: str) -> None:
    model = RewardModel(half_life_s=HOUR)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        model.merge_document(document, where="ConfigMap x/y")
    assert model.nodes == 0


def test_scoring_constants_are_checked() -> None:
    with pytest.raises(ValueError, match="nodeShare"):
        ScoringConstants(node_share=1.5)
    with pytest.raises(ValueError, match="halfLifeS"):
        RewardModel(half_life_s=0.0)


def test_a_node_reset_forgets_what_it_taught_and_ignores_older_outcomes() -> None:
    model = RewardModel(half_life_s=HOUR)
    failures(model, "node-a", "shop/Deployment/web", 6, at_s=0.0)
    failures(model, "node-b", "shop/Deployment/web", 2, at_s=0.0)
    assert model.reset_node("node-a", at_s=60.0)
    assert not model.reset_node("node-a", at_s=60.0)  # applied once
    snapshot = model.snapshot(120.0)
    assert set(snapshot.node_rows) == {"node-b"}
    assert snapshot.pair_counts("shop/Deployment/web", "node-a", 120.0) == (0.0, 0.0)
    assert snapshot.pair_counts("shop/Deployment/web", "node-b", 120.0)[1] > 0  # untouched
    # An outcome of before the repair reported late is ignored; one after it counts.
    failures(model, "node-a", "shop/Deployment/web", 1, at_s=30.0)
    assert "node-a" not in model.snapshot(120.0).node_rows
    failures(model, "node-a", "shop/Deployment/web", 1, at_s=90.0)
    assert model.snapshot(120.0).pair_counts("shop/Deployment/web", "node-a", 120.0)[1] > 0

    # Saved and restored: the reset still holds (older evidence stays out, newer stays in).
    restored = RewardModel(half_life_s=HOUR)
    restored.merge_document(model.to_document(120.0), where="test")
    assert restored.node_resets == {"node-a": 60.0}
    assert not restored.reset_node("node-a", at_s=60.0)  # a restart does not reset again
    failures(restored, "node-a", None, 1, at_s=45.0)
    counts = restored.snapshot(120.0).pair_counts("shop/Deployment/web", "node-a", 120.0)
    assert counts[1] == pytest.approx(2 ** (-30 / HOUR), rel=1e-3)  # the one after the reset
    # A reset long past (ten half-lives) is let go with the faded evidence.
    restored.snapshot(120.0 + 11 * HOUR)
    assert restored.node_resets == {}
