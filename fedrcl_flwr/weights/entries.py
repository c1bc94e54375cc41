"""A weight store entry as bytes: the file layout (``MAGIC``, the header's length, the JSON
header of ``[dtype, shape, offset, nbytes]``, each array's C-order bytes 64-byte aligned),
its content hash (XXH3-128, or SHA-256 without ``xxhash``) and the reference that names it
(:class:`Entry`); the checks every reader makes before it maps anything: of a reference
(:func:`check_reference`) and of the file (a regular file, opened without following a link
or waiting on a FIFO: :func:`open_regular`, :func:`map_file`). The package's docstring
(:mod:`fedrcl_flwr.weights`) tells the whole design."""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import re
import stat
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedrcl_flwr.errors import file_mode_kind

try:  # XXH3-128: ~20x faster than SHA-256; a soft dependency
    import xxhash

    HASH_ALGO = "xxh3_128"
except ImportError:  # pragma: no cover - exercised only without xxhash
    xxhash = None  # type: ignore[assignment]
    HASH_ALGO = "sha256"

MAGIC = b"FRCLWS01"
ALIGN = 64
ARENA = "arena"  # a store's file of slots (Arena)
PAGE = 4096
PIECE = 1 << 18  # bytes copied (and hashed) at a time into a slot: stays in the cache
GLOBAL_SLOTS = 4  # the server's sends kept readable: two rounds of FedACG's look-ahead + model
_HEX = {"xxh3_128": 32, "sha256": 64}


class StoreError(ValueError):
    """A reference or store entry that cannot be used (one line: which and why)."""


def new_hasher(algo: str = HASH_ALGO):
    if algo == "xxh3_128":
        if xxhash is None:
            raise StoreError("the entry is named by XXH3-128 but xxhash is not installed")
        return xxhash.xxh3_128()
    if algo == "sha256":
        return hashlib.sha256()
    raise StoreError(f"unknown hash algorithm {algo!r}")


def padding(n: int) -> int:
    return -n % ALIGN


def _layout(arrays: Sequence[np.ndarray]) -> tuple[bytes, list]:
    """The file's head (magic, length, JSON header, padding) and the layout."""
    entries: list = []
    # offsets are relative to the end of the head; fixed up once its size is known
    pos = 0
    for a in arrays:
        entries.append([a.dtype.str, list(a.shape), pos, int(a.nbytes)])
        pos += int(a.nbytes) + padding(int(a.nbytes))
    # the head's size depends on the offsets' digits: iterate until stable
    base = 0
    while True:
        layout = [[d, s, base + o, n] for d, s, o, n in entries]
        header = json.dumps(layout, separators=(",", ":")).encode()
        head_len = len(MAGIC) + 8 + len(header)
        new_base = head_len + padding(head_len)
        if new_base == base:
            head = MAGIC + struct.pack("<Q", len(header)) + header + b"\0" * padding(head_len)
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
        p = padding(int(a.nbytes))
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
        self.size = len(self.head) if last is None else last[2] + last[3] + padding(last[3])
        self._hash: str | None = None

    @property
    def hashed(self) -> bool:
        """Whether :attr:`hash` is known already (computed, or recorded by a copy)."""
        return self._hash is not None

    def record_hash(self, digest: str) -> None:
        """The hash of this entry's bytes, computed by whoever copied them (the slot copy
        of :meth:`WeightStore.publish_in_slot`): the one read of the arrays."""
        self._hash = digest

    @property
    def hash(self) -> str:
        if self._hash is None:
            h = new_hasher()
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


def is_digest_name(name: str, algo: str) -> bool:
    return algo in _HEX and len(name) == _HEX[algo] and re.fullmatch(r"[0-9a-f]+", name) is not None


def check_reference(ref) -> dict:
    """``ref`` as a checked dict, or :class:`StoreError` naming what is wrong."""
    if not isinstance(ref, dict):
        raise StoreError("a weight reference must be a JSON object")
    for key, typ in (("store", str), ("hash", str), ("algo", str), ("size", int), ("arrays", list)):
        if not isinstance(ref.get(key), typ):
            raise StoreError(f"a weight reference needs '{key}' ({typ.__name__})")
    if not is_digest_name(ref["hash"], ref["algo"]):
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
        raise StoreError(f"{what}: {path} is {file_mode_kind(mode)}, not a regular file")
    return fd


def map_file(path: Path, short: str, size: int | None = None) -> mmap.mmap:
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
