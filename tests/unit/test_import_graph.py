"""The shape of launcher/: no import cycle (scripts/import_cycles.py, TYPE_CHECKING imports
included) and no module over 600 lines, read from the source with `ast` (nothing is imported)."""

from __future__ import annotations

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
