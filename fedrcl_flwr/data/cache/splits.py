"""The client splits stored beside an entry's arrays (``split-<key>.npz``), so that every
process of a run reads the split the CLI's check computed (:func:`load_partition`)."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import numpy as np

from fedrcl_flwr.data.cache.keys import key_of


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
    key = key_of({"split": settings, "code": _partition_code()})
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
