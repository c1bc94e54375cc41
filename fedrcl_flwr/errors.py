"""The error every input check raises (standard library only, so that the modules that
declare checks — :mod:`fedrcl_flwr.components`, :mod:`fedrcl_flwr.config` — need nothing
else). The CLI turns it into one line on stderr and exit code 2. Also the error of a run
that did not complete (:class:`RunFailed`, exit code 1)."""

from __future__ import annotations

import stat


class ConfigError(ValueError):
    """Raised for any invalid experiment configuration (bad key, type or value)."""


class PartitionError(ConfigError):
    """A partition request that cannot be met (too many clients, min size too large...)."""


class CheckpointError(ValueError):
    """A checkpoint file that is missing, truncated or holds something other than data."""


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters with its full length
    (a value of 100,000 characters is not echoed whole)."""
    try:
        r = repr(value)
    except ValueError:  # an integer beyond Python's 4,300 digits of int -> str
        return f"an integer of {value.bit_length():,} bits" if isinstance(value, int) else "?"
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r):,} characters)"


def one_line(text: object, limit: int = 2000) -> str:
    """``text`` on one line; beyond ``limit`` characters its head and tail with what was
    left out between them (the key and the file come first in every message)."""
    line = " ".join(str(text).split())
    if len(line) <= limit:
        return line
    head, tail = line[: limit - 300], line[-250:]
    return f"{head} ...[{len(line) - len(head) - len(tail):,} characters left out]... {tail}"


class RunFailed(RuntimeError):
    """A run that did not complete: one line saying why (the details are in the run's
    ``run.log`` / ``flower.log``); the CLI prints it and exits with 1."""


def file_mode_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for a message about a path that should be a
    regular file: ``a FIFO``, ``a directory``, ``a symbolic link`` (from ``lstat``), ...;
    ``not a regular file`` for any other kind."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"
