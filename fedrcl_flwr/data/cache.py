"""The dataset cache: a dataset's prepared arrays, built once, memory-mapped by every process.

Preparing a dataset — generating the synthetic images, decoding torchvision's files,
resizing image folders, holding out the validation split — takes seconds, and every
process of a run (the CLI's checks, the ServerApp, each Ray worker or SuperNode) used to
do it again and hold its own copy of the pixels. Now the first process that needs a
dataset writes its arrays to an *entry* of the cache directory and every process
memory-maps that entry read-only: the pixels exist once in the page cache, whatever the
number of workers.

Where: ``dataset.cache_dir``; if null, ``$FEDRCL_FLWR_CACHE_DIR``, else
``$XDG_CACHE_HOME/fedrcl-flwr``, else ``~/.cache/fedrcl-flwr``.

Key: an entry is named by the SHA-256 of everything that determines the arrays — the
dataset settings that shape them (name, resolved ``root`` / ``path``, ``image_size``,
``normalize`` (true, false or the constants themselves: the stored statistics),
``val_fraction``, ``domains``, ``test_fraction``, the synthetic generator's settings, and
the seed where it draws something: the synthetic images, the validation hold-out, an image
folder's test split) plus the size and modification time of every source file read — and
the cache format. Augmentation (``augment``, ``rotation``, ``crop_pad``, ``flip``,
``pad_fill``) is drawn per batch and is not part of it.

An entry is a directory ``<key>/`` of ``.npy`` arrays (images already in the
(N, C, H, W) layout training uses; labels; domain ids) plus ``meta.json`` (shapes, dtypes,
byte sizes and SHA-256 of every array file; normalisation statistics; number of classes;
domain names) and ``meta.sha256`` (the hash of ``meta.json``). Written atomically: built in
a temporary directory beside it, flushed to disk, then renamed into place; when two
processes race, the first rename wins and the other uses the winner's entry. Opening
checks the metadata's hash and fields, every array's size and header; :func:`load` (what
the CLI runs once before a run starts) also checks every array file's content hash, so an
entry edited in place (same sizes) is rebuilt with a note, never used; the processes of
the run trust that check and only open the entry (:func:`open_prepared`).

Only what is provably the cache's own is ever removed (:func:`is_own_entry`): a directory
named by a key (32 hex digits) or a temporary ``.tmp-<key>-*`` / ``.discard-<key>-*``
directory, holding only the cache's file names with the cache's content (its metadata
hash line and fields, NumPy's magic in every array file). Anything else in the cache directory is
listed as ``foreign`` by ``cache ls`` and left alone by ``cache clear``.

Simulations run by ``fedrcl-flwr run`` prepare the entry in the CLI before any Flower
process exists and hand its path to the ServerApp and the ClientApps
(:func:`fedrcl_flwr.run.runtime.use_prepared_dataset`), which then only open it. On a Ray
cluster across machines the cache directory must therefore be a path every node sees
(a shared filesystem); a node without it stops with one error naming the host and the path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np

# 2: explicit normalisation constants; CIFAR's classes from batches.meta
# 3: every array file's SHA-256 in meta.json (checked when the CLI prepares a run)
FORMAT = 3
META = "meta.json"
META_HASH = "meta.sha256"
ENV_VAR = "FEDRCL_FLWR_CACHE_DIR"
_SPLITS = ("train", "test", "val")
KEY_LEN = 32
KEY_RE = re.compile(rf"[0-9a-f]{{{KEY_LEN}}}")
KEY_PREFIX_RE = re.compile(rf"[0-9a-f]{{1,{KEY_LEN}}}")
_ARRAY_RE = re.compile(r"(train|test|val)_(x|y|d)")
_TEMP_RE = re.compile(rf"\.(tmp|discard)-([0-9a-f]{{{KEY_LEN}}})-[A-Za-z0-9_.-]+")
_MAX_META_BYTES = 1 << 20


class CacheMiss(Exception):
    """An entry that is absent or unusable (the message says which and why)."""


class CacheForeign(Exception):
    """The path of an entry holds something the cache did not write (left alone)."""


# a client split stored beside an entry's arrays (load_partition), and one being written
_SPLIT_RE = re.compile(rf"split-[0-9a-f]{{{KEY_LEN}}}\.npz|\.split-[0-9a-f]{{{KEY_LEN}}}-\d+\.tmp")


def _own_file(name: str) -> bool:
    return (
        name in (META, META_HASH)
        or bool(_SPLIT_RE.fullmatch(name))
        or (name.endswith(".npy") and bool(_ARRAY_RE.fullmatch(name[:-4])))
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
        if (entry / META).stat().st_size > _MAX_META_BYTES:
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
    """``path`` is provably the cache's own, by its name *and* its content: a real
    directory (not a link) named by a key (or a temporary / discarded entry's name) that
    holds only regular files with the cache's names (``meta.json``, ``meta.sha256``,
    ``<split>_<x|y|d>.npy``, the client splits of :func:`load_partition`,
    ``split-<key>.npz``), each with the cache's content: every ``.npy`` starts with
    NumPy's magic and every split with the zip magic (or is empty: a write cut short),
    and a metadata pair is the cache's (:func:`_own_meta`). A key directory needs the
    metadata pair; a temporary one (an entry being built) may lack it, or be empty. A
    user's ``meta.json`` in a 32-hex-named directory, or user files in a ``.tmp-<key>-…``
    directory, are therefore never the cache's."""
    p = Path(path)
    temp = bool(_TEMP_RE.fullmatch(p.name))
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


