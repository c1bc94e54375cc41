"""Model weights by reference inside one node: a store of immutable files, one per blob,
each named by its content hash (no Flower here; the translation to and from Flower's
messages is ``fedrcl_flwr/app/transport.py``).

Issue 30: in a simulation every message carried the whole model through Flower's message
path (serialised, copied into the SuperLink's object store, handed to a Ray actor, and the
same way back). With ``simulation.transport: shared`` the server writes the round's
weights once into this store and the message carries a small JSON *reference* (the
store, the hash, the layout: dtypes, shapes, offsets); a client maps the file read-only
with ``mmap``, re-hashes it, checks the layout and loads the arrays (read-only views of
the mapping, no copy). Uploads come back the same way and the strategy averages them
where they lie.

* **Where**: ``/dev/shm/<name of the run's private home>`` (:func:`create_store`): memory,
  visible to every process of the node, and unique per run because the private home is
  (``tempfile.mkdtemp``). Where ``/dev/shm`` is unusable, a folder inside the private
  home. The run's watchdog removes it with the home (:func:`remove_store`, also after a
  ``kill -9`` of the CLI).
* **Names**: the hex digest of XXH3-128 (``xxhash``) or, without it, SHA-256 of the whole
  file (header included). A reader re-hashes the whole file before using it, so a damaged,
  truncated or foreign entry is refused (:class:`StoreError`) and a stale entry can never
  be read as something else: the hash decides.
* **Publishing** (:meth:`WeightStore.publish`): the hash first (one read of the arrays),
  then, unless this process already wrote that entry, the file as a temporary name and one
  ``rename`` (atomic; no fsync: the file lives in memory and dies with the run).

File layout: ``MAGIC`` (8 bytes), the header's length (8 bytes, little-endian), the
header (JSON: the list of arrays as ``[dtype, shape, offset, nbytes]``), then each array's
C-order bytes at its offset (64-byte aligned).

**Slots** (:class:`Arena`): a file per entry costs, on every round, the kernel's page
allocation when it is written and a page fault per 4 KiB page in each process that maps
it (tmpfs; ~24 ms and ~9 ms per 42 MiB entry on a quiet 2-core machine, several times
that under load). So the server also creates, once, one preallocated file ``arena`` in
the store, cut into equal slots (the entry's size rounded up to a page): a ring of
:data:`GLOBAL_SLOTS` for the models it sends and two sets of one slot per client of a
round for the uploads (round parity). Every process maps the arena once and keeps the
mapping (a writer also a writable one); a writer copies an entry into a slot, whose pages
already exist, and hashes each piece right after copying it. An entry in a slot has the
same layout and the same hash check as a file (its reference adds ``offset``),
but a slot is reused: a global model's slot two rounds later (after ``GLOBAL_SLOTS``
more sends), an upload's slot two rounds later. A reader that re-reads a slot after that
is refused by the hash (a client more than a round late); what it mapped and checked in
time is what it trains on.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import shutil
import struct
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from itertools import count
from pathlib import Path

import numpy as np

try:  # XXH3-128: ~20x faster than SHA-256; a soft dependency
    import xxhash

    HASH_ALGO = "xxh3_128"
except ImportError:  # pragma: no cover - exercised only without xxhash
    xxhash = None  # type: ignore[assignment]
    HASH_ALGO = "sha256"

SHM = Path("/dev/shm")
MAGIC = b"FRCLWS01"
ALIGN = 64
ARENA = "arena"  # a store's file of slots (Arena)
PAGE = 4096
PIECE = 1 << 18  # bytes copied (and hashed) at a time into a slot: stays in the cache
GLOBAL_SLOTS = 4  # the server's sends kept readable: two rounds of FedACG's look-ahead + model
_HEX = {"xxh3_128": 32, "sha256": 64}
_counter = count()


class StoreError(ValueError):
    """A reference or store entry that cannot be used (one line: which and why)."""


def _hasher(algo: str = HASH_ALGO):
    if algo == "xxh3_128":
        if xxhash is None:
            raise StoreError("the entry is named by XXH3-128 but xxhash is not installed")
        return xxhash.xxh3_128()
    if algo == "sha256":
        return hashlib.sha256()
    raise StoreError(f"unknown hash algorithm {algo!r}")


def _pad(n: int) -> int:
    return -n % ALIGN


def _layout(arrays: Sequence[np.ndarray]) -> tuple[bytes, list]:
    """The file's head (magic, length, JSON header, padding) and the layout."""
    entries: list = []
    # offsets are relative to the end of the head; fixed up once its size is known
    pos = 0
    for a in arrays:
        entries.append([a.dtype.str, list(a.shape), pos, int(a.nbytes)])
        pos += int(a.nbytes) + _pad(int(a.nbytes))
    # the head's size depends on the offsets' digits: iterate until stable
    base = 0
    while True:
        layout = [[d, s, base + o, n] for d, s, o, n in entries]
        header = json.dumps(layout, separators=(",", ":")).encode()
        head_len = len(MAGIC) + 8 + len(header)
        new_base = head_len + _pad(head_len)
        if new_base == base:
            head = MAGIC + struct.pack("<Q", len(header)) + header + b"\0" * _pad(head_len)
            return head, layout
        base = new_base


