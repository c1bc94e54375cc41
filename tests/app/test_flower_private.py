"""Flower's non-public API has one door (fedrcl_flwr/app/flower_private.py): every other
module imports only Flower's public API, and each private symbol still has the shape this
project relies on. When Flower changes one, the failing test names the symbol."""

import ast
import importlib
from pathlib import Path

import pytest

from fedrcl_flwr.app import flower_private
from fedrcl_flwr.app.flower_private import PRIVATE_API, PrivateSymbol, problem

ROOT = Path(__file__).resolve().parents[2]
DOOR = ROOT / "fedrcl_flwr" / "app" / "flower_private.py"
# Flower's documented public API: these modules' __all__
PUBLIC = (
    "flwr.app",
    "flwr.client",
    "flwr.client.mod",
    "flwr.common",
    "flwr.server",
    "flwr.server.strategy",
    "flwr.server.workflow",
    "flwr.simulation",
)


@pytest.mark.parametrize("symbol", PRIVATE_API, ids=lambda s: s.path)
def test_private_symbol_has_the_shape_we_rely_on(symbol):
    why = problem(symbol)
    assert why is None, f"Flower changed {symbol.path}: {why} -> adapt flower_private.py"


def test_a_changed_symbol_is_named():
    gone = problem(PrivateSymbol("flwr.cli.no_such_module:run", lambda obj: None))
    assert gone.startswith("flwr.cli.no_such_module:run: cannot be imported")
    moved = problem(PrivateSymbol("flwr.cli.typing:NoSuchConnection", lambda obj: None))
    assert "flwr.cli.typing:NoSuchConnection" in moved
    shape = problem(
        PrivateSymbol(
            "flwr.cli.typing:SuperLinkConnection",
            flower_private._parameters("name", "no_such_parameter"),
        )
    )
    assert shape.startswith(
        "flwr.cli.typing:SuperLinkConnection: no parameter(s) ['no_such_parameter']"
    )


def _flwr_imports(path: Path):
    """``(module, name or None, line)`` of every Flower import in ``path``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and (node.module == "flwr" or node.module.startswith("flwr."))
        ):
            for alias in node.names:
                yield node.module, alias.name, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "flwr" or alias.name.startswith("flwr."):
                    yield alias.name, None, node.lineno


def test_only_the_door_imports_flowers_non_public_api():
    public = {m: set(importlib.import_module(m).__all__) for m in PUBLIC}
    bad = []
    files = [p for d in ("fedrcl_flwr", "clients", "strategies") for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 50
    for path in files:
        if path == DOOR:
            continue
        for module, name, line in _flwr_imports(path):
            ok = module in public and (name is None or name in public[module])
            if not ok:
                bad.append(
                    f"{path.relative_to(ROOT)}:{line}: {module}" + (f".{name}" if name else "")
                )
    assert not bad, "non-public Flower imports outside flower_private.py:\n" + "\n".join(bad)


def test_no_flower_import_outside_app():
    """The layering rule: Flower is imported by ``fedrcl_flwr/app/`` (and the Flower
    classes in ``clients/`` and ``strategies/``) only; every other package of the core
    (``config/``, ``run/``, ``report/``, ``server/``, ``data/``, ``models/``, ...) is plain
    PyTorch/NumPy, so it can be read, tested and reused without Flower."""
    core = ROOT / "fedrcl_flwr"
    files = [p for p in core.rglob("*.py") if (core / "app") not in p.parents]
    packages = {p.parent.name for p in files}
    assert {"config", "run", "report", "server"} <= packages  # the walk sees the layers
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in files
        for module, _, line in _flwr_imports(path)
    ]
    assert not bad, "Flower imported outside fedrcl_flwr/app/:\n" + "\n".join(bad)


def test_our_grids_implement_flowers_grid_interface():
    """The in-process grid and the reply collector (a wrapper: every method of
    Flower's Grid must reach the wrapped grid, not the base class's default)."""
    import inspect

    from flwr.server import Grid

    from fedrcl_flwr.app.inprocess import InProcessGrid
    from fedrcl_flwr.app.replies import ReplyCollector

    missing = {m for m in Grid.__abstractmethods__ if m not in vars(InProcessGrid)}
    assert not missing, f"flwr.server.Grid gained abstract method(s) {sorted(missing)}"
    theirs = {n for n, _ in inspect.getmembers(Grid) if not n.startswith("_")}
    assert theirs <= set(vars(ReplyCollector)), sorted(theirs - set(vars(ReplyCollector)))


def test_the_in_process_grid_takes_both_pull_messages_signatures():
    """Flower 1.42 calls ``pull_messages(message_ids)``; 1.43 ``pull_messages(
    reply_to_message_ids=None, *, message_ids=None)``. Every form reaches the method
    (NotImplementedError: it answers in send_and_receive), none is a TypeError, and the
    installed Flower's own parameter names are all accepted."""
    import inspect

    import pytest
    from flwr.server import Grid

    from fedrcl_flwr.app.inprocess import InProcessGrid

    grid = InProcessGrid({}, 1)
    for args, kwargs in (
        ((["m1"],), {}),  # 1.42: positional message_ids
        ((), {"message_ids": ["m1"]}),  # 1.42 by keyword, 1.43's deprecated keyword
        ((), {"reply_to_message_ids": ["m1"]}),  # 1.43
        ((["m1"],), {"message_ids": ["m2"]}),  # 1.43: both
    ):
        with pytest.raises(NotImplementedError):
            grid.pull_messages(*args, **kwargs)
    ours = inspect.signature(InProcessGrid.pull_messages).parameters
    theirs = [p for p in inspect.signature(Grid.pull_messages).parameters if p != "self"]
    assert set(theirs) <= set(ours), (theirs, list(ours))
