"""docs/architecture.md's import diagram is true to the code, and no room imports one above it.

The diagram's rooms: the top-level packages, the controllers one by one, and the extender as
four parts (its data model, plugins, sources, and the service that combines and serves them).
The arrows are read from the code's own imports (AST only, including imports inside
functions and under TYPE_CHECKING), so the test fails when the code gains an arrow the
diagram lacks, or loses one it shows.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = ("livedata", "training", "predictor", "extender", "controllers", "bench")
EXTENDER_MODEL = {"state", "cycle", "protocol", "limits", "pods", "rtt", "node_requests"}
# Lower rooms first: an arrow may only point to a room listed before its importer.
ORDER = (
    "livedata",
    "predictor",
    "training",
    "extender.model",
    "extender.sources",
    "extender.plugins",
    "extender.service",
    "controllers.probes",
    "controllers.energy_adapter",
    "controllers.node_power",
    "bench",
)


def room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "extender":
        if len(parts) > 1 and parts[1] in ("plugins", "sources"):
            return f"extender.{parts[1]}"
        if len(parts) > 1 and parts[1] == "rewards":  # the Reward plugin's learning source
            return "extender.sources"
        return (
            "extender.model"
            if len(parts) > 1 and parts[1] in EXTENDER_MODEL
            else "extender.service"
        )
    if parts[0] == "controllers" and len(parts) > 1:
        return f"controllers.{parts[1]}"
    return parts[0]


def code_arrows() -> set[tuple[str, str]]:
    arrows = set()
    for path in REPO.rglob("*.py"):
        rel = path.relative_to(REPO)
        if rel.parts[0] not in OURS:
            continue
        name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base]
            else:
                continue
            for target in targets:
                if target.split(".")[0] in OURS and room(name) != room(target):
                    arrows.add((room(name), room(target)))
    return arrows


def doc_arrows() -> set[tuple[str, str]]:
    text = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"```mermaid\n(.*?)```", text, re.DOTALL)
    assert block, "docs/architecture.md has no mermaid block"
    arrows = re.findall(r"^\s*(\w+) --> (\w+)\s*$", block.group(1), re.MULTILINE)
    ids = {room_name.replace(".", "_"): room_name for room_name in ORDER}
    unknown = {a for pair in arrows for a in pair} - set(ids)
    assert not unknown, f"diagram rooms the test does not know: {unknown}"
    return {(ids[a], ids[b]) for a, b in arrows}


def test_the_diagram_shows_exactly_the_imports_between_rooms() -> None:
    code, doc = code_arrows(), doc_arrows()
    assert code - doc == set(), "arrows in the code missing from docs/architecture.md"
    assert doc - code == set(), "arrows in docs/architecture.md the code no longer has"


@pytest.mark.parametrize(("importer", "imported"), sorted(code_arrows()))
def test_no_room_imports_one_above_it(importer: str, imported: str) -> None:
    assert importer in ORDER and imported in ORDER, (importer, imported)
    assert ORDER.index(imported) < ORDER.index(importer), f"{importer} reaches up to {imported}"
