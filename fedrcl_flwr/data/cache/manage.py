"""The ``cache ls`` / ``cache clear`` commands' side: every item of the cache directory
with its status (:func:`list_entries`; anything the cache did not write is ``foreign``) and
the removal of only what is provably the cache's own (:func:`clear`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from fedrcl_flwr.data.cache.entries import read_meta, verify_arrays
from fedrcl_flwr.data.cache.layout import KEY_PREFIX_RE, CacheMiss
from fedrcl_flwr.data.cache.ownership import discard, is_own_entry


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
            meta = read_meta(entry)
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
        discard(entry)
        removed.append(entry.name)
    return removed, foreign
