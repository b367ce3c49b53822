"""The shape of launcher/: no import cycle (scripts/import_cycles.py, TYPE_CHECKING imports
included) and no module over 600 lines, read from the source with `ast` (nothing is imported)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from support.paths import ROOT

MAX_LINES = 600


@pytest.fixture
def graph_tool(monkeypatch):
    """scripts/import_cycles.py as a module, run from the repository root (it names modules by path)."""
    monkeypatch.chdir(ROOT)
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "scripts" / "import_cycles.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_launcher_has_no_import_cycle(graph_tool):
    known = graph_tool.modules(Path("launcher"))
    graph = {name: graph_tool.imports(name, path, known, False) for name, path in known.items()}
    assert len(known) > 50 and graph_tool.cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle(graph_tool):
    assert graph_tool.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_over_600_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in (ROOT / "launcher").rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_import_runs_back_up_the_layers(graph_tool):
    # late imports (inside functions) count: a dependency that runs up is one, however late it runs
    known = graph_tool.modules(Path("launcher"))
    graph = {name: graph_tool.imports(name, path, known, False, late=True) for name, path in known.items()}
    assert graph_tool.upward(graph) == []


def test_an_import_that_runs_back_up_is_found(graph_tool, tmp_path, monkeypatch):
    # a telemetry module reaching into the agent, late, in a file: the check names it
    for folder in ("telemetry", "agent"):
        (tmp_path / "launcher" / folder).mkdir(parents=True)
        (tmp_path / "launcher" / folder / "__init__.py").write_text("")
    (tmp_path / "launcher" / "__init__.py").write_text("")
    (tmp_path / "launcher" / "agent" / "env.py").write_text("")
    (tmp_path / "launcher" / "telemetry" / "board.py").write_text("def f():\n    from ..agent import env\n")
    monkeypatch.chdir(tmp_path)
    known = graph_tool.modules(Path("launcher"))
    graph = {name: graph_tool.imports(name, path, known, False, late=True) for name, path in known.items()}
    assert ("launcher.telemetry.board", "launcher.agent.env") in graph_tool.upward(graph)
    assert graph_tool.upward({"launcher.agent.env": {"launcher.telemetry.board", "launcher.spec"}}) == []


def test_the_top_level_shows_the_groups():
    # at most 12 root modules besides the package's faces; every subpackage says what it is and may import
    root = ROOT / "launcher"
    modules = {p.name for p in root.glob("*.py")} - {"__init__.py", "__main__.py", "launch.py"}
    assert len(modules) <= 12, sorted(modules)
    for package in (p for p in root.iterdir() if (p / "__init__.py").is_file()):
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        assert doc, f"{package.name}/__init__.py has no docstring"
        top = package.name in {"cli", "agent", "policy", "telemetry", "worker"}
        assert not top or "import" in doc, f"{package.name}/__init__.py does not say what it may import"
