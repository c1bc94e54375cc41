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
``add_messages_to_queue`` (and ``run_api``, which      new messages, woken when the
starts it), ``flwr.server.superlink.linkstate:``       ServerApp sends (:func:`engine_doorbell`)
``LinkState.get_message_ins`` (what it calls)
``flwr.server.superlink.fleet.vce.backend.``           each actor given its next message
``raybackend:RayBackend`` (``build``, ``terminate``,   while it runs one
its ``pool``: a ``BasicActorPool``'s ``pool`` list     (:func:`two_messages_per_actor`)
and ``num_actors``)
=====================================================  ====================================

The two engine changes fail safe: every symbol a replacement calls is in
:data:`PRIVATE_API` and checked (:func:`problem`) before the change is made, and the
checks and the change run inside one guard (:func:`_fail_safe`): whatever is wrong, even
a check that itself fails (a Flower function wrapped by a decorator), Flower's own
behaviour is kept and the run's log says why.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from flwr.common.constant import ErrorCode
from flwr.server.client_proxy import ClientProxy

__all__ = [
    "CLIENT_APP_RAISED_EXCEPTION",
    "ClientProxy",
    "EngineDoorbell",
    "EnginePatch",
    "LeastBusyFirst",
    "PRIVATE_API",
    "cli_run",
    "control_http_client",
    "engine_doorbell",
    "list_runs_request",
    "load",
    "problem",
    "stream_logs_request",
    "task_identity",
    "two_messages_per_actor",
]

# the error code of a reply whose ClientApp raised
CLIENT_APP_RAISED_EXCEPTION: int = int(ErrorCode.CLIENT_APP_RAISED_EXCEPTION)


def load(path: str) -> Any:
    """The object named ``"module:attribute"`` or ``"module:Class.attribute"`` (imported
    now). Flower's CLI modules are typer code on a click version that deprecates what
    typer imports: those DeprecationWarnings are Flower's and typer's, not the user's,
    and are silenced."""
    import warnings

    module, _, attr = path.partition(":")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        obj = importlib.import_module(module)
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


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
class EnginePatch:
    """One change to Flower's simulation engine: whether it is made (``installed``), and
    a line for the run's log saying what it does or why Flower's own behaviour is kept."""

    installed: bool
    note: str


@dataclass
class EngineDoorbell(EnginePatch):
    """Rung by the ServerApp after it sends messages (``ReplyCollector``): the engine's
    look-up for new messages runs at once instead of at its next 0.1 s tick."""

    event: threading.Event

    def ring(self) -> None:
        self.event.set()


_INSTALLED: dict[str, EnginePatch] = {}  # what this process made of each change
_INSTALL_LOCK = threading.Lock()


def _once(name: str, install: Callable[[], EnginePatch]) -> EnginePatch:
    """``install()``'s answer, asked once per process."""
    with _INSTALL_LOCK:
        if name not in _INSTALLED:
            _INSTALLED[name] = install()
        return _INSTALLED[name]


def _fail_safe(
    install: Callable[[], EnginePatch], kept: Callable[[str], EnginePatch]
) -> EnginePatch:
    """``install()``, or ``kept(why)`` (Flower's behaviour, the reason for the log) when
    anything in it raises: the shape checks, the look-ups and the change itself run in
    this one guard, so a Flower that changed in a way no check foresaw costs the speed-up
    and never the run."""
    try:
        return install()
    except Exception as exc:  # noqa: BLE001 - any surprise keeps Flower's behaviour
        one = " ".join(str(exc).split())[:300]
        return kept(f"the change could not be made ({type(exc).__name__}: {one})")


def _first_problem(symbols: tuple[PrivateSymbol, ...]) -> str | None:
    return next(filter(None, (problem(s) for s in symbols)), None)


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
    return cast(EngineDoorbell, _once("doorbell", _install_doorbell))


def _install_doorbell() -> EngineDoorbell:
    event = threading.Event()

    def kept(why: str) -> EngineDoorbell:
        note = f"the simulation engine looks for new messages every 0.1 s (Flower's): {why}"
        return EngineDoorbell(False, note, event)

    def install() -> EngineDoorbell:
        module = sys.modules.get(ENGINE_MODULE)
        if module is None:
            return kept("not a Flower simulation process")
        why = _first_problem(_DOORBELL_SYMBOLS)
        if why:
            return kept(f"Flower's engine changed ({why})")
        original = module.add_messages_to_queue
        if any(getattr(t, "_target", None) is original for t in threading.enumerate()):
            return kept("its thread had started before the ServerApp")
        setattr(module, "add_messages_to_queue", _lookup_on_ring(event))  # noqa: B010
        return EngineDoorbell(
            True,
            "the simulation engine picks up messages when the ServerApp sends them "
            f"(its look-up, {ENGINE_LOOKUP}, woken; Flower's 0.1 s otherwise)",
            event,
        )

    return cast(EngineDoorbell, _fail_safe(install, kept))


