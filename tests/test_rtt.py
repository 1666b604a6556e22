"""The RTT matrix (symmetric, self at 0, unknown never zero, expiry) and the static RTT file."""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from extender.rtt import RTT_SIGNAL, RttLink, RttMatrix
from extender.sources.goldpinger import (
    binomial_quantile,
    confident_quantile,
    histogram_quantile,
)
from extender.sources.rtt import RttSource, RttSourceSettings
from extender.sources.rtt_file import RttFileError, read_rtt_file
from extender.state import ClusterState


def matrix(*links: RttLink, static: tuple[RttLink, ...] = (), at_s: float = 1000.0) -> RttMatrix:
    return RttMatrix.build(links, static, built_at_s=at_s)


def rtt_between(m: RttMatrix, a: str, b: str, now_s: float) -> tuple[float, bool]:
    values = m.links_from(a, m.index_of((b,)), now_s)
    return float(values.rtt_ms[0]), bool(values.known[0])


def test_the_larger_direction_counts_and_a_node_is_at_zero_from_itself() -> None:
    m = matrix(RttLink("a", "b", 4.0, 990.0, 1290.0), RttLink("b", "a", 6.5, 995.0, 1295.0))
    assert rtt_between(m, "a", "b", 1000.0) == (6.5, True)
    assert rtt_between(m, "b", "a", 1000.0) == (6.5, True)
    assert rtt_between(m, "a", "a", 1000.0) == (0.0, True)
    # The age is the larger direction's: measured at 995 s.
    age = m.links_from("a", m.index_of(("b",)), 1000.0).age_s[0]
    assert age == pytest.approx(5.0)


def test_one_measured_direction_is_the_round_trip() -> None:
    m = matrix(RttLink("a", "b", 12.0, 990.0, 1290.0))
    assert rtt_between(m, "b", "a", 1000.0) == (12.0, True)


def test_unknown_links_are_never_zero() -> None:
    m = matrix(RttLink("a", "b", 3.0, 990.0, 1290.0), RttLink("c", "d", 3.0, 990.0, 1290.0))
    rtt, known = rtt_between(m, "a", "c", 1000.0)
    assert math.isnan(rtt) and not known
    # A name the matrix has never heard of: unknown too.
    values = m.links_from("a", m.index_of(("zz",)), 1000.0)
    assert np.isnan(values.rtt_ms[0]) and not values.known[0]
    assert m.summary(1000.0)["pairs_known"] == 2


def test_a_measured_link_expires_and_keeps_its_last_value_for_the_reason() -> None:
    m = matrix(RttLink("a", "b", 8.0, 900.0, 1200.0))
    assert rtt_between(m, "a", "b", 1199.0) == (8.0, True)
    values = m.links_from("a", m.index_of(("b",)), 1300.0)
    assert not values.known[0]
    assert values.rtt_ms[0] == 8.0 and values.age_s[0] == pytest.approx(400.0)
    assert m.summary(1300.0)["pairs_expired"] == 1


def test_fresh_measurements_win_over_static_values_which_never_expire() -> None:
    static = (RttLink("a", "b", 30.0, 0.0), RttLink("a", "c", 50.0, 0.0))
    m = matrix(RttLink("a", "b", 9.0, 990.0, 1290.0), RttLink("a", "c", 9.0, 100.0, 400.0),
               static=static)  # fmt: skip
    assert rtt_between(m, "a", "b", 1000.0) == (9.0, True)
    # a-c was measured, but that expired before the matrix was built: the static value holds.
    assert rtt_between(m, "a", "c", 1000.0) == (50.0, True)
    assert rtt_between(m, "a", "c", 1e12) == (50.0, True)


def test_candidate_positions_are_cached_per_list_object() -> None:
    m = matrix(RttLink("a", "b", 1.0, 990.0, 1290.0))
    names = ("b", "zz", "a")
    first = m.index_of(names)
    assert first.tolist() == [m.positions["b"], -1, m.positions["a"]]
    assert m.index_of(names) is first
    other = tuple(["b", "zz", "a"])  # an equal list, another object
    assert m.index_of(other) is not first and m.index_of(other).tolist() == first.tolist()


def test_a_negative_or_nan_rtt_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0 ms"):
        RttLink("a", "b", -1.0, 0.0)
    with pytest.raises(ValueError, match=">= 0 ms"):
        RttLink("a", "b", math.nan, 0.0)


