"""The layer table of docs/architecture.md holds: every import of the simulator's modules, at module
level, inside functions or for annotations only, goes to a lower layer (or within a layer), and
the modules that run at import time form no circle.

The table is read from the document itself, so the document and the check cannot drift apart.
"""
from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEM = REPO / "system"
DOC = REPO / "docs" / "architecture.md"


def layer_table() -> list[tuple[int, list[str]]]:
    """(layer, module patterns) rows of the "Layers" table, in document order."""
    text = DOC.read_text()
    section = text[text.index("## Layers"):]
    section = section[:section.index("\n## ", 4)] if "\n## " in section[4:] else section
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            rows.append((int(cells[0]), re.findall(r"`([^`]+)`", cells[1])))
    assert rows, "docs/architecture.md has no layer table"
    return rows


def project_modules() -> dict[str, Path]:
    """Dotted name -> file of every module importable from system/ (and the generators' package,
    ``datagen``, importable from dataset/)."""
    modules = {}
    for root in (SYSTEM, REPO / "dataset"):
        for path in root.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            if root.name == "dataset" and len(parts) == 1:
                continue  # dataset/generate_*.py are scripts, not modules anything imports
            modules[".".join(parts).removesuffix(".__init__")] = path
    return modules


def imports_of(path: Path, known: dict[str, Path]) -> list[tuple[str, bool]]:
    """(imported project module, whether it runs at import or call time) for every import of the
    file; imports under ``if TYPE_CHECKING:`` never run."""

    def resolve(name: str) -> str | None:
        while name:
            if name in known:
                return name
            name = name.rpartition(".")[0]
        return None

    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, runs: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.body:
                    visit_stmt(sub, False)
                for sub in child.orelse:
                    visit_stmt(sub, runs)
                continue
            visit_stmt(child, runs)

    def visit_stmt(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = resolve(alias.name)
                if target:
                    found.append((target, runs))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                target = resolve(f"{node.module}.{alias.name}") or resolve(node.module)
                if target:
                    found.append((target, runs))
        visit(node, runs)

    visit(ast.parse(path.read_text()), True)
    return found


def layer_of(module: str, table: list[tuple[int, list[str]]]) -> int | None:
    for layer, patterns in table:
        if any(module == p or fnmatch.fnmatchcase(module, p) for p in patterns):
            return layer
    return None


def test_every_module_has_a_layer():
    table = layer_table()
    missing = sorted(m for m in project_modules() if layer_of(m, table) is None)
    assert not missing, f"modules without a row in docs/architecture.md's layer table: {missing}"


def test_no_import_goes_up_a_layer():
    table, known = layer_table(), project_modules()
    upward = []
    for module, path in sorted(known.items()):
        mine = layer_of(module, table)
        for target, _ in imports_of(path, known):
            theirs = layer_of(target, table)
            if target != module and theirs is not None and mine is not None and theirs > mine:
                upward.append(f"{module} (layer {mine}) imports {target} (layer {theirs})")
    assert not upward, "imports from a lower layer up:\n" + "\n".join(upward)


def test_no_import_circle():
    known = project_modules()
    graph = {m: sorted({t for t, runs in imports_of(p, known) if runs and t != m}) for m, p in known.items()}
    state: dict[str, int] = {}
    circles = []

    def walk(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            # a package imports its own submodules (its __init__ re-exports them): not a circle
            if node.startswith(nxt + ".") or nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                circles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else f"{node} -> {nxt}")
            elif nxt not in state:
                walk(nxt, trail + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("source, expected", [
    ("from flcore.servers.serverbase import Server\n", [("flcore.servers.serverbase", True)]),
    ("def f():\n    import flcore.flat\n", [("flcore.flat", True)]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flcore.flat import FlatModel\n",
     [("flcore.flat", False)]),
])
def test_the_check_reads_module_level_function_and_annotation_imports(tmp_path, source, expected):
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert imports_of(path, project_modules()) == expected


def test_an_upward_import_is_caught():
    table = layer_table()
    assert layer_of("flcore.protocol", table) < layer_of("flcore.servers.serverbase", table)
    assert layer_of("flcore.trainmodel.text", table) < layer_of("cli.flags", table)


def stale_patterns(table: list[tuple[int, list[str]]], modules: list[str]) -> list[str]:
    """The table's names that match no module (a module that was moved or removed)."""
    return [p for _, patterns in table for p in patterns
            if not any(m == p or fnmatch.fnmatchcase(m, p) for m in modules)]


def test_every_name_in_the_table_is_a_module():
    stale = stale_patterns(layer_table(), sorted(project_modules()))
    assert not stale, f"docs/architecture.md's layer table names modules that do not exist: {stale}"


def test_a_stale_name_in_the_table_is_caught():
    assert stale_patterns([(0, ["utils.errors", "utils.gone"]), (1, ["flcore.*"])], ["utils.errors", "flcore.flat"]) == ["utils.gone"]
