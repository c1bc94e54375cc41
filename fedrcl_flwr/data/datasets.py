"""Datasets: one in-memory image representation for every source.

Every source (the embedded synthetic data, torchvision's CIFAR-10/100, MNIST,
Fashion-MNIST, SVHN, USPS, STL-10, Tiny-ImageNet, image-folder trees such as PACS,
Office-10, DomainNet and HAM10000, Digit-5, and user ``.npz`` arrays) is read once into
``uint8`` arrays and wrapped in :class:`ImageArrayDataset`, which normalises (the
training set's per-channel mean/std, fixed constants such as the authors', or not at all:
``dataset.normalize``) and augments whole batches on tensors (random rotation, random
crop with padding, horizontal flip, per dataset; pixel-exact to torchvision's transforms
on the PIL image for the same draws: ``fedrcl_flwr/augment.py``). Clients never copy data:
they hold index arrays into the one training set of their process.

Nothing is downloaded unless ``download=True``; a missing dataset raises
:class:`DatasetError` saying where it looked and how to get it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from fedrcl_flwr.accel import gather_rows, to_device, transfer_plan
from fedrcl_flwr.config.catalog import DATASET_NAMES, TORCHVISION_CLASSES, dataset_info
from fedrcl_flwr.data.raw import DatasetError, RawSplit
from fedrcl_flwr.data.raw import hwc as _hwc
from fedrcl_flwr.data.raw import int_labels as _int_labels
from fedrcl_flwr.data.raw import resize_u8 as _resize_u8
from fedrcl_flwr.errors import ConfigError

# --------------------------------------------------------------------------------------
# The one dataset class
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AugmentSpec:
    """The training augmentation, in torchvision's order on the image before
    ``ToTensor`` / ``Normalize``: random rotation by up to ``rotation`` degrees (0 = off;
    nearest neighbour, black corners), random crop with padding ``crop_pad`` (0 = off),
    horizontal flip. ``pad_fill``: ``black`` pads the crop with pixel value 0 before
    normalisation (torchvision's ``RandomCrop(padding=p)`` on a PIL image); ``mean`` pads
    the normalised image with 0, i.e. with the normalisation mean colour."""

    crop_pad: int = 0
    flip: bool = False
    rotation: float = 0.0
    pad_fill: str = "mean"

    @property
    def active(self) -> bool:
        return self.crop_pad > 0 or self.flip or self.rotation > 0


@dataclass
class AugmentDraws:
    """The random draws of one training batch (:meth:`ImageArrayDataset.draw_augment`):
    rotation angles in degrees, crop offsets (row ``top``, column ``left``) and the
    flip mask; ``None`` where that transform is off."""

    angles: torch.Tensor | None = None
    top: torch.Tensor | None = None
    left: torch.Tensor | None = None
    flip: torch.Tensor | None = None


class ImageArrayDataset(Dataset):
    """Images held as a ``uint8`` tensor (N, C, H, W) plus labels.

    ``dataset[i]`` returns ``(x, y)`` with ``x`` normalised float32 (C, H, W) (augmented
    when an :class:`AugmentSpec` is active); :meth:`get_batch` returns a whole batch with
    vectorised augmentation drawn from a given generator — the training loop's fast path.
    ``images`` is only ever read (it may be a read-only memory map).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: np.ndarray,
        mean,
        std,
        augment: AugmentSpec | None = None,
    ):
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self._labels_t = torch.as_tensor(self.labels)
        self.mean = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.augment = augment if augment is not None and augment.active else None
        self._stats_on: dict = {}  # device -> (mean, std) there

    def _stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, std)`` on ``device`` (copied there once)."""
        if device.type == "cpu":
            return self.mean, self.std
        key = str(device)
        if key not in self._stats_on:
            self._stats_on[key] = (to_device(self.mean, device), to_device(self.std, device))
        return self._stats_on[key]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def plain(self) -> ImageArrayDataset:
        """The same data without augmentation (for embedding / evaluation)."""
        return ImageArrayDataset(
            self.images, self.labels, self.mean.flatten(), self.std.flatten(), None
        )

    def _normalise(self, u8: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(u8.device)
        return (u8.float().div_(255.0) - mean) / std

    def __getitem__(self, i):
        x, y = self.get_batch(np.asarray([int(i)]))
        return x[0], int(y[0])

    def draw_augment(self, b: int, generator: torch.Generator | None = None) -> AugmentDraws:
        """The random draws of a training batch of ``b`` samples, in this order (all from
        ``generator`` on the host): rotation angles (``torch.rand(b)``), then, with a crop,
        column and row offsets (``torch.randint(0, 2·pad + 1, (b,))`` each) and flips
        (``torch.rand(b) < 0.5``), or, without a crop, flips alone."""
        from fedrcl_flwr.augment import draw_angles, draw_crop_flip

        aug = self.augment
        draws = AugmentDraws()
        if aug is None:
            return draws
        if aug.rotation > 0:
            draws.angles = draw_angles(b, aug.rotation, generator)
        if aug.crop_pad > 0:
            draws.top, draws.left, draws.flip = draw_crop_flip(b, aug.crop_pad, aug.flip, generator)
        elif aug.flip:
            draws.flip = torch.rand(b, generator=generator) < 0.5
        return draws

    def apply_augment(self, u8: torch.Tensor, draws: AugmentDraws) -> torch.Tensor:
        """The normalised float32 batch of the ``uint8`` images ``u8`` (B, C, H, W) under
        ``draws``: as torchvision's ``RandomRotation`` -> ``RandomCrop(padding)`` ->
        ``RandomHorizontalFlip`` -> ``ToTensor`` -> ``Normalize`` on the PIL images with
        these angles / offsets / flips (``pad_fill: black``; with ``mean`` the crop pads
        the normalised image with 0). Rotation, crop and flip only move pixels, so they run
        on the ``uint8`` values, on ``u8``'s device."""
        from fedrcl_flwr.augment import crop_flip, rotate

        aug = self.augment
        if draws.angles is not None:
            u8 = rotate(u8, draws.angles)
        if aug is None or draws.top is None or draws.left is None:  # drawn together
            x = self._normalise(u8)
            if draws.flip is not None:
                do = to_device(draws.flip, u8.device)
                x = torch.where(do[:, None, None, None], x.flip(3), x)
            return x
        if aug.pad_fill == "black":
            return self._normalise(crop_flip(u8, draws.top, draws.left, draws.flip, aug.crop_pad))
        return crop_flip(self._normalise(u8), draws.top, draws.left, draws.flip, aug.crop_pad)

    def get_batch(
        self, idx, generator: torch.Generator | None = None, device: torch.device | None = None
    ):
        """Samples ``idx`` as ``(x, y)`` on ``device`` (default: the CPU).

        The ``uint8`` pixels and the labels are gathered on the host (into pinned memory
        for a CUDA device) and copied without blocking; augmentation (rotation, crop,
        flip: :meth:`draw_augment`, :meth:`apply_augment`) and normalisation then run
        there as batched tensor ops. Every random draw comes from ``generator`` on the
        host, in the same order whatever the device."""
        idx_t = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        dev = torch.device("cpu" if device is None else device)
        pin, _ = transfer_plan(dev)
        u8 = to_device(gather_rows(self.images, idx_t, pin), dev)
        y = to_device(gather_rows(self._labels_t, idx_t, pin), dev)
        if self.augment is None:
            return self._normalise(u8), y
        return self.apply_augment(u8, self.draw_augment(len(idx_t), generator)), y


