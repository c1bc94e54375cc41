"""The suite mirrors the package (README, "Tests"): every test file lives in the directory
of what it tests, no test file imports another (shared code is ``tests/helpers.py``), and
the conftest hook gives every test exactly one of ``unit`` / ``integration``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
DIRS = {
    "app", "cli", "clients", "config", "datasets", "e2e", "losses", "models", "project",
    "protocol", "registry", "report", "run", "server", "strategies",
}  # fmt: skip


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "data" not in p.relative_to(TESTS).parts)


def test_every_test_file_is_in_a_directory_of_the_package():
    files = _test_files()
    assert len(files) > 50
    misplaced = [str(p.relative_to(TESTS)) for p in files if p.parent.name not in DIRS]
    assert misplaced == []
    names = [p.name for p in files]
    assert len(names) == len(set(names)), "test file names must be unique across directories"


def test_no_test_file_imports_another_test_file_or_the_conftest():
    bad = []
    for path in [*_test_files(), TESTS / "helpers.py"]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                last = name.rpartition(".")[2]
                if last.startswith("test_") or last == "conftest":
                    bad.append(f"{path.relative_to(TESTS)}:{node.lineno}: {name}")
    assert bad == []


def test_markers_are_set_by_place(request):
    """This test (tests/project/) is ``unit``; the hook marks by directory."""
    marks = {m.name for m in request.node.iter_markers()}
    assert "unit" in marks and "integration" not in marks and "slow" not in marks


@pytest.mark.flwr
def test_a_flwr_test_is_integration_and_slow_only_when_marked(request):
    """(Starts nothing: only the markers the hook adds to a ``flwr`` test are read.)"""
    marks = {m.name for m in request.node.iter_markers()}
    assert "integration" in marks and "unit" not in marks and "slow" not in marks


def test_the_default_run_leaves_out_the_slow_tier_only():
    import tomllib

    ini = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]
    assert ini["ini_options"]["addopts"] == ["-m", "not slow"]


class _Item:
    def __init__(self, path: Path, marks: set[str]):
        self.path, self.nodeid, self.marks = path, f"{path.name}::test_x", set(marks)

    def get_closest_marker(self, name):
        return name if name in self.marks else None

    def add_marker(self, mark):
        self.marks.add(mark.name)


def test_slow_is_refused_on_a_test_that_starts_no_flower(request):
    (hook,) = [
        p
        for p in request.config.pluginmanager.get_plugins()
        if getattr(p, "__file__", None) == str(TESTS / "conftest.py")
    ]
    flwr = _Item(TESTS / "e2e" / "test_x.py", {"flwr", "slow"})
    hook.pytest_collection_modifyitems(request.config, [flwr])
    assert flwr.marks == {"flwr", "slow", "integration"}
    plain = _Item(TESTS / "losses" / "test_x.py", {"slow"})
    with pytest.raises(pytest.UsageError, match="test_x.py::test_x: only a test that starts"):
        hook.pytest_collection_modifyitems(request.config, [plain])
