"""Input limits of the request path: body size, candidate node count, JSON nesting depth.

Every request is parsed and scored on the event loop, so what one request may cost has to be
bounded before the work starts, and a request over a limit gets an answer that says which limit
and by how much instead of a slow or crashing one:

- **body size** (413): read with a cap, never buffered whole first (``app.read_body_capped``);
- **JSON depth** (400): checked on the raw bytes *before* parsing. orjson builds Python objects
  recursively, and a body of a million ``[`` (2 MB, well under the size cap) crashes the whole
  process with a segmentation fault; an answer echoing Node objects cannot be written deeper than
  254 levels either. The scan is linear, iterative, in C-level byte and numpy operations: escapes
  are removed, brackets inside strings masked by quote parity (a ``[`` inside a name is not
  nesting), and the rest counted with a running sum;
- **node count** (400): the candidates of one request, checked right after parsing.

Defaults are sized for a 5000-node cluster (the Kubernetes scalability limit): see
``DEFAULT_*`` below. ``ExtenderConfig`` exposes each as a flag.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A bare Node object as kube-scheduler sends it (nodeCacheCapable: false) is ~2 KiB, one with a
# long status.images list 10-20 KiB: 64 MiB holds 5000 nodes of up to ~13 KiB each. With
# nodeCacheCapable: true (our manifests) 5000 names are ~100 KiB.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# Twice the 5000 nodes Kubernetes supports in one cluster.
DEFAULT_MAX_NODES = 10_000
# Real requests nest 12 levels (v1.28 samples); a Pod with affinity terms and managedFields
# reaches ~20. orjson cannot write an answer deeper than 254 levels.
DEFAULT_MAX_JSON_DEPTH = 64

HTTP_BAD_REQUEST = 400
HTTP_PAYLOAD_TOO_LARGE = 413

# Every byte but the structural ones that matter for depth: quotes and brackets.
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'"[]{}')
# +1 for an opening bracket, -1 for a closing one, 0 for everything else.
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[list(b"[{")] = 1
_BRACKET_STEP[list(b"]}")] = -1
_QUOTE = ord('"')


class LimitError(ValueError):
    """A request over one of the input limits; ``status_code`` is the HTTP answer (400/413)."""

    def __init__(self, message: str, *, status_code: int = HTTP_BAD_REQUEST, kind: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.kind = kind


@dataclass(frozen=True)
class InputLimits:
    """The limits one app enforces; each must be positive."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_nodes: int = DEFAULT_MAX_NODES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH


def body_too_large(limit_bytes: int, size_bytes: int | None = None) -> LimitError:
    """The 413 for a body over ``limit_bytes`` (size when declared up front, else unknown)."""
    size = f"of {size_bytes} bytes " if size_bytes is not None else ""
    return LimitError(
        f"request body {size}exceeds the limit of {limit_bytes} bytes (--max-body-bytes)",
        status_code=HTTP_PAYLOAD_TOO_LARGE,
        kind="body_too_large",
    )


def json_depth(body: bytes) -> int:
    """Deepest nesting of arrays and objects in a JSON text; strings do not count.

    Exact for valid JSON; for invalid JSON a number the parser will not get to use anyway.
    Linear in the body size and free of recursion.
    """
    # Escapes out first, escaped backslashes before escaped quotes: in `\\"` the quote ends
    # the string, in `\"` it does not. (Two C-level replaces; a regex is three times slower.)
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = np.frombuffer(body.translate(None, _NOT_STRUCTURAL), dtype=np.uint8)
    if not marks.size:
        return 0
    # A bracket is inside a string when an odd number of quotes precede it.
    inside_strings = np.bitwise_xor.accumulate((marks == _QUOTE).view(np.uint8))
    steps = _BRACKET_STEP[marks] * (1 - inside_strings).view(np.int8)
    # int32: the depth is at most the body length, capped far below 2**31 by --max-body-bytes.
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def check_json_depth(body: bytes, max_depth: int) -> None:
    """LimitError (400) when ``body`` nests arrays/objects deeper than ``max_depth``."""
    # Cheap bound first: nesting cannot be deeper than the number of openers.
    if body.count(b"[") + body.count(b"{") <= max_depth:
        return
    depth = json_depth(body)
    if depth > max_depth:
        raise LimitError(
            f"request JSON nests {depth} levels deep; the limit is {max_depth} (--max-json-depth)",
            kind="too_deep",
        )


def check_node_count(count: int, max_nodes: int) -> None:
    """LimitError (400) when a request names more than ``max_nodes`` candidates."""
    if count > max_nodes:
        raise LimitError(
            f"request has {count} candidate nodes; the limit is {max_nodes} (--max-nodes)",
            kind="too_many_nodes",
        )