@dataclass
class DataBundle:
    """What an experiment trains and tests on.

    ``train_domains`` / ``test_domains`` hold one domain id per sample (``None`` for
    single-domain data); ``domain_names`` names them. ``val`` is the held-out part of the
    training set (``dataset.val_fraction``), or ``None``.
    """

    name: str
    train: ImageArrayDataset
    test: ImageArrayDataset
    train_labels: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    in_channels: int
    image_size: int
    train_domains: np.ndarray | None = None
    test_domains: np.ndarray | None = None
    domain_names: list = field(default_factory=list)
    val: ImageArrayDataset | None = None


# --------------------------------------------------------------------------------------
# Raw sources: each returns uint8 arrays (N, H, W, C)
# --------------------------------------------------------------------------------------


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


def _missing(name: str, root: Path, extra: str = "") -> DatasetError:
    how = (
        (
            f"set dataset.download: true on a machine with a network (uses "
            f"torchvision.datasets.{TORCHVISION_CLASSES[name]}), or copy the files there"
        )
        if name in TORCHVISION_CLASSES
        else "put the data there"
    )
    return DatasetError(
        f"dataset '{name}' not found under {root}{extra}: {how}, or point "
        f"dataset.root at the directory that holds it"
    )


def _torchvision_files(name: str, root: Path) -> tuple[Path, list[tuple[str, str | None]]]:
    """The folder and the ``(file name, MD5 or None)`` list that torchvision's class for
    ``name`` reads (its :class:`TorchvisionLayout`'s ``files``, taken from the class's own
    attributes, so they follow torchvision). ``None``: torchvision does not check that
    file's checksum when loading."""
    import torchvision.datasets as tvd

    return _layout(name).files(getattr(tvd, TORCHVISION_CLASSES[name]), root)


def _layout(name: str) -> TorchvisionLayout:
    layout = SOURCES[name].torchvision
    if layout is None:
        raise DatasetError(f"dataset {name!r} is not read by torchvision")
    return layout


def _cifar_files(cls, root: Path) -> tuple[Path, list]:
    files = [(f, m) for f, m in cls.train_list + cls.test_list]
    return root / cls.base_folder, files + [(cls.meta["filename"], cls.meta["md5"])]


def _cifar_split(cls, root: Path, train: bool, download: bool) -> tuple:
    ds = cls(str(root), train=train, download=download)
    return ds.data, ds.targets, len(ds.classes)  # the classes batches.meta names (their K)


def _stl10_files(cls, root: Path) -> tuple[Path, list]:
    return root / cls.base_folder, [(f, m) for f, m in cls.train_list + cls.test_list]


def _stl10_split(cls, root: Path, train: bool, download: bool) -> tuple:
    ds = cls(str(root), split="train" if train else "test", download=download)
    return ds.data, ds.labels, None


def _svhn_files(cls, root: Path) -> tuple[Path, list]:
    return root / "svhn", [(cls.split_list[s][1], cls.split_list[s][2]) for s in ("train", "test")]


def _svhn_split(cls, root: Path, train: bool, download: bool) -> tuple:
    ds = cls(str(root / "svhn"), split="train" if train else "test", download=download)
    return ds.data, ds.labels, None


def _usps_files(cls, root: Path) -> tuple[Path, list]:
    # torchvision's USPS reads the bz2 files without checking them
    return root / "usps", [(cls.split_list[s][1], None) for s in ("train", "test")]


def _usps_split(cls, root: Path, train: bool, download: bool) -> tuple:
    ds = cls(str(root / "usps"), train=train, download=download)
    return ds.data, ds.targets, None


