"""Digit-5 at 32x32 RGB, one domain per digit source: MNIST, SVHN and USPS through
torchvision's classes, SynthDigits and MNIST-M (not in torchvision) from ``.npz`` files or
image folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedrcl_flwr.data.sources.imagefolder import read_imagefolder
from fedrcl_flwr.data.sources.npz import read_npz
from fedrcl_flwr.data.sources.raw import DatasetError, RawSplit
from fedrcl_flwr.data.sources.raw import resize_u8 as _resize_u8
from fedrcl_flwr.data.sources.torchvision_files import read_torchvision

DIGIT5_DOMAINS = ("mnist", "svhn", "usps", "synthdigits", "mnistm")


def read_digit5(
    root: Path, download: bool, domains: list, verify_md5: bool = True
) -> tuple[RawSplit, RawSplit, list]:
    """Digit-5 at 32x32 RGB: MNIST, SVHN and USPS from torchvision; SynthDigits and
    MNIST-M (not in torchvision) from ``root/synthdigits.npz`` / ``root/mnistm.npz``
    (x_train, y_train, x_test, y_test) or image folders ``root/<name>/{train,test}/<class>``."""
    names = list(domains) if domains else list(DIGIT5_DOMAINS)
    trs: list[RawSplit] = []
    tes: list[RawSplit] = []
    for di, name in enumerate(names):
        if name in ("mnist", "svhn", "usps"):
            tr, te = read_torchvision(name, root, download, verify_md5)
        elif (root / f"{name}.npz").exists():
            tr, te, _ = read_npz(root / f"{name}.npz")
        elif (root / name).is_dir():
            tr, te, _ = read_imagefolder(root / name, [], 32, 0.2, 0)
        else:
            raise DatasetError(
                f"Digit-5 domain '{name}' not found: expected {root}/{name}.npz "
                f"(x_train, y_train, x_test, y_test) or {root}/{name}/ (class "
                "folders); it is not in torchvision, so it cannot be downloaded "
                "automatically"
            )
        for split, acc in ((tr, trs), (te, tes)):
            x = _resize_u8(split.x, 32)
            if x.shape[-1] == 1:
                x = np.repeat(x, 3, axis=-1)
            acc.append(RawSplit(x, split.y, np.full(len(split.y), di, np.int64)))

    def cat(parts):
        return RawSplit(
            np.concatenate([p.x for p in parts]),
            np.concatenate([p.y for p in parts]),
            np.concatenate([p.d for p in parts]),
        )

    return cat(trs), cat(tes), names
