"""CONTRIBUTING's one command: every client method, server optimizer and dataset has each
piece its recipe asks for.

``python -m pytest -q tests/project/test_completeness.py`` reads the source tree (no import
of the components, no run: the check works on a copy as well as on the repository) and
lists, per component, each missing piece by the recipe's own words:

* a client method (``method = "..."`` in ``clients/*.py``): its line in ``CLIENTS``; the
  loss functions it imports from ``fedrcl_flwr/losses/`` defined there, listed in the
  module's ``__all__``, with a docstring citing a paper equation or the authors' code, and
  each named by a test in ``tests/clients/`` or ``tests/losses/`` (the closed form or
  reference values); its entry in ``E2E`` of ``tests/clients/test_baselines.py``; its name in
  the overview table of ``docs/configuration.md``; its name in the loop of
  ``experiments/baselines/synthetic_all.yaml``;
* a server optimizer (``name = "..."`` in ``strategies/*.py``): its line in ``STRATEGIES``;
  a test in ``tests/strategies/test_server_optimizers.py`` naming it (hand-computed rounds);
  an entry in a ``strategy`` parametrisation of ``tests/app/test_inprocess_runs.py`` (the
  in-process run); its name in the overview table of ``docs/configuration.md``;
* a dataset (``DATASETS`` in ``fedrcl_flwr/config/catalog.py``): its entry in ``SOURCES``
  (the data layer); a test in ``tests/datasets/`` naming it; its rows in the layout and
  augmentation tables of ``docs/datasets.md``; its name in the ``dataset.name`` comment of
  ``docs/configuration.md``;
* a model (``MODELS``): a test in ``tests/models/`` naming it; its name in the
  ``model.name`` comment of ``docs/configuration.md``;
* a partition scheme (``PARTITION_SCHEMES`` of the catalog): a test in ``tests/datasets/``
  naming it; its name in the partitions text of ``docs/datasets.md``.

``tests/registry/test_registries.py`` imports the registries (every class builds, every
model meets its interface, every scheme partitions) and ``tests/project/test_docs.py`` checks
the parameter rows; this check adds the pieces only the recipes name.
``test_check_names_each_removed_piece`` removes each piece from a copy and sees the check
name it. What an existing component lacks for a stated reason is in ``ALLOWED``.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The start of a gap line -> why that component has no such piece. Nothing else is skipped.
ALLOWED: dict[str, str] = {
    # Objectives that are the cross-entropy alone or a term the base client owns.
    "method fedavg: loss:": "cross-entropy only (cross_entropy_term, fedrcl_flwr/training)",
    "method freeze: loss:": "cross-entropy only; it changes trainable_parameters",
    "method fedprox: loss:": "the base client's distance_to_received_term (FedACG's client "
    "term too), tested in tests/clients/test_baselines.py",
    # Run in process by other tests than the E2E table (their own assertions).
    "method fedavg: e2e:": "tests/app/test_inprocess_runs.py runs it with every optimizer",
    "method fedrcl: e2e:": "tests/app/test_inprocess_runs.py runs it with every optimizer",
    "method fedccl: e2e:": "tests/app/test_weight_transport.py runs it in process",
    # Not a loss: a helper of FedCCL's attack that reads the dataset's normalisation.
    "method fedccl: docstring: dataset_pixel_stats's": "no equation: it reads (mean, std)",
    # Tested with the authors' split it was added for, not in tests/models/.
    "model resnet10_bn: test:": "tests/datasets/test_authors_rethinkfl.py builds and checks it",
}

#: A docstring that cites: a paper's equation / algorithm, or the authors' code.
CITATION = re.compile(
    r"\bEqs?\.|\bequation|\bAlg(orithm)?\.?\s*\d|authors'|\bofficial\b"
    r"|et al\.,?[^)]*\b(19|20)\d\d\b|\b(19|20)\d\d\b[^)]*et al\.",
    re.I,
)


# ------------------------------------------------------------------------------ reading
def _tree(path: Path) -> ast.Module:
    return _parse(path.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1024)
def _parse(source: str) -> ast.Module:
    """Parsed once per distinct text (the copies share most files); never modified."""
    return ast.parse(source)


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    """The value assigned to the module-level ``name`` (plain or annotated)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == name and node.value is not None:
                return node.value
    return None