def _idx_files(cls, root: Path) -> tuple[Path, list]:
    """MNIST / FashionMNIST: the uncompressed idx files in ``<root>/<Class>/raw`` (the MD5s
    torchvision lists are those of the .gz downloads; loading only checks existence)."""
    return (
        root / cls.__name__ / "raw",
        [(os.path.splitext(os.path.basename(url))[0], None) for url, _ in cls.resources],
    )


def _idx_split(cls, root: Path, train: bool, download: bool) -> tuple:
    ds = cls(str(root), train=train, download=download)
    return ds.data.numpy(), ds.targets.numpy(), None


def _unpack_idx_gz(folder: Path, files: list) -> None:
    """MNIST / Fashion-MNIST as distributed are ``*-idx?-ubyte.gz``; torchvision's class
    only reads the unpacked files (it unpacks only after a download). Unpack any .gz
    present next to a missing file, with torchvision's own ``extract_archive``."""
    from torchvision.datasets.utils import extract_archive

    for fname, _ in files:
        gz = folder / f"{fname}.gz"
        if not (folder / fname).exists() and gz.is_file():
            try:
                extract_archive(str(gz), str(folder))
            except (OSError, EOFError) as exc:
                raise DatasetError(f"{gz}: cannot be unpacked ({exc})") from None


def _existence_checked(cls):
    """``cls`` (torchvision's CIFAR10 / CIFAR100 / SVHN / STL10) with every expected
    MD5 replaced by ``None``: torchvision's own ``check_integrity(path, None)`` then only
    checks that each file exists, and the class decodes the files exactly as it decodes
    the official ones. Same name and folders as ``cls``."""
    attrs = {}
    for key in ("train_list", "test_list"):
        if hasattr(cls, key):
            attrs[key] = [[f, None] for f, _ in getattr(cls, key)]
    if isinstance(getattr(cls, "meta", None), dict):
        attrs["meta"] = {**cls.meta, "md5": None}
    if isinstance(getattr(cls, "split_list", None), dict):
        attrs["split_list"] = {k: [v[0], v[1], None] for k, v in cls.split_list.items()}
    return type(cls.__name__, (cls,), attrs)


def _torchvision(
    name: str, root: Path, download: bool, verify_md5: bool = True
) -> tuple[RawSplit, RawSplit]:
    """Decode a dataset with torchvision's own class (its file layout, checks and
    decoding). A refusal is turned into one clear error: files missing (where and how to
    get them), a file whose MD5 differs from the official release (torchvision verifies
    CIFAR, SVHN and STL-10 on every load), or files it cannot decode.

    ``verify_md5=False`` (``dataset.verify_md5: false``) loads CIFAR / SVHN / STL-10 files
    that differ from the official release (your own data in that layout, or the tiny
    files of the tests) with the same class, which then checks only that the files exist
    (:func:`_existence_checked`); MNIST, Fashion-MNIST and USPS are never MD5-checked by
    torchvision when loading."""
    import torchvision.datasets as tvd

    layout = _layout(name)
    folder, files = _torchvision_files(name, root)
    if layout.idx_gz:
        _unpack_idx_gz(folder, files)
    try:
        cls = getattr(tvd, TORCHVISION_CLASSES[name])
        if layout.md5_checked and not verify_md5:
            cls = _existence_checked(cls)
        out = []
        for train in (True, False):
            x, y, classes = layout.split(cls, root, train, download)
            out.append(
                RawSplit(
                    _hwc(x, f"dataset '{name}'"),
                    _int_labels(y, f"dataset '{name}' labels"),
                    classes=classes,
                )
            )
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - every refusal becomes one clear error
        raise _torchvision_refusal(exc, name, root, download, verify_md5, folder, files) from None
    return out[0], out[1]


def _torchvision_refusal(
    exc: Exception,
    name: str,
    root: Path,
    download: bool,
    verify_md5: bool,
    folder: Path,
    files: list,
) -> DatasetError:
    """What a torchvision class's refusal means, in one line: a failed download, files
    missing (where and how to get them), a file failing the MD5 check, or files it
    cannot decode."""
    if download and isinstance(exc, (RuntimeError, OSError)):
        return DatasetError(f"dataset '{name}': download into {root} failed ({exc})")
    missing = [f for f, _ in files if not (folder / f).is_file()]
    if missing:
        return _missing(name, root, f" (no {folder / missing[0]})")
    from torchvision.datasets.utils import check_integrity

    bad = [
        f
        for f, md5 in files
        if verify_md5 and md5 is not None and not check_integrity(str(folder / f), md5)
    ]
    if bad:
        return DatasetError(
            f"dataset '{name}': {folder / bad[0]} fails torchvision's MD5 check (it is "
            "corrupted, truncated or not the official release): copy the official "
            "files there, use dataset.download: true, or set dataset.verify_md5: false "
            "to load files of your own in this layout"
        )
    detail = " ".join(str(exc).split())
    return DatasetError(
        f"dataset '{name}': torchvision.datasets.{TORCHVISION_CLASSES[name]} "
        f"cannot read the files in {folder} ({type(exc).__name__}: "
        f"{detail})"
    )


_IMG_EXT = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")


def _read_images(files: list[Path], size: int | None) -> np.ndarray:
    from PIL import Image

    out = []
    if size is not None:
        check_fits_memory(
            len(files) * size * size * 3, f"{len(files)} images", f"{size}x{size} RGB uint8 each"
        )
    for f in files:
        try:
            with Image.open(f) as src:
                im = src.convert("RGB")
                if size is not None and im.size != (size, size):
                    im = im.resize((size, size), Image.Resampling.BILINEAR)
                out.append(np.asarray(im, dtype=np.uint8))
        except (OSError, ValueError, SyntaxError) as exc:  # PIL's errors for a bad file
            raise DatasetError(
                f"{f}: not a readable image ({' '.join(str(exc).split())})"
            ) from None
    if not out:
        return np.zeros((0, size or 1, size or 1, 3), np.uint8)
    shapes = {a.shape for a in out}
    if len(shapes) > 1:
        raise DatasetError(
            f"images of different sizes {sorted(shapes)[:3]}...: set "
            "dataset.image_size to resize them"
        )
    return np.stack(out)


