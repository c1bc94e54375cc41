"""Image files on disk: class-folder trees (``root/[domain/][train|test/]class/image``:
PACS, Office-10, DomainNet, HAM10000, RethinkFL's trees with its train/test rule) and
Tiny-ImageNet-200 as distributed. Images are decoded with Pillow, converted to RGB and
resized to one size."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedrcl_flwr.data.sources.memory import check_fits_memory
from fedrcl_flwr.data.sources.raw import DatasetError, RawSplit

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


def read_imagefolder(
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
    domain_dirs = _domain_dirs(root, domains)
    size = image_size or 64
    splits: dict[str, tuple[list, list, list]] = {"train": ([], [], []), "test": ([], [], [])}
    class_names: list | None = None
    for di, ddir in enumerate(domain_dirs):
        trees = _split_trees(ddir, di, test_fraction, seed, test_split)
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


def _domain_dirs(root: Path, domains: list) -> list[Path]:
    """The folder of each domain (``root`` itself without ``domains``), each checked to
    exist."""
    if not root.is_dir():
        raise DatasetError(
            f"image folder {root} does not exist: set dataset.root to a "
            "directory of class sub-folders (or domain/class sub-folders)"
        )
    domain_dirs = [root / d for d in domains] if domains else [root]
    for d in domain_dirs:
        if not d.is_dir():
            raise DatasetError(
                f"domain folder {d} does not exist (dataset.domains lists "
                f"{domains}; found {sorted(p.name for p in root.iterdir())})"
            )
    return domain_dirs


def _split_trees(
    ddir: Path, di: int, test_fraction: float, seed: int, test_split: str
) -> dict[str, dict[str, list[Path]]]:
    """The ``train`` and ``test`` class trees of domain folder ``ddir`` (domain ``di``):
    its ``train`` / ``test`` (or ``val``) sub-folders, else RethinkFL's rule
    (``test_split`` ``rethinkfl``), else a seeded, stratified ``test_fraction`` of each
    class held out (:func:`read_imagefolder`)."""
    test_dir = next((t for t in ("test", "val") if (ddir / t).is_dir()), None)
    if (ddir / "train").is_dir() and test_dir:
        return {"train": _class_tree(ddir / "train"), "test": _class_tree(ddir / test_dir)}
    if test_split == "rethinkfl":
        return _rethinkfl_trees(_class_tree(ddir))
    tree = _class_tree(ddir)
    rng = np.random.default_rng([seed, di, 31])
    trees: dict[str, dict[str, list[Path]]] = {"train": {}, "test": {}}
    for cname, files in tree.items():
        perm = rng.permutation(len(files))
        n_test = int(round(test_fraction * len(files)))
        trees["test"][cname] = [files[i] for i in sorted(perm[:n_test])]
        trees["train"][cname] = [files[i] for i in sorted(perm[n_test:])]
    return trees


def _rethinkfl_trees(tree: dict) -> dict:
    """Split a class tree by RethinkFL's rule (see :func:`read_imagefolder`)."""
    from fedrcl_flwr.data.sources.rethinkfl import rethinkfl_train_mask

    flat = [(c, f) for c, files in tree.items() for f in files]
    train = rethinkfl_train_mask(len(flat))
    trees: dict = {"train": {}, "test": {}}
    for (cname, f), is_train in zip(flat, train):
        trees["train" if is_train else "test"].setdefault(cname, []).append(f)
    return trees


def read_tinyimagenet(root: Path, image_size: int | None) -> tuple[RawSplit, RawSplit]:
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