# ---- histogram quantiles (checked against Prometheus itself in test_delay_live) -------------


BOUNDS = np.array([0.005, 0.01, 0.025, 0.05, math.inf])


def test_histogram_quantile_interpolates_like_promql_and_upper_takes_the_bucket_bound() -> None:
    counts = np.array([0.0, 2.0, 10.0, 10.0, 10.0])  # 2 in 5-10 ms, 8 in 10-25 ms
    # rank 5: 3 of the 8 in the 10-25 ms bucket -> 10 + 15 * 3/8 ms
    assert histogram_quantile(0.5, BOUNDS, counts, estimate="interpolate") == pytest.approx(
        0.010 + 0.015 * 3 / 8
    )
    assert histogram_quantile(0.5, BOUNDS, counts, estimate="upper") == pytest.approx(0.025)
    assert histogram_quantile(0.1, BOUNDS, counts, estimate="upper") == pytest.approx(0.010)


def test_histogram_quantile_without_calls_is_unknown_and_beyond_the_buckets_is_far() -> None:
    assert math.isnan(histogram_quantile(0.5, BOUNDS, np.zeros(5), estimate="upper"))
    beyond = np.array([0.0, 0.0, 0.0, 0.0, 4.0])
    assert histogram_quantile(0.5, BOUNDS, beyond, estimate="interpolate") == 0.05
    assert histogram_quantile(0.5, BOUNDS, beyond, estimate="upper") == math.inf


def test_the_confidence_bound_reads_a_higher_call_the_fewer_calls_a_window_holds() -> None:
    # Ten calls: the median's 95 % upper bound is the ninth (P(Bin(10, 0.5) <= 8) = 0.989).
    assert confident_quantile(0.5, 10, 0.95) == pytest.approx(0.9)
    # A thousand: just past the 52nd percentile; no confidence: the quantile itself.
    assert 0.52 < confident_quantile(0.5, 1000, 0.95) < 0.53
    assert confident_quantile(0.5, 10, 0.0) == 0.5
    # Never past the largest call, and a window without calls asks nothing.
    assert confident_quantile(0.9, 10, 0.95) == 1.0
    assert confident_quantile(0.5, 0.2, 0.95) == 0.5


@pytest.mark.parametrize("n", [1, 2, 5, 10, 31, 100, 1000, 12345, 200_000])
@pytest.mark.parametrize("p", [0.01, 0.1, 0.5, 0.77, 0.9, 0.99])
def test_the_binomial_quantile_is_scipys_without_importing_it(n: int, p: float) -> None:
    from scipy.stats import binom  # the reference; the service itself does not import it

    for probability in (0.5, 0.9, 0.95, 0.99, 0.999):
        k = binomial_quantile(probability, n, p)
        # The smallest k whose CDF reaches the probability (ties within float rounding).
        assert binom.cdf(k, n, p) >= probability - 1e-9
        assert k == 0 or binom.cdf(k - 1, n, p) < probability + 1e-9
    assert binomial_quantile(0.95, n, 0.0) == 0 and binomial_quantile(0.95, n, 1.0) == n


def test_a_link_just_over_a_limit_is_not_passed_on_a_lucky_median() -> None:
    # Ten calls, six at or under 50 ms, four over: the median reads "50 ms" and passes a
    # 50 ms limit; with 95 % confidence the ninth call counts: 100 ms.
    bounds = np.array([0.005, 0.01, 0.025, 0.05, 0.1, math.inf])
    counts = np.array([0.0, 0.0, 0.0, 6.0, 10.0, 10.0])
    assert histogram_quantile(0.5, bounds, counts, estimate="upper") == pytest.approx(0.05)
    assert histogram_quantile(
        0.5, bounds, counts, estimate="upper", confidence=0.95
    ) == pytest.approx(0.1)
    # A link whose calls are all under the limit stays under it, however confident.
    steady = np.array([0.0, 0.0, 10.0, 10.0, 10.0, 10.0])
    assert histogram_quantile(
        0.5, bounds, steady, estimate="upper", confidence=0.95
    ) == pytest.approx(0.025)