def _class_tree(folder: Path) -> dict[str, list[Path]]:
    classes = {}
    for cdir in sorted(p for p in folder.iterdir() if p.is_dir()):
        files = sorted(f for f in cdir.rglob("*") if f.suffix.lower() in _IMG_EXT)
        if files:
            classes[cdir.name] = files
    return classes


def _imagefolder(
    root: Path,
    domains: list,
    image_size: int | None,
    test_fraction: float,
    seed: int,
    test_split: str = "random",
) -> tuple[RawSplit, RawSplit, list]:
    """``root/[domain/][train|test/]class/image``.

    With ``domains`` each named sub-folder is one domain (PACS, Office-10, DomainNet). A
    folder with ``train``/``test`` (or ``train``/``val``, RethinkFL's SynthDigits layout)
    sub-folders uses them; otherwise ``test_split`` ``random`` holds out a seeded,
    stratified ``test_fraction`` of each class for testing, and ``rethinkfl`` RethinkFL's
    Office-Caltech rule (``datasets/officecaltech.py``: image ``i`` of the domain, classes
    and files sorted as torchvision's ``ImageFolder``, is a test image iff ``i % 10 > 7``).
    """
    if not root.is_dir():
        raise DatasetError(
            f"image folder {root} does not exist: set dataset.root to a "
            "directory of class sub-folders (or domain/class sub-folders)"
        )
    size = image_size or 64
    domain_dirs = [root / d for d in domains] if domains else [root]
    for d in domain_dirs:
        if not d.is_dir():
            raise DatasetError(
                f"domain folder {d} does not exist (dataset.domains lists "
                f"{domains}; found {sorted(p.name for p in root.iterdir())})"
            )
    splits: dict[str, tuple[list, list, list]] = {"train": ([], [], []), "test": ([], [], [])}
    class_names: list | None = None
    for di, ddir in enumerate(domain_dirs):
        test_dir = next((t for t in ("test", "val") if (ddir / t).is_dir()), None)
        if (ddir / "train").is_dir() and test_dir:
            trees = {"train": _class_tree(ddir / "train"), "test": _class_tree(ddir / test_dir)}
        elif test_split == "rethinkfl":
            trees = _rethinkfl_trees(_class_tree(ddir))
        else:
            tree = _class_tree(ddir)
            rng = np.random.default_rng([seed, di, 31])
            trees = {"train": {}, "test": {}}
            for cname, files in tree.items():
                perm = rng.permutation(len(files))
                n_test = int(round(test_fraction * len(files)))
                trees["test"][cname] = [files[i] for i in sorted(perm[:n_test])]
                trees["train"][cname] = [files[i] for i in sorted(perm[n_test:])]
        names = sorted(set(trees["train"]) | set(trees["test"]))
        if not names:
            raise DatasetError(
                f"no images found under {ddir} (expected class sub-folders "
                f"with {', '.join(_IMG_EXT)} files)"
            )
        if class_names is None:
            class_names = names
        elif names != class_names:
            raise DatasetError(
                f"{ddir} has classes {names[:5]}... but the first domain has "
                f"{class_names[:5]}...: every domain needs the same classes"
            )
        for s in ("train", "test"):
            xs, ys, ds = splits[s]
            for ci, cname in enumerate(class_names):
                files = trees[s].get(cname, [])
                xs.append(_read_images(files, size))
                ys.append(np.full(len(files), ci, np.int64))
                ds.append(np.full(len(files), di, np.int64))
    out = []
    for s in ("train", "test"):
        xs, ys, ds = splits[s]
        out.append(RawSplit(np.concatenate(xs), np.concatenate(ys), np.concatenate(ds)))
    return out[0], out[1], list(domains) if domains else []


def _rethinkfl_trees(tree: dict) -> dict:
    """Split a class tree by RethinkFL's rule (see :func:`_imagefolder`)."""
    from fedrcl_flwr.data.rethinkfl import rethinkfl_train_mask

    flat = [(c, f) for c, files in tree.items() for f in files]
    train = rethinkfl_train_mask(len(flat))
    trees: dict = {"train": {}, "test": {}}
    for (cname, f), is_train in zip(flat, train):
        trees["train" if is_train else "test"].setdefault(cname, []).append(f)
    return trees


def _tinyimagenet(root: Path, image_size: int | None) -> tuple[RawSplit, RawSplit]:
    """Tiny-ImageNet-200 as distributed: ``train/<wnid>/images/*.JPEG`` and
    ``val/images`` + ``val/val_annotations.txt`` (used as the test set)."""
    base = root / "tiny-imagenet-200" if (root / "tiny-imagenet-200").is_dir() else root
    train_dir, val_dir = base / "train", base / "val"
    ann = val_dir / "val_annotations.txt"
    if not train_dir.is_dir() or not ann.exists():
        raise DatasetError(
            f"dataset 'tinyimagenet' not found under {base}: unpack "
            "tiny-imagenet-200.zip there (train/ and val/ with "
            "val_annotations.txt)"
        )
    wnids = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    index = {w: i for i, w in enumerate(wnids)}
    size = image_size or 64
    files, labels = [], []
    for w in wnids:
        fs = sorted((train_dir / w).rglob("*.JPEG"))
        files += fs
        labels += [index[w]] * len(fs)
    tr = RawSplit(_read_images(files, size), np.asarray(labels, np.int64))
    vfiles, vlabels = [], []
    for line in ann.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[1] in index:
            vfiles.append(val_dir / "images" / parts[0])
            vlabels.append(index[parts[1]])
    te = RawSplit(_read_images(vfiles, size), np.asarray(vlabels, np.int64))
    return tr, te


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


