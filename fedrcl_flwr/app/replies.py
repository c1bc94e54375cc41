"""One collector of replies for all of a round's clients.

Flower's legacy server loop sends each client's message from a thread of its own
(``flwr/server/compat/grid_client_proxy.py``: ``grid.send_and_receive([message])``), and
the simulation's ``InMemoryGrid.send_and_receive`` then looks for that one reply every
``pull_interval`` (0.1 s by default). So K clients make K look-ups per interval, and a
round's last reply waits half an interval on average before the server sees it; a short
interval multiplies the look-ups (50 clients at 10 ms: 5,000 a second).

:class:`ReplyCollector` wraps the grid: every ``send_and_receive`` pushes its messages
and waits; one thread asks the grid for the replies of *all* waiting messages in one
``pull_messages`` call every :data:`INTERVAL` seconds and hands each reply to its waiter.
The round's last reply now waits 5 ms on average, for one look-up per interval whatever
the number of clients, and none while nothing is waited for. Timeouts keep Flower's
meaning: a call returns the replies that came before its deadline. Every other method is
the grid's own.

In simulation the collector also rings the engine's doorbell after every send
(``flower_private.engine_doorbell``): Flower's engine looks for new messages only every
0.1 s otherwise.

Under the Deployment Engine the ServerApp's grid asks the SuperLink over the wire, and
Flower's ``send_and_receive`` sleeps 3 s between look-ups (``flwr/superlink/grid/
http_grid.py``), so every round waited 1.5 s on average for its last reply; the collector
asks every :data:`WIRE_INTERVAL` seconds instead, one request for all waiting messages.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from flwr.server import Grid

INTERVAL = 0.01  # seconds between look-ups while a reply is awaited (in memory)
WIRE_INTERVAL = 0.2  # the same over the wire to a SuperLink (the Deployment Engine)


IDLE_EXIT = 5.0  # seconds without a waiter after which the thread ends


class _Waiter:
    def __init__(self, ids: set[str]):
        self.missing = set(ids)
        self.replies: list = []
        self.error: BaseException | None = None
        self.done = threading.Event()


class ReplyCollector(Grid):
    """``grid`` with one thread collecting the replies of every waiting
    :meth:`send_and_receive` (module docstring); ``on_send``, when given, is called after
    every push (the simulation engine's doorbell)."""

    def __init__(
        self,
        grid: Grid,
        interval: float = INTERVAL,
        on_send: Callable[[], None] | None = None,
    ):
        self.grid = grid
        self.interval = interval
        self.on_send = on_send
        self._lock = threading.Lock()
        self._waiters: dict[str, _Waiter] = {}  # message id -> its waiter
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    # -- the grid's own
    def __getattr__(self, name: str):
        """Anything else the grid has (an attribute a later Flower reads) is its own."""
        if name == "grid":  # not set yet (during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.grid, name)

    def set_run(self, run) -> None:
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, *args, **kwargs):
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self):
        return self.grid.get_nodes()

    def push_messages(self, messages) -> Iterable[str]:
        ids = self.grid.push_messages(messages)
        if self.on_send is not None:
            self.on_send()
        return ids

    def pull_messages(self, *args, **kwargs):
        return self.grid.pull_messages(*args, **kwargs)

    # -- collected
    def send_and_receive(self, messages, *, timeout: float | None = None):
        ids = {str(i) for i in self.push_messages(messages)}
        if not ids:
            return []
        waiter = _Waiter(ids)
        with self._lock:
            for i in ids:
                self._waiters[i] = waiter
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._collect, name="fedrcl-replies", daemon=True
                )
                self._thread.start()
            self._wake.notify()
        if not waiter.done.wait(timeout):
            with self._lock:  # late replies are left to the grid, as Flower does
                for i in waiter.missing:
                    self._waiters.pop(i, None)
        with self._lock:
            if waiter.error is not None:
                raise waiter.error
            return list(waiter.replies)

    def _collect(self) -> None:
        while True:
            with self._lock:
                if not self._waiters:
                    self._wake.wait(IDLE_EXIT)
                    if not self._waiters:
                        self._thread = None
                        return
                ids = list(self._waiters)
            try:
                replies = list(self.grid.pull_messages(ids))
            except BaseException as exc:  # the grid failed: every waiter hears it
                with self._lock:
                    for waiter in set(self._waiters.values()):
                        waiter.error = exc
                        waiter.done.set()
                    self._waiters.clear()
                    self._thread = None
                return
            with self._lock:
                for msg in replies:
                    key = str(msg.metadata.reply_to_message_id)
                    if key not in self._waiters:
                        continue
                    waiter = self._waiters.pop(key)
                    waiter.replies.append(msg)
                    waiter.missing.discard(key)
                    if not waiter.missing:
                        waiter.done.set()
                if not self._waiters:
                    continue
            time.sleep(self.interval)
