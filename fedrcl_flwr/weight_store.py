"""Model weights by reference inside one node: a store of immutable files, one per blob,
each named by its content hash (no Flower here; the translation to and from Flower's
messages is ``fedrcl_flwr/app/wire/transport.py``).

In a simulation Flower's messages carry the whole model (serialised, copied into the
SuperLink's object store, handed to a Ray actor, and the same way back). With
``simulation.transport: shared`` the server writes the round's weights once into this
store and the message carries a small JSON *reference* (the store, the hash, the layout:
dtypes, shapes, offsets); a client maps the file read-only with ``mmap``, checks the
layout, and copies the arrays into its model while it hashes them. Uploads come back the
same way and the strategy averages them from where they lie, hashing each piece it
averages.

* **Where**: a directory of the run's own (:func:`create_store`), made by ``mkdtemp``
  (an unpredictable name, created exclusively, mode 0700) under ``/dev/shm`` (memory,
  visible to every process of the node) or, where ``/dev/shm`` is unusable, inside the
  run's private home; it is marked (:data:`STORE_MARKER`: the PIDs of the processes that
  own it), and only a marked directory is ever removed: by the run's teardown
  (:func:`remove_store`, also after a ``kill -9`` of the CLI) or, once every PID it names
  is gone, by a later run (:func:`remove_stale_stores`).
* **Names**: the hex digest of XXH3-128 (``xxhash``) or, without it, SHA-256 of the whole
  file (header included). A reader copies the entry out of the store and hashes what it
  copied, in one pass (:func:`read_entry`; the server's average: :class:`HashCheck`), on
  every read, so that the bytes it uses are the bytes that hashed to the name: a damaged,
  truncated, rewritten or foreign entry is refused (:class:`StoreError`), and so is
  anything in the store that is not a regular file (a FIFO, a device, a link: opened
  with ``O_NOFOLLOW | O_NONBLOCK``, checked with ``fstat``, never waited on).
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
more sends), an upload's slot two rounds later. A reader that reads a slot after that is
refused by the hash (a client more than a round late); what it copied and checked in time
is what it trains on. The server checks a slot it would send again (the same model)
before it does (:func:`intact`) and writes the model afresh when the slot no longer holds
it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import re
import shutil
import stat
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
        """Write ``arrays`` as one entry (unless this process already wrote it and it is
        still intact there: :func:`intact`); return its reference (a JSON-able dict).
        Raises ``OSError`` when the store cannot be written (the caller falls back to
        Flower's messages for this message)."""
        entry = Entry(arrays)
        target = self.path(entry.hash)
        if entry.hash not in self._written or not intact(entry.reference(self.root)):
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


def open_regular(path: Path | str, flags: int, what: str) -> int:
    """A file descriptor of ``path``, which must be a regular file: opened with
    ``O_NOFOLLOW | O_NONBLOCK`` (a link is refused, a FIFO or a device is never waited
    on) and checked with ``fstat``. :class:`StoreError` (one line naming ``what``)
    otherwise."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise StoreError(f"{what}: cannot open {path} ({why})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StoreError(f"{what}: {path} is {_kind(mode)}, not a regular file")
    return fd


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _map_file(path: Path, short: str, size: int | None = None) -> mmap.mmap:
    """A read-only mapping of the whole regular file ``path``; ``size``: the bytes the
    entry's reference says it has (checked; ``None`` for the arena)."""
    fd = open_regular(path, os.O_RDONLY, f"weight store entry {short}")
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


def _entry_mapping(ref: dict) -> tuple[mmap.mmap, int]:
    """The mapping that holds the entry of the checked reference ``ref`` and where the
    entry starts in it (the arena's kept mapping and the slot's offset, or the entry's
    own file)."""
    short, size = ref["hash"][:12], ref["size"]
    if "offset" in ref:
        mm = _arena_map(Path(ref["store"]) / ARENA, short)
        if ref["offset"] + size > len(mm):
            raise StoreError(f"weight store entry {short}: its slot lies outside the arena")
        return mm, ref["offset"]
    return _map_file(Path(ref["store"]) / ref["hash"], short, size), 0


def _private_head(ref: dict, mm, base: int) -> tuple[bytes, list]:
    """The entry's head (magic, length, JSON header) copied out of the mapping, and the
    layout it holds, checked against the reference's (the caller hashes the copy)."""
    short, size = ref["hash"][:12], ref["size"]
    damaged = _overwritten_or(ref, "damaged or foreign")
    start = bytes(mm[base : base + min(size, len(MAGIC) + 8)])
    if size < len(MAGIC) + 8 or start[: len(MAGIC)] != MAGIC:
        raise StoreError(f"weight store entry {short}: not a weight store file ({damaged})")
    (hlen,) = struct.unpack("<Q", start[len(MAGIC) :])
    if hlen > size - len(start):
        raise StoreError(f"weight store entry {short}: unreadable header ({damaged})")
    header = bytes(mm[base + len(start) : base + len(start) + hlen])
    try:
        layout = json.loads(header)
    except ValueError:
        raise StoreError(f"weight store entry {short}: unreadable header ({damaged})") from None
    if layout != ref["arrays"]:
        raise StoreError(
            f"weight store entry {short}: its layout differs from the reference's ({damaged})"
        )
    pos = len(start) + hlen
    for dtype, shape, offset, nbytes in layout:
        try:
            dt = np.dtype(dtype)
            n = int(np.prod(shape, dtype=np.int64))
        except (TypeError, ValueError):
            raise StoreError(f"weight store entry {short}: bad array entry in its header") from None
        if dt.hasobject or offset < pos or offset + nbytes > size:
            raise StoreError(f"weight store entry {short}: bad array entry in its header")
        if n * dt.itemsize != nbytes:
            raise StoreError(f"weight store entry {short}: array size does not match its shape")
        pos = offset + nbytes
    return start + header, layout


def load(ref) -> list[np.ndarray]:
    """The arrays of the entry ``ref`` names, as this process's own read-only copies
    (:func:`read_entry`). A missing, truncated, damaged, overwritten or foreign entry, or
    one that is not a regular file, raises :class:`StoreError` (one line)."""
    return read_entry(ref)


def read_entry(ref, into: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
    """The arrays of the entry ``ref`` names, copied out of the store and hashed as they
    are copied (one pass): the hash is computed over the copy, so the arrays returned
    are exactly the bytes that hashed to the entry's name, whatever happens to the store
    afterwards. ``into[i]`` (optional): where array ``i`` goes (a writable C-contiguous
    array of its dtype and shape, e.g. a model's tensor; the copy then goes straight
    there); any other array is copied into a new read-only array. :class:`StoreError`
    (one line) when the hash or the layout does not match: what was written into
    ``into`` must then not be used."""
    ref = check_reference(ref)
    mm, base = _entry_mapping(ref)
    head, layout = _private_head(ref, mm, base)
    hasher = _hasher(ref["algo"])
    hasher.update(head)
    pos, out = len(head), []
    for i, (dtype, shape, offset, nbytes) in enumerate(layout):
        _hash_mapped(hasher, mm, base + pos, base + offset)  # padding: never used
        dt = np.dtype(dtype)
        dst = into[i] if into is not None and i < len(into) else None
        fresh = not _fits(dst, dt, shape)
        if fresh:
            dst = np.empty(shape, dt)
        assert dst is not None
        _copy_hashing(hasher, mm, base + offset, nbytes, dst)
        if fresh:
            dst.flags.writeable = False
        out.append(dst)
        pos = offset + nbytes
    _hash_mapped(hasher, mm, base + pos, base + ref["size"])
    if hasher.hexdigest() != ref["hash"]:
        raise StoreError(
            f"weight store entry {ref['hash'][:12]}: its content does not hash to its name "
            f"({_overwritten_or(ref, 'damaged or foreign')})"
        )
    return out


def _fits(dst, dt: np.dtype, shape) -> bool:
    return (
        isinstance(dst, np.ndarray)
        and dst.dtype == dt
        and dst.shape == tuple(shape)
        and dst.flags.c_contiguous
        and dst.flags.writeable
    )


def _copy_hashing(hasher, mm, start: int, nbytes: int, dst: np.ndarray) -> None:
    """Copy ``nbytes`` of the mapping from ``start`` into ``dst``, :data:`PIECE` bytes
    at a time, each piece hashed from ``dst`` right after it was copied (still in the
    cache)."""
    if not nbytes:
        return
    src = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=start)
    flat = dst.reshape(-1).view(np.uint8)
    for a in range(0, nbytes, PIECE):
        piece = flat[a : a + PIECE]
        np.copyto(piece, src[a : a + PIECE])
        hasher.update(piece)


def _hash_mapped(hasher, mm, start: int, stop: int) -> None:
    if stop > start:
        view = memoryview(mm)[start:stop]
        hasher.update(view)
        view.release()


def intact(ref) -> bool:
    """Whether the entry ``ref`` names is still in the store as written (its head
    matches and its bytes hash to its name); reads only (the server, before it sends a
    slot again)."""
    try:
        ref = check_reference(ref)
        mm, base = _entry_mapping(ref)
        head, _ = _private_head(ref, mm, base)
        hasher = _hasher(ref["algo"])
        hasher.update(head)
        _hash_mapped(hasher, mm, base + len(head), base + ref["size"])
        return hasher.hexdigest() == ref["hash"]
    except (OSError, StoreError):
        return False


def open_entry(ref) -> tuple[list[np.ndarray], HashCheck]:
    """The entry ``ref`` names for a reader that copies it out piece by piece itself
    (the server's average): the arrays as views of the mapping, for their shapes and
    dtypes only, and the entry's :class:`HashCheck`, through which every value must be
    read (:meth:`HashCheck.take`) and which the reader finishes before it uses what it
    computed from them. Never read the views' values: they are not checked."""
    ref = check_reference(ref)
    mm, base = _entry_mapping(ref)
    head, layout = _private_head(ref, mm, base)
    out = [
        np.frombuffer(
            mm, dtype=np.dtype(d), count=int(np.prod(s, dtype=np.int64)), offset=base + o
        ).reshape(s)
        for d, s, o, _ in layout
    ]
    return out, HashCheck(ref, mm, base, head)


def _overwritten_or(ref: dict, otherwise: str) -> str:
    return (
        "damaged, or its slot was written again since: a reader more than a round late"
        if "offset" in ref
        else otherwise
    )


class HashCheck:
    """The content hash of one entry, computed as its reader copies it out:
    :meth:`take` copies elements ``start:stop`` of an array into this check's own
    buffer and hashes that copy (the bytes the entry holds before them, head or padding,
    are hashed from the store: they are never used); the reader uses only what
    :meth:`take` returns, in the entry's order. :meth:`finish` hashes the rest and
    compares with the entry's name (:class:`StoreError` when they differ)."""

    def __init__(self, ref: dict, mm, base: int, head: bytes):
        self.ref = ref
        self._mm = mm
        self._base = base
        self._hasher = _hasher(ref["algo"])
        self._hasher.update(head)
        self._pos = len(head)  # bytes of the entry hashed so far
        self._buffer = np.empty(0, np.uint8)

    def take(self, array: int, start: int, stop: int) -> np.ndarray:
        """Elements ``start:stop`` of array ``array`` (flat), copied out of the store and
        hashed; valid until the next call. Calls must follow the entry's order."""
        dtype, _, offset, _ = self.ref["arrays"][array]
        dt = np.dtype(dtype)
        first, last = offset + start * dt.itemsize, offset + stop * dt.itemsize
        if first < self._pos:
            raise ValueError("HashCheck.take: pieces must be taken in the entry's order")
        _hash_mapped(self._hasher, self._mm, self._base + self._pos, self._base + first)
        n = last - first
        if self._buffer.size < n:
            self._buffer = np.empty(n, np.uint8)
        piece = self._buffer[:n]
        if n:
            np.copyto(piece, np.frombuffer(self._mm, np.uint8, count=n, offset=self._base + first))
            self._hasher.update(piece)
        self._pos = last
        return piece.view(dt)

    def finish(self) -> None:
        _hash_mapped(self._hasher, self._mm, self._base + self._pos, self._base + self.ref["size"])
        self._pos = self.ref["size"]
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
        ino = os.lstat(path).st_ino  # a link put there is another file: opened (and refused)
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
        fd = open_regular(path, os.O_RDWR, "weight store arena")
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


def forget(root: Path | str) -> None:
    """Drop this process's kept mappings of the arena under ``root`` (the writable one
    is closed; the read-only one goes once no array views it), so that a removed store's
    memory is given back (the in-process runner, which outlives its runs)."""
    key = str(Path(root) / ARENA)
    if key in _WRITERS:
        _close_map(_WRITERS.pop(key)[1].mm)
    _MAPS.pop(key, None)


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
