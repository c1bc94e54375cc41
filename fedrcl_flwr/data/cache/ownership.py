"""What is provably the dataset cache's own (:func:`is_own_entry`: by name *and* content),
and the one way an entry is removed (:func:`discard`: renamed away atomically, then
deleted)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from fedrcl_flwr.data.cache.layout import (
    ARRAY_RE,
    KEY_LEN,
    KEY_RE,
    MAX_META_BYTES,
    META,
    META_HASH,
    TEMP_RE,
)

# a client split stored beside an entry's arrays (load_partition), and one being written
_SPLIT_RE = re.compile(rf"split-[0-9a-f]{{{KEY_LEN}}}\.npz|\.split-[0-9a-f]{{{KEY_LEN}}}-\d+\.tmp")


def _own_file(name: str) -> bool:
    return (
        name in (META, META_HASH)
        or bool(_SPLIT_RE.fullmatch(name))
        or (name.endswith(".npy") and bool(ARRAY_RE.fullmatch(name[:-4])))
    )


_NPY_MAGIC = b"\x93NUMPY"  # every array file np.save writes starts with it
_NPZ_MAGIC = b"PK\x03\x04"  # the client splits (np.savez: a zip archive)
_HASH_LINE_RE = re.compile(rb"[0-9a-f]{64}\n?")


def _starts_with(path: str, magic: bytes) -> bool:
    """The regular file at ``path`` is empty (created, nothing written yet: an
    interrupted write) or starts with ``magic``."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        head = os.read(fd, len(magic))
    finally:
        os.close(fd)
    return head == b"" or head == magic


def _own_meta(entry: Path, arrays: bool) -> bool:
    """The metadata pair is the cache's: ``meta.sha256`` is the cache's hash line of
    ``meta.json``; or it is a hash line (64 hex digits) beside NumPy arrays of the cache
    (``arrays``: ``meta.json`` damaged); or ``meta.json`` carries the cache's own fields
    (``format``, ``arrays``, ``settings``: the hash line damaged)."""
    try:
        if (entry / META).stat().st_size > MAX_META_BYTES:
            return False
        raw = (entry / META).read_bytes()
        line = (entry / META_HASH).read_bytes()[:200] if (entry / META_HASH).is_file() else b""
    except OSError:
        return False
    if _HASH_LINE_RE.fullmatch(line):
        if arrays or hashlib.sha256(raw).hexdigest() == line[:64].decode():
            return True
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and all(k in meta for k in ("format", "arrays", "settings"))


def is_own_entry(path: Path) -> bool:
    """``path`` is provably the cache's own, by its name *and* its content: a real directory
    (not a link) named by a key (or a temporary / discarded entry's name) that holds only
    regular files with the cache's names (``meta.json``, ``meta.sha256``,
    ``<split>_<x|y|d>.npy``, the client splits of
    :func:`~fedrcl_flwr.data.cache.splits.load_partition`, ``split-<key>.npz``), each with
    the cache's content: every ``.npy`` starts with NumPy's magic and every split with the
    zip magic (or is empty: a write cut short), and a metadata pair is the cache's
    (:func:`_own_meta`). A key directory needs the metadata pair; a temporary one (an entry
    being built) may lack it, or be empty. A user's ``meta.json`` in a 32-hex-named
    directory, or user files in a ``.tmp-<key>-…`` directory, are therefore never the
    cache's."""
    p = Path(path)
    temp = bool(TEMP_RE.fullmatch(p.name))
    if not (KEY_RE.fullmatch(p.name) or temp):
        return False
    try:
        if p.is_symlink() or not p.is_dir():
            return False
        names = set()
        arrays = False
        with os.scandir(p) as it:
            for e in it:
                if not _own_file(e.name) or not e.is_file(follow_symlinks=False):
                    return False
                if e.name.endswith(".npy"):
                    if not _starts_with(e.path, _NPY_MAGIC):
                        return False
                    arrays = arrays or e.stat(follow_symlinks=False).st_size > 0
                if e.name.endswith((".npz", ".tmp")) and not _starts_with(e.path, _NPZ_MAGIC):
                    return False
                names.add(e.name)
        if META in names or META_HASH in names or not temp:
            return _own_meta(p, arrays)
        return True  # a temporary entry cut short before its metadata (or empty)
    except OSError:
        return False


def discard(path: Path) -> None:
    """Move ``path`` out of the way atomically, then delete it."""
    gone = path.parent / f".discard-{path.name}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.rename(path, gone)
    except OSError:
        return
    shutil.rmtree(gone, ignore_errors=True)