def default_cache_dir() -> Path:
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedrcl-flwr"


def cache_dir(dataset_cfg) -> Path:
    """The cache directory of a :class:`~fedrcl_flwr.config.DatasetConfig`."""
    given = getattr(dataset_cfg, "cache_dir", None)
    return Path(given).expanduser().resolve() if given else default_cache_dir().resolve()


def check_cache_dir(path: Path) -> str | None:
    """Why ``path`` cannot hold the cache (``None`` when it can): it is not a directory,
    or neither it nor its nearest existing ancestor is writable."""
    p = Path(path)
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if p.exists() and not p.is_dir():
        return f"{p} is not a directory"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{p} is not writable"
    return None


# ------------------------------------------------------------------------------ keys


def _source_files(d) -> list[Path]:
    """The files (or roots of file trees) a dataset is read from: none for a generated
    one, ``dataset.path``, torchvision's folder under ``dataset.root``, or the root."""
    from fedrcl_flwr.config.catalog import dataset_info
    from fedrcl_flwr.data.sources.table import SOURCES
    from fedrcl_flwr.data.sources.torchvision_files import torchvision_files

    root = Path(os.path.expanduser(d.root or "."))
    info = dataset_info(d.name)
    if info.generated:
        return []
    if info.source == "path" and d.name == "hf_disk" and d.path:
        from fedrcl_flwr.data.sources.hf import check_hf_disk

        # checked before its folder is walked (``dataset.path: /`` would walk the whole
        # file system); the fingerprint is the folder's, as the entries users hold
        check_hf_disk(d.path)
    if info.source == "path" and d.name == "npz" and d.path:
        from fedrcl_flwr.data.sources.npz import check_npz_path

        check_npz_path(Path(os.path.expanduser(d.path)))  # a folder is not walked either
    if info.source == "path":
        return [Path(os.path.expanduser(d.path))] if d.path else []
    source = SOURCES.get(d.name)
    if source is not None and source.torchvision is not None:
        return [torchvision_files(d.name, root)[0]]
    return [root]


def _fingerprint(paths: list[Path]) -> list:
    """(relative path, size, mtime_ns) of every file under ``paths`` (sorted): a source
    that changes on disk gets a new entry."""
    out = []
    for base in paths:
        if base.is_file():
            st = base.stat()
            out.append([str(base.resolve()), st.st_size, st.st_mtime_ns])
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                f = Path(dirpath) / name
                try:
                    st = f.stat()
                except OSError:
                    continue
                out.append([str(f.relative_to(base)), st.st_size, st.st_mtime_ns])
    return out