def _contiguous(arrays) -> list[np.ndarray]:
    out = []
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.hasobject:
            raise ValueError("object arrays cannot be stored (they would need pickle)")
        out.append(a if a.flags.c_contiguous else np.ascontiguousarray(a))
    return out


def _chunks(head: bytes, arrays: list[np.ndarray]):
    yield head
    for a in arrays:
        if a.nbytes:
            yield memoryview(a.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        p = _pad(int(a.nbytes))
        if p:
            yield b"\0" * p


class Entry:
    """``arrays`` as a store entry: its head, layout and size (from the layout, without
    reading the arrays), its content hash, and :meth:`chunks`, its bytes in order without
    copying the arrays. The hash is computed on first use of :attr:`hash` (one read of
    the arrays), or while :meth:`WeightStore.publish_in_slot` copies the entry into its
    slot (the bytes hashed are then the slot's, still in the cache)."""

    def __init__(self, arrays: Sequence):
        self.arrays = _contiguous(arrays)
        self.head, self.layout = _layout(self.arrays)
        last = self.layout[-1] if self.layout else None
        self.size = len(self.head) if last is None else last[2] + last[3] + _pad(last[3])
        self._hash: str | None = None

    @property
    def hash(self) -> str:
        if self._hash is None:
            h = _hasher()
            for c in self.chunks():
                h.update(c)
            self._hash = h.hexdigest()
        return self._hash

    def chunks(self):
        return _chunks(self.head, self.arrays)

    def reference(self, root: Path, offset: int | None = None) -> dict:
        ref = {
            "store": str(root),
            "hash": self.hash,
            "algo": HASH_ALGO,
            "size": self.size,
            "arrays": self.layout,
        }
        if offset is not None:
            ref["offset"] = offset
        return ref


class WeightStore:
    """One run's store: a folder of entries named by their content hash, and its
    :class:`Arena` of slots when the server made one."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._written: set[str] = set()  # entries this process wrote (publish skips them)

    def path(self, name: str) -> Path:
        return self.root / name

    def publish(self, arrays: Sequence) -> dict:
        """Write ``arrays`` as one entry (unless this process already wrote it); return
        its reference (a JSON-able dict). Raises ``OSError`` when the store cannot be
        written (the caller falls back to Flower's messages for this message)."""
        entry = Entry(arrays)
        target = self.path(entry.hash)
        if entry.hash not in self._written or not target.exists():
            tmp = self.root / f".tmp-{os.getpid()}-{next(_counter)}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    with os.fdopen(fd, "wb", buffering=0, closefd=True) as fh:
                        for c in entry.chunks():
                            fh.write(c)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
                os.rename(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            self._written.add(entry.hash)
        return entry.reference(self.root)

    def publish_in_slot(self, entry: Entry, offset: int, capacity: int) -> dict:
        """Copy ``entry`` into the arena's slot at ``offset`` (``capacity`` bytes), through
        this process's writable mapping of the arena (kept: the slot's pages are mapped
        once per process), and return its reference. An entry not hashed yet is hashed
        piece by piece right after each piece is copied (the copy is then the one read of
        the arrays). ``OSError`` when the arena cannot be written; :class:`StoreError`
        when the entry does not fit (the caller writes a file)."""
        if entry.size > capacity:
            raise StoreError(f"an entry of {entry.size} bytes does not fit a {capacity}-byte slot")
        writer = _arena_writer(self.root / ARENA)
        mm = writer.mm
        if offset + capacity > len(mm):
            raise StoreError("the slot lies outside the arena")
        writer.populate_once(offset, capacity)
        h = _hasher() if entry._hash is None else None
        slot = np.frombuffer(mm, dtype=np.uint8, count=entry.size, offset=offset)
        try:
            pos = 0
            for c in entry.chunks():
                src = np.frombuffer(c, dtype=np.uint8)
                for start in range(0, src.size, PIECE):
                    piece = src[start : start + PIECE]
                    dst = slot[pos : pos + piece.size]
                    np.copyto(dst, piece)
                    if h is not None:
                        h.update(dst)
                    pos += piece.size
        finally:
            del slot
        if h is not None:
            entry._hash = h.hexdigest()
        return entry.reference(self.root, offset)

    def remove(self, ref: dict) -> None:
        """Delete the entry of ``ref`` (a reader that mapped it keeps its mapping)."""
        name = str(ref.get("hash", ""))
        if _name_ok(name, str(ref.get("algo", ""))):
            self._written.discard(name)
            try:
                self.path(name).unlink()
            except FileNotFoundError:
                pass

    def entries(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()) if self.root.exists() else []


def _name_ok(name: str, algo: str) -> bool:
    return algo in _HEX and len(name) == _HEX[algo] and re.fullmatch(r"[0-9a-f]+", name) is not None


def check_reference(ref) -> dict:
    """``ref`` as a checked dict, or :class:`StoreError` naming what is wrong."""
    if not isinstance(ref, dict):
        raise StoreError("a weight reference must be a JSON object")
    for key, typ in (("store", str), ("hash", str), ("algo", str), ("size", int), ("arrays", list)):
        if not isinstance(ref.get(key), typ):
            raise StoreError(f"a weight reference needs '{key}' ({typ.__name__})")
    if not _name_ok(ref["hash"], ref["algo"]):
        raise StoreError(f"weight reference: {ref['hash']!r} is not a {ref['algo']} digest")
    if not os.path.isabs(ref["store"]):
        raise StoreError(f"weight reference: store {ref['store']!r} is not an absolute path")
    if "offset" in ref and not (
        isinstance(ref["offset"], int)
        and not isinstance(ref["offset"], bool)
        and ref["offset"] >= 0
    ):
        raise StoreError("weight reference: 'offset' must be a whole number >= 0")
    return ref


def _map_file(path: Path, short: str, size: int | None = None) -> mmap.mmap:
    """A read-only mapping of the whole file ``path``; ``size``: the bytes the entry's
    reference says it has (checked; ``None`` for the arena)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise StoreError(
            f"weight store entry {short}: cannot open {path} ({exc.strerror})"
        ) from None
    try:
        actual = os.fstat(fd).st_size
        if size is not None and actual != size:
            raise StoreError(
                f"weight store entry {short}: {actual} bytes, the reference says {size} "
                "(truncated or foreign)"
            )
        if actual == 0:
            raise StoreError(f"weight store entry {short}: empty")
        return mmap.mmap(fd, actual, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def load(ref) -> list[np.ndarray]:
    """The arrays of the entry ``ref`` names: read-only views of its mapping (its file's,
    or the arena's, kept by this process), after its header matched the reference and
    its bytes were re-hashed. A missing, truncated, damaged, overwritten or foreign entry
    raises :class:`StoreError` (one line)."""
    arrays, check = open_entry(ref)
    check.finish()
    return arrays


def open_entry(ref) -> tuple[list[np.ndarray], HashCheck]:
    """:func:`load` with the hash left to the caller: the arrays (views) and the
    entry's :class:`HashCheck`, which the caller feeds as it reads the arrays and
    finishes before it uses what it computed from them (the server's average reads
    each upload once for both)."""
    ref = check_reference(ref)
    short = ref["hash"][:12]
    size = ref["size"]
    if "offset" in ref:
        mm = _arena_map(Path(ref["store"]) / ARENA, short)
        base = ref["offset"]
        if base + size > len(mm):
            raise StoreError(f"weight store entry {short}: its slot lies outside the arena")
    else:
        mm = _map_file(Path(ref["store"]) / ref["hash"], short, size)
        base = 0
    view = memoryview(mm)[base : base + size]
    try:
        if bytes(view[: len(MAGIC)]) != MAGIC or size < len(MAGIC) + 8:
            raise StoreError(
                f"weight store entry {short}: not a weight store file "
                f"({_overwritten_or(ref, 'damaged or foreign')})"
            )
        (hlen,) = struct.unpack("<Q", view[len(MAGIC) : len(MAGIC) + 8])
        try:
            layout = json.loads(bytes(view[len(MAGIC) + 8 : len(MAGIC) + 8 + hlen]))
        except ValueError:
            raise StoreError(
                f"weight store entry {short}: unreadable header "
                f"({_overwritten_or(ref, 'damaged or foreign')})"
            ) from None
        if layout != ref["arrays"]:
            raise StoreError(
                f"weight store entry {short}: its layout differs from the reference's "
                f"({_overwritten_or(ref, 'damaged or foreign')})"
            )
    finally:
        view.release()
    out = []
    for dtype, shape, offset, nbytes in layout:
        dt = np.dtype(dtype)
        if dt.hasobject or offset + nbytes > size:
            raise StoreError(f"weight store entry {short}: bad array entry in its header")
        n = int(np.prod(shape, dtype=np.int64))
        if n * dt.itemsize != nbytes:
            raise StoreError(f"weight store entry {short}: array size does not match its shape")
        out.append(np.frombuffer(mm, dtype=dt, count=n, offset=base + offset).reshape(shape))
    return out, HashCheck(ref, mm, base)


def _overwritten_or(ref: dict, otherwise: str) -> str:
    return (
        "damaged, or its slot was written again since: a reader more than a round late"
        if "offset" in ref
        else otherwise
    )


class HashCheck:
    """The content hash of one entry, computed as its reader goes: :meth:`upto` hashes
    the entry's bytes from where it stopped to the end of what the reader has just read
    (``array``'s first ``stop`` elements: the bytes before the array, head or padding,
    come with it), :meth:`finish` the rest, then compares with the entry's name
    (:class:`StoreError` when they differ)."""

    def __init__(self, ref: dict, mm, base: int):
        self.ref = ref
        self._mm = mm
        self._base = base
        self._pos = 0  # bytes of the entry hashed so far
        self._hasher = _hasher(ref["algo"])

    def upto(self, array: int, stop: int) -> None:
        dtype, _, offset, _ = self.ref["arrays"][array]
        self._hash_to(offset + stop * np.dtype(dtype).itemsize)

    def _hash_to(self, end: int) -> None:
        if end > self._pos:
            view = memoryview(self._mm)[self._base + self._pos : self._base + end]
            self._hasher.update(view)
            view.release()
            self._pos = end

    def finish(self) -> None:
        self._hash_to(self.ref["size"])
        if self._hasher.hexdigest() != self.ref["hash"]:
            why = _overwritten_or(self.ref, "damaged or foreign")
            raise StoreError(
                f"weight store entry {self.ref['hash'][:12]}: its content does not hash to "
                f"its name ({why})"
            )


# ------------------------------------------------------------------ the arena's slots
_MAPS: OrderedDict = OrderedDict()  # arena path -> (inode, read-only mapping): kept
_WRITERS: OrderedDict = OrderedDict()  # arena path -> (inode, _Writer): kept
_KEEP_OPEN = 4  # arenas per process (a process serves one run; tests make many)


def _cached(cache: OrderedDict, path: Path, open_fn, close_fn):
    """``cache``'s handle of ``path``, (re)opened when the file there is another one."""
    try:
        ino = os.stat(path).st_ino
    except OSError:
        ino = None
    key = str(path)
    if key in cache and cache[key][0] == ino:
        cache.move_to_end(key)
        return cache[key][1]
    if key in cache:
        close_fn(cache.pop(key)[1])
    handle = open_fn()
    cache[key] = (ino, handle)
    while len(cache) > _KEEP_OPEN:
        close_fn(cache.popitem(last=False)[1][1])
    return handle


def _arena_map(path: Path, short: str) -> mmap.mmap:
    # an old mapping is left to the garbage collector (arrays may still view it)
    return _cached(_MAPS, path, lambda: _map_file(path, short), lambda mm: None)


def _arena_writer(path: Path) -> _Writer:
    def open_writer() -> _Writer:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        try:
            return _Writer(mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_WRITE))
        finally:
            os.close(fd)

    return _cached(_WRITERS, path, open_writer, lambda w: _close_map(w.mm))


MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14


class _Writer:
    """A process's writable mapping of an arena, and the regions it has mapped in."""

    def __init__(self, mm: mmap.mmap):
        self.mm = mm
        self.populated: set[int] = set()  # start offsets of the regions mapped in

    def populate_once(self, offset: int, capacity: int) -> None:
        """Map, in one call, every page of the arena's region that holds the slot at
        ``offset`` (the server's ring, or the upload slots), the first time this process
        writes into that region: otherwise each slot's first write in each process
        faults its pages in one by one (~13 ms per 42 MiB slot on the 2-core machine, for
        every upload slot in every actor over a run's first rounds); the same pages,
        paid at once at the start. Where the kernel cannot (before 5.14), the faults
        stay lazy."""
        ring = GLOBAL_SLOTS * capacity
        start, stop = (0, ring) if offset < ring else (ring, len(self.mm))
        if start in self.populated or stop <= start:
            return
        self.populated.add(start)
        try:
            self.mm.madvise(MADV_POPULATE_WRITE, start, stop - start)
        except (OSError, ValueError):
            pass


def _close_map(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:  # still viewed: the garbage collector unmaps it later
        pass


class Arena:
    """The slots of a store's ``arena`` file: ``slot_size`` bytes each, first a ring of
    :data:`GLOBAL_SLOTS` for what the server sends, then two sets of ``uploads`` slots
    (one per client of a round; even and odd rounds alternate) for what clients send
    back. Made once by the server (:meth:`create`); the offsets travel in the
    references."""

    def __init__(self, root: Path, slot_size: int, uploads: int):
        self.root = Path(root)
        self.slot_size = slot_size
        self.uploads = uploads
        self._next_global = 0

    @classmethod
    def create(cls, store: WeightStore, entry_size: int, uploads: int) -> Arena | str:
        """The arena for entries of ``entry_size`` bytes and ``uploads`` clients per
        round, its space reserved now (``posix_fallocate``: a full disk is an error here,
        never a fault later); or, as a string, why there is none (the store then writes
        a file per entry, as without an arena)."""
        slot = -(-entry_size // PAGE) * PAGE
        total = slot * (GLOBAL_SLOTS + 2 * uploads)
        st = os.statvfs(store.root)
        free = st.f_bavail * st.f_frsize
        if total > free // 2:
            return (
                f"{total / 2**20:.0f} MiB of slots would take more than half of the "
                f"{free / 2**20:.0f} MiB free in {store.root}"
            )
        path = store.root / ARENA
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, total)
        except OSError as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            return f"cannot reserve {total / 2**20:.0f} MiB in {store.root} ({exc.strerror})"
        os.close(fd)
        return cls(store.root, slot, uploads)

    def next_global_offset(self) -> int:
        """The ring's next slot (a send overwrites the one :data:`GLOBAL_SLOTS` sends ago)."""
        offset = self._next_global * self.slot_size
        self._next_global = (self._next_global + 1) % GLOBAL_SLOTS
        return offset

    def upload_offset(self, run_round: int, index: int) -> int | None:
        """The slot of the ``index``-th client of round ``run_round`` (``None``: more
        clients than the arena has slots for; that client writes a file)."""
        if not 0 <= index < self.uploads:
            return None
        return (GLOBAL_SLOTS + (run_round % 2) * self.uploads + index) * self.slot_size


# ------------------------------------------------------------------ a run's store
def store_dir(home: Path | str) -> Path:
    """Where the store of the run whose private home is ``home`` lives."""
    return SHM / Path(home).name


def create_store(home: Path | str) -> WeightStore:
    """The store of the run whose private home is ``home``: ``/dev/shm/<home's name>``,
    or ``<home>/weights`` where ``/dev/shm`` is unusable. Raises ``OSError`` when
    neither can be made."""
    home = Path(home)
    for root in (store_dir(home), home / "weights"):
        try:
            root.mkdir(mode=0o700)
            probe = root / ".probe"
            probe.write_bytes(b"x")
            probe.unlink()
            return WeightStore(root)
        except OSError as exc:
            last = exc
            shutil.rmtree(root, ignore_errors=True)
    raise last


def remove_store(home: Path | str) -> None:
    """Delete the store of the run whose private home is ``home`` (the one in the home
    goes with the home)."""
    shutil.rmtree(store_dir(home), ignore_errors=True)


def forget(root: Path | str) -> None:
    """Drop this process's kept mappings of the arena under ``root`` (the writable one
    is closed; the read-only one goes once no array views it), so that a removed store's
    memory is given back (the in-process runner, which outlives its runs)."""
    key = str(Path(root) / ARENA)
    if key in _WRITERS:
        _close_map(_WRITERS.pop(key)[1].mm)
    _MAPS.pop(key, None)


def temporary_store(prefix: str = "fedrcl-flwr-store-") -> tuple[WeightStore, Path]:
    """A store with a fresh unique name (the in-process runner, benchmarks): the store
    and the folder to delete afterwards (under ``/dev/shm`` when usable).

    The name carries this process's PID and PID namespace (``<prefix><pid>-<namespace>-
    <random>``): a process killed before it deleted its store (SIGTERM and SIGKILL run no
    ``finally``) left a folder in ``/dev/shm``, that is in memory, which the next call
    with the same prefix removes (:func:`remove_stale_stores`)."""
    owned = f"{prefix}{os.getpid()}-{_pid_namespace()}-"
    for parent in (SHM, Path(tempfile.gettempdir())):
        remove_stale_stores(parent, prefix)
        try:
            return WeightStore(root := Path(tempfile.mkdtemp(prefix=owned, dir=parent))), root
        except OSError:
            continue
    raise OSError(f"cannot create a weight store in {SHM} or {tempfile.gettempdir()}")


def remove_stale_stores(parent: Path, prefix: str) -> list[Path]:
    """Delete the stores :func:`temporary_store` made in ``parent`` for processes that no
    longer exist; returns them. Only what it can recognise: a folder of this user named
    ``<prefix><pid>-<namespace>-<random>`` whose process is gone, holding nothing but
    regular files (an arena, entries, an entry being written). A live PID (even a reused
    one) keeps its folder, and so does one of another PID namespace (a container sharing
    ``/dev/shm``, whose PIDs this process cannot see)."""
    removed: list[Path] = []
    namespace = _pid_namespace()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        pid_text, _, rest = entry.name[len(prefix) :].partition("-")
        ns_text, dash, _ = rest.partition("-")
        if not (entry.name.startswith(prefix) and dash and pid_text.isdigit()):
            continue
        if namespace == "0" or ns_text != namespace:
            continue
        if _alive(int(pid_text)):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            if not all(f.is_file(follow_symlinks=False) for f in os.scandir(entry.path)):
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def _pid_namespace() -> str:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``), or ``"0"``
    where it cannot be read (then no store is ever judged stale)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return "0"
    digits = "".join(ch for ch in link if ch.isdigit())
    return digits or "0"


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a PID this module wrote: leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's
        return True
    return True
