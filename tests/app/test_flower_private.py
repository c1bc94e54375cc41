"""Flower's non-public API has one door (fedrcl_flwr/app/wire/flower_private.py): every other
module imports only Flower's public API, and each private symbol still has the shape this
project relies on. When Flower changes one, the failing test names the symbol."""

import ast
import importlib
from pathlib import Path

import pytest

from fedrcl_flwr.app.wire import flower_private
from fedrcl_flwr.app.wire.flower_private import PRIVATE_API, PrivateSymbol, problem

ROOT = Path(__file__).resolve().parents[2]
DOOR = ROOT / "fedrcl_flwr" / "app" / "wire" / "flower_private.py"
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


# ------------------------------------------------------- the engine changes fail safe
def _real_engine(monkeypatch):
    """Flower's real engine modules in this process, as in a simulation process (Ray not
    started), with what an installed change would replace restored after the test."""
    import sys
    import types

    engine = importlib.import_module(flower_private.ENGINE_MODULE)
    backend = flower_private.load(flower_private.BACKEND)
    monkeypatch.setattr(engine, "add_messages_to_queue", engine.add_messages_to_queue)
    monkeypatch.setattr(backend, "build", backend.build)
    monkeypatch.setattr(backend, "terminate", backend.terminate)
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False))
    return engine


def _remove(monkeypatch, path: str) -> None:
    module, _, attr = path.partition(":")
    *owner, name = attr.split(".")
    obj = importlib.import_module(module)
    for part in owner:
        obj = getattr(obj, part)
    monkeypatch.delattr(obj, name)


CHANGES = [("doorbell", s, "_install_doorbell") for s in flower_private._DOORBELL_SYMBOLS] + [
    ("two per actor", s, "_install_two_per_actor") for s in flower_private._PIPELINE_SYMBOLS
]


def test_every_symbol_an_engine_change_calls_is_checked():
    """What the replacements call (the look-up's ``LinkState.get_message_ins``, the
    backend's ``build``/``terminate``, the pool's list and count) is in PRIVATE_API."""
    paths = {s.path for s in PRIVATE_API}
    needed = {
        "flwr.server.superlink.linkstate:LinkState.get_message_ins",
        f"{flower_private.ENGINE_MODULE}:add_messages_to_queue",
        f"{flower_private.ENGINE_MODULE}:run_api",
        f"{flower_private.BACKEND}.build",
        f"{flower_private.BACKEND}.terminate",
        "flwr.simulation.ray_transport.ray_actor:BasicActorPool",
    }
    assert needed <= paths, needed - paths
    assert {s.path for _, s, _ in CHANGES} <= paths


@pytest.mark.parametrize("change,symbol,install", CHANGES, ids=lambda x: getattr(x, "path", x))
def test_a_symbol_gone_keeps_flowers_behaviour_with_the_note(monkeypatch, change, symbol, install):
    """Each symbol a change relies on, made to disappear: the change is not made, the
    note (the run's log line) names the symbol, nothing raises."""
    engine = _real_engine(monkeypatch)
    original = engine.add_messages_to_queue
    _remove(monkeypatch, symbol.path)
    patch = getattr(flower_private, install)()
    assert not patch.installed, patch.note
    assert symbol.path in patch.note and "Flower's" in patch.note, patch.note
    assert getattr(engine, "add_messages_to_queue", original) is original
    backend = getattr(importlib.import_module(flower_private.BACKEND_MODULE), "RayBackend", None)
    build = getattr(backend, "build", None)
    assert getattr(build, "__name__", "") != "build_two_per_actor"


def test_the_real_engine_takes_both_changes(monkeypatch):
    engine = _real_engine(monkeypatch)
    assert flower_private._install_doorbell().installed
    assert engine.add_messages_to_queue.__name__ == "add_messages_to_queue"
    assert flower_private._install_two_per_actor().installed


@pytest.mark.parametrize("install", ["_install_doorbell", "_install_two_per_actor"])
def test_a_wrapped_run_api_or_a_failing_change_keeps_flowers_behaviour(monkeypatch, install):
    """Flower's ``run_api`` wrapped by a callable without ``__code__`` (a decorator that
    keeps no ``__wrapped__``): the shape check cannot read it, the change is not made, the
    note says so; and a change whose making raises is not made either."""
    import functools

    engine = _real_engine(monkeypatch)
    monkeypatch.setattr(engine, "run_api", functools.partial(engine.run_api))
    patch = getattr(flower_private, install)()
    assert not patch.installed and "run_api: has no code to check" in patch.note, patch.note
    monkeypatch.undo()

    _real_engine(monkeypatch)

    def broken(*args, **kwargs):
        raise RuntimeError("a Flower nobody foresaw")

    monkeypatch.setattr(flower_private, "_lookup_on_ring", broken)
    monkeypatch.setattr(flower_private, "LeastBusyFirst", None)  # not called at install
    monkeypatch.setattr(flower_private, "load", broken)
    patch = getattr(flower_private, install)()
    assert not patch.installed and "a Flower nobody foresaw" in patch.note, patch.note
