"""The memory check of the dataset readers: a source whose arrays would not fit in the
memory available now is refused with one :class:`~fedrcl_flwr.data.sources.raw.DatasetError`
before it is read."""

from __future__ import annotations

from pathlib import Path

from fedrcl_flwr.data.sources.raw import DatasetError


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (``MemAvailable``), or ``None``."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits_memory(nbytes: int, what: str, why: str) -> None:
    """A :class:`DatasetError` when ``nbytes`` exceeds the memory available now."""
    avail = available_memory()
    if avail is not None and nbytes > avail:
        raise DatasetError(
            f"{what} needs about {nbytes / 2**30:.1f} GiB in memory ({why}), "
            f"more than the {avail / 2**30:.1f} GiB available"
        )