def _dict_keys(value: ast.expr | None) -> list[str]:
    """String keys of a dict literal, also inside a call such as ``Registry("x", {...})``."""
    if value is None:
        return []
    for node in ast.walk(value):
        if isinstance(node, ast.Dict):
            return [k.value for k in node.keys if isinstance(k, ast.Constant)]
    return []


def _class_attr(path: Path, attr: str) -> list[str]:
    """The string values of class attribute ``attr`` of the classes defined in ``path``."""
    out = []
    for node in _tree(path).body:
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets)
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                ):
                    out.append(stmt.value.value)
    return out


def _test_functions(where: Path) -> list[ast.FunctionDef]:
    """Every ``test_*`` function (with its decorators) of the test file ``where`` or of the
    test files under the folder ``where``."""
    paths = [where] if where.is_file() else sorted(where.rglob("test_*.py"))
    out = []
    for path in paths:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                out.append(node)
    return out


def _names_in(fn: ast.FunctionDef) -> set[str]:
    """Identifiers and string constants a test function (decorators included) mentions."""
    found: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


def _mentions(*places: Path) -> list[set[str]]:
    """What each test function of ``places`` mentions (read once per check)."""
    return [_names_in(fn) for place in places if place.exists() for fn in _test_functions(place)]


def _section(text: str, heading: str) -> str:
    """The text of a Markdown section from ``heading`` to the next heading of any level."""
    start = text.find(heading)
    if start < 0:
        return ""
    rest = text[start + len(heading) :]
    end = re.search(r"^#", rest, re.M)
    return rest[: end.start()] if end else rest


def _ticked(text: str) -> set[str]:
    return set(re.findall(r"`([a-z0-9_]+)`", text))