# ---- the static file ---------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_a_matrix_file_and_link_entries(tmp_path: Path) -> None:
    path = write(
        tmp_path / "rtt.yaml",
        """
        nodes: [edge-1a, edge-1b, cloud-1]
        rttMs:
          - [0, 1.2, 38]
          - [1.5, 0, null]
          - [40, ~, 0]
        links:
          - {from: edge-1a, to: tower-7, rttMs: 4.5}
        """,
    )
    os.utime(path, (1_700_000_000, 1_700_000_000))
    links = read_rtt_file(path)
    assert {(link.source, link.target): link.rtt_ms for link in links} == {
        ("edge-1a", "edge-1b"): 1.2,
        ("edge-1a", "cloud-1"): 38.0,
        ("edge-1b", "edge-1a"): 1.5,
        ("cloud-1", "edge-1a"): 40.0,
        ("edge-1a", "tower-7"): 4.5,
    }
    assert all(link.measured_at_s == 1_700_000_000 for link in links)
    assert all(math.isinf(link.expires_at_s) for link in links)
    m = RttMatrix.build(static=links, built_at_s=1_800_000_000)
    assert rtt_between(m, "cloud-1", "edge-1a", 1_800_000_000) == (40.0, True)
    assert not rtt_between(m, "cloud-1", "edge-1b", 1_800_000_000)[1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: [a, b]\nrttMs: [[0, 1]]\n", "rttMs has 1 rows for 2 nodes"),
        ("nodes: [a, b]\nrttMs: [[0, 1], [1, 0, 3]]\n", "rttMs row 2 (b): 3 values for 2 nodes"),
        ("nodes: [a, b]\nrttMs: [[0, fast], [1, 0]]\n", "row 1 (a), column 2 (b): 'fast' is not"),
        ("nodes: [a, b]\nrttMs: [[0, -2], [1, 0]]\n", "column 2 (b): -2 must be a finite"),
        ("nodes: [a, a]\nrttMs: [[0, 1], [1, 0]]\n", "nodes[1] 'a' is already nodes[0]"),
        ("rttMs: [[0]]\n", "rttMs needs nodes"),
        ("links:\n  - {from: a, to: b}\n", "links[0]: needs exactly from, to, rttMs; missing"),
        ("links:\n  - {from: a, to: a, rttMs: 1}\n", "links[0]: from and to are both 'a'"),
        ("links:\n  - {from: a, to: b, rttMs: true}\n", "links[0].rttMs: True is not a number"),
        ("matrix: []\n", "unknown key(s) ['matrix']"),
        ("- a\n", "expected a mapping"),
        ("links: []\n", "no RTT in the file"),
        ("nodes: [a\n", "not valid YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_place(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "rtt.yaml", text)
    with pytest.raises(RttFileError) as error:
        read_rtt_file(path)
    assert str(error.value).startswith(str(path))
    assert message in str(error.value)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(RttFileError, match="cannot read the RTT file"):
        read_rtt_file(tmp_path / "nope.yaml")


# ---- the background source with a file --------------------------------------------------------


def test_the_file_is_read_again_when_it_changes_and_a_bad_change_is_refused(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "rtt.yaml", "links:\n  - {from: a, to: b, rttMs: 4}\n")
    os.utime(path, (1_000, 1_000))
    state = ClusterState()
    source = RttSource(RttSourceSettings(rtt_file=path), state, clock=lambda: 5_000.0)
    first = source.refresh()
    assert state.view(5_000.0).signal(RTT_SIGNAL) is first
    assert rtt_between(first, "a", "b", 5_000.0) == (4.0, True)

    write(path, "links:\n  - {from: a, to: b, rttMs: 9}\n")
    os.utime(path, (2_000, 2_000))
    assert rtt_between(source.refresh(), "a", "b", 5_000.0) == (9.0, True)

    write(path, "links:\n  - {from: a, to: b, rttMs: nine}\n")
    os.utime(path, (3_000, 3_000))
    kept = source.refresh()
    assert rtt_between(kept, "a", "b", 5_000.0) == (9.0, True)
    status = source.status()["rtt_file"]
    assert status["errors_total"] == 1 and "'nine' is not a number" in status["last_error"]
    assert status["modified_at_s"] == 2_000  # still the file that was accepted
    source.refresh()  # the same bad file again: refused once, not counted again
    assert source.status()["rtt_file"]["errors_total"] == 1