def _npz(path: Path) -> tuple[RawSplit, RawSplit, list]:
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


DIGIT5_DOMAINS = ("mnist", "svhn", "usps", "synthdigits", "mnistm")


def _digit5(
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
            tr, te = _torchvision(name, root, download, verify_md5)
        elif (root / f"{name}.npz").exists():
            tr, te, _ = _npz(root / f"{name}.npz")
        elif (root / name).is_dir():
            tr, te, _ = _imagefolder(root / name, [], 32, 0.2, 0)
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


# --------------------------------------------------------------------------------------
# Assembly
# --------------------------------------------------------------------------------------


def default_augment(name: str, image_size: int) -> AugmentSpec:
    """The standard augmentation of dataset ``name`` (:data:`SOURCES`' ``augment``); for
    natural images of any size (``augment`` ``None``: image folders, and a name not in
    the table) a crop padded by an eighth of the image size, and a flip."""
    source = SOURCES.get(name)
    if source is not None and source.augment is not None:
        return source.augment
    return AugmentSpec(max(1, image_size // 8), True)


def augment_spec(
    name: str,
    image_size: int,
    augment: bool,
    rotation: float = 0.0,
    crop_pad: int | None = None,
    flip: bool | None = None,
    pad_fill: str = "mean",
) -> AugmentSpec | None:
    """The training augmentation of a dataset: its standard crop/flip
    (:func:`default_augment`; none for ``npz``) with ``dataset.rotation`` / ``crop_pad`` /
    ``flip`` / ``pad_fill`` applied; ``None`` when ``dataset.augment`` is off or nothing is
    left. Not part of the prepared arrays (it is drawn per batch), so changing it never
    rebuilds the dataset cache."""
    if not augment:
        return None
    aug = replace(default_augment(name, image_size), pad_fill=str(pad_fill))
    if rotation > 0:
        aug = replace(aug, rotation=float(rotation))
    if crop_pad is not None:
        aug = replace(aug, crop_pad=int(crop_pad))
    if flip is not None:
        aug = replace(aug, flip=bool(flip))
    return aug if aug.active else None


def normalisation(normalize, x: np.ndarray, what: str = "dataset") -> tuple[list, list]:
    """``(mean, std)`` per channel of ``dataset.normalize``: the training images'
    statistics (``True``), none (``False``: 0 / 1) or the given ``{mean, std}`` constants
    (checked against the images' channels: a :class:`DatasetError` otherwise)."""
    channels = int(x.shape[-1])
    if normalize is True:
        return _channel_stats(x)
    if normalize is False or normalize is None:
        return [0.0] * channels, [1.0] * channels
    from fedrcl_flwr.config import normalize_constants

    try:
        constants = normalize_constants(normalize, what, channels)
    except ConfigError as exc:
        raise DatasetError(str(exc)) from None
    assert constants is not None  # None only for true / false, handled above
    mean, std = constants
    return mean, std


def _channel_stats(x: np.ndarray) -> tuple[list, list]:
    sample = x[:: max(1, len(x) // 10000)].astype(np.float64) / 255.0
    mean = sample.mean(axis=(0, 1, 2))
    std = sample.std(axis=(0, 1, 2))
    std = np.where(std < 1e-6, 1.0, std)
    return mean.tolist(), std.tolist()


def load_dataset(
    name: str,
    *,
    root: str = "~/data",
    path: str | None = None,
    download: bool = False,
    augment: bool = True,
    normalize: bool = True,
    image_size: int | None = None,
    synthetic: dict | None = None,
    seed: int = 0,
    val_fraction: float = 0.0,
    domains: list | None = None,
    test_fraction: float = 0.2,
    test_split: str = "random",
    rotation: float = 0.0,
    crop_pad: int | None = None,
    verify_md5: bool = True,
    flip: bool | None = None,
    pad_fill: str = "mean",
    image_column: str | None = None,
    label_column: str | None = None,
    domain_column: str | None = None,
) -> DataBundle:
    """Load a dataset into a :class:`DataBundle` (see the module docstring).
    ``normalize``: ``True`` | ``False`` | ``{"mean": [...], "std": [...]}``.

    Steps: read the source's ``uint8`` images (:func:`_read_source`), check the two
    splits (:func:`_check_splits`), resize (``image_size``), count the classes
    (:func:`_num_classes`), hold out a validation share (:func:`_hold_out_validation`),
    then wrap train / test / validation with the normalisation and augmentation."""
    tr, te, dnames, class_list = _read_source(
        name,
        root,
        path=path,
        download=download,
        image_size=image_size,
        synthetic=synthetic,
        seed=seed,
        domains=domains,
        test_fraction=test_fraction,
        verify_md5=verify_md5,
        test_split=test_split,
        columns=(image_column, label_column, domain_column),
    )
    _check_splits(name, tr, te)
    if image_size is not None:
        tr = RawSplit(_resize_u8(tr.x, image_size), tr.y, tr.d)
        te = RawSplit(_resize_u8(te.x, image_size), te.y, te.d)
    if tr.x.shape[1:] != te.x.shape[1:] and len(te.y):
        raise DatasetError(
            f"dataset '{name}': train images {tr.x.shape[1:]} and test images "
            f"{te.x.shape[1:]} differ; set dataset.image_size"
        )
    num_classes = _num_classes(name, tr, te, class_list)
    tr, val_split = _hold_out_validation(tr, val_fraction, seed)
    mean, std = normalisation(normalize, tr.x, f"dataset {name!r}")
    size = int(tr.x.shape[1])
    aug = augment_spec(name, size, augment, rotation, crop_pad, flip, pad_fill)

    def wrap(split: RawSplit, aug_spec):
        imgs = torch.from_numpy(np.ascontiguousarray(split.x.transpose(0, 3, 1, 2)))
        return ImageArrayDataset(imgs, split.y, mean, std, aug_spec)

    has_domains = tr.d is not None and len(np.unique(tr.d)) > 1
    return DataBundle(
        name=name,
        train=wrap(tr, aug),
        test=wrap(te, None),
        train_labels=tr.y,
        test_labels=te.y,
        num_classes=num_classes,
        in_channels=int(tr.x.shape[-1]),
        image_size=size,
        train_domains=tr.d if has_domains else None,
        test_domains=te.d if has_domains and te.d is not None else None,
        domain_names=dnames if has_domains else [],
        val=wrap(val_split, None) if val_split is not None else None,
    )


def _read_source(
    name: str,
    root: str,
    *,
    path: str | None,
    download: bool,
    image_size: int | None,
    synthetic: dict | None,
    seed: int,
    domains: list | None,
    test_fraction: float,
    verify_md5: bool,
    test_split: str = "random",
    columns: tuple[str | None, str | None, str | None] = (None, None, None),
) -> tuple[RawSplit, RawSplit, list, int | None]:
    """The train and test images of source ``name`` (its reader in :data:`SOURCES`), its
    domain names, and the number of classes its own class list names (CIFAR's
    ``batches.meta``, a Hugging Face ``ClassLabel``, the synthetic generator's
    ``num_classes``; ``None`` for the others)."""
    source = SOURCES.get(name)
    if source is None:
        raise DatasetError(f"unknown dataset {name!r} (known: {', '.join(DATASET_NAMES)})")
    if dataset_info(name).source == "path" and not path:
        raise DatasetError(f"dataset.path is required when dataset.name is {name}")
    args = SourceArgs(
        name=name,
        root=Path(os.path.expanduser(root or ".")),
        path=path,
        download=download,
        image_size=image_size,
        synthetic=synthetic or {},
        seed=seed,
        domains=list(domains or []),
        test_fraction=test_fraction,
        verify_md5=verify_md5,
        test_split=test_split,
        columns=columns,
    )
    return source.read(args)


def _synthetic(sy: dict, seed: int) -> tuple[RawSplit, RawSplit, list]:
    """The embedded synthetic images (:func:`fedrcl_flwr.data.synthetic.make_synthetic`),
    after checking that they fit in memory."""
    from fedrcl_flwr.data.synthetic import make_synthetic

    hw = int(sy.get("image_size", 32)) ** 2 * int(sy.get("channels", 3))
    n_all = int(sy.get("num_train", 20000)) + int(sy.get("num_test", 4000))
    bank = (int(sy.get("num_classes", 10)) * int(sy.get("subclusters", 3)) + 6) * 25 * hw
    check_fits_memory(
        n_all * hw + 12 * bank + 16 * 4096 * hw,
        "dataset.synthetic",
        f"{n_all} images of {hw} uint8 values, plus float pattern banks",
    )
    xtr, ytr, dtr, xte, yte, dte = make_synthetic(**sy, seed=seed)
    nd = int(sy.get("num_domains", 1))
    return (
        RawSplit(xtr, ytr, dtr),
        RawSplit(xte, yte, dte),
        [f"domain{i}" for i in range(nd)] if nd > 1 else [],
    )


# --------------------------------------------------------------------------------------
# The sources: every dataset of the catalog once, by name
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceArgs:
    """What :func:`_read_source` hands a reader: the dataset settings that shape its
    arrays (``root`` expanded)."""

    name: str
    root: Path
    path: str | None
    download: bool
    image_size: int | None
    synthetic: dict
    seed: int
    domains: list
    test_fraction: float
    verify_md5: bool
    test_split: str
    columns: tuple[str | None, str | None, str | None]  # image, label, domain column


# (train, test, domain names, number of classes its own class list names or None)
SourceRead = tuple[RawSplit, RawSplit, list, int | None]


@dataclass(frozen=True)
class TorchvisionLayout:
    """How the ``torchvision.datasets`` class of a dataset (the catalog's
    ``torchvision``) is read. ``files(cls, root)``: the folder and the ``(file name, MD5
    or None)`` list the class reads (``None``: not checked when loading);
    ``split(cls, root, train, download)``: one split's images, labels and the number of
    classes the class's own list names (or ``None``); ``md5_checked``: the class checks
    its files' MD5s on every load (``dataset.verify_md5: false`` then swaps in
    :func:`_existence_checked`); ``idx_gz``: MNIST's ``.gz`` idx files are unpacked
    first (:func:`_unpack_idx_gz`)."""

    files: Callable[[Any, Path], tuple[Path, list[tuple[str, str | None]]]]
    split: Callable[[Any, Path, bool, bool], tuple[Any, Any, int | None]]
    md5_checked: bool
    idx_gz: bool = False


def _never(d: Any) -> bool:
    return False


def _always(d: Any) -> bool:
    return True


def _no_key_fields(d: Any) -> dict:
    return {}


@dataclass(frozen=True)
class DataSource:
    """How a dataset is loaded (its facts before loading are the catalog's
    :class:`~fedrcl_flwr.config.catalog.DatasetInfo`).

    ``read``: its reader (:class:`SourceArgs` -> train, test, domain names, the classes
    its own class list names); ``augment``: its standard training augmentation, as the
    papers' code uses (``None``: natural images of any size, scaled to the image size:
    :func:`default_augment`); ``torchvision``: how torchvision's class reads it;
    ``seeded(d)``: the experiment's seed draws its arrays (beyond ``dataset.val_fraction``:
    :func:`fedrcl_flwr.data.cache.seed_shapes_arrays`); ``key_fields(d)``: settings of
    the dataset config ``d`` only this dataset reads, added to its cache key."""

    read: Callable[[SourceArgs], SourceRead]
    augment: AugmentSpec | None
    torchvision: TorchvisionLayout | None = None
    seeded: Callable[[Any], bool] = _never
    key_fields: Callable[[Any], dict] = _no_key_fields


def _read_synthetic(a: SourceArgs) -> SourceRead:
    tr, te, dnames = _synthetic(a.synthetic, a.seed)
    classes = a.synthetic.get("num_classes")
    return tr, te, dnames, None if classes is None else int(classes)


def _read_torchvision(a: SourceArgs) -> SourceRead:
    tr, te = _torchvision(a.name, a.root, a.download, a.verify_md5)
    return tr, te, [], tr.classes


def _read_tinyimagenet(a: SourceArgs) -> SourceRead:
    return (*_tinyimagenet(a.root, a.image_size), [], None)


def _read_imagefolder(a: SourceArgs) -> SourceRead:
    return (
        *_imagefolder(a.root, a.domains, a.image_size, a.test_fraction, a.seed, a.test_split),
        None,
    )


def _read_digit5(a: SourceArgs) -> SourceRead:
    return (*_digit5(a.root, a.download, a.domains, a.verify_md5), None)


def _read_npz(a: SourceArgs) -> SourceRead:
    assert a.path is not None  # dataset.path: required (catalog source "path")
    return (*_npz(Path(os.path.expanduser(a.path))), None)


def _read_hf_disk(a: SourceArgs) -> SourceRead:
    from fedrcl_flwr.data.hf import read_hf_disk

    assert a.path is not None  # dataset.path: required (catalog source "path")
    tr, te, names = read_hf_disk(
        a.path, *a.columns[:2], image_size=a.image_size, domain_column=a.columns[2]
    )
    return tr, te, names, tr.classes


def _synthetic_key(d: Any) -> dict:
    from dataclasses import asdict

    return {"synthetic": asdict(d.synthetic)}


def _imagefolder_seeded(d: Any) -> bool:
    """An image folder without ``train`` / ``test`` sub-folders: the seed draws its test
    split (:func:`_imagefolder`)."""
    root = Path(os.path.expanduser(d.root or "."))
    folders = [root / x for x in d.domains] if d.domains else [root]
    return not all((f / "train").is_dir() and (f / "test").is_dir() for f in folders)


def _hf_columns_key(d: Any) -> dict:
    columns = [d.image_column, d.label_column]  # which columns are read
    domain = getattr(d, "domain_column", None)
    return {"columns": columns + [domain] if domain else columns}


_CIFAR = TorchvisionLayout(_cifar_files, _cifar_split, md5_checked=True)
_IDX = TorchvisionLayout(_idx_files, _idx_split, md5_checked=False, idx_gz=True)

# name -> how it is loaded: the catalog's DATASETS, same names, same order
# (tests/registry/test_registries.py)
SOURCES: dict[str, DataSource] = {
    "synthetic": DataSource(
        _read_synthetic, AugmentSpec(2, True), seeded=_always, key_fields=_synthetic_key
    ),
    "cifar10": DataSource(_read_torchvision, AugmentSpec(4, True), _CIFAR),
    "cifar100": DataSource(_read_torchvision, AugmentSpec(4, True), _CIFAR),
    "mnist": DataSource(_read_torchvision, AugmentSpec(0, False), _IDX),
    "fmnist": DataSource(_read_torchvision, AugmentSpec(0, False), _IDX),
    "svhn": DataSource(
        _read_torchvision,
        AugmentSpec(4, False),
        TorchvisionLayout(_svhn_files, _svhn_split, md5_checked=True),
    ),
    "usps": DataSource(
        _read_torchvision,
        AugmentSpec(0, False),
        TorchvisionLayout(_usps_files, _usps_split, md5_checked=False),
    ),
    "stl10": DataSource(
        _read_torchvision,
        AugmentSpec(12, True),
        TorchvisionLayout(_stl10_files, _stl10_split, md5_checked=True),
    ),
    "tinyimagenet": DataSource(_read_tinyimagenet, AugmentSpec(8, True)),
    "imagefolder": DataSource(_read_imagefolder, None, seeded=_imagefolder_seeded),
    "digit5": DataSource(_read_digit5, AugmentSpec(2, False)),
    # your own arrays: nothing is assumed about them (digits, text, medical images, ...:
    # a horizontal flip is wrong for most that are not natural photographs); opt in with
    # dataset.crop_pad / dataset.flip / dataset.rotation
    "npz": DataSource(_read_npz, AugmentSpec(0, False)),
    # your data, like npz: opt in to augmentation
    "hf_disk": DataSource(_read_hf_disk, AugmentSpec(0, False), key_fields=_hf_columns_key),
}


def _check_splits(name: str, tr: RawSplit, te: RawSplit) -> None:
    if len(tr.y) == 0:
        raise DatasetError(f"dataset '{name}' has no training images")
    if len(te.y) == 0:
        raise DatasetError(
            f"dataset '{name}' has no test images (every experiment is evaluated on a test set)"
        )
    unseen = sorted(set(np.unique(te.y).tolist()) - set(np.unique(tr.y).tolist()))
    if unseen:
        raise DatasetError(
            f"dataset '{name}': test classes {unseen[:10]} never occur in the "
            "training set (no client could learn them)"
        )


def _num_classes(name: str, tr: RawSplit, te: RawSplit, class_list: int | None) -> int:
    """The largest label + 1, or the classes the source's own class list names
    (:func:`_read_source`: CIFAR's ``batches.meta``, the authors' ``K``; the synthetic
    generator's ``num_classes``)."""
    num_classes = int(max(tr.y.max(), te.y.max() if len(te.y) else 0)) + 1
    if class_list is not None:  # e.g. CIFAR: the classes batches.meta names (their K)
        if num_classes > class_list:
            raise DatasetError(
                f"dataset '{name}': label {num_classes - 1} but the class "
                f"list names only {class_list} classes"
            )
        num_classes = class_list
    return num_classes


def _hold_out_validation(
    tr: RawSplit, val_fraction: float, seed: int
) -> tuple[RawSplit, RawSplit | None]:
    """A seeded, stratified validation share of the training set (UniVarFL: 90/10):
    ``(training set without it, validation set)``; none when ``val_fraction`` is 0."""
    if val_fraction <= 0:
        return tr, None
    rng = np.random.default_rng([seed, 1234])
    hold = np.zeros(len(tr.y), bool)
    for c in np.unique(tr.y):
        idx = np.flatnonzero(tr.y == c)
        hold[rng.choice(idx, int(round(val_fraction * len(idx))), replace=False)] = True
    return (
        RawSplit(tr.x[~hold], tr.y[~hold], None if tr.d is None else tr.d[~hold]),
        RawSplit(tr.x[hold], tr.y[hold]),
    )


def _takes_device(get_batch) -> bool:
    import inspect

    try:
        return "device" in inspect.signature(get_batch).parameters
    except (TypeError, ValueError):
        return False


# what becomes of an epoch's last, incomplete batch (:func:`batch_bounds`)
LAST_BATCH_RULES = ("keep", "drop", "fold")


def batch_bounds(n: int, batch_size: int, last_batch: str = "keep") -> list[tuple[int, int]]:
    """``(start, stop)`` of each batch of ``n`` samples in batches of ``batch_size``.

    ``last_batch`` says what becomes of the last, incomplete batch: ``keep`` it (PyTorch's
    ``DataLoader`` default); ``drop`` it (``DataLoader(drop_last=True)``: FedUV's
    ``utils/dataloader.py``, sonhamin/FedUV @ dd2e3c5, and RethinkFL's label-skew loader;
    fewer than ``batch_size`` samples make no batch at all); ``fold``: never a batch of
    one — a last batch of a single sample joins the batch before it (which then holds
    ``batch_size + 1``), and a lone single sample makes no batch (a BatchNorm layer in
    training mode cannot normalise one sample; :func:`fedrcl_flwr.training.last_batch_rule`
    picks ``fold`` for such models). Every other batch is the same under all three.
    """
    if last_batch not in LAST_BATCH_RULES:
        raise ValueError(f"last_batch must be one of {', '.join(LAST_BATCH_RULES)}")
    bounds = [(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]
    if not bounds or bounds[-1][1] - bounds[-1][0] == batch_size:
        return bounds
    if last_batch == "drop":
        return bounds[:-1]
    if last_batch == "fold" and bounds[-1][1] - bounds[-1][0] == 1:
        if len(bounds) == 1:
            return []
        return bounds[:-2] + [(bounds[-2][0], n)]
    return bounds


def iterate_batches(
    dataset,
    indices,
    batch_size: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    last_batch: str = "keep",
):
    """The project's one batch iterator: ``(x, y)`` batches of ``dataset[indices]``.

    Without ``generator``: in order and un-augmented (evaluation, embedding). With it
    (training, via ``runtime.make_batches``): the indices in a random order and the
    dataset's augmentation, both drawn from ``generator``. Datasets with ``get_batch``
    (every built-in one) fetch a whole batch at once; others are read sample by sample.
    ``device``: where the batches are delivered; a ``get_batch`` that takes ``device``
    (:meth:`ImageArrayDataset.get_batch`) moves the ``uint8`` pixels there and
    normalises / augments there, other datasets' batches are moved as they come.
    ``last_batch``: what becomes of the last, incomplete batch (:func:`batch_bounds`).
    """
    ds = dataset
    indices = np.asarray(indices, dtype=np.int64)
    if generator is None:
        ds = dataset.plain() if hasattr(dataset, "plain") else dataset
    else:
        indices = indices[torch.randperm(len(indices), generator=generator).numpy()]
    batch_has_device = (
        device is not None and hasattr(ds, "get_batch") and _takes_device(ds.get_batch)
    )
    for start, stop in batch_bounds(len(indices), batch_size, last_batch):
        chunk = indices[start:stop]
        if batch_has_device:
            yield ds.get_batch(chunk, generator=generator, device=device)
            continue
        if hasattr(ds, "get_batch"):
            x, y = ds.get_batch(chunk, generator=generator)
        else:
            xs, ys = zip(*(ds[int(j)] for j in chunk))
            x, y = torch.stack(xs), torch.as_tensor(ys)
        yield to_device(x, device), to_device(y, device)
