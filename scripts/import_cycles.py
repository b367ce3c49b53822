"""Import cycles among a package's modules, and imports that run back up launcher's layers; exit 1 if any.

Run:  .venv/bin/python scripts/import_cycles.py [launcher] [--runtime]

Every module-level import counts, those under `if TYPE_CHECKING:` included (a reader follows them
too; --runtime leaves them out); imports inside functions run late and are skipped. Importing
`a.b.c` runs `a` and `a.b` first, so it counts as importing them as well (a module's own parent
packages excepted: they are being imported already).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path], runtime: bool, late: bool = False) -> set[str]:
    """The modules of `known` that `name` imports at module level (`late`: inside functions too)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    named: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if not (runtime and "TYPE_CHECKING" in ast.unparse(node.test)):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    named.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source)
            elif late and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.With)):
                visit(node.body)
            elif late:
                visit([child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)])

    visit(ast.parse(path.read_text()).body)
    deps = set()
    for full in named:
        parts = full.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in known and prefix != name and not name.startswith(prefix + "."):
                deps.add(prefix)
    return deps


# The groups of launcher/, top to bottom: a module may import its own group and the groups below it
# (docs/layout.md). `entry` is the package's faces (`launcher`, `python -m launcher`, `launcher.launch`);
# `vocabulary` is every other root module but `config`, which composes the subsystems' settings.
LAYERS = ("entry", "cli", "agent", "policy", "telemetry", "config", "rendezvous", "worker", "tcpstore", "vocabulary")
ENTRY = {"launcher", "launcher.__main__", "launcher.launch"}


def group_of(name: str) -> str:
    """The layer of module `name` (a dotted name under launcher)."""
    if name in ENTRY:
        return "entry"
    part = name.split(".")[1]
    if part in LAYERS:
        return part  # a subpackage, or a module in one
    return "config" if part == "config" else "vocabulary"


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports that run back up: from a module to one of a group above its own."""
    rank = {group: i for i, group in enumerate(LAYERS)}
    return sorted(
        (name, dep) for name, deps in graph.items() for dep in deps if rank[group_of(dep)] < rank[group_of(name)]
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            strong(v)
    return found


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    runtime = "--runtime" in argv
    known = modules(Path(args[0] if args else "launcher"))
    graph = {name: imports(name, path, known, runtime) for name, path in known.items()}
    found = cycles(graph)
    edges = sum(map(len, graph.values()))
    print(f"{len(known)} modules, {edges} module-level imports, {len(found)} import cycles")
    for component in found:
        print("  cycle:", " <-> ".join(component))
    everything = {name: imports(name, path, known, False, late=True) for name, path in known.items()}
    up = upward(everything) if all(name.startswith("launcher") for name in known) else []
    print(f"{len(up)} imports run back up the layers ({' > '.join(LAYERS)}), late ones included")
    for name, dep in up:
        print(f"  up: {name} ({group_of(name)}) imports {dep} ({group_of(dep)})")
    return 1 if found or up else 0


if __name__ == "__main__":
    sys.setrecursionlimit(10_000)
    sys.exit(main(sys.argv[1:]))
