"""The embedded synthetic image dataset: generated in code, deterministic by seed, fast.

Structure (so that every method has something real to learn, offline):

* each class ``c`` has a low-frequency *class pattern* ``A_c``;
* each class has ``subclusters`` sub-cluster patterns drawn from a pool shared by all
  classes (intra-class structure, which FedCCL's clustering should find; a sub-cluster of
  one class looks like a sub-cluster of another, only ``A_c`` tells them apart): the
  prototype of sub-cluster *s* is ``class_weight * A_c + pool[pick(c, s)]``;
* a sample is ``a * prototype + d * distractor + noise``: a random amplitude ``a``, one of
  a few class-independent *distractor* patterns with a random strength, pixel noise, and a
  random translation of up to 2 pixels, squashed to ``uint8``;
* optional *domains* restyle whole images — colour mixing, contrast/gamma, blur and an
  additive texture — for inter-domain (feature-shift) splits. Every domain holds every
  class in equal numbers.

Images are generated as ``uint8`` (N, H, W, C) like real datasets, so the rest of the
pipeline (normalisation, augmentation, partitions) is the same for both.
20,000 32x32x3 images take a few seconds on two CPU cores. :func:`read_synthetic` is the
``synthetic`` dataset's reader (memory checked before generating).
"""

from __future__ import annotations

import numpy as np
import torch

from fedrcl_flwr.data.sources.memory import check_fits_memory
from fedrcl_flwr.data.sources.raw import RawSplit


def _smooth_patterns(
    rng: np.random.Generator, n: int, size: int, channels: int, grid: int = 4
) -> np.ndarray:
    """``n`` smooth random images (n, C, H, W): a ``grid x grid`` Gaussian field upsampled
    bilinearly to ``size``, with zero mean and unit RMS."""
    coarse = rng.standard_normal((n, channels, grid, grid))
    pos = np.linspace(0, grid - 1, size)
    i0 = np.floor(pos).astype(int).clip(0, grid - 2)
    t = pos - i0
    # separable bilinear interpolation: rows then columns
    rows = (
        coarse[:, :, i0, :] * (1 - t)[None, None, :, None]
        + coarse[:, :, i0 + 1, :] * t[None, None, :, None]
    )
    img = (
        rows[:, :, :, i0] * (1 - t)[None, None, None, :]
        + rows[:, :, :, i0 + 1] * t[None, None, None, :]
    )
    img -= img.mean(axis=(1, 2, 3), keepdims=True)
    img /= np.sqrt((img**2).mean(axis=(1, 2, 3), keepdims=True)) + 1e-8
    return img


def _domain_style(rng: np.random.Generator, d: int, channels: int, size: int) -> dict:
    """Style of domain ``d`` (domain 0 is the plain style)."""
    if d == 0:
        return {
            "mix": np.eye(channels),
            "gamma": 1.0,
            "contrast": 1.0,
            "blur": 1,
            "texture": np.zeros((channels, size, size)),
        }
    mix = np.eye(channels) + 0.6 * rng.standard_normal((channels, channels))
    texture = rng.standard_normal((channels, size, size))
    texture = 0.35 * (texture - texture.mean()) / texture.std()
    return {
        "mix": mix / np.abs(mix).sum(1, keepdims=True) * 1.2,
        "gamma": float(rng.uniform(0.6, 1.6)),
        "contrast": float(rng.uniform(0.5, 1.5)),
        "blur": int(rng.choice([1, 3])) if size >= 16 else 1,
        "texture": texture,
    }


def make_synthetic(
    num_train: int = 20000,
    num_test: int = 4000,
    num_classes: int = 10,
    image_size: int = 32,
    channels: int = 3,
    subclusters: int = 3,
    num_domains: int = 1,
    seed: int = 0,
    noise: float = 0.9,
    distractors: int = 6,
    distractor_strength: float = 1.0,
    class_weight: float = 1.0,
):
    """Generate ``(x_train, y_train, d_train, x_test, y_test, d_test)``.

    ``x_*`` are uint8 (N, H, W, C); ``y_*`` int64 labels; ``d_*`` int64 domain ids (all zero
    when ``num_domains == 1``). Deterministic in ``seed``; train and test share the
    patterns and differ in the per-sample draws.
    """
    rng = np.random.default_rng([seed, 7919])
    k, s, size, c = num_classes, subclusters, image_size, channels
    class_pat = _smooth_patterns(rng, k, size, c, grid=4)
    # sub-cluster patterns come from a pool shared by all classes: sub-cluster s of class
    # c looks like sub-cluster s' of another class, only the class pattern tells them apart
    pool = _smooth_patterns(rng, max(k * s // 2, s + 1), size, c, grid=5)
    pick = np.stack([rng.choice(len(pool), s, replace=False) for _ in range(k)])
    protos = class_weight * class_pat[:, None] + pool[pick]
    protos /= np.sqrt((protos**2).mean(axis=(2, 3, 4), keepdims=True))
    distract = _smooth_patterns(rng, distractors, size, c, grid=3)
    styles = [_domain_style(rng, d, c, size) for d in range(num_domains)]

    banks = _Banks.of(protos, distract, styles)
    xtr, ytr, dtr = _draw(
        banks, num_train, seed, 1, k, s, num_domains, noise, distractors, distractor_strength
    )
    xte, yte, dte = _draw(
        banks, num_test, seed, 2, k, s, num_domains, noise, distractors, distractor_strength
    )
    return xtr, ytr, dtr, xte, yte, dte


# the translations every prototype / distractor is drawn at: (dy, dx) in [-2, 2]^2
_SHIFTS = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)]


