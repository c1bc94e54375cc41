"""Datasets: one in-memory image representation for every source.

Every source (the embedded synthetic data, torchvision's CIFAR-10/100, MNIST,
Fashion-MNIST, SVHN, USPS, STL-10, Tiny-ImageNet, image-folder trees such as PACS,
Office-10, DomainNet and HAM10000, Digit-5, and user ``.npz`` arrays) is read once into
``uint8`` arrays and wrapped in :class:`ImageArrayDataset`, which normalises with the
training set's per-channel mean/std and augments on tensors (random crop with padding and
horizontal flip, per dataset). Clients never copy data: they hold index arrays into the
one training set of their process.

Nothing is downloaded unless ``download=True``; a missing dataset raises
:class:`DatasetError` saying where it looked and how to get it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from fedrcl_flwr.config import ConfigError


class DatasetError(ConfigError):
    """A dataset that cannot be found or read (a user-input problem: exit code 2)."""


# --------------------------------------------------------------------------------------
# The one dataset class
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AugmentSpec:
    """Random rotation by up to ``rotation`` degrees (0 = off; applied first, to the
    un-normalised [0, 1] image so the corners are black as with torchvision), then random
    crop with zero padding ``crop_pad`` (0 = off) and horizontal flip."""

    crop_pad: int = 0
    flip: bool = False
    rotation: float = 0.0

    @property
    def active(self) -> bool:
        return self.crop_pad > 0 or self.flip or self.rotation > 0


class ImageArrayDataset(Dataset):
    """Images held as a ``uint8`` tensor (N, C, H, W) plus labels.

    ``dataset[i]`` returns ``(x, y)`` with ``x`` normalised float32 (C, H, W) (augmented
    when an :class:`AugmentSpec` is active); :meth:`get_batch` returns a whole batch with
    vectorised augmentation drawn from a given generator — the training loop's fast path.
    """

    def __init__(self, images: torch.Tensor, labels: np.ndarray, mean, std,
                 augment: Optional[AugmentSpec] = None):
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self._labels_t = torch.as_tensor(self.labels)
        self.mean = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.augment = augment if augment is not None and augment.active else None

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def plain(self) -> "ImageArrayDataset":
        """The same data without augmentation (for embedding / evaluation)."""
        return ImageArrayDataset(self.images, self.labels, self.mean.flatten(),
                                 self.std.flatten(), None)

    def _normalise(self, u8: torch.Tensor) -> torch.Tensor:
        return (u8.float().div_(255.0) - self.mean) / self.std

    def __getitem__(self, i):
        x, y = self.get_batch(np.asarray([int(i)]))
        return x[0], int(y[0])

    def get_batch(self, idx, generator: Optional[torch.Generator] = None):
        idx_t = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        if self.augment is not None and self.augment.rotation > 0:
            from fedrcl_flwr.augment import random_rotation

            x = random_rotation(self.images[idx_t].float().div_(255.0), self.augment.rotation,
                                generator=generator)
            x = (x - self.mean) / self.std
        else:
            x = self._normalise(self.images[idx_t])
        if self.augment is not None:
            from fedrcl_flwr.augment import random_crop_flip

            if self.augment.crop_pad > 0:
                x = random_crop_flip(x, pad=self.augment.crop_pad, flip=self.augment.flip,
                                     generator=generator)
            elif self.augment.flip:
                do = torch.rand(x.shape[0], generator=generator) < 0.5
                x = torch.where(do[:, None, None, None], x.flip(3), x)
        return x, self._labels_t[idx_t]


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
    train_domains: Optional[np.ndarray] = None
    test_domains: Optional[np.ndarray] = None
    domain_names: list = field(default_factory=list)
    val: Optional[ImageArrayDataset] = None

    @property
    def train_plain(self) -> ImageArrayDataset:
        return self.train.plain()


# --------------------------------------------------------------------------------------
# Raw sources: each returns uint8 arrays (N, H, W, C)
# --------------------------------------------------------------------------------------


@dataclass
class RawSplit:
    x: np.ndarray  # uint8 (N, H, W, C)
    y: np.ndarray  # int64 (N,)
    d: Optional[np.ndarray] = None  # int64 domain ids


def _hwc(x) -> np.ndarray:
    """Any image array (N,H,W), (N,H,W,C) or (N,C,H,W) -> uint8 (N,H,W,C)."""
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[..., None]
    elif x.ndim == 4 and x.shape[1] in (1, 3) and x.shape[-1] not in (1, 3):
        x = x.transpose(0, 2, 3, 1)
    if x.ndim != 4:
        raise DatasetError(f"images must be N x H x W or N x H x W x C, got shape {x.shape}")
    if x.dtype != np.uint8:
        xf = x.astype(np.float64)
        if xf.size and xf.max() <= 1.0 and xf.min() >= 0.0:
            xf = xf * 255.0
        x = np.clip(np.rint(xf), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(x)


_HOW_TO_GET = {
    "cifar10": "torchvision.datasets.CIFAR10",
    "cifar100": "torchvision.datasets.CIFAR100",
    "mnist": "torchvision.datasets.MNIST",
    "fmnist": "torchvision.datasets.FashionMNIST",
    "svhn": "torchvision.datasets.SVHN",
    "usps": "torchvision.datasets.USPS",
    "stl10": "torchvision.datasets.STL10",
}


def _missing(name: str, root: Path, extra: str = "") -> DatasetError:
    how = (f"set dataset.download: true on a machine with a network (uses "
           f"{_HOW_TO_GET[name]}), or copy the files there") if name in _HOW_TO_GET else \
        "put the data there"
    return DatasetError(f"dataset '{name}' not found under {root}{extra}: {how}, or point "
                        f"dataset.root at the directory that holds it")


def _torchvision(name: str, root: Path, download: bool) -> tuple[RawSplit, RawSplit]:
    import torchvision.datasets as tvd

    def make(train: bool):
        split = "train" if train else "test"
        if name == "cifar10":
            ds = tvd.CIFAR10(str(root), train=train, download=download)
            return ds.data, ds.targets
        if name == "cifar100":
            ds = tvd.CIFAR100(str(root), train=train, download=download)
            return ds.data, ds.targets
        if name == "mnist":
            ds = tvd.MNIST(str(root), train=train, download=download)
            return ds.data.numpy(), ds.targets.numpy()
        if name == "fmnist":
            ds = tvd.FashionMNIST(str(root), train=train, download=download)
            return ds.data.numpy(), ds.targets.numpy()
        if name == "svhn":
            ds = tvd.SVHN(str(root / "svhn"), split=split, download=download)
            return ds.data, ds.labels
        if name == "usps":
            ds = tvd.USPS(str(root / "usps"), train=train, download=download)
            return ds.data, ds.targets
        if name == "stl10":
            ds = tvd.STL10(str(root), split=split, download=download)
            return ds.data, ds.labels
        raise DatasetError(f"unknown torchvision dataset {name!r}")

    try:
        out = []
        for train in (True, False):
            x, y = make(train)
            out.append(RawSplit(_hwc(x), np.asarray(y, dtype=np.int64)))
    except DatasetError:
        raise
    except (RuntimeError, FileNotFoundError, OSError) as exc:
        if download:
            raise DatasetError(f"dataset '{name}': download into {root} failed ({exc})") \
                from None
        raise _missing(name, root) from None
    return out[0], out[1]


_IMG_EXT = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")


def _read_images(files: list[Path], size: Optional[int]) -> np.ndarray:
    from PIL import Image

    out = []
    for f in files:
        with Image.open(f) as im:
            im = im.convert("RGB")
            if size is not None and im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            out.append(np.asarray(im, dtype=np.uint8))
    if not out:
        return np.zeros((0, size or 1, size or 1, 3), np.uint8)
    shapes = {a.shape for a in out}
    if len(shapes) > 1:
        raise DatasetError(f"images of different sizes {sorted(shapes)[:3]}...: set "
                           "dataset.image_size to resize them")
    return np.stack(out)


def _class_tree(folder: Path) -> dict[str, list[Path]]:
    classes = {}
    for cdir in sorted(p for p in folder.iterdir() if p.is_dir()):
        files = sorted(f for f in cdir.rglob("*") if f.suffix.lower() in _IMG_EXT)
        if files:
            classes[cdir.name] = files
    return classes


def _imagefolder(root: Path, domains: list, image_size: Optional[int], test_fraction: float,
                 seed: int) -> tuple[RawSplit, RawSplit, list]:
    """``root/[domain/][train|test/]class/image``.

    With ``domains`` each named sub-folder is one domain (PACS, Office-10, DomainNet). A
    folder with ``train``/``test`` sub-folders uses them; otherwise a seeded, stratified
    ``test_fraction`` of each class is held out for testing.
    """
    if not root.is_dir():
        raise DatasetError(f"image folder {root} does not exist: set dataset.root to a "
                           "directory of class sub-folders (or domain/class sub-folders)")
    size = image_size or 64
    domain_dirs = [root / d for d in domains] if domains else [root]
    for d in domain_dirs:
        if not d.is_dir():
            raise DatasetError(f"domain folder {d} does not exist (dataset.domains lists "
                               f"{domains}; found {sorted(p.name for p in root.iterdir())})")
    splits = {"train": ([], [], []), "test": ([], [], [])}
    class_names: Optional[list] = None
    for di, ddir in enumerate(domain_dirs):
        if (ddir / "train").is_dir() and (ddir / "test").is_dir():
            trees = {s: _class_tree(ddir / s) for s in ("train", "test")}
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
            raise DatasetError(f"no images found under {ddir} (expected class sub-folders "
                               f"with {', '.join(_IMG_EXT)} files)")
        if class_names is None:
            class_names = names
        elif names != class_names:
            raise DatasetError(f"{ddir} has classes {names[:5]}... but the first domain has "
                               f"{class_names[:5]}...: every domain needs the same classes")
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


def _tinyimagenet(root: Path, image_size: Optional[int]) -> tuple[RawSplit, RawSplit]:
    """Tiny-ImageNet-200 as distributed: ``train/<wnid>/images/*.JPEG`` and
    ``val/images`` + ``val/val_annotations.txt`` (used as the test set)."""
    base = root / "tiny-imagenet-200" if (root / "tiny-imagenet-200").is_dir() else root
    train_dir, val_dir = base / "train", base / "val"
    ann = val_dir / "val_annotations.txt"
    if not train_dir.is_dir() or not ann.exists():
        raise DatasetError(f"dataset 'tinyimagenet' not found under {base}: unpack "
                           "tiny-imagenet-200.zip there (train/ and val/ with "
                           "val_annotations.txt)")
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


def _npz(path: Path) -> tuple[RawSplit, RawSplit]:
    if not path.exists():
        raise DatasetError(f"npz dataset file {path} does not exist (dataset.path)")
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one clear error
        raise DatasetError(f"{path}: not a readable .npz file ({exc})") from None
    with z:
        missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in z.files]
        if missing:
            raise DatasetError(f"{path}: missing array(s) {', '.join(missing)} (an npz "
                               "dataset holds x_train, y_train, x_test, y_test)")
        out = []
        for s in ("train", "test"):
            x, y = _hwc(z[f"x_{s}"]), np.asarray(z[f"y_{s}"]).astype(np.int64).ravel()
            if len(x) != len(y):
                raise DatasetError(f"{path}: x_{s} has {len(x)} images but y_{s} has "
                                   f"{len(y)} labels")
            if len(y) and y.min() < 0:
                raise DatasetError(f"{path}: y_{s} has negative labels")
            d = np.asarray(z[f"d_{s}"]).astype(np.int64).ravel() if f"d_{s}" in z.files \
                else None
            if d is not None and len(d) != len(y):
                raise DatasetError(f"{path}: d_{s} has {len(d)} domain ids but y_{s} has "
                                   f"{len(y)} labels")
            out.append(RawSplit(x, y, d))
    return out[0], out[1]


DIGIT5_DOMAINS = ("mnist", "svhn", "usps", "synthdigits", "mnistm")


def _digit5(root: Path, download: bool, domains: list) -> tuple[RawSplit, RawSplit, list]:
    """Digit-5 at 32x32 RGB: MNIST, SVHN and USPS from torchvision; SynthDigits and
    MNIST-M (not in torchvision) from ``root/synthdigits.npz`` / ``root/mnistm.npz``
    (x_train, y_train, x_test, y_test) or image folders ``root/<name>/{train,test}/<class>``."""
    names = list(domains) if domains else list(DIGIT5_DOMAINS)
    trs, tes = [], []
    for di, name in enumerate(names):
        if name in ("mnist", "svhn", "usps"):
            tr, te = _torchvision(name, root, download)
        elif (root / f"{name}.npz").exists():
            tr, te = _npz(root / f"{name}.npz")
        elif (root / name).is_dir():
            tr, te, _ = _imagefolder(root / name, [], 32, 0.2, 0)
        else:
            raise DatasetError(f"Digit-5 domain '{name}' not found: expected {root}/{name}.npz "
                               f"(x_train, y_train, x_test, y_test) or {root}/{name}/ (class "
                               "folders); it is not in torchvision, so it cannot be downloaded "
                               "automatically")
        for split, acc in ((tr, trs), (te, tes)):
            x = _resize_u8(split.x, 32)
            if x.shape[-1] == 1:
                x = np.repeat(x, 3, axis=-1)
            acc.append(RawSplit(x, split.y, np.full(len(split.y), di, np.int64)))

    def cat(parts):
        return RawSplit(np.concatenate([p.x for p in parts]),
                        np.concatenate([p.y for p in parts]),
                        np.concatenate([p.d for p in parts]))

    return cat(trs), cat(tes), names


# --------------------------------------------------------------------------------------
# Assembly
# --------------------------------------------------------------------------------------


def _resize_u8(x: np.ndarray, size: int) -> np.ndarray:
    """Resize uint8 (N, H, W, C) to ``size x size`` (antialiased bilinear), in chunks."""
    if x.shape[1] == size and x.shape[2] == size:
        return x
    out = np.empty((x.shape[0], size, size, x.shape[3]), np.uint8)
    for i in range(0, len(x), 2048):
        t = torch.from_numpy(x[i:i + 2048]).permute(0, 3, 1, 2).float()
        r = F.interpolate(t, size=(size, size), mode="bilinear", antialias=True,
                          align_corners=False)
        out[i:i + 2048] = r.round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
    return out


# per-dataset standard augmentation (as the papers' code uses): crop padding, flip
_AUGMENT = {
    "cifar10": AugmentSpec(4, True), "cifar100": AugmentSpec(4, True),
    "tinyimagenet": AugmentSpec(8, True), "stl10": AugmentSpec(12, True),
    "svhn": AugmentSpec(4, False), "mnist": AugmentSpec(0, False),
    "fmnist": AugmentSpec(0, False), "usps": AugmentSpec(0, False),
    "digit5": AugmentSpec(2, False), "synthetic": AugmentSpec(2, True),
}


def default_augment(name: str, image_size: int) -> AugmentSpec:
    if name in _AUGMENT:
        return _AUGMENT[name]
    return AugmentSpec(max(1, image_size // 8), True)  # imagefolder, npz


def _channel_stats(x: np.ndarray) -> tuple[list, list]:
    sample = x[:: max(1, len(x) // 10000)].astype(np.float64) / 255.0
    mean = sample.mean(axis=(0, 1, 2))
    std = sample.std(axis=(0, 1, 2))
    std = np.where(std < 1e-6, 1.0, std)
    return mean.tolist(), std.tolist()


DATASET_NAMES = ("synthetic", "cifar10", "cifar100", "mnist", "fmnist", "svhn", "usps",
                 "stl10", "tinyimagenet", "imagefolder", "digit5", "npz")


def load_dataset(name: str, *, root: str = "~/data", path: Optional[str] = None,
                 download: bool = False, augment: bool = True, normalize: bool = True,
                 image_size: Optional[int] = None, synthetic: Optional[dict] = None,
                 seed: int = 0, val_fraction: float = 0.0, domains: Optional[list] = None,
                 test_fraction: float = 0.2, rotation: float = 0.0,
                 crop_pad: Optional[int] = None) -> DataBundle:
    """Load a dataset into a :class:`DataBundle` (see the module docstring)."""
    root_p = Path(os.path.expanduser(root or "."))
    dnames: list = []
    if name == "synthetic":
        from fedrcl_flwr.data.synthetic import make_synthetic

        xtr, ytr, dtr, xte, yte, dte = make_synthetic(**(synthetic or {}), seed=seed)
        tr, te = RawSplit(xtr, ytr, dtr), RawSplit(xte, yte, dte)
        nd = int((synthetic or {}).get("num_domains", 1))
        dnames = [f"domain{i}" for i in range(nd)] if nd > 1 else []
    elif name in _HOW_TO_GET:
        tr, te = _torchvision(name, root_p, download)
    elif name == "tinyimagenet":
        tr, te = _tinyimagenet(root_p, image_size)
    elif name == "imagefolder":
        tr, te, dnames = _imagefolder(root_p, list(domains or []), image_size, test_fraction,
                                      seed)
    elif name == "digit5":
        tr, te, dnames = _digit5(root_p, download, list(domains or []))
    elif name == "npz":
        if not path:
            raise DatasetError("dataset.path is required when dataset.name is npz")
        tr, te = _npz(Path(os.path.expanduser(path)))
    else:
        raise DatasetError(f"unknown dataset {name!r} (known: {', '.join(DATASET_NAMES)})")

    if len(tr.y) == 0:
        raise DatasetError(f"dataset '{name}' has no training images")
    if image_size is not None:
        tr = RawSplit(_resize_u8(tr.x, image_size), tr.y, tr.d)
        te = RawSplit(_resize_u8(te.x, image_size), te.y, te.d)
    if tr.x.shape[1:] != te.x.shape[1:] and len(te.y):
        raise DatasetError(f"dataset '{name}': train images {tr.x.shape[1:]} and test images "
                           f"{te.x.shape[1:]} differ; set dataset.image_size")
    num_classes = int(max(tr.y.max(), te.y.max() if len(te.y) else 0)) + 1
    if name == "synthetic":
        num_classes = int((synthetic or {}).get("num_classes", num_classes))

    val_split = None
    if val_fraction > 0:  # seeded, stratified hold-out (UniVarFL: 90/10)
        rng = np.random.default_rng([seed, 1234])
        hold = np.zeros(len(tr.y), bool)
        for c in np.unique(tr.y):
            idx = np.flatnonzero(tr.y == c)
            hold[rng.choice(idx, int(round(val_fraction * len(idx))), replace=False)] = True
        val_split = RawSplit(tr.x[hold], tr.y[hold])
        tr = RawSplit(tr.x[~hold], tr.y[~hold], None if tr.d is None else tr.d[~hold])
    mean, std = _channel_stats(tr.x) if normalize else ([0.0] * tr.x.shape[-1],
                                                         [1.0] * tr.x.shape[-1])
    size = int(tr.x.shape[1])
    aug = default_augment(name, size) if augment else None
    if aug is not None and rotation > 0:
        aug = replace(aug, rotation=float(rotation))
    if aug is not None and crop_pad is not None:
        aug = replace(aug, crop_pad=int(crop_pad))

    def wrap(split: RawSplit, aug_spec):
        imgs = torch.from_numpy(np.ascontiguousarray(split.x.transpose(0, 3, 1, 2)))
        return ImageArrayDataset(imgs, split.y, mean, std, aug_spec)

    has_domains = tr.d is not None and len(np.unique(tr.d)) > 1
    return DataBundle(
        name=name, train=wrap(tr, aug), test=wrap(te, None), train_labels=tr.y,
        test_labels=te.y, num_classes=num_classes, in_channels=int(tr.x.shape[-1]),
        image_size=size,
        train_domains=tr.d if has_domains else None,
        test_domains=te.d if has_domains and te.d is not None else None,
        domain_names=dnames if has_domains else [],
        val=wrap(val_split, None) if val_split is not None else None,
    )


def iterate_batches(dataset, indices, batch_size: int):
    """Un-augmented, in-order batches of ``dataset[indices]`` (embedding, evaluation)."""
    ds = dataset.plain() if hasattr(dataset, "plain") else dataset
    indices = np.asarray(indices)
    for i in range(0, len(indices), batch_size):
        chunk = indices[i:i + batch_size]
        if hasattr(ds, "get_batch"):
            yield ds.get_batch(chunk)
        else:
            xs, ys = zip(*(ds[int(j)] for j in chunk))
            yield torch.stack(xs), torch.as_tensor(ys)
