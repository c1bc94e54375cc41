"""Writing an entry: the dataset prepared once and published atomically (built in a
temporary directory beside it, flushed, renamed into place; the first rename of a race wins,
:func:`build_entry`), and :func:`load`, which opens the entry and builds it when absent or
unusable."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from fedrcl_flwr.data.cache.entries import open_entry
from fedrcl_flwr.data.cache.keys import entry_settings, key_of
from fedrcl_flwr.data.cache.layout import (
    FORMAT,
    META,
    META_HASH,
    SPLITS,
    CacheForeign,
    CacheMiss,
    cache_dir,
    file_sha256,
)
from fedrcl_flwr.data.cache.ownership import discard, is_own_entry


def _write_entry(tmp: Path, bundle, settings: dict) -> None:
    arrays = {}
    for split in SPLITS:
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
            "sha256": file_sha256(f),
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
                discard(final)
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
    key = key_of(settings)
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
            discard(entry)
    return build_entry(root, key, d, seed, settings), entry