# ------------------------------------------------------- two messages per actor in flight
BACKEND_MODULE = "flwr.server.superlink.fleet.vce.backend.raybackend"
BACKEND = f"{BACKEND_MODULE}:RayBackend"
IN_FLIGHT_PER_ACTOR = 2


def two_messages_per_actor() -> EnginePatch:
    """In a Flower simulation process, give each Ray actor its next message while it runs
    one (installed once per process; later calls return the same answer).

    Flower's engine (``vce_api.run_api``) runs one worker thread per actor of its pool
    (``RayBackend.num_workers``); a thread takes a message, hands it to an idle actor
    (``a.run.remote``), waits for the reply (``ray.get``) and only then takes the next
    one. Between two messages an actor idles while its reply travels back and the next
    message is sent: 5-7 ms per message on the 2-core machine, a third of the cross-device
    regime's per-client overhead (docs/performance.md). After Flower's ``build`` this lists
    every actor :data:`IN_FLIGHT_PER_ACTOR` times in the pool (``BasicActorPool.pool``,
    ``num_actors``), so that many worker threads serve each actor: Ray runs an actor's
    tasks one at a time in the order they were sent, and the next message is already in
    the actor when one ends. Nothing else changes: one message at a time per actor, every
    message's context retrieved and stored by Flower's worker as before (the suite's runs
    give the same numbers). A message goes to the actor with the fewest messages in
    flight (:class:`LeastBusyFirst`), so an idle actor is never passed over. ``terminate``
    stops each actor once. Flower runs its workers in a ``ThreadPoolExecutor()``
    (``min(32, cores + 4)`` threads), which bounds the messages in flight: with more
    actors than half of that, some actors hold one message at a time, as before.

    Not installed (Flower's pool kept, ``note`` says why) outside a simulation process,
    when Flower's classes no longer have the shape relied on here (``PRIVATE_API`` names
    it), or when Ray had already started in this process (the pool may have been built)."""
    return _once("two per actor", _install_two_per_actor)


def _install_two_per_actor() -> EnginePatch:
    def kept(why: str) -> EnginePatch:
        return EnginePatch(False, f"each Ray actor gets one message at a time (Flower's): {why}")

    def install() -> EnginePatch:
        if sys.modules.get(ENGINE_MODULE) is None:
            return kept("not a Flower simulation process")
        why = _first_problem(_PIPELINE_SYMBOLS)
        if why:
            return kept(f"Flower's engine changed ({why})")
        backend = load(BACKEND)
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            return kept("Ray had started before the ServerApp")
        build, terminate = backend.build, backend.terminate

        def build_two_per_actor(self: Any, app_fn: Any) -> None:
            build(self, app_fn)
            actors = list(self.pool.pool)
            self.pool.pool = LeastBusyFirst(actors * IN_FLIGHT_PER_ACTOR)
            self.pool.num_actors = len(self.pool.pool)
            print(
                f"[fedrcl-flwr] each of the {len(actors)} Ray actors holds its next message "
                f"while it runs one ({IN_FLIGHT_PER_ACTOR} in flight per actor)",
                file=sys.stderr,
                flush=True,
            )

        def terminate_each_actor_once(self: Any) -> None:
            if self.pool is not None:
                once = {id(actor): actor for actor in self.pool.pool}
                self.pool.pool = list(once.values())
                self.pool.num_actors = len(self.pool.pool)
            terminate(self)

        build_two_per_actor.__doc__ = two_messages_per_actor.__doc__
        backend.build, backend.terminate = build_two_per_actor, terminate_each_actor_once
        return EnginePatch(
            True,
            f"each Ray actor is given its next message while it runs one ({BACKEND}.build)",
        )

    return _fail_safe(install, kept)


class LeastBusyFirst(list):
    """The actor pool's list of idle entries (``BasicActorPool.pool``) when every actor has
    :data:`IN_FLIGHT_PER_ACTOR` entries: ``pop()`` returns an entry of the actor with the
    most entries here, i.e. the fewest messages in flight (of those, the entry nearest the
    end, as Flower's ``list.pop()``). A plain list of duplicates would hand a message to
    whichever entry was returned last, so that with fewer messages than entries (5 clients
    a round on 5 GPU actors) one actor could be given two while another idled. Flower's
    worker threads pop and append concurrently: both hold a lock here."""

    def __init__(self, entries: Any = ()) -> None:
        super().__init__(entries)
        self._lock = threading.Lock()

    def pop(self, index: Any = -1) -> Any:
        with self._lock:
            if index != -1 or not self:
                return super().pop(index)
            free: dict[int, int] = {}
            for entry in self:
                free[id(entry)] = free.get(id(entry), 0) + 1
            best = max(range(len(self)), key=lambda i: (free[id(self[i])], i))
            return super().pop(best)

    def append(self, entry: Any) -> None:
        with self._lock:
            super().append(entry)


