"""No two modules of the package import each other, however indirectly: a circle makes a module's meaning depend on
which one is imported first, and hides which of the two is the lower one. Every import counts (at the top, in a
function, under TYPE_CHECKING), and so do the packages an import of a submodule runs first."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "components" / "triarch"


def modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (its file, whether it is a package's __init__)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def imports(name: str, path: Path, package: bool, known: dict[str, tuple[Path, bool]]) -> set[str]:
    """The package's modules `name` imports, with the packages above each that are not above `name` itself."""
    here = name if package else name.rpartition(".")[0]
    targets: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets += [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        while target:
            if target in known and target != name and not name.startswith(target + "."):
                found.add(target)
            target = target.rpartition(".")[0]
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that reach each other (Tarjan's strongly connected components, more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for after in sorted(edges[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_one_that_imports_it() -> None:
    known = modules()
    edges = {name: imports(name, path, package, known) for name, (path, package) in known.items()}
    assert "triarch.planners.model_plan" in edges["triarch.planners.coldstart"]
    assert circles(edges) == []


def test_a_circle_is_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
