"""The user's ``.npz`` arrays (``x_train``, ``y_train``, ``x_test``, ``y_test``, optional
``d_train`` / ``d_test`` domain ids and ``domain_names``), read without pickle; the path,
the members and the memory they need are checked before anything is loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedrcl_flwr.data.sources.memory import check_fits_memory
from fedrcl_flwr.data.sources.raw import DatasetError, RawSplit
from fedrcl_flwr.data.sources.raw import hwc as _hwc
from fedrcl_flwr.data.sources.raw import int_labels as _int_labels


def check_npz_path(path: Path) -> None:
    """``dataset.path`` of an ``npz`` dataset, when something is there, is a regular file:
    a directory is refused before the dataset cache would fingerprint every file under it
    (``/``: the whole file system), a FIFO before ``np.load`` would wait on it, a path
    that cannot be looked up (a name too long) as such. One :class:`DatasetError`."""
    import errno

    from fedrcl_flwr.config.loading import file_kind
    from fedrcl_flwr.errors import shown

    try:
        if path.is_file():
            return
        kind = file_kind(path)
    except OSError as exc:
        why = "a file name too long" if exc.errno == errno.ENAMETOOLONG else exc.strerror
        raise DatasetError(
            f"dataset.path {shown(str(path))}: cannot be looked up ({why or exc})"
        ) from None
    if kind is not None:
        raise DatasetError(
            f"dataset.path {shown(str(path), 300)}: {kind}, not an .npz file of arrays"
        )


def read_npz(path: Path) -> tuple[RawSplit, RawSplit, list]:
    check_npz_path(path)
    if not path.exists():
        raise DatasetError(f"npz dataset file {path} does not exist (dataset.path)")
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one clear error
        raise DatasetError(f"{path}: not a readable .npz file ({exc})") from None
    with z:
        missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in z.files]
        if missing:
            raise DatasetError(
                f"{path}: missing array(s) {', '.join(missing)} (an npz "
                "dataset holds x_train, y_train, x_test, y_test)"
            )
        _check_npz_memory(path)
        out = []

        def arr(key):
            try:
                return z[key]
            except (ValueError, OSError, EOFError) as exc:  # object arrays, torn members
                raise DatasetError(
                    f"{path}: array {key} cannot be read without pickle "
                    f"({' '.join(str(exc).split())}); store plain numeric "
                    "arrays"
                ) from None

        for s in ("train", "test"):
            x = _hwc(arr(f"x_{s}"), f"{path}: x_{s}")
            y = _int_labels(arr(f"y_{s}"), f"{path}: y_{s}")
            if len(x) != len(y):
                raise DatasetError(
                    f"{path}: x_{s} has {len(x)} images but y_{s} has {len(y)} labels"
                )
            d = _int_labels(arr(f"d_{s}"), f"{path}: d_{s}") if f"d_{s}" in z.files else None
            if d is not None and len(d) != len(y):
                raise DatasetError(
                    f"{path}: d_{s} has {len(d)} domain ids but y_{s} has {len(y)} labels"
                )
            out.append(RawSplit(x, y, d))
        names = _npz_domain_names(z, path, out[0], out[1])
    return out[0], out[1], names


MAX_DOMAIN_NAME = 100  # characters of one npz domain name (a table column header)


def _npz_domain_names(z, path: Path, tr: RawSplit, te: RawSplit) -> list:
    """The npz's optional ``domain_names``: a 1-D array of strings (numpy ``U`` dtype, read
    without pickle), name ``i`` for domain id ``i``, one per domain id ``d_train`` /
    ``d_test`` use (at least max id + 1), distinct and non-empty. Absent: ``[]`` (the
    domains are then called ``domain0``, ``domain1``, ...)."""
    if "domain_names" not in z.files:
        return []
    if tr.d is None:
        raise DatasetError(f"{path}: domain_names without d_train (the domain id of each image)")
    try:
        raw = z["domain_names"]
    except (ValueError, OSError, EOFError):
        raw = None
    if raw is None or raw.dtype.kind != "U" or raw.ndim != 1:
        raise DatasetError(
            f"{path}: domain_names must be a 1-D array of strings "
            "(np.array(['mnist', 'usps']), stored without pickle)"
        )
    names = [str(n) for n in raw.tolist()]
    used = int(max(tr.d.max(initial=0), te.d.max(initial=0) if te.d is not None else 0)) + 1
    bad = [n for n in names if not n.strip() or len(n) > MAX_DOMAIN_NAME or "\n" in n]
    if bad or len(set(names)) != len(names) or len(names) < used:
        why = (
            f"an empty, multi-line or over-{MAX_DOMAIN_NAME}-character name"
            if bad
            else "a name twice"
            if len(set(names)) != len(names)
            else f"{len(names)} names for domain ids up to {used - 1}"
        )
        raise DatasetError(
            f"{path}: domain_names has {why} (one distinct name per domain id of d_train / d_test)"
        )
    return names


def _check_npz_memory(path: Path) -> None:
    """Refuse an npz whose arrays (read from the member headers, nothing loaded) exceed
    the memory available: their bytes plus the uint8 copy of the images."""
    import zipfile

    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                with zf.open(info) as fh:
                    fmt = np.lib.format
                    version = fmt.read_magic(fh)
                    read = (
                        fmt.read_array_header_1_0
                        if version == (1, 0)
                        else fmt.read_array_header_2_0
                    )
                    shape, _, dtype = read(fh)
                n = int(np.prod(shape, dtype=np.float64))
                total += n * dtype.itemsize + (n if info.filename.startswith("x_") else 0)
    except Exception:  # noqa: BLE001 - unreadable headers are reported when loading
        return
    check_fits_memory(total, f"{path}", "its arrays plus a uint8 copy of the images")