def seed_shapes_arrays(d) -> bool:
    """Whether the experiment's seed changes the arrays: it draws the synthetic images,
    the ``val_fraction`` hold-out and the test split of an image folder without
    ``train``/``test`` sub-folders; nothing else (an ``npz`` file, torchvision's files)
    depends on it, so those share one entry across seeds. Per dataset:
    :data:`~fedrcl_flwr.data.sources.table.SOURCES`' ``seeded``."""
    from fedrcl_flwr.data.sources.table import SOURCES

    if float(d.val_fraction) > 0:
        return True
    source = SOURCES.get(d.name)
    return source is not None and source.seeded(d)


def entry_settings(d, seed: int) -> dict:
    """Everything that determines a dataset's arrays (see the module docstring): the seed
    only where it does (:func:`seed_shapes_arrays`)."""
    from fedrcl_flwr.config.catalog import dataset_info
    from fedrcl_flwr.data.sources.table import SOURCES

    root = str(Path(os.path.expanduser(d.root or ".")).resolve())
    settings = {
        "format": FORMAT,
        "name": d.name,
        "seed": int(seed) if seed_shapes_arrays(d) else None,
        "root": root if dataset_info(d.name).source == "root" else None,
        "path": str(Path(os.path.expanduser(d.path)).resolve()) if d.path else None,
        "image_size": d.image_size,
        "normalize": _normalize_key(d.normalize),
        "val_fraction": float(d.val_fraction),
        "domains": list(d.domains or []),
        "test_fraction": float(d.test_fraction),
        **({"test_split": d.test_split} if d.test_split != "random" else {}),
        "synthetic": None,  # the generator's settings (key_fields of synthetic)
        "sources": _fingerprint(_source_files(d)),
    }
    source = SOURCES.get(d.name)
    if source is not None:  # settings only this dataset reads (synthetic, hf_disk's columns)
        settings.update(source.key_fields(d))
    return settings


def _normalize_key(value):
    """``dataset.normalize`` as it enters the key: true / false, or the constants as
    floats (so ``1`` and ``1.0`` are one entry)."""
    if isinstance(value, dict):
        return {k: [float(v) for v in value[k]] for k in ("mean", "std")}
    return bool(value)


def _key_of(settings: dict) -> str:
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def entry_key(d, seed: int) -> str:
    return _key_of(entry_settings(d, seed))


# ------------------------------------------------------------------------------ read


def _read_meta(entry: Path) -> dict:
    try:
        if (entry / META).stat().st_size > _MAX_META_BYTES:
            raise CacheMiss(f"{entry}: {META} is too large (corrupt)")
        raw = (entry / META).read_bytes()
        want = (entry / META_HASH).read_bytes()[:200].decode("ascii", "replace").strip()
    except OSError as exc:
        raise CacheMiss(f"{entry}: incomplete ({exc.strerror or exc})") from None
    if hashlib.sha256(raw).hexdigest() != want:
        raise CacheMiss(f"{entry}: {META} does not match its hash (corrupt)")
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):
        raise CacheMiss(f"{entry}: {META} is not JSON (corrupt)") from None
    if not isinstance(meta, dict):
        raise CacheMiss(f"{entry}: {META} is not a JSON object (corrupt)")
    if meta.get("format") != FORMAT:
        raise CacheMiss(
            f"{entry}: cache format {meta.get('format')!r} (this version reads {FORMAT})"
        )
    why = _meta_problem(meta)
    if why:
        raise CacheMiss(f"{entry}: {META} {why} (corrupt)")
    return meta


