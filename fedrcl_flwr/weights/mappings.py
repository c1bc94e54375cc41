"""This process's kept mappings of arenas (the stores' files of slots,
:class:`~fedrcl_flwr.weights.store.Arena`): a read-only one per arena for readers, a
writable one for writers, each mapped once per process and reopened when another file lies
at the path; a writer's regions are populated in one call the first time it writes there
(``MADV_POPULATE_WRITE``). :func:`forget` gives a removed store's mappings back."""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from pathlib import Path

from fedrcl_flwr.weights.entries import ARENA, GLOBAL_SLOTS, map_file, open_regular

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


def arena_map(path: Path, short: str) -> mmap.mmap:
    # an old mapping is left to the garbage collector (arrays may still view it)
    return _cached(_MAPS, path, lambda: map_file(path, short), lambda mm: None)


def arena_writer(path: Path) -> _Writer:
    def open_writer() -> _Writer:
        fd = open_regular(path, os.O_RDWR, "weight store arena")
        try:
            return _Writer(mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_WRITE))
        finally:
            os.close(fd)

    return _cached(_WRITERS, path, open_writer, lambda w: close_map(w.mm))


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


def close_map(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:  # still viewed: the garbage collector unmaps it later
        pass


def forget(root: Path | str) -> None:
    """Drop this process's kept mappings of the arena under ``root`` (the writable one
    is closed; the read-only one goes once no array views it), so that a removed store's
    memory is given back (the in-process runner, which outlives its runs)."""
    key = str(Path(root) / ARENA)
    if key in _WRITERS:
        close_map(_WRITERS.pop(key)[1].mm)
    _MAPS.pop(key, None)
