"""Reading a weight store entry: copied out of the store and hashed as it is copied, in one
pass, so that the bytes used are the bytes that hashed to the entry's name
(:func:`read_entry`; for the server's average, which copies piece by piece itself:
:func:`open_entry` and :class:`HashCheck`); :func:`intact`, whether an entry is still as
written. A damaged, truncated, overwritten or foreign entry is refused
(:class:`~fedrcl_flwr.weights.entries.StoreError`, one line)."""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedrcl_flwr.weights.entries import (
    ARENA,
    MAGIC,
    PIECE,
    StoreError,
    check_reference,
    map_file,
    new_hasher,
)
from fedrcl_flwr.weights.mappings import arena_map


def _entry_mapping(ref: dict) -> tuple[mmap.mmap, int]:
    """The mapping that holds the entry of the checked reference ``ref`` and where the
    entry starts in it (the arena's kept mapping and the slot's offset, or the entry's
    own file)."""
    short, size = ref["hash"][:12], ref["size"]
    if "offset" in ref:
        mm = arena_map(Path(ref["store"]) / ARENA, short)
        if ref["offset"] + size > len(mm):
            raise StoreError(f"weight store entry {short}: its slot lies outside the arena")
        return mm, ref["offset"]
    return map_file(Path(ref["store"]) / ref["hash"], short, size), 0


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
    hasher = new_hasher(ref["algo"])
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
        hasher = new_hasher(ref["algo"])
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
        self._hasher = new_hasher(ref["algo"])
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