def _table_after(text: str, header: str) -> str:
    """The rows of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header):
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(row.split("|")[1])  # the first column names the component
            return "\n".join(rows)
    return ""


# ------------------------------------------------------------------------------ the check
def _method_gaps(root: Path) -> list[tuple[str, str, str, str]]:
    registry = set(_dict_keys(_assigned(_tree(root / "clients/__init__.py"), "CLIENTS")))
    e2e = set(_dict_keys(_assigned(_tree(root / "tests/clients/test_baselines.py"), "E2E")))
    overview = _ticked(_section(_read(root / "docs/configuration.md"), "## Methods and server"))
    loop_text = _read(root / "experiments/baselines/synthetic_all.yaml")
    loop = re.search(r"^#\s*for m in (.*?); do", loop_text, re.M | re.S)
    looped = set(re.findall(r"[a-z0-9_]+", loop.group(1))) if loop else set()
    loss_tests = _mentions(root / "tests/clients", root / "tests/losses")
    gaps = []
    for path in sorted((root / "clients").glob("*.py")):
        if path.name in ("__init__.py", "base.py", "faulty.py"):
            continue  # the base class; faulty is a test double (tests/conftest.py)
        for name in _class_attr(path, "method"):

            def gap(piece: str, what: str, name: str = name) -> None:
                gaps.append(("method", name, piece, what))

            if name not in registry:
                gap("registry", f"no line in CLIENTS (clients/__init__.py) for {path.name}")
            losses = _imported_losses(root, path)
            if not losses:
                gap("loss", f"{path.name} imports no loss function from fedrcl_flwr/losses/")
            for module, fn in losses:
                rel = module.relative_to(root)
                tree = _tree(module)
                defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
                other = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
                if fn not in defs and fn not in other and _assigned(tree, fn) is None:
                    gap("loss", f"loss function {fn} is not defined in {rel}")
                    continue
                if fn not in _all_names(tree):
                    gap("__all__", f"{fn} is not listed in __all__ of {rel}")
                if fn in defs:
                    doc = ast.get_docstring(defs[fn]) or ""
                    if not CITATION.search(doc):
                        gap("docstring", f"{fn}'s docstring cites no equation or authors' code")
                    if not any(fn in names for names in loss_tests):
                        gap(
                            "closed-form test",
                            f"no test in tests/clients or tests/losses names {fn}",
                        )
            if name not in e2e:
                gap("e2e", "no entry in E2E of tests/clients/test_baselines.py")
            if name not in overview:
                gap("docs", "not in the overview table of docs/configuration.md")
            if name not in looped:
                gap("experiment", "not in the loop of experiments/baselines/synthetic_all.yaml")
    return gaps


def _imported_losses(root: Path, client: Path) -> list[tuple[Path, str]]:
    """(loss module, function name) for each function the client imports from losses/."""
    out = []
    for node in ast.walk(_tree(client)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "fedrcl_flwr.losses."
        ):
            module = root / (node.module.replace(".", "/") + ".py")  # type: ignore[union-attr]
            out += [(module, a.name) for a in node.names if not a.name.isupper()]
        elif isinstance(node, ast.ImportFrom) and node.module == "fedrcl_flwr.losses":
            for alias in node.names:  # ``from fedrcl_flwr.losses import univarfl as U``
                module = root / "fedrcl_flwr/losses" / f"{alias.name}.py"
                used = {
                    a.attr
                    for a in ast.walk(_tree(client))
                    if isinstance(a, ast.Attribute)
                    and isinstance(a.value, ast.Name)
                    and a.value.id == (alias.asname or alias.name)
                }
                out += [(module, fn) for fn in sorted(used) if not fn.isupper()]
    return out


def _all_names(tree: ast.Module) -> set[str]:
    value = _assigned(tree, "__all__")
    if not isinstance(value, ast.List | ast.Tuple):
        return set()
    return {e.value for e in value.elts if isinstance(e, ast.Constant)}


def _strategy_gaps(root: Path) -> list[tuple[str, str, str, str]]:
    registry = set(_dict_keys(_assigned(_tree(root / "strategies/__init__.py"), "STRATEGIES")))
    overview = _ticked(_section(_read(root / "docs/configuration.md"), "## Methods and server"))
    inprocess = _parametrised(root / "tests/app/test_inprocess_runs.py", "strategy")
    optimizer_tests = _mentions(root / "tests/strategies/test_server_optimizers.py")
    gaps = []
    for path in sorted((root / "strategies").glob("*.py")):
        if path.name in ("__init__.py", "base.py", "privacy.py"):
            continue  # the base class; privacy.py holds the DP wrappers, not an optimizer
        for name in _class_attr(path, "name"):
            classes = {n.name for n in _tree(path).body if isinstance(n, ast.ClassDef)}

            def gap(piece: str, what: str, name: str = name) -> None:
                gaps.append(("strategy", name, piece, what))

            if name not in registry:
                gap("registry", f"no line in STRATEGIES (strategies/__init__.py) for {path.name}")
            if not any(({name} | classes) & names for names in optimizer_tests):
                gap("closed-form test", "no test in tests/strategies/test_server_optimizers.py")
            if name not in inprocess:
                gap("e2e", "no strategy entry in tests/app/test_inprocess_runs.py")
            if name not in overview:
                gap("docs", "not in the overview table of docs/configuration.md")
    return gaps


def _parametrised(path: Path, argname: str) -> set[str]:
    """The string values of every ``@pytest.mark.parametrize(argname, [...])`` in ``path``."""
    out: set[str] = set()
    if not path.exists():
        return out
    for node in ast.walk(_tree(path)):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "parametrize"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == argname
            and len(node.args) > 1
        ):
            out |= {
                e.value
                for e in ast.walk(node.args[1])
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
    return out


def _sources_file(root: Path) -> Path | None:
    """The data-layer module that assigns ``SOURCES`` (wherever the data layer keeps it)."""
    for path in sorted((root / "fedrcl_flwr/data").rglob("*.py")):
        if re.search(r"^SOURCES\b", _read(path), re.M):
            return path
    return None


def _dataset_gaps(root: Path) -> list[tuple[str, str, str, str]]:
    names = _dict_keys(_assigned(_tree(root / "fedrcl_flwr/config/catalog.py"), "DATASETS"))
    src = _sources_file(root)
    sources = set(_dict_keys(_assigned(_tree(src), "SOURCES"))) if src else set()
    docs = _read(root / "docs/datasets.md")
    layout = _ticked(_table_after(docs, "| `dataset.name` | source |"))
    augment = _ticked(_table_after(docs, "| `dataset.name` | random crop"))
    comment = re.search(
        r"^dataset:\n\s+name: \S+\s*#(.*)$", _read(root / "docs/configuration.md"), re.M
    )
    commented = set(re.findall(r"[a-z0-9_]+", comment.group(1))) if comment else set()
    dataset_tests = _mentions(root / "tests/datasets")
    gaps = []
    for name in names:

        def gap(piece: str, what: str, name: str = name) -> None:
            gaps.append(("dataset", name, piece, what))

        if name not in sources:
            gap("registry", "no entry in SOURCES of the data layer (fedrcl_flwr/data/)")
        if not any(name in names for names in dataset_tests):
            gap("test", "no test in tests/datasets/ names it")
        if name not in layout:
            gap("docs", "no row in the layout table of docs/datasets.md")
        if name not in augment:
            gap("docs", "no row in the augmentation table of docs/datasets.md")
        if name not in commented:
            gap("docs", "not in the dataset.name comment of docs/configuration.md")
    return gaps


def _model_gaps(root: Path) -> list[tuple[str, str, str, str]]:
    names = _dict_keys(_assigned(_tree(root / "fedrcl_flwr/models/__init__.py"), "MODELS"))
    model_tests = _mentions(root / "tests/models")
    lines = _read(root / "docs/configuration.md").splitlines()
    start = next((i for i, ln in enumerate(lines) if ln == "model:"), len(lines))
    comment = []  # the ``model.name`` line and the comment lines that continue it
    for ln in lines[start + 1 : start + 2]:
        comment.append(ln.partition("#")[2])
    for ln in lines[start + 2 :]:
        if not ln.lstrip().startswith("#"):
            break
        comment.append(ln)
    commented = set(re.findall(r"[a-z0-9_]+", " ".join(comment)))
    gaps = []
    for name in names:
        if not any(name in found for found in model_tests):
            gaps.append(("model", name, "test", "no test in tests/models/ names it"))
        if name not in commented:
            gaps.append(
                ("model", name, "docs", "not in the model.name comment of docs/configuration.md")
            )
    return gaps


def _scheme_gaps(root: Path) -> list[tuple[str, str, str, str]]:
    catalog = _tree(root / "fedrcl_flwr/config/catalog.py")
    names = _dict_keys(_assigned(catalog, "PARTITION_SCHEMES"))
    scheme_tests = _mentions(root / "tests/datasets")
    docs = _read(root / "docs/datasets.md")
    start = docs.find("\nPartitions (")
    paragraph = _ticked(docs[start : docs.find("\n## ", start)] if start >= 0 else "")
    gaps = []
    for name in names:
        if not any(name in found for found in scheme_tests):
            gaps.append(("scheme", name, "test", "no test in tests/datasets/ names it"))
        if name not in paragraph:
            gaps.append(("scheme", name, "docs", "not in the partitions text of docs/datasets.md"))
    return gaps


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


def gaps(root: Path) -> list[str]:
    """One line per missing piece: ``kind name: piece: what``."""
    found = _method_gaps(root) + _strategy_gaps(root) + _dataset_gaps(root)
    found += _model_gaps(root) + _scheme_gaps(root)
    return [f"{kind} {name}: {piece}: {what}" for kind, name, piece, what in found]


def incomplete(root: Path) -> list[str]:
    """The gaps that ``ALLOWED`` does not excuse."""
    return [g for g in gaps(root) if not any(g.startswith(a) for a in ALLOWED)]


# ------------------------------------------------------------------------------ the tests
def test_every_component_has_each_piece_of_its_recipe():
    assert incomplete(ROOT) == []


def test_every_allowance_is_still_needed():
    """An entry of ``ALLOWED`` that no longer excuses a gap is removed, not kept."""
    found = gaps(ROOT)
    assert [a for a in ALLOWED if not any(g.startswith(a) for g in found)] == []


#: What the copy needs: the files the check reads.
COPIED = (
    "clients",
    "strategies",
    "fedrcl_flwr/losses",
    "fedrcl_flwr/config/catalog.py",
    "fedrcl_flwr/data",
    "tests/clients",
    "tests/losses",
    "tests/strategies",
    "tests/datasets",
    "tests/app/test_inprocess_runs.py",
    "tests/models",
    "fedrcl_flwr/models/__init__.py",
    "docs/configuration.md",
    "docs/datasets.md",
    "experiments/baselines/synthetic_all.yaml",
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    for rel in COPIED:
        src, dst = ROOT / rel, root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pt"))
        else:
            shutil.copy2(src, dst)
    assert incomplete(root) == [], "the copy must start complete"
    return root


def _edit(path: Path, old: str, new: str = "", count: int = 1) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count), encoding="utf-8")


def _drop_tests_naming(folder: Path, name: str) -> None:
    """Delete every test function under ``folder`` that names ``name`` (its whole source)."""
    for path in folder.rglob("test_*.py"):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        doomed = []
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and name in _names_in(node):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                doomed.append((first - 1, node.end_lineno))
        for start, end in sorted(doomed, reverse=True):
            del lines[start:end]
        path.write_text("".join(lines), encoding="utf-8")


# (kind name, piece removed, how) — each piece of each recipe, removed from a copy in turn.
REMOVALS = {
    "method feddecorr: registry": lambda r: _edit(
        r / "clients/__init__.py", '"feddecorr": "clients.feddecorr:FedDecorrClient",'
    ),
    "method feddecorr: __all__": lambda r: _edit(
        r / "fedrcl_flwr/losses/baselines.py", '    "feddecorr_loss",\n'
    ),
    "method feddecorr: loss": lambda r: _edit(
        r / "fedrcl_flwr/losses/baselines.py", "def feddecorr_loss(", "def _renamed_loss("
    ),
    "method feddecorr: docstring": lambda r: _cut_docstring(
        r / "fedrcl_flwr/losses/baselines.py", "feddecorr_loss"
    ),
    "method feddecorr: closed-form test": lambda r: (
        _drop_tests_naming(r / "tests/clients", "feddecorr_loss"),
        _drop_tests_naming(r / "tests/losses", "feddecorr_loss"),
    ),
    "method feddecorr: e2e": lambda r: _edit(
        r / "tests/clients/test_baselines.py", '    "feddecorr": (["ce", "decorr"], {}),\n'
    ),
    "method feddecorr: docs": lambda r: _edit(r / "docs/configuration.md", "`feddecorr`, "),
    "method feddecorr: experiment": lambda r: _edit(
        r / "experiments/baselines/synthetic_all.yaml", " feddecorr ", " "
    ),
    "strategy fedavgm: registry": lambda r: _edit(
        r / "strategies/__init__.py", '"fedavgm": "strategies.fedavgm:FedAvgM",'
    ),
    "strategy fedavgm: closed-form test": lambda r: (
        _drop_tests_naming(r / "tests/strategies", "fedavgm"),
        _drop_tests_naming(r / "tests/strategies", "FedAvgM"),
    ),
    "strategy fedavgm: e2e": lambda r: _edit(
        r / "tests/app/test_inprocess_runs.py", '"fedavgm", ', "", count=-1
    ),
    "strategy fedavgm: docs": lambda r: _edit(r / "docs/configuration.md", "`fedavgm`, "),
    "dataset tinyimagenet: registry": lambda r: _drop_dict_entry(
        _sources_file(r), "SOURCES", "tinyimagenet"
    ),
    "dataset tinyimagenet: test": lambda r: _drop_tests_naming(
        r / "tests/datasets", "tinyimagenet"
    ),
    "dataset tinyimagenet: docs": lambda r: _edit(
        r / "docs/datasets.md", "| `tinyimagenet` | 8 | yes |\n"
    ),
    "model vgg9_gn: test": lambda r: _drop_tests_naming(r / "tests/models", "vgg9_gn"),
    "model vgg9_gn: docs": lambda r: _edit(r / "docs/configuration.md", "vgg9_gn | "),
    "scheme shards: test": lambda r: _drop_tests_naming(r / "tests/datasets", "shards"),
    "scheme shards: docs": lambda r: _edit(r / "docs/datasets.md", "`shards`", "", count=-1),
}


def _cut_docstring(path: Path, fn: str) -> None:
    tree = _tree(path)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
    doc = node.body[0]
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[doc.lineno - 1 : doc.end_lineno] = ['    """A loss."""\n']
    path.write_text("".join(lines), encoding="utf-8")


def _drop_dict_entry(path: Path | None, table: str, key: str) -> None:
    assert path is not None
    value = _assigned(_tree(path), table)
    assert isinstance(value, ast.Dict)
    i = [k.value for k in value.keys if isinstance(k, ast.Constant)].index(key)
    start, end = value.keys[i].lineno, value.values[i].end_lineno
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    del lines[start - 1 : end]
    path.write_text("".join(lines), encoding="utf-8")


@pytest.mark.parametrize("removed", sorted(REMOVALS))
def test_check_names_each_removed_piece(pristine, tmp_path, removed):
    root = tmp_path / "copy"
    shutil.copytree(pristine, root)
    REMOVALS[removed](root)
    component, piece = removed.split(": ")
    named = [line for line in incomplete(root) if line.startswith(f"{component}: {piece}:")]
    assert named, f"removing {removed} went unnoticed: {incomplete(root)}"
