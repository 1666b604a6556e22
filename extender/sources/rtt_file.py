"""A static RTT file: round-trip times for sites that measure them another way than Goldpinger.

YAML (or JSON), milliseconds, as a matrix, as per-link entries, or both::

    nodes: [edge-1a, edge-1b, cloud-1]
    rttMs:                      # row i, column j: RTT from nodes[i] to nodes[j]
      - [0,   1.2, 38]
      - [1.2, 0,   null]        # null (or ~): not known
      - [38,  41,  0]
    links:
      - {from: edge-1a, to: tower-7, rttMs: 4.5}   # an endpoint need not be a node

Names are node names, or any place a pod may name in `delay_<from>` (a cell tower, a
gateway): the Delay plugin resolves `<from>` against the cluster's nodes and the matrix's names.
The diagonal is ignored (a node's RTT to itself is 0). The matrix need not be symmetric: the
larger direction counts. Static values never expire; they are read again when the file's
modification time changes (a mounted ConfigMap is swapped atomically by the kubelet).

Every problem raises `RttFileError` naming the file and the place (row, column, link number,
field), so a bad file is refused as a whole and the previous one keeps serving.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from extender.rtt import RttLink

KEYS = ("nodes", "rttMs", "links")
LINK_KEYS = ("from", "to", "rttMs")


class RttFileError(ValueError):
    """An RTT file the extender cannot use; the message names the file and the entry."""


def read_rtt_file(path: Path) -> list[RttLink]:
    """The directed links of an RTT file, stamped with its modification time."""
    path = Path(path)
    try:
        text = path.read_text()
        modified_at_s = path.stat().st_mtime
    except OSError as error:
        raise RttFileError(f"{path}: cannot read the RTT file: {error.strerror}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise RttFileError(f"{path}: not valid YAML/JSON: {error}") from None
    return parse_rtt_document(document, where=str(path), measured_at_s=modified_at_s)


def parse_rtt_document(document: object, *, where: str, measured_at_s: float) -> list[RttLink]:
    """The links of a parsed RTT document (see the module docstring); RttFileError if bad."""
    if not isinstance(document, Mapping):
        raise RttFileError(
            f"{where}: expected a mapping with {', '.join(KEYS)}, got {type(document).__name__}"
        )
    unknown = sorted(set(document) - set(KEYS))
    if unknown:
        raise RttFileError(f"{where}: unknown key(s) {unknown}; expected {', '.join(KEYS)}")
    if "rttMs" in document and "nodes" not in document:
        raise RttFileError(f"{where}: rttMs needs nodes (the names of its rows and columns)")
    links: list[RttLink] = []
    if "nodes" in document:
        links += _matrix_links(document, where, measured_at_s)
    for number, entry in enumerate(_list(document.get("links", []), f"{where}: links")):
        links.append(_link(entry, f"{where}: links[{number}]", measured_at_s))
    if not links:
        raise RttFileError(f"{where}: no RTT in the file (give rttMs with nodes, or links)")
    return links


def _matrix_links(document: Mapping[str, Any], where: str, at_s: float) -> list[RttLink]:
    nodes = _list(document["nodes"], f"{where}: nodes")
    for number, name in enumerate(nodes):
        if not isinstance(name, str) or not name:
            raise RttFileError(f"{where}: nodes[{number}] must be a name, got {name!r}")
    seen: dict[str, int] = {}
    for number, name in enumerate(nodes):
        if name in seen:
            raise RttFileError(f"{where}: nodes[{number}] {name!r} is already nodes[{seen[name]}]")
        seen[name] = number
    rows = _list(document.get("rttMs", []), f"{where}: rttMs")
    if len(rows) != len(nodes):
        raise RttFileError(
            f"{where}: rttMs has {len(rows)} rows for {len(nodes)} nodes (one row per node)"
        )
    links = []
    for i, row in enumerate(rows):
        row_where = f"{where}: rttMs row {i + 1} ({nodes[i]})"
        row = _list(row, row_where)
        if len(row) != len(nodes):
            raise RttFileError(f"{row_where}: {len(row)} values for {len(nodes)} nodes")
        for j, value in enumerate(row):
            if i == j or value is None:
                continue
            rtt_ms = _milliseconds(value, f"{row_where}, column {j + 1} ({nodes[j]})")
            links.append(RttLink(nodes[i], nodes[j], rtt_ms, at_s))
    return links


def _link(entry: object, where: str, at_s: float) -> RttLink:
    if not isinstance(entry, Mapping):
        raise RttFileError(f"{where}: expected {{from, to, rttMs}}, got {entry!r}")
    unknown = sorted(set(entry) - set(LINK_KEYS))
    missing = [key for key in LINK_KEYS if key not in entry]
    if unknown or missing:
        raise RttFileError(
            f"{where}: needs exactly {', '.join(LINK_KEYS)}"
            + (f"; unknown {unknown}" if unknown else "")
            + (f"; missing {missing}" if missing else "")
        )
    source, target = entry["from"], entry["to"]
    for key, name in (("from", source), ("to", target)):
        if not isinstance(name, str) or not name:
            raise RttFileError(f"{where}.{key}: must be a name, got {name!r}")
    if source == target:
        raise RttFileError(f"{where}: from and to are both {source!r} (a node to itself is 0)")
    return RttLink(source, target, _milliseconds(entry["rttMs"], f"{where}.rttMs"), at_s)


def _milliseconds(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RttFileError(f"{where}: {value!r} is not a number of milliseconds")
    if not (math.isfinite(value) and value >= 0):
        raise RttFileError(f"{where}: {value!r} must be a finite number of milliseconds >= 0")
    return float(value)


def _list(value: object, where: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise RttFileError(f"{where}: expected a list, got {type(value).__name__}")
    return value
