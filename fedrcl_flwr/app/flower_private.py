"""Flower's non-public API: the one door through which this project uses it.

Flower's documented public API is the ``__all__`` of ``flwr.app``, ``flwr.client``,
``flwr.client.mod``, ``flwr.common``, ``flwr.server``, ``flwr.server.strategy``,
``flwr.server.workflow`` and ``flwr.simulation``. Everything else this project needs
from Flower is imported here and nowhere else (``tests/app/test_flower_private.py`` checks
both: that no other module imports a non-public name, and that each symbol below still
exists with the shape this project relies on, naming the symbol when it does not). When
Flower changes one of them (1.43 moved the Control API to HTTP only and reshuffled
``flwr.compat``), that test fails first and this module is the one to adapt.

=====================================================  ====================================
symbol                                                 used for
=====================================================  ====================================
``flwr.cli.run.run:run``                               ``flwr run`` in-process (runner)
``flwr.cli.typing:SuperLinkConnection``                the SuperLink's Control API address
``flwr.cli.utils:init_http_client_from_connection``    a Control API client (its
(a ``ControlHttpClient``)                              ``ListRuns``, ``StreamLogs``)
``flwr.proto.control_pb2:ListRunsRequest`` (and its    a run's status (``flwr list``)
response ``run_dict[..].status.status/sub_status``)
``flwr.proto.control_pb2:StreamLogsRequest`` (and      a run's log (``flwr log``)
its response ``log_output``)
``flwr.supercore.task_identity:TaskIdentity``          the in-process workflow's task id
``flwr.common.constant:ErrorCode``                     the code of a ClientApp that raised
``flwr.server.client_proxy:ClientProxy``               the strategy's type annotations
``flwr.server.superlink.fleet.vce.vce_api:``           the simulation engine's look-up for
``add_messages_to_queue``                              new messages, woken when the
                                                       ServerApp sends (:func:`engine_doorbell`)
=====================================================  ====================================
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from flwr.common.constant import ErrorCode
from flwr.server.client_proxy import ClientProxy

__all__ = [
    "CLIENT_APP_RAISED_EXCEPTION",
    "ClientProxy",
    "EngineDoorbell",
    "PRIVATE_API",
    "cli_run",
    "control_http_client",
    "engine_doorbell",
    "list_runs_request",
    "load",
    "problem",
    "stream_logs_request",
    "task_identity",
]

# the error code of a reply whose ClientApp raised
CLIENT_APP_RAISED_EXCEPTION: int = int(ErrorCode.CLIENT_APP_RAISED_EXCEPTION)


def load(path: str) -> Any:
    """The object named ``"module:attribute"`` (imported now). Flower's CLI modules are
    typer code on a click version that deprecates what typer imports: those
    DeprecationWarnings are Flower's and typer's, not the user's, and are silenced."""
    import warnings

    module, _, attr = path.partition(":")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return getattr(importlib.import_module(module), attr)


# --------------------------------------------------------------------- Control API
def cli_run() -> Callable[..., None]:
    """Flower's ``flwr run`` command function (it validates the app's ``pyproject.toml``,
    builds the FAB and calls ``StartRun``)."""
    return load("flwr.cli.run.run:run")


def control_http_client() -> Callable[[str], Any]:
    """``connect(address)``: a Control API client of the SuperLink at ``address``
    (insecure loopback, as the runner starts it), with ``ListRuns``, ``StreamLogs`` and
    ``close``. Flower's modules are imported now, ``connect`` reads ``FLWR_HOME``."""
    connection = load("flwr.cli.typing:SuperLinkConnection")
    make = load("flwr.cli.utils:init_http_client_from_connection")
    return lambda address: make(connection(name="local", address=address, insecure=True))


def list_runs_request(run_id: int) -> Any:
    return load("flwr.proto.control_pb2:ListRunsRequest")(run_id=run_id)


def stream_logs_request(run_id: int, after_timestamp: float = 0.0) -> Any:
    return load("flwr.proto.control_pb2:StreamLogsRequest")(
        run_id=run_id, after_timestamp=after_timestamp
    )


# ---------------------------------------------------------------------- task identity
@contextlib.contextmanager
def task_identity(run_id: int, node_id: int, task_id: int = 0) -> Iterator[None]:
    """Flower's identity of the running task (``TaskIdentity``), which ``Message(...)``
    reads: set by Flower's runtime in a real ServerApp process, set here by the
    in-process runner (:mod:`fedrcl_flwr.app.inprocess`) while it drives Flower's
    workflows itself."""
    identity = load("flwr.supercore.task_identity:TaskIdentity")
    before = (identity._run_id, identity._node_id, identity._task_id)
    identity.run_id, identity.node_id, identity.task_id = run_id, node_id, task_id
    try:
        yield
    finally:
        identity.run_id, identity.node_id, identity.task_id = before