def _is_int(v, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _is_num(v) -> bool:
    import math

    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _meta_problem(meta: dict) -> str | None:
    """What is missing or mistyped in a ``meta.json`` whose hash matched (an entry of
    another version, or written by hand), or ``None``."""
    checks = {
        "name": lambda v: isinstance(v, str),
        "created": _is_num,
        "settings": lambda v: isinstance(v, dict),
        "mean": lambda v: isinstance(v, list) and v and all(_is_num(x) for x in v),
        "std": lambda v: isinstance(v, list) and v and all(_is_num(x) for x in v),
        "num_classes": lambda v: _is_int(v, 1),
        "in_channels": lambda v: _is_int(v, 1),
        "image_size": lambda v: _is_int(v, 1),
        "domain_names": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "arrays": lambda v: isinstance(v, dict),
    }
    for key, ok in checks.items():
        if key not in meta:
            return f"lacks '{key}'"
        if not ok(meta[key]):
            return f"has a malformed '{key}'"
    arrays = meta["arrays"]
    for need in ("train_x", "train_y", "test_x", "test_y"):
        if need not in arrays:
            return f"lists no array '{need}'"
    for name, spec in arrays.items():
        if not isinstance(name, str) or not _ARRAY_RE.fullmatch(name):
            return f"lists an unknown array {str(name)[:40]!r}"
        if not isinstance(spec, dict) or not (
            isinstance(spec.get("shape"), list)
            and all(_is_int(x) for x in spec["shape"])
            and isinstance(spec.get("dtype"), str)
            and _is_int(spec.get("bytes"))
            and isinstance(spec.get("sha256"), str)
            and re.fullmatch(r"[0-9a-f]{64}", spec["sha256"])
        ):
            return f"has a malformed spec for array '{name}'"
    return None


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 22)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def verify_arrays(entry: Path, meta: dict) -> None:
    """Every array file's content matches the SHA-256 in ``meta.json`` (catches an edit
    that kept the file's size, which the size and header checks cannot); else
    :class:`CacheMiss`."""
    for name, spec in meta["arrays"].items():
        f = Path(entry) / f"{name}.npy"
        try:
            got = _file_sha256(f)
        except OSError as exc:
            raise CacheMiss(f"{entry}: {f.name} cannot be read ({exc.strerror or exc})") from None
        if got != spec["sha256"]:
            raise CacheMiss(
                f"{entry}: {f.name} does not match its content hash (edited or corrupt)"
            )


