"""The layer contract (README, "Architecture"; ``[tool.importlinter]`` in pyproject.toml):
the import graph of ``fedrcl_flwr``, ``clients`` and ``strategies`` — imports inside
functions and under ``TYPE_CHECKING`` included — has no cycle, no import points up a layer,
and ``lint-imports`` (run by ``.ci/run``) fails on a copy of the tree with an inverted
import or a Flower import in a loss."""

from __future__ import annotations

import ast
import functools
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fedrcl_flwr", "clients", "strategies")


@functools.cache
def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: modules of the project it imports}``, read from the source with ``ast``
    (every ``import`` statement, wherever it is)."""
    files = {}
    for pkg in PACKAGES:
        for p in (root / pkg).rglob("*.py"):
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = p

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    up = base[: len(base) - node.level + 1]
                    src = ".".join(up + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                targets = [src] + [f"{src}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                r = resolve(t)
                if r is not None and r != mod:
                    graph[mod].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layers(root: Path) -> list[list[str]]:
    """The layers contract of ``root/pyproject.toml``, top first, each a list of modules."""
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in conf["contracts"] if c["type"] == "layers"]
    return [[m.strip() for m in layer.replace("|", ":").split(":")] for layer in contract["layers"]]


def layer_index(order: list[list[str]], mod: str) -> int | None:
    """The layer (index, top first) of ``mod``: that of its longest listed prefix."""
    best, best_len = None, -1
    for i, layer in enumerate(order):
        for name in layer:
            if (mod == name or mod.startswith(name + ".")) and len(name) > best_len:
                best, best_len = i, len(name)
    return best


def upward_imports(root: Path) -> list[str]:
    """Imports from a module to one in a higher layer (the layer of a module is that of
    its longest listed prefix; a module of no layer is not counted)."""
    order = layers(root)

    def layer_of(mod: str) -> int | None:
        return layer_index(order, mod)

    bad = []
    for mod, deps in import_graph(root).items():  # (cached: copies are fresh paths)
        lm = layer_of(mod)
        for dep in deps:
            ld = layer_of(dep)
            if lm is not None and ld is not None and ld < lm:  # index 0 is the top
                bad.append(f"{mod} -> {dep}")
    return sorted(bad)


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the tree at ``root`` (its pyproject.toml's contracts)."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.argv[0] = 'lint-imports'; lint_imports_command()",
            "--no-cache",
        ],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_tree(tmp: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(
            ROOT / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n\n" + text)


# ------------------------------------------------------------------------------ the tree


def test_the_import_graph_has_no_cycle():
    graph = import_graph(ROOT)
    assert len(graph) > 100
    assert "fedrcl_flwr.launch.processes" in graph["fedrcl_flwr.runner"]  # the walk sees imports
    assert cycles(graph) == []


def test_no_import_points_up_a_layer():
    assert upward_imports(ROOT) == []


def test_every_module_has_a_layer():
    listed = [name for layer in layers(ROOT) for name in layer]
    packages = {m for m in import_graph(ROOT) if (ROOT / m.replace(".", "/")).is_dir()}
    orphans = [
        m
        for m in import_graph(ROOT)
        if m not in packages and not any(m == n or m.startswith(n + ".") for n in listed)
    ]
    assert orphans == [], f"add these modules to a layer in pyproject.toml: {orphans}"


def test_lint_imports_keeps_both_contracts_on_the_tree():
    res = lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 2 kept, 0 broken." in res.stdout


# --------------------------------------------------------------- a broken copy is caught


def test_an_inverted_import_inside_a_function_breaks_the_layers(tmp_path):
    root = copy_tree(tmp_path)
    append(
        root / "fedrcl_flwr/errors.py",
        "def _cli():\n    from fedrcl_flwr import cli\n\n    return cli\n",
    )
    res = lint_imports(root)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Layers point one way BROKEN" in res.stdout
    assert "fedrcl_flwr.errors is not allowed to import fedrcl_flwr.cli" in res.stdout
    assert "Flower only in fedrcl_flwr.app, clients, strategies KEPT" in res.stdout
    assert upward_imports(root) == ["fedrcl_flwr.errors -> fedrcl_flwr.cli"]


def test_a_flower_import_in_a_loss_breaks_the_flower_contract(tmp_path):
    root = copy_tree(tmp_path)
    append(
        root / "fedrcl_flwr/losses/rcl.py", "def _flower():\n    import flwr\n\n    return flwr\n"
    )
    res = lint_imports(root)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Flower only in fedrcl_flwr.app, clients, strategies BROKEN" in res.stdout
    assert "fedrcl_flwr.losses is not allowed to import flwr" in res.stdout
    assert "fedrcl_flwr.losses.rcl -> flwr" in res.stdout
    assert "Layers point one way KEPT" in res.stdout


def test_a_cycle_between_siblings_of_one_layer_is_caught(tmp_path):
    """``run.results`` and ``run.run_files`` share a layer (``:``, allowed to import each
    other), so the layers contract keeps a cycle between them; the graph test does not."""
    root = copy_tree(tmp_path)
    append(
        root / "fedrcl_flwr/run/run_files.py",
        "def _results():\n    from fedrcl_flwr.run import results\n\n    return results\n",
    )
    assert upward_imports(root) == []
    # one component: results imports run_files directly and through plots
    assert cycles(import_graph(root)) == [
        ["fedrcl_flwr.run.plots", "fedrcl_flwr.run.results", "fedrcl_flwr.run.run_files"]
    ]


# ------------------------------------------------------------------ the folders are layers


def folder_of(root: Path, mod: str) -> str:
    """The unit a module belongs to at the folder level: its package (a folder under
    ``fedrcl_flwr``, or ``clients``/``strategies``), or the module itself where it lies
    directly in ``fedrcl_flwr`` (``cli``, ``runner``, ``errors``, ...: each its own unit)."""
    if (root / mod.replace(".", "/")).is_dir():
        return mod
    parent = mod.rpartition(".")[0]
    return mod if parent in ("", "fedrcl_flwr") else parent


def folder_graph(root: Path) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod, deps in import_graph(root).items():
        unit = folder_of(root, mod)
        graph.setdefault(unit, set())
        for dep in deps:
            other = folder_of(root, dep)
            graph.setdefault(other, set())
            if other != unit:
                graph[unit].add(other)
    return graph


def folder_layers(root: Path) -> dict[str, set[int]]:
    """``{folder: the layers (index, top first) its modules sit in}``."""
    order = layers(root)

    def layer_of(mod: str) -> int | None:
        return layer_index(order, mod)

    out: dict[str, set[int]] = {}
    for mod in import_graph(root):
        if not (root / mod.replace(".", "/")).is_dir():  # a package's __init__ aside
            out.setdefault(folder_of(root, mod), set()).add(layer_of(mod))  # type: ignore[arg-type]
    return out


def test_every_folder_is_one_layer():
    """A folder holds the modules of one layer, so with no module importing up a layer
    no folder imports up either (the folders show the architecture the contract writes)."""
    mixed = {f: sorted(ls) for f, ls in folder_layers(ROOT).items() if len(ls) > 1}
    assert mixed == {}, f"folders holding modules of several layers: {mixed}"


def test_the_folder_graph_has_no_cycle():
    graph = folder_graph(ROOT)
    assert "fedrcl_flwr.app.wire" in graph["clients"]  # the walk sees folders
    assert cycles(graph) == []


def test_a_folder_of_two_layers_is_caught(tmp_path):
    """A module of the launching layer put back among the run records is named."""
    root = copy_tree(tmp_path)
    shutil.move(root / "fedrcl_flwr/launch/plan.py", root / "fedrcl_flwr/run/plan.py")
    conf = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(
        conf.replace(
            '"fedrcl_flwr.runner : fedrcl_flwr.launch"',
            '"fedrcl_flwr.runner : fedrcl_flwr.launch : fedrcl_flwr.run.plan"',
        )
    )
    mixed = {f: ls for f, ls in folder_layers(root).items() if len(ls) > 1}
    assert list(mixed) == ["fedrcl_flwr.run"]
    assert cycles(folder_graph(root)) != []  # launch -> run.plan, run.plan -> launch
