"""A run's weight store from creation to removal: a directory made by ``mkdtemp`` under
``/dev/shm`` (else in the run's private home), marked with an owner record naming the PIDs
(and start times, and PID namespace) of the processes that own it; removed by the run's
teardown (:func:`remove_store`) or, once every owner has ended, by a later run
(:func:`remove_stale_stores`). Only a directory it can recognise is ever removed."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fedrcl_flwr.weights.entries import StoreError, open_regular
from fedrcl_flwr.weights.mappings import forget
from fedrcl_flwr.weights.store import WeightStore

SHM = Path("/dev/shm")
STORE_PREFIX = "fedrcl-flwr-store-"  # <prefix><pid>-<random>: mkdtemp under /dev/shm
STORE_MARKER = ".fedrcl-flwr-store"  # in a store: JSON {"pids", "namespace", "home"}


def create_store(owners: Sequence[int] = (), home: Path | str | None = None) -> WeightStore:
    """A new store of this run's own: a directory made by ``mkdtemp`` (an unpredictable
    name ``fedrcl-flwr-store-<pid>-<random>``, created exclusively, mode 0700) in
    ``/dev/shm``, else in ``home`` (the run's private home) or the system's temporary
    directory; marked with :data:`STORE_MARKER`, which names this process and the
    processes ``owners`` (a run: its watchdog) and ``home``. Stale stores of earlier runs
    are removed first (:func:`remove_stale_stores`). Raises ``OSError`` when none can be
    made. On any failure only the directory this call created is removed."""
    pids = [os.getpid(), *owners]
    parents = [SHM, Path(home) if home is not None else Path(tempfile.gettempdir())]
    last: OSError = OSError(f"cannot create a weight store in {SHM}")
    for parent in parents:
        remove_stale_stores(parent)
        try:
            root = Path(tempfile.mkdtemp(prefix=f"{STORE_PREFIX}{os.getpid()}-", dir=parent))
        except OSError as exc:
            last = exc
            continue
        try:  # mkdtemp made it (O_EXCL semantics): this directory is ours to remove
            _write_new(root / STORE_MARKER, _marker(pids, home))
            return WeightStore(root)
        except OSError as exc:
            last = exc
            shutil.rmtree(root, ignore_errors=True)
    raise last


def _marker(pids: Sequence[int], home: Path | str | None) -> bytes:
    owners = [[int(pid), process_start(int(pid))] for pid in pids]
    text = {"pids": owners, "namespace": pid_namespace(), "home": str(home or "")}
    return (json.dumps(text) + "\n").encode()


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_marker(directory: Path | str, name: str) -> dict | None:
    """The owner record ``name`` in ``directory`` (a real directory of this user holding
    it as a regular file of valid JSON with ``pids`` and ``namespace``), else ``None``."""
    d = Path(directory)
    try:
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        fd = open_regular(d / name, os.O_RDONLY, "marker")
        try:
            data = json.loads(os.read(fd, 1 << 16))
        finally:
            os.close(fd)
    except (OSError, StoreError, ValueError):
        return None
    ok = (
        isinstance(data, dict)
        and isinstance(data.get("namespace"), str)
        and isinstance(data.get("pids"), list)
        and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) for p in data["pids"])
    )
    return data if ok else None


def owners_gone(record: dict) -> bool:
    """Whether every process an owner record names has ended (a PID that now belongs to
    a process started at another time is another process). ``False`` for a record of
    another PID namespace (a container sharing the directory: its PIDs are not ours to
    judge) or when this process's namespace cannot be read."""
    ns = pid_namespace()
    if ns == "0" or record.get("namespace") != ns or not record["pids"]:
        return False
    return all(not _same_process(pid, start) for pid, start in record["pids"])


def remove_store(root: Path | str, home: Path | str | None = None) -> bool:
    """Delete the store ``root`` if it is one (a directory of this user carrying
    :data:`STORE_MARKER`, naming ``home`` when given); anything else is left alone.
    Returns whether it was removed."""
    record = read_marker(root, STORE_MARKER)
    if record is None or (home is not None and record.get("home") != str(home)):
        return False
    shutil.rmtree(root, ignore_errors=True)
    forget(root)
    return True


def stores_of(home: Path | str, parent: Path | str = SHM) -> list[Path]:
    """The stores in ``parent`` whose owner record names the private home ``home``."""
    try:
        entries = [e.path for e in os.scandir(parent) if e.name.startswith(STORE_PREFIX)]
    except OSError:
        return []
    out = []
    for path in entries:
        record = read_marker(path, STORE_MARKER)
        if record is not None and record.get("home") == str(home):
            out.append(Path(path))
    return out


def temporary_store() -> tuple[WeightStore, Path]:
    """A store of this process alone (the in-process runner, benchmarks): the store and
    its folder, to delete afterwards with :func:`remove_store`. A process killed before
    it deleted its store (SIGTERM and SIGKILL run no ``finally``) left it in ``/dev/shm``,
    in memory: the next call removes it (:func:`create_store`)."""
    store = create_store()
    return store, store.root


def remove_stale_stores(parent: Path | str) -> list[Path]:
    """Delete the stores in ``parent`` whose owners have all ended; returns them. Only
    what it can recognise: a directory of this user named ``fedrcl-flwr-store-...``
    carrying a valid :data:`STORE_MARKER` whose processes are all gone
    (:func:`owners_gone`: a live PID keeps its store, and so does a record of another
    PID namespace), holding nothing but regular files (the marker, the arena, entries,
    an entry being written)."""
    removed: list[Path] = []
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(STORE_PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        record = read_marker(entry.path, STORE_MARKER)
        if record is None or not owners_gone(record):
            continue
        try:
            if not all(f.is_file(follow_symlinks=False) for f in os.scandir(entry.path)):
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def pid_namespace() -> str:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``), or ``"0"``
    where it cannot be read (then no owner is ever judged gone)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return "0"
    digits = "".join(ch for ch in link if ch.isdigit())
    return digits or "0"


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, ``/proc/PID/stat`` field
    22), or ``None`` when there is no such process (or no ``/proc``)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _same_process(pid: int, start) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (``None``: the
    start was unknown; then any process with that PID counts)."""
    if pid <= 0:
        return True  # not a PID this module wrote: leave its directory
    now = process_start(pid)
    if now is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:  # exists, another user's
            return True
        return True
    return start is None or now == start