def _open_array(entry: Path, name: str, spec: dict, mmap: bool) -> np.ndarray:
    f = entry / f"{name}.npy"
    try:
        size = f.stat().st_size
    except OSError:
        raise CacheMiss(f"{entry}: {f.name} is missing") from None
    if size != spec["bytes"]:
        raise CacheMiss(
            f"{entry}: {f.name} has {size} bytes, its metadata says "
            f"{spec['bytes']} (truncated or corrupt)"
        )
    try:
        arr = np.load(f, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CacheMiss(f"{entry}: {f.name} cannot be read ({exc})") from None
    if list(arr.shape) != spec["shape"] or str(arr.dtype) != spec["dtype"]:
        raise CacheMiss(
            f"{entry}: {f.name} is {arr.dtype}{list(arr.shape)}, its metadata "
            f"says {spec['dtype']}{spec['shape']} (corrupt)"
        )
    return arr


def open_entry(entry: Path, d, *, verify: bool = False):
    """The :class:`~fedrcl_flwr.data.datasets.DataBundle` of a cache entry, images
    memory-mapped read-only; ``d`` (the dataset config) gives the augmentation.
    ``verify``: also check every array file's content hash (:func:`verify_arrays`).
    Raises :class:`CacheMiss` for an absent, incomplete or corrupt entry."""
    import torch

    from fedrcl_flwr.data.datasets import DataBundle, ImageArrayDataset, augment_spec

    entry = Path(entry)
    if not entry.is_dir():
        raise CacheMiss(f"{entry}: no such entry")
    if not is_own_entry(entry):  # links, FIFOs, other files: never opened
        raise CacheMiss(f"{entry}: holds files the cache does not write")
    meta = _read_meta(entry)
    if verify:
        verify_arrays(entry, meta)
    arrays = {
        name: _open_array(entry, name, spec, mmap=name.endswith("_x"))
        for name, spec in meta["arrays"].items()
    }
    aug = augment_spec(
        meta["name"], meta["image_size"], d.augment, d.rotation, d.crop_pad, d.flip, d.pad_fill
    )

    def wrap(split: str, aug_spec):
        if f"{split}_x" not in arrays:
            return None
        with warnings.catch_warnings():  # read-only memmap: never written (see module doc)
            warnings.simplefilter("ignore", UserWarning)
            images = torch.from_numpy(arrays[f"{split}_x"])
        return ImageArrayDataset(images, arrays[f"{split}_y"], meta["mean"], meta["std"], aug_spec)

    return DataBundle(
        name=meta["name"],
        train=wrap("train", aug),
        test=wrap("test", None),
        train_labels=np.asarray(arrays["train_y"]),
        test_labels=np.asarray(arrays["test_y"]),
        num_classes=int(meta["num_classes"]),
        in_channels=int(meta["in_channels"]),
        image_size=int(meta["image_size"]),
        train_domains=arrays.get("train_d"),
        test_domains=arrays.get("test_d"),
        domain_names=list(meta["domain_names"]),
        val=wrap("val", None),
    )


# ------------------------------------------------------------------------------ write


def _write_entry(tmp: Path, bundle, settings: dict) -> None:
    arrays = {}
    for split in _SPLITS:
        ds = getattr(bundle, split)
        if ds is None:
            continue
        arrays[f"{split}_x"] = np.ascontiguousarray(ds.images.numpy())
        arrays[f"{split}_y"] = np.asarray(ds.labels, np.int64)
    if bundle.train_domains is not None:
        arrays["train_d"] = np.asarray(bundle.train_domains, np.int64)
    if bundle.test_domains is not None:
        arrays["test_d"] = np.asarray(bundle.test_domains, np.int64)
    specs = {}
    for name, arr in arrays.items():
        f = tmp / f"{name}.npy"
        with open(f, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        specs[name] = {
            "shape": list(arr.shape),
            "dtype": str(arr.dtype),
            "bytes": f.stat().st_size,
            "sha256": _file_sha256(f),
        }
    meta = {
        "format": FORMAT,
        "name": bundle.name,
        "created": time.time(),
        "settings": {k: v for k, v in settings.items() if k != "sources"},
        "num_sources": len(settings["sources"]),
        "mean": [float(v) for v in bundle.train.mean.flatten().tolist()],
        "std": [float(v) for v in bundle.train.std.flatten().tolist()],
        "num_classes": int(bundle.num_classes),
        "in_channels": int(bundle.in_channels),
        "image_size": int(bundle.image_size),
        "domain_names": list(bundle.domain_names),
        "arrays": specs,
    }
    raw = json.dumps(meta, indent=1, sort_keys=True).encode()
    (tmp / META).write_bytes(raw)
    (tmp / META_HASH).write_text(hashlib.sha256(raw).hexdigest() + "\n")
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(path: Path) -> None:
    """Move ``path`` out of the way atomically, then delete it."""
    gone = path.parent / f".discard-{path.name}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.rename(path, gone)
    except OSError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def build_entry(root: Path, key: str, d, seed: int, settings: dict):
    """Prepare the dataset and publish it as entry ``key``; returns the opened entry.
    Race-safe: if another process published the key first, theirs is used."""
    from dataclasses import asdict

    from fedrcl_flwr.config.catalog import dataset_info
    from fedrcl_flwr.data.datasets import load_dataset

    bundle = load_dataset(
        d.name,
        root=d.root,
        path=d.path,
        download=d.download,
        augment=d.augment,
        normalize=d.normalize,
        image_size=d.image_size,
        synthetic=asdict(d.synthetic) if dataset_info(d.name).generated else None,
        seed=seed,
        val_fraction=d.val_fraction,
        domains=d.domains,
        test_fraction=d.test_fraction,
        test_split=d.test_split,
        rotation=d.rotation,
        crop_pad=d.crop_pad,
        verify_md5=d.verify_md5,
        flip=d.flip,
        pad_fill=d.pad_fill,
        image_column=getattr(d, "image_column", None),
        label_column=getattr(d, "label_column", None),
        domain_column=getattr(d, "domain_column", None),
    )
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
    try:
        _write_entry(tmp, bundle, settings)
        try:
            os.rename(tmp, final)
        except OSError:  # a non-empty entry exists: someone else won, or it is corrupt
            try:
                return open_entry(final, d, verify=True)
            except CacheMiss:
                if not is_own_entry(final):
                    raise CacheForeign(
                        f"{final} is not a dataset cache entry (it holds other files); move it away"
                    ) from None
                _discard(final)
                os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return open_entry(final, d)


def load(d, seed: int, *, note=None):
    """Open the dataset's entry — its array files checked against their content hashes
    — building it first when absent or unusable. ``note`` (a callable) hears why an
    existing entry was rebuilt. Returns ``(bundle, entry)``. :class:`CacheForeign` when
    the entry's path holds something the cache did not write (never removed)."""
    root = cache_dir(d)
    settings = entry_settings(d, seed)
    key = _key_of(settings)
    entry = root / key
    if entry.exists() or entry.is_symlink():
        try:
            if entry.is_symlink():
                raise CacheMiss(f"{entry}: a link, not an entry")
            return open_entry(entry, d, verify=True), entry
        except CacheMiss as exc:
            if not is_own_entry(entry):
                raise CacheForeign(
                    f"{entry} is not a dataset cache entry ({exc}); it was "
                    "left in place: move it away"
                ) from None
            if note is not None:
                note(f"dataset cache: rebuilding an unusable entry: {exc}")
            _discard(entry)
    return build_entry(root, key, d, seed, settings), entry


def open_prepared(entry: Path, d):
    """Open an entry prepared by the CLI; any problem is one
    :class:`~fedrcl_flwr.data.sources.raw.DatasetError` naming this host and the path (a
    process of a run never builds the dataset itself)."""
    from fedrcl_flwr.data.sources.raw import DatasetError

    try:
        return open_entry(entry, d)
    except CacheMiss as exc:
        raise DatasetError(
            f"dataset cache entry unusable on host {socket.gethostname()}: {exc}. The CLI "
            "prepared it before the run; dataset.cache_dir must be a directory every node "
            "of the Ray cluster sees at the same path (a shared filesystem), and must not "
            "be cleared while a run uses it"
        ) from None


# ------------------------------------------------------------------------- partitions


def _partition_code() -> list:
    """What decides a split besides its settings: the source of the partition modules
    (the dispatch, the project's schemes, the authors' generators, the split-file reader)
    and the versions of the generators they draw from (a split stored by other code is
    never read)."""
    import torch

    from fedrcl_flwr.data import partition, partition_authors, partition_schemes, split_file

    h = hashlib.sha256()
    for module in (partition, partition_schemes, partition_authors, split_file):
        h.update(Path(str(module.__file__)).read_bytes())
    return [h.hexdigest(), torch.__version__, np.__version__]


def _read_partition(path: Path, num_clients: int) -> list | None:
    """The split in ``path``, or ``None`` when it is absent, unreadable or inconsistent
    (wrong number of clients, offsets out of order, content not matching its hash)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            indices, offsets, digest = z["indices"], z["offsets"], str(z["sha256"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if (
        indices.dtype != np.int64
        or offsets.dtype != np.int64
        or indices.ndim != 1
        or offsets.shape != (num_clients + 1,)
        or offsets[0] != 0
        or offsets[-1] != len(indices)
        or np.any(np.diff(offsets) < 0)
    ):
        return None
    h = hashlib.sha256(indices.tobytes())
    h.update(offsets.tobytes())
    if h.hexdigest() != digest:
        return None
    return np.split(indices, offsets[1:-1])


def load_partition(entry: Path, settings: list, num_clients: int, compute) -> list:
    """The client index arrays of a split of the dataset in ``entry``: read from
    ``entry/split-<key>.npz`` when stored, else ``compute()`` and stored there for the
    next process (written to ``.split-<key>-<pid>.tmp``, then renamed: a file of the
    entry's own at every moment; an unwritable entry only costs the computation).
    ``key`` is the SHA-256 of ``settings`` (the dataset and partition sections, the number
    of clients, the seed) and of :func:`_partition_code`. A split is a pure function of
    those (``fedrcl_flwr.data.partition``), so the CLI's check before a run computes it
    once and every process of the run reads the same arrays."""
    key = _key_of({"split": settings, "code": _partition_code()})
    path = Path(entry) / f"split-{key}.npz"
    parts = _read_partition(path, num_clients)
    if parts is not None:
        return parts
    parts = [np.asarray(p) for p in compute()]
    if len(parts) != num_clients or any(p.dtype != np.int64 or p.ndim != 1 for p in parts):
        return parts  # not the shape this file stores (never the case for our schemes)
    indices = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    h = hashlib.sha256(indices.tobytes())
    h.update(offsets.tobytes())
    tmp = path.with_name(f".split-{key}-{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, indices=indices, offsets=offsets, sha256=np.str_(h.hexdigest()))
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass
    return parts


# ------------------------------------------------------------------------------ manage


def _dir_bytes(path: Path) -> int:
    total = 0
    for f in path.rglob("*"):
        try:
            if f.is_file():
                total += f.stat().st_size
        except OSError:
            pass
    return total


def list_entries(root: Path) -> list[dict]:
    """One dict per item of the cache directory (``key``, ``name``, ``settings``,
    ``bytes``, ``created``, ``status``: ``ok``, ``corrupt: reason`` — the metadata, sizes
    and content hashes are checked — or ``foreign`` for anything the cache did not
    write, which is never removed). Temporary directories are not listed."""
    out: list[dict] = []
    if not Path(root).is_dir():
        return out
    for entry in sorted(Path(root).iterdir()):
        if not is_own_entry(entry):
            out.append(
                {
                    "key": entry.name,
                    "bytes": 0,
                    "name": "-",
                    "settings": {},
                    "created": None,
                    "status": "foreign",
                }
            )
            continue
        if entry.name.startswith("."):  # the cache's own temporary directories
            continue
        row = {
            "key": entry.name,
            "bytes": _dir_bytes(entry),
            "name": "?",
            "settings": {},
            "created": None,
        }
        try:  # is_own_entry held: regular files only (no link, no FIFO to block on)
            meta = _read_meta(entry)
            for name, spec in meta["arrays"].items():
                f = entry / f"{name}.npy"
                if not f.is_file() or f.stat().st_size != spec["bytes"]:
                    raise CacheMiss(f"{f.name} missing or of the wrong size")
            verify_arrays(entry, meta)
            row.update(
                name=meta["name"], settings=meta["settings"], created=meta["created"], status="ok"
            )
        except CacheMiss as exc:
            row["status"] = f"corrupt: {str(exc).split(': ', 1)[-1]}"
        out.append(row)
    return out


def clear(root: Path, prefixes: list | None = None) -> tuple[list[str], list[str]]:
    """Delete the entries whose key starts with one of ``prefixes`` (every entry when
    there are none) and, with no prefixes, leftover temporary directories — only what
    :func:`is_own_entry` proves the cache's own. Returns ``(deleted keys, foreign
    items left in place)``. A prefix must be hex digits (:data:`KEY_PREFIX_RE`): the
    empty string is not "all"."""
    prefixes = list(prefixes or [])
    for p in prefixes:
        if not isinstance(p, str) or not KEY_PREFIX_RE.fullmatch(p):
            raise ValueError(f"not a cache key prefix: {p!r}")
    removed: list[str] = []
    foreign: list[str] = []
    if not Path(root).is_dir():
        return removed, foreign
    for entry in sorted(Path(root).iterdir()):
        if not is_own_entry(entry):
            foreign.append(entry.name)
            continue
        if entry.name.startswith("."):  # a temporary or discarded entry
            if not prefixes:
                shutil.rmtree(entry, ignore_errors=True)
            continue
        if prefixes and not any(entry.name.startswith(p) for p in prefixes):
            continue
        _discard(entry)
        removed.append(entry.name)
    return removed, foreign
