"""The dataset cache's layout: the entry format (:data:`FORMAT`, the metadata file names,
the names of keys, arrays and temporary directories), its two errors, where the cache
directory is (:func:`cache_dir`) and the content hash every array file carries
(:func:`file_sha256`)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

# 2: explicit normalisation constants; CIFAR's classes from batches.meta
# 3: every array file's SHA-256 in meta.json (checked when the CLI prepares a run)
FORMAT = 3
META = "meta.json"
META_HASH = "meta.sha256"
ENV_VAR = "FEDRCL_FLWR_CACHE_DIR"
SPLITS = ("train", "test", "val")
KEY_LEN = 32
KEY_RE = re.compile(rf"[0-9a-f]{{{KEY_LEN}}}")
KEY_PREFIX_RE = re.compile(rf"[0-9a-f]{{1,{KEY_LEN}}}")
ARRAY_RE = re.compile(r"(train|test|val)_(x|y|d)")
TEMP_RE = re.compile(rf"\.(tmp|discard)-([0-9a-f]{{{KEY_LEN}}})-[A-Za-z0-9_.-]+")
MAX_META_BYTES = 1 << 20


class CacheMiss(Exception):
    """An entry that is absent or unusable (the message says which and why)."""


class CacheForeign(Exception):
    """The path of an entry holds something the cache did not write (left alone)."""


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


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 22)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()
