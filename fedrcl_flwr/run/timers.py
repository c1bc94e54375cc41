"""Stage timers in the real message path, off unless ``FEDRCL_TIMERS`` names a directory.

``benchmarks/bench_regimes.py`` sets ``FEDRCL_TIMERS=DIR`` on a ``fedrcl-flwr run``; every
process of the run inherits it (the SuperLink, the simulation process, Ray's actors) and
appends one JSON line per event to ``DIR/<role>-<pid>.jsonl``:

* a ClientApp message (``role`` ``client``): wall-clock times of its arrival in the
  ClientApp (``t_enter``), of the server's creation of the message (``created_at``), of
  the client's ``fit`` start and end, and of its departure (``t_exit``), plus the seconds
  of each stage timed inside (``construct``: the ClientApp's ``client_fn``; ``data``,
  ``load``, ``train``, ``encode`` in :meth:`clients.base.FederatedClient.fit`);
* server events (``role`` ``server``): a round's instructions handed to Flower
  (``sent``), its results handed back (``results``), the background round end
  (``eval_start`` / ``eval_end``);
* start-up events: the CLI launching the SuperLink (``superlink_launch``, written by
  :mod:`fedrcl_flwr.launch.superlink` after the pre-run checks), the ServerApp called by Flower
  (``serverapp_start``, with its process's start time and the time its module finished
  importing) and set up (``serverapp_built``: data, model, strategy).

Progress (always on under ``fedrcl-flwr run``, independent of ``FEDRCL_TIMERS``): the
runner sets ``FEDRCL_FLWR_PROGRESS`` to a file in the run's private home, and the
start-up events (``serverapp_start``, ``serverapp_built``, the first ``sent``) are also
appended there, so that the CLI prints each start-up phase as it happens
(:func:`read_progress`; :mod:`fedrcl_flwr.launch.follower`).

The benchmark turns them into the per-client breakdown (Ray dispatch, decode, client
construction, model load, training, encode, SuperLink round trip). Timers only read
clocks: a timed run computes exactly what an untimed one does. Disabled (the default),
each timer is one ``if`` on a module constant; nothing is written.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

ENV_VAR = "FEDRCL_TIMERS"

_DIR: str | None = os.environ.get(ENV_VAR) or None
PROGRESS_VAR = "FEDRCL_FLWR_PROGRESS"
_PROGRESS: str | None = os.environ.get(PROGRESS_VAR) or None
PROGRESS_EVENTS = ("serverapp_start", "serverapp_built", "sent")
_progress_written: set = set()  # each progress event once per process
_local = threading.local()  # the message this thread serves (``record`` of begin())


def enabled() -> bool:
    return _DIR is not None


def progress_enabled() -> bool:
    return _PROGRESS is not None


def _write(role: str, rec: dict) -> None:
    """One JSON line appended with one ``write`` (records of concurrent processes never
    interleave, and a killed process loses at most the line it was writing)."""
    assert _DIR is not None  # callers write only when enabled()
    line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
    path = Path(_DIR) / f"{role}-{os.getpid()}.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def begin(**fields) -> None:
    """Open the record of the message this thread now serves."""
    if _DIR is None:
        return
    _local.record = {"t_enter": time.time(), "pid": os.getpid(), "stages": {}, **fields}


def note(**fields) -> None:
    """Add fields (or wall-clock marks) to the open record, if any."""
    rec = getattr(_local, "record", None) if _DIR is not None else None
    if rec is not None:
        rec.update(fields)


def mark(name: str) -> None:
    """Record the wall-clock time ``name`` in the open record, if any."""
    if _DIR is not None:
        note(**{name: time.time()})


@contextmanager
def _timed(name: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        rec = getattr(_local, "record", None)
        if rec is not None:
            stages = rec["stages"]
            stages[name] = stages.get(name, 0.0) + time.perf_counter() - t0


class _Off:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_OFF = _Off()


def stage(name: str):
    """``with stage("train"): ...`` adds the block's seconds to the open record's
    ``stages[name]`` (a no-op context when timers are off)."""
    return _OFF if _DIR is None else _timed(name)


def end() -> None:
    """Close and write the open record (``t_exit`` now)."""
    rec = getattr(_local, "record", None) if _DIR is not None else None
    if rec is None:
        return
    _local.record = None
    rec["t_exit"] = time.time()
    _write("client", rec)


def server_event(event: str, **fields) -> None:
    """A server-side event with its wall-clock time (and, the first time in this process,
    a start-up event to the progress file: module docstring)."""
    if _DIR is not None:
        _write("server", {"event": event, "t": time.time(), **fields})
    if _PROGRESS is not None and event in PROGRESS_EVENTS and event not in _progress_written:
        _progress_written.add(event)
        _append_line(Path(_PROGRESS), {"event": event, "t": time.time(), **fields})


def _append_line(path: Path, rec: dict) -> None:
    line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:  # progress is a convenience: never fail a run for it
        return
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_progress(path: Path) -> list[dict]:
    """The progress events written so far to ``path`` (a torn last line is skipped)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("event"), str):
            out.append(rec)
    return out


def process_start_time() -> float:
    """Wall-clock time at which this process started (Linux: its start in clock ticks
    after boot, ``/proc/self/stat`` field 22, against ``/proc/uptime``; 10 ms
    resolution); ``nan`` where ``/proc`` is not there."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def read_records(directory: Path) -> tuple[list[dict], list[dict]]:
    """(client records, server events) written under ``directory``; a torn last line
    (a process killed while writing) is skipped."""
    clients: list[dict] = []
    server: list[dict] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        out = clients if path.name.startswith("client-") else server
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return clients, server
