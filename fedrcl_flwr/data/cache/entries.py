"""Reading an entry: its metadata checked (hash, format, fields), every array's size,
header and (``verify``) content hash, the arrays memory-mapped read-only into a
:class:`~fedrcl_flwr.data.datasets.DataBundle` (:func:`open_entry`); a run's processes
only open the entry the CLI prepared (:func:`open_prepared`)."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import warnings
from pathlib import Path

import numpy as np

from fedrcl_flwr.data.cache.layout import (
    ARRAY_RE,
    FORMAT,
    MAX_META_BYTES,
    META,
    META_HASH,
    CacheMiss,
    file_sha256,
)
from fedrcl_flwr.data.cache.ownership import is_own_entry


def read_meta(entry: Path) -> dict:
    try:
        if (entry / META).stat().st_size > MAX_META_BYTES:
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
        if not isinstance(name, str) or not ARRAY_RE.fullmatch(name):
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


def verify_arrays(entry: Path, meta: dict) -> None:
    """Every array file's content matches the SHA-256 in ``meta.json`` (catches an edit
    that kept the file's size, which the size and header checks cannot); else
    :class:`CacheMiss`."""
    for name, spec in meta["arrays"].items():
        f = Path(entry) / f"{name}.npy"
        try:
            got = file_sha256(f)
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
    meta = read_meta(entry)
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