class _Banks:
    """Every translation of every prototype and distractor, precomputed as float32
    tensors (pattern, shift, C, H, W), and the domains' styles as tensors."""

    def __init__(self, protos: torch.Tensor, distract: torch.Tensor, styles: list):
        self.protos, self.distract, self.styles = protos, distract, styles

    @classmethod
    def of(cls, protos: np.ndarray, distract: np.ndarray, styles: list) -> _Banks:
        k, s, c, size = protos.shape[0], protos.shape[1], protos.shape[2], protos.shape[3]
        flat_protos = protos.reshape(k * s, c, size, size)
        bank_p = torch.from_numpy(
            np.stack([np.roll(flat_protos, sh, axis=(2, 3)) for sh in _SHIFTS], 1).astype(
                np.float32
            )
        )
        bank_d = torch.from_numpy(
            np.stack([np.roll(distract, sh, axis=(2, 3)) for sh in _SHIFTS], 1).astype(np.float32)
        )
        style_t = [
            {
                "mix": torch.from_numpy(st["mix"].astype(np.float32)),
                "texture": torch.from_numpy(st["texture"].astype(np.float32)),
                "gamma": st["gamma"],
                "contrast": st["contrast"],
                "blur": st["blur"],
            }
            for st in styles
        ]
        return cls(bank_p, bank_d, style_t)


def _draw(
    banks: _Banks,
    n: int,
    seed: int,
    stream: int,
    k: int,
    s: int,
    num_domains: int,
    noise: float,
    distractors: int,
    distractor_strength: float,
):
    """``n`` images of split ``stream`` (1 train, 2 test): balanced classes and domains in
    a seeded order, each a shifted, scaled prototype of a random sub-cluster plus a
    distractor and pixel noise, then its domain's style; ``(x uint8, y, domain)``."""
    r = np.random.default_rng([seed, 104729, stream])
    y = np.arange(n) % k
    dom = (np.arange(n) // k) % num_domains
    order = r.permutation(n)
    y, dom = y[order], dom[order]
    sub = r.integers(0, s, n)
    sh = r.integers(0, len(_SHIFTS), n)
    amp = torch.from_numpy(r.uniform(0.6, 1.4, n).astype(np.float32))
    dsel = r.integers(0, distractors, n)
    dstr = torch.from_numpy(r.uniform(0.0, distractor_strength, n).astype(np.float32))
    g = torch.Generator().manual_seed(int(r.integers(0, 2**62)))
    size, c = banks.protos.shape[-1], banks.protos.shape[-3]
    out = np.empty((n, size, size, c), np.uint8)
    for d, st in enumerate(banks.styles):
        m = np.flatnonzero(dom == d)
        for i in range(0, len(m), 4096):
            j = m[i : i + 4096]
            jt = torch.from_numpy(j)
            x = (
                amp[jt, None, None, None]
                * banks.protos[torch.from_numpy(y[j] * s + sub[j]), torch.from_numpy(sh[j])]
            )
            x += (
                dstr[jt, None, None, None]
                * banks.distract[torch.from_numpy(dsel[j]), torch.from_numpy(sh[j])]
            )
            x += noise * torch.randn(x.shape, generator=g)
            if d > 0:
                x = torch.einsum("ij,njhw->nihw", st["mix"], x) + st["texture"]
                if st["blur"] > 1:
                    x = torch.nn.functional.avg_pool2d(
                        x, st["blur"], stride=1, padding=st["blur"] // 2, count_include_pad=False
                    )
            u = torch.sigmoid(st["contrast"] * x / 1.5) ** st["gamma"]
            out[j] = (255 * u).round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
    return out, y.astype(np.int64), dom.astype(np.int64)


def read_synthetic(sy: dict, seed: int) -> tuple[RawSplit, RawSplit, list]:
    """The embedded synthetic images (:func:`make_synthetic`),
    after checking that they fit in memory."""
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
