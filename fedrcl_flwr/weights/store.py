"""Publishing weights: :class:`WeightStore`, one run's folder of entries named by their
content hash (written as a temporary name and one atomic ``rename``), and its
:class:`Arena`, one preallocated file cut into slots that entries are copied into (a ring
for the server's sends, two sets of upload slots by round parity)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import count
from pathlib import Path

import numpy as np

from fedrcl_flwr.weights.entries import (
    ARENA,
    GLOBAL_SLOTS,
    PAGE,
    PIECE,
    Entry,
    StoreError,
    is_digest_name,
    new_hasher,
)
from fedrcl_flwr.weights.mappings import arena_writer
from fedrcl_flwr.weights.reading import intact

_counter = count()


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
        writer = arena_writer(self.root / ARENA)
        mm = writer.mm
        if offset + capacity > len(mm):
            raise StoreError("the slot lies outside the arena")
        writer.populate_once(offset, capacity)
        h = None if entry.hashed else new_hasher()
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
            entry.record_hash(h.hexdigest())
        return entry.reference(self.root, offset)

    def remove(self, ref: dict) -> None:
        """Delete the entry of ``ref`` (a reader that mapped it keeps its mapping)."""
        name = str(ref.get("hash", ""))
        if is_digest_name(name, str(ref.get("algo", ""))):
            self._written.discard(name)
            try:
                self.path(name).unlink()
            except FileNotFoundError:
                pass

    def entries(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()) if self.root.exists() else []


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
