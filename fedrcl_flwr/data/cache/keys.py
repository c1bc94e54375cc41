"""An entry's key: the SHA-256 of everything that determines a dataset's arrays
(:func:`entry_settings`: the settings that shape them, the seed where it draws something,
the size and modification time of every source file) and of the cache format."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fedrcl_flwr.data.cache.layout import FORMAT


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


def key_of(settings: dict) -> str:
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def entry_key(d, seed: int) -> str:
    return key_of(entry_settings(d, seed))
