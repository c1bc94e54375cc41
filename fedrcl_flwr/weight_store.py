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


class WeightStore:
    """One run's store: a folder of entries named by their content hash."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._written: set[str] = set()  # entries this process wrote (publish skips them)

    def path(self, name: str) -> Path:
        return self.root / name

    def publish(self, arrays: Sequence) -> dict:
        """Write ``arrays`` as one entry (unless this process already wrote it); return
        its reference (a JSON-able dict). Raises ``OSError`` when the store cannot be
        written (the caller falls back to Flower's messages for this message)."""
        arrays = _contiguous(arrays)
        head, layout = _layout(arrays)
        h = _hasher()
        for c in _chunks(head, arrays):
            h.update(c)
        name = h.hexdigest()
        size = sum(len(c) if isinstance(c, bytes) else c.nbytes for c in _chunks(head, arrays))
        target = self.path(name)
        if name not in self._written or not target.exists():
            tmp = self.root / f".tmp-{os.getpid()}-{next(_counter)}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    with os.fdopen(fd, "wb", buffering=0, closefd=True) as fh:
                        for c in _chunks(head, arrays):
                            fh.write(c)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
                os.rename(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            self._written.add(name)
        return {
            "store": str(self.root),
            "hash": name,
            "algo": HASH_ALGO,
            "size": size,
            "arrays": layout,
        }

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
    return ref


def load(ref) -> list[np.ndarray]:
    """The arrays of the entry ``ref`` names: read-only views of its mapping, after the
    whole file was re-hashed and its header matched the reference. A missing, truncated,
    damaged or foreign entry raises :class:`StoreError` (one line)."""
    ref = check_reference(ref)
    path = Path(ref["store"]) / ref["hash"]
    short = ref["hash"][:12]
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise StoreError(
            f"weight store entry {short}: cannot open {path} ({exc.strerror})"
        ) from None
    try:
        size = os.fstat(fd).st_size
        if size != ref["size"]:
            raise StoreError(
                f"weight store entry {short}: {size} bytes, the reference says {ref['size']} "
                "(truncated or foreign)"
            )
        if size == 0:
            raise StoreError(f"weight store entry {short}: empty")
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    h = _hasher(ref["algo"])
    h.update(mm)
    if h.hexdigest() != ref["hash"]:
        raise StoreError(
            f"weight store entry {short}: its content does not hash to its name "
            "(damaged or foreign)"
        )
    view = memoryview(mm)
    if bytes(view[: len(MAGIC)]) != MAGIC or size < len(MAGIC) + 8:
        raise StoreError(f"weight store entry {short}: not a weight store file")
    (hlen,) = struct.unpack("<Q", view[len(MAGIC) : len(MAGIC) + 8])
    try:
        layout = json.loads(bytes(view[len(MAGIC) + 8 : len(MAGIC) + 8 + hlen]))
    except ValueError:
        raise StoreError(f"weight store entry {short}: unreadable header") from None
    if layout != ref["arrays"]:
        raise StoreError(f"weight store entry {short}: its layout differs from the reference's")
    out = []
    for dtype, shape, offset, nbytes in layout:
        dt = np.dtype(dtype)
        if dt.hasobject or offset + nbytes > size:
            raise StoreError(f"weight store entry {short}: bad array entry in its header")
        n = int(np.prod(shape, dtype=np.int64))
        if n * dt.itemsize != nbytes:
            raise StoreError(f"weight store entry {short}: array size does not match its shape")
        out.append(np.frombuffer(mm, dtype=dt, count=n, offset=offset).reshape(shape))
    return out


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


def temporary_store(prefix: str = "fedrcl-flwr-store-") -> tuple[WeightStore, Path]:
    """A store with a fresh unique name (the in-process runner, benchmarks): the store
    and the folder to delete afterwards (under ``/dev/shm`` when usable)."""
    try:
        root = Path(tempfile.mkdtemp(prefix=prefix, dir=SHM))
    except OSError:
        root = Path(tempfile.mkdtemp(prefix=prefix))
    return WeightStore(root), root
