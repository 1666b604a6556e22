"""Round-trip times between nodes: the immutable matrix the Delay plugin reads on each request.

A background source (`extender.sources.rtt`) measures or reads RTTs as *directed links*
(`RttLink`: from a node, to a node, milliseconds, when measured, until when the value may be
used) and publishes an `RttMatrix` under `RTT_SIGNAL`. The matrix is what a request sees:

- **symmetric**: a round trip is a round trip; when both directions are known the larger one
  counts (Goldpinger times an HTTP call, and the busier end of a link answers slower: the
  larger value is the one a pod would meet);
- **a node's RTT to itself is 0**, always known;
- **unknown is never zero**: a link nobody measured is NaN, and a measured link is usable only
  until its `expires_at_s` (its measurement time plus the source's maximum age), after which a
  request treats it as unknown, with its last value and age at hand for the reason;
- **two layers**: measured links (Goldpinger) win over static ones (an RTT file) wherever a
  measured value is still fresh when the matrix is built; static values never expire.

Dense arrays (three float64 per node pair: 24 MB at 1,000 nodes): an all-pairs RTT source does
not go far beyond that (Goldpinger at 1,000 nodes already sends a million pings per refresh).
Looking up one source node against every candidate is one row gather; candidate positions in
the matrix are cached per candidate list.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

RTT_SIGNAL = "delay.rtt"
MAX_CACHED_CANDIDATE_LISTS = 8


@dataclass(frozen=True)
class RttLink:
    """One directed measurement: the RTT from `source` to `target`, in milliseconds.

    `measured_at_s` is when the value was measured (Unix seconds; for a file, its modification
    time); it may be used until `expires_at_s` (infinity for static values).
    """

    source: str
    target: str
    rtt_ms: float
    measured_at_s: float
    expires_at_s: float = math.inf

    def __post_init__(self) -> None:
        # +inf is a value ("beyond every bucket": too far for any limit); NaN is not.
        if not self.rtt_ms >= 0:
            raise ValueError(
                f"RTT {self.source} -> {self.target} must be >= 0 ms, got {self.rtt_ms!r}"
            )


@dataclass(frozen=True)
class LinkValues:
    """RTTs from one origin to a list of nodes, aligned to that list.

    `rtt_ms` NaN: never measured. `known` is False for those and for expired values, whose last
    value stays in `rtt_ms` (and `age_s`) so that a reason can say how old it is.
    """

    rtt_ms: np.ndarray
    age_s: np.ndarray
    known: np.ndarray


@dataclass(frozen=True, eq=False)
class RttMatrix:
    """Symmetric RTTs between named endpoints (nodes, or places an RTT file names).

    Arrays are n x n, aligned to `nodes`: `rtt_ms` (NaN unknown, 0 on the diagonal),
    `measured_at_s` (-inf unknown) and `expires_at_s` (-inf unknown, inf static). Read-only.
    """

    nodes: tuple[str, ...]
    rtt_ms: np.ndarray
    measured_at_s: np.ndarray
    expires_at_s: np.ndarray
    built_at_s: float
    sources: tuple[str, ...] = ()  # what the values came from, for /status and reasons
    positions: Mapping[str, int] = field(init=False, repr=False)
    _index_cache: dict = field(init=False, repr=False)
    _index_lock: threading.Lock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        count = len(self.nodes)
        for name in ("rtt_ms", "measured_at_s", "expires_at_s"):
            array = getattr(self, name)
            if array.shape != (count, count):
                raise ValueError(f"{name} must be {count} x {count}, got {array.shape}")
            array.flags.writeable = False
        object.__setattr__(
            self, "positions", MappingProxyType({n: i for i, n in enumerate(self.nodes)})
        )
        object.__setattr__(self, "_index_cache", {})
        object.__setattr__(self, "_index_lock", threading.Lock())

    def __len__(self) -> int:
        return len(self.nodes)

    # ---- building ---------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        measured: Iterable[RttLink] = (),
        static: Iterable[RttLink] = (),
        *,
        nodes: Iterable[str] = (),
        built_at_s: float,
        sources: Sequence[str] = (),
    ) -> RttMatrix:
        """The matrix of measured links over static ones, symmetric, self at 0.

        Measured links already expired at `built_at_s` are left out (a static value, if any,
        takes their place). Several values for one directed link: the largest counts.
        """
        measured = [link for link in measured if link.expires_at_s > built_at_s]
        static = list(static)
        names = dict.fromkeys(nodes)
        for link in (*measured, *static):
            names.setdefault(link.source)
            names.setdefault(link.target)
        order = tuple(names)
        positions = {name: i for i, name in enumerate(order)}
        count = len(order)

        rtt, measured_at, expires_at = _symmetric_layer(measured, positions, count)
        static_rtt, static_at, static_expires = _symmetric_layer(static, positions, count)
        use_static = np.isnan(rtt) & ~np.isnan(static_rtt)
        rtt[use_static] = static_rtt[use_static]
        measured_at[use_static] = static_at[use_static]
        expires_at[use_static] = static_expires[use_static]

        diagonal = np.arange(count)
        rtt[diagonal, diagonal] = 0.0
        measured_at[diagonal, diagonal] = math.inf  # age 0: nothing to measure
        expires_at[diagonal, diagonal] = math.inf
        return cls(order, rtt, measured_at, expires_at, float(built_at_s), tuple(sources))

    # ---- reading (request path) -------------------------------------------------------------

    def index_of(self, names: Sequence[str]) -> np.ndarray:
        """Position of each name in the matrix (-1: not in it); cached per `names` object.

        kube-scheduler sends the same candidate list pod after pod, and the state hands back
        the same `names` tuple for it: the lookup is paid once per list and matrix.
        """
        key = id(names)
        cached = self._index_cache.get(key)
        if cached is not None and cached[0] is names:
            return cached[1]
        get = self.positions.get
        index = np.fromiter((get(n, -1) for n in names), dtype=np.intp, count=len(names))
        index.flags.writeable = False
        with self._index_lock:
            self._index_cache[key] = (names, index)
            while len(self._index_cache) > MAX_CACHED_CANDIDATE_LISTS:
                del self._index_cache[next(iter(self._index_cache))]
        return index

    def links_from(self, origin: str, targets: np.ndarray, now_s: float) -> LinkValues:
        """RTT from `origin` to each target position (`index_of`), as of `now_s`.

        A target at -1 (not in the matrix), or an origin the matrix does not know, is unknown.
        """
        count = targets.size
        row = self.positions.get(origin, -1)
        if row < 0:
            nan = np.full(count, np.nan)
            return LinkValues(nan, nan.copy(), np.zeros(count, dtype=bool))
        inside = targets >= 0
        columns = np.where(inside, targets, 0)
        rtt = np.where(inside, self.rtt_ms[row].take(columns), np.nan)
        measured_at = np.where(inside, self.measured_at_s[row].take(columns), -np.inf)
        expires_at = np.where(inside, self.expires_at_s[row].take(columns), -np.inf)
        with np.errstate(invalid="ignore"):
            known = ~np.isnan(rtt) & (now_s <= expires_at)
            age_s = np.where(np.isnan(rtt), np.nan, np.maximum(now_s - measured_at, 0.0))
        return LinkValues(rtt, age_s, known)

    # ---- status -----------------------------------------------------------------------------

    def summary(self, now_s: float) -> dict[str, object]:
        """Counts for /status: endpoints, node pairs known (fresh), measured but expired."""
        count = len(self.nodes)
        upper = np.triu_indices(count, k=1)
        rtt = self.rtt_ms[upper]
        expires_at = self.expires_at_s[upper]
        measured = ~np.isnan(rtt)
        fresh = measured & (now_s <= expires_at)
        ages = now_s - self.measured_at_s[upper][fresh]
        return {
            "endpoints": count,
            "pairs": int(rtt.size),
            "pairs_known": int(np.count_nonzero(fresh)),
            "pairs_expired": int(np.count_nonzero(measured & ~fresh)),
            "oldest_known_age_s": round(float(ages.max()), 1) if ages.size else None,
            "built_at_s": self.built_at_s,
            "sources": list(self.sources),
        }


def _symmetric_layer(
    links: Sequence[RttLink], positions: Mapping[str, int], count: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rtt, measured_at, expires_at) of one layer: per node pair, the larger direction.

    Vectorised: a Goldpinger mesh of a few hundred nodes has a hundred thousand links, rebuilt
    every refresh in a thread that shares the interpreter with the request path.
    """
    rtt = np.full((count, count), np.nan)
    measured_at = np.full((count, count), -np.inf)
    expires_at = np.full((count, count), -np.inf)
    total = len(links)
    if total:
        source = np.fromiter((positions[link.source] for link in links), np.intp, total)
        target = np.fromiter((positions[link.target] for link in links), np.intp, total)
        values = np.fromiter((link.rtt_ms for link in links), np.float64, total)
        measured = np.fromiter((link.measured_at_s for link in links), np.float64, total)
        expires = np.fromiter((link.expires_at_s for link in links), np.float64, total)
        # A node to itself is 0 by definition; repeated directed links: the largest value.
        keep = source != target
        cell = source[keep] * count + target[keep]
        values, measured, expires = values[keep], measured[keep], expires[keep]
        order = np.lexsort((values, cell))
        last = np.ones(order.size, dtype=bool)
        last[:-1] = cell[order][1:] != cell[order][:-1]
        chosen = order[last]
        rtt.flat[cell[chosen]] = values[chosen]
        measured_at.flat[cell[chosen]] = measured[chosen]
        expires_at.flat[cell[chosen]] = expires[chosen]
    # Symmetric: the larger direction, with that direction's times; a direction nobody
    # measured takes the other's.
    mirror = ~np.isnan(rtt.T) & (np.isnan(rtt) | (rtt < rtt.T))
    return (
        np.where(mirror, rtt.T, rtt),
        np.where(mirror, measured_at.T, measured_at),
        np.where(mirror, expires_at.T, expires_at),
    )