# ------------------------------------------------------ the simulation engine's look-up
ENGINE_MODULE = "flwr.server.superlink.fleet.vce.vce_api"
ENGINE_LOOKUP = f"{ENGINE_MODULE}:add_messages_to_queue"
ENGINE_LOOKUP_PARAMETERS = ("state", "queue", "nodes_mapping", "f_stop")
LOOKUP_INTERVAL = 0.1  # seconds: Flower's own interval, kept when nothing rings


@dataclass
class EngineDoorbell:
    """Rung by the ServerApp after it sends messages (``ReplyCollector``): the engine's
    look-up for new messages runs at once instead of at its next 0.1 s tick.

    ``note`` says, for the run's log, whether the engine listens (``installed``) or keeps
    Flower's own look-up, and why."""

    installed: bool
    note: str
    event: threading.Event

    def ring(self) -> None:
        self.event.set()


_DOORBELL: EngineDoorbell | None = None
_DOORBELL_LOCK = threading.Lock()


def _lookup_on_ring(event: threading.Event) -> Callable[..., None]:
    """Flower's ``add_messages_to_queue`` (flwr 1.42, ``vce_api.py``) with one change:
    between two passes it waits for ``event`` (at most Flower's 0.1 s) where Flower waits
    only for ``f_stop``. A pass is Flower's: one ``get_message_ins(node_id, limit=1)`` per
    node, each message found put on the engine's queue. The event is cleared after the wait
    and before the pass, so a ring during a pass brings one more pass, never a lost one."""

    def add_messages_to_queue(state: Any, queue: Any, nodes_mapping: Any, f_stop: Any) -> None:
        while not f_stop.is_set():
            for node_id in nodes_mapping.keys():
                for message in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(message)
            event.wait(LOOKUP_INTERVAL)
            event.clear()

    add_messages_to_queue.__doc__ = _lookup_on_ring.__doc__
    return add_messages_to_queue


def engine_doorbell() -> EngineDoorbell:
    """In a Flower simulation process, the doorbell of its engine's look-up for new
    messages (installed once per process; later calls return the same one).

    Flower's simulation engine and the ServerApp share one process and one in-memory
    LinkState; a thread of the engine looks for new messages every 0.1 s
    (``add_messages_to_queue``: ``f_stop.wait(0.1)``, a constant), so a round's messages
    waited 50 ms on average before any client started (docs/performance.md). Flower's
    ``run_api`` starts that thread with the module's ``add_messages_to_queue`` once its
    Ray backend is built, seconds after the ServerApp has started; the ServerApp replaces
    the function before then with :func:`_lookup_on_ring`'s. Not installed (Flower's own
    look-up is kept, ``note`` says why) outside a simulation process (the engine's module
    is not loaded), when Flower's function no longer has the shape replaced here
    (``PRIVATE_API`` names it), or when the engine's thread had already started."""
    global _DOORBELL
    with _DOORBELL_LOCK:
        if _DOORBELL is None:
            _DOORBELL = _install_doorbell()
        return _DOORBELL


def _install_doorbell() -> EngineDoorbell:
    event = threading.Event()

    def kept(why: str) -> EngineDoorbell:
        note = f"the simulation engine looks for new messages every 0.1 s (Flower's): {why}"
        return EngineDoorbell(False, note, event)

    module = sys.modules.get(ENGINE_MODULE)
    if module is None:
        return kept("not a Flower simulation process")
    original = getattr(module, "add_messages_to_queue", None)
    run_api = getattr(module, "run_api", None)
    if original is None or run_api is None:
        return kept(f"{ENGINE_MODULE} changed (no add_messages_to_queue or run_api)")
    why = _parameters(*ENGINE_LOOKUP_PARAMETERS)(original) or _starts_lookup_by_name(run_api)
    if why:
        return kept(f"{ENGINE_MODULE} changed ({why})")
    if any(getattr(t, "_target", None) is original for t in threading.enumerate()):
        return kept("its thread had started before the ServerApp")
    setattr(module, "add_messages_to_queue", _lookup_on_ring(event))  # noqa: B010
    return EngineDoorbell(
        True,
        "the simulation engine picks up messages when the ServerApp sends them "
        f"(its look-up, {ENGINE_LOOKUP}, woken; Flower's 0.1 s otherwise)",
        event,
    )


# ------------------------------------------------------ the shapes this project relies on
@dataclass(frozen=True)
class PrivateSymbol:
    """One non-public Flower symbol and the check of the shape this module relies on
    (``check(obj)`` returns what is wrong, or ``None``)."""

    path: str
    check: Callable[[Any], str | None]