def _code_names(function: Any) -> set[str] | None:
    """The global and attribute names ``function``'s code reads (through decorators
    that keep ``__wrapped__``), or ``None`` when it has no code object to read."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    return set(code.co_names) if code is not None else None


def _runs_a_worker_per_pool_entry(run_api: Any) -> str | None:
    """``run_api`` must start its worker threads by ``backend.num_workers``."""
    names = _code_names(run_api)
    if names is None:
        return "has no code to check (wrapped?)"
    if "num_workers" not in names:
        return "does not start a worker per backend.num_workers"
    return None


def _concrete(function: Any) -> str | None:
    """A method the class implements (not only its base class's abstract one)."""
    if getattr(function, "__isabstractmethod__", False):
        return "is abstract here (the class no longer implements it)"
    return None


def _sets_in_init(*names: str) -> Callable[[Any], str | None]:
    """A class whose ``__init__`` sets the instance attributes ``names``."""

    def check(cls: Any) -> str | None:
        have = _code_names(getattr(cls, "__init__", None))
        if have is None:
            return "its __init__ has no code to check (wrapped?)"
        missing = [n for n in names if n not in have]
        return f"__init__ sets no attribute(s) {missing}" if missing else None

    return check


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
    names = _code_names(run_api)
    if names is None:
        return "has no code to check (wrapped?)"
    if "add_messages_to_queue" not in names:
        return "does not read the module's add_messages_to_queue when it runs"
    return None


def _int_attribute(name: str) -> Callable[[Any], str | None]:
    def check(obj: Any) -> str | None:
        value = getattr(obj, name, None)
        return None if isinstance(value, int) else f"{name} is {value!r}, not an int"

    return check


# what :func:`engine_doorbell` relies on: the look-up it replaces, the function that
# starts it by name, and what the replacement calls
_DOORBELL_SYMBOLS: tuple[PrivateSymbol, ...] = (
    PrivateSymbol(ENGINE_LOOKUP, _parameters(*ENGINE_LOOKUP_PARAMETERS)),
    PrivateSymbol(f"{ENGINE_MODULE}:run_api", _starts_lookup_by_name),
    PrivateSymbol(
        "flwr.server.superlink.linkstate:LinkState.get_message_ins",
        _parameters("node_id", "limit"),
    ),
)

# what :func:`two_messages_per_actor` relies on: the engine starting a worker per pool
# entry, the backend's build / terminate it wraps, the pool's list and count it changes
_PIPELINE_SYMBOLS: tuple[PrivateSymbol, ...] = (
    PrivateSymbol(f"{ENGINE_MODULE}:run_api", _runs_a_worker_per_pool_entry),
    PrivateSymbol(
        BACKEND,
        _all(
            _attributes("build", "terminate", "process_message", "num_workers"),
            _sets_in_init("pool"),
        ),
    ),
    PrivateSymbol(f"{BACKEND}.build", _all(_concrete, _parameters("app_fn"))),
    PrivateSymbol(f"{BACKEND}.terminate", _all(_concrete, _parameters())),
    PrivateSymbol(
        "flwr.simulation.ray_transport.ray_actor:BasicActorPool",
        _all(
            _attributes("add_actors_to_pool", "submit", "terminate_all_actors"),
            _parameters("actor_type", "client_resources", "actor_kwargs"),
            _sets_in_init("pool", "num_actors"),
        ),
    ),
)

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
    *_DOORBELL_SYMBOLS,
    *_PIPELINE_SYMBOLS,
)


def problem(symbol: PrivateSymbol) -> str | None:
    """What is wrong with ``symbol`` in the installed Flower (``None``: nothing). Never
    raises: a check that fails on an object it did not foresee is a problem too."""
    try:
        obj = load(symbol.path)
    except (ImportError, AttributeError) as exc:
        return f"{symbol.path}: cannot be imported ({type(exc).__name__}: {exc})"
    try:
        why = symbol.check(obj)
    except Exception as exc:  # noqa: BLE001 - a shape nobody foresaw
        why = f"cannot be checked ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    return f"{symbol.path}: {why}" if why else None
