"""The package's structure: no import cycle among its modules (the network layer's sides
kept apart), and the protocol's documentation lists exactly the operations a server
serves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rlreplay.net.server.operations import OPERATIONS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rlreplay"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, name: str, package: bool, modules: set[str]) -> set[str]:
    """Modules of rlreplay a module imports: at module level, in a function, or for type
    checking only (an ``if TYPE_CHECKING:`` import ties the modules as much). ``from
    package import submodule`` names the submodule, not the package."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = name.split(".")[: len(name.split(".")) - child.level + package]
                    base = ".".join(parts + ([base] if base else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in modules else base)
            visit(child)

    visit(tree)
    return found


def _graph(under: str = "rlreplay") -> dict[str, set[str]]:
    modules = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph = {}
    for name, path in modules.items():
        if name == under or name.startswith(under + "."):
            tree = ast.parse(path.read_text())
            imported = _imports(tree, name, path.name == "__init__.py", set(modules))
            graph[name] = {m for m in imported if m in modules and m != name}
    return {n: {m for m in imported if m in graph} for n, imported in graph.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_package_modules_import_no_cycle():
    graph = _graph()
    assert "rlreplay.net.client.client" in graph and "rlreplay.core.table" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_wire_imports_neither_side():
    graph = _graph("rlreplay.net")
    for name, imported in graph.items():
        if name.startswith("rlreplay.net.wire"):
            assert not {m for m in imported if not m.startswith("rlreplay.net.wire")}, name
        if name.startswith("rlreplay.net.client"):
            assert not {m for m in imported if m.startswith("rlreplay.net.server")}, name
        if name.startswith("rlreplay.net.server"):
            assert not {m for m in imported if m.startswith("rlreplay.net.client")}, name


def test_protocol_doc_lists_exactly_the_served_operations():
    text = (ROOT / "docs" / "protocol.md").read_text()
    section = text[text.index("### Requests") :]
    section = section[: section.index("\n### ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {n for row in rows for n in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert documented == set(OPERATIONS)