def _parameters(*names: str) -> Callable[[Any], str | None]:
    def check(obj: Any) -> str | None:
        have = set(inspect.signature(obj).parameters)
        missing = [n for n in names if n not in have]
        return f"no parameter(s) {missing} (has {sorted(have)})" if missing else None

    return check


def _attributes(*names: str) -> Callable[[Any], str | None]:
    def check(obj: Any) -> str | None:
        missing = [n for n in names if not hasattr(obj, n)]
        return f"no attribute(s) {missing}" if missing else None

    return check


def _proto_fields(*names: str) -> Callable[[Any], str | None]:
    def check(obj: Any) -> str | None:
        have = set(obj.DESCRIPTOR.fields_by_name)
        missing = [n for n in names if n not in have]
        return f"no field(s) {missing} (has {sorted(have)})" if missing else None

    return check


def _all(*checks: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def check(obj: Any) -> str | None:
        return next((why for why in (c(obj) for c in checks) if why), None)

    return check


def _settable_class_properties(*names: str) -> Callable[[Any], str | None]:
    """Class-level properties with setters (defined on the metaclass), each backed by a
    ``_name`` class attribute."""

    def check(obj: Any) -> str | None:
        bad = [
            n
            for n in names
            if not (
                isinstance(getattr(type(obj), n, None), property)
                and getattr(type(obj), n).fset is not None
                and f"_{n}" in vars(obj)
            )
        ]
        return f"no settable class propert(ies) {bad} backed by _<name>" if bad else None

    return check


def _starts_lookup_by_name(run_api: Any) -> str | None:
    """``run_api`` must start the look-up's thread with the module's global
    ``add_messages_to_queue``, read when it runs (what :func:`engine_doorbell` replaces)."""
    if "add_messages_to_queue" not in run_api.__code__.co_names:
        return "does not read the module's add_messages_to_queue when it runs"
    return None


def _int_attribute(name: str) -> Callable[[Any], str | None]:
    def check(obj: Any) -> str | None:
        value = getattr(obj, name, None)
        return None if isinstance(value, int) else f"{name} is {value!r}, not an int"

    return check


PRIVATE_API: tuple[PrivateSymbol, ...] = (
    PrivateSymbol(
        "flwr.cli.run.run:run",
        _parameters(
            "app",
            "superlink",
            "federation",
            "run_config_overrides",
            "federation_config_overrides",
            "stream",
            "output_format",
        ),
    ),
    PrivateSymbol(
        "flwr.cli.typing:SuperLinkConnection", _parameters("name", "address", "insecure")
    ),
    PrivateSymbol("flwr.cli.utils:init_http_client_from_connection", _parameters("connection")),
    PrivateSymbol(
        "flwr.supercore.control.control_http_client:ControlHttpClient",
        _attributes("ListRuns", "StreamLogs", "close"),
    ),
    PrivateSymbol("flwr.proto.control_pb2:ListRunsRequest", _proto_fields("run_id")),
    PrivateSymbol("flwr.proto.control_pb2:ListRunsResponse", _proto_fields("run_dict")),
    PrivateSymbol("flwr.proto.run_pb2:Run", _proto_fields("status")),
    PrivateSymbol("flwr.proto.run_pb2:RunStatus", _proto_fields("status", "sub_status")),
    PrivateSymbol(
        "flwr.proto.control_pb2:StreamLogsRequest", _proto_fields("run_id", "after_timestamp")
    ),
    PrivateSymbol("flwr.proto.control_pb2:StreamLogsResponse", _proto_fields("log_output")),
    PrivateSymbol(
        "flwr.supercore.task_identity:TaskIdentity",
        _settable_class_properties("run_id", "node_id", "task_id"),
    ),
    PrivateSymbol("flwr.common.constant:ErrorCode", _int_attribute("CLIENT_APP_RAISED_EXCEPTION")),
    PrivateSymbol(
        "flwr.server.client_proxy:ClientProxy",
        _all(_parameters("cid"), _attributes("fit", "evaluate")),
    ),
    PrivateSymbol(ENGINE_LOOKUP, _parameters(*ENGINE_LOOKUP_PARAMETERS)),
    PrivateSymbol(f"{ENGINE_MODULE}:run_api", _starts_lookup_by_name),
)


def problem(symbol: PrivateSymbol) -> str | None:
    """What is wrong with ``symbol`` in the installed Flower (``None``: nothing)."""
    try:
        obj = load(symbol.path)
    except (ImportError, AttributeError) as exc:
        return f"{symbol.path}: cannot be imported ({type(exc).__name__}: {exc})"
    why = symbol.check(obj)
    return f"{symbol.path}: {why}" if why else None
