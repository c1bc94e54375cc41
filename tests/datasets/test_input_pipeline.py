"""The training input pipeline against torchvision's transforms on PIL images.

For the same rotation angle, crop offsets and flip, a batch of ``ImageArrayDataset`` is
what ``RandomRotation`` -> ``RandomCrop(padding)`` -> ``RandomHorizontalFlip`` ->
``ToTensor`` -> ``Normalize`` gives (the FedRCL authors' ``datasets/build.py`` chain),
with ``dataset.pad_fill: black``; ``dataset.normalize`` takes their constants and is
checked before a run; the constants enter the dataset cache key, the augmentation not.
"""

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
import yaml
from PIL import Image
from torchvision import transforms

from fedrcl_flwr.augment import AugmentSpec, rotate
from fedrcl_flwr.cli import main
from fedrcl_flwr.config import ConfigError, config_from_dict
from fedrcl_flwr.data.datasets import DatasetError, ImageArrayDataset, load_dataset

CIFAR10_MEAN, CIFAR10_STD = [0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]


def _torchvision(img: np.ndarray, angle, top, left, flip, pad, mean, std) -> torch.Tensor:
    """The authors' chain on one HWC uint8 image with fixed parameters (torchvision's
    functional ops, as the random transforms call them)."""
    pil = Image.fromarray(img.squeeze(-1) if img.shape[-1] == 1 else img)
    if angle is not None:
        pil = TF.rotate(pil, angle, interpolation=transforms.InterpolationMode.NEAREST, fill=0)
    h, w = img.shape[:2]
    if pad:
        pil = TF.pad(pil, pad, fill=0)
        pil = TF.crop(pil, top, left, h, w)
    if flip:
        pil = TF.hflip(pil)
    return TF.normalize(TF.to_tensor(pil), mean, std)


def _dataset(images: np.ndarray, spec: AugmentSpec, mean, std) -> ImageArrayDataset:
    u8 = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    return ImageArrayDataset(u8, np.zeros(len(images), np.int64), mean, std, spec)


@pytest.mark.parametrize(
    "shape,pad,rotation",
    [((32, 32, 3), 4, 10.0), ((64, 64, 3), 4, 10.0), ((28, 28, 1), 2, 15.0), ((20, 24, 3), 3, 0.0)],
)
def test_batch_equals_torchvision_chain_for_the_same_draws(shape, pad, rotation):
    rng = np.random.default_rng(sum(shape))
    images = rng.integers(0, 256, (24, *shape), dtype=np.uint8)
    c = shape[-1]
    mean, std = (CIFAR10_MEAN, CIFAR10_STD) if c == 3 else ([0.1307], [0.3081])
    ds = _dataset(images, AugmentSpec(pad, True, rotation, "black"), mean, std)
    idx = np.arange(len(images))
    x, _ = ds.get_batch(idx, torch.Generator().manual_seed(11))
    draws = ds.draw_augment(len(idx), torch.Generator().manual_seed(11))
    assert (draws.angles is not None) == (rotation > 0)
    assert draws.flip.any() and not draws.flip.all()
    assert int(draws.top.max()) <= 2 * pad and int(draws.left.min()) >= 0
    for i in idx:
        want = _torchvision(
            images[i],
            None if draws.angles is None else float(draws.angles[i]),
            int(draws.top[i]),
            int(draws.left[i]),
            bool(draws.flip[i]),
            pad,
            mean,
            std,
        )
        torch.testing.assert_close(x[i], want, rtol=0, atol=1e-6)


def test_fixed_angles_offsets_flip_and_black_border():
    images = np.full((1, 32, 32, 3), 200, dtype=np.uint8)
    for angle, top, left, flip in [
        (10.0, 0, 8, True),
        (-7.25, 8, 0, False),
        (3.0, 4, 4, True),
        (-10.0, 1, 7, False),
    ]:
        ds = _dataset(images, AugmentSpec(4, True, 10.0, "black"), CIFAR10_MEAN, CIFAR10_STD)
        from fedrcl_flwr.data.datasets import AugmentDraws

        draws = AugmentDraws(
            torch.tensor([angle]), torch.tensor([top]), torch.tensor([left]), torch.tensor([flip])
        )
        got = ds.apply_augment(ds.images, draws)[0]
        want = _torchvision(images[0], angle, top, left, flip, 4, CIFAR10_MEAN, CIFAR10_STD)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # black: the padded border is pixel 0, i.e. -mean/std after normalising
    ds = _dataset(images, AugmentSpec(4, False, 0.0, "black"), CIFAR10_MEAN, CIFAR10_STD)
    draws = AugmentDraws(None, torch.tensor([0]), torch.tensor([0]), None)
    black = ds.apply_augment(ds.images, draws)[0]
    expect = -torch.tensor(CIFAR10_MEAN) / torch.tensor(CIFAR10_STD)
    torch.testing.assert_close(black[:, 0, 0], expect)
    # mean (the former behaviour): the border is 0 after normalising = the mean colour
    ds = _dataset(images, AugmentSpec(4, False, 0.0, "mean"), CIFAR10_MEAN, CIFAR10_STD)
    assert torch.equal(ds.apply_augment(ds.images, draws)[0][:, :4, :4], torch.zeros(3, 4, 4))


def test_rotation_is_pillows_for_any_angle_and_dtype():
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (40, 17, 23, 3), dtype=np.uint8)
    angles = list(rng.uniform(-180, 180, 36)) + [0.0, 90.0, 180.0, -90.0]
    out = rotate(torch.from_numpy(imgs).permute(0, 3, 1, 2), angles)
    for i, a in enumerate(angles):
        assert np.array_equal(
            out[i].permute(1, 2, 0).numpy(), np.asarray(Image.fromarray(imgs[i]).rotate(a))
        ), a
    f = rotate(torch.from_numpy(imgs).permute(0, 3, 1, 2).float() / 255, angles)
    assert torch.equal(f, out.float() / 255)


def test_normalize_constants_reach_the_batches_and_test_set(tmp_path):
    syn = {"num_train": 40, "num_test": 10, "num_classes": 2, "image_size": 16}
    const = {"mean": [0.5, 0.25, 0.75], "std": [0.5, 0.1, 0.2]}
    b = load_dataset("synthetic", synthetic=syn, normalize=const, crop_pad=0, flip=False)
    assert b.train.mean.flatten().tolist() == pytest.approx(const["mean"])
    x, _ = b.test.get_batch(np.arange(3))
    u = b.test.images[:3].float() / 255
    want = (u - torch.tensor(const["mean"]).view(3, 1, 1)) / torch.tensor(const["std"]).view(
        3, 1, 1
    )
    assert torch.equal(x, want)
    plain = load_dataset("synthetic", synthetic=syn, normalize=False)
    assert plain.train.std.flatten().tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(DatasetError, match="has 3 values but the images have 1 channel"):
        load_dataset("synthetic", synthetic={**syn, "channels": 1}, normalize=const)


def _cfg(**dataset):
    return {"name": "n", "dataset": {"name": "cifar10", **dataset}}


@pytest.mark.parametrize(
    "value,msg",
    [
        (
            {"mean": [0.5, 0.5], "std": [0.2, 0.2]},
            "'dataset.normalize.mean' has 2 values but the images have 3 channel(s)",
        ),
        ({"mean": [0.5] * 3, "std": [0.2, 0.0, 0.2]}, "'dataset.normalize.std' must be >= 0.001"),
        ({"mean": [0.5] * 3, "std": [0.2, -1, 0.2]}, "'dataset.normalize.std' must be >= 0.001"),
        ({"mean": [1.5, 0.5, 0.5], "std": [0.2] * 3}, "'dataset.normalize.mean' must be in [0, 1]"),
        ({"mean": [0.5] * 3}, "'dataset.normalize.std' is missing: 'dataset.normalize' as a"),
        ({"mean": [0.5] * 3, "std": [0.2] * 3, "eps": 1}, "unknown key 'dataset.normalize.eps'"),
        ({"mean": "0.5", "std": [0.2] * 3}, "'dataset.normalize.mean' must be a list of numbers"),
        ({"mean": [0.5, None, 0.5], "std": [0.2] * 3}, "must be a list of numbers"),
        (1, "'dataset.normalize' must be bool or dict"),
    ],
)
def test_bad_normalize_is_one_config_error(value, msg):
    with pytest.raises(ConfigError) as e:
        config_from_dict(_cfg(normalize=value), "exp.yaml")
    assert msg in str(e.value) and str(e.value).startswith("exp.yaml: "), str(e.value)


def test_bad_normalize_and_pad_fill_exit_2_before_any_work(tmp_path, capsys):
    for dataset, msg in [
        ({"normalize": {"mean": [0.5], "std": [0.5]}}, "dataset.normalize.mean' has 1 values"),
        ({"pad_fill": "white"}, "'dataset.pad_fill' must be black or mean"),
    ]:
        path = tmp_path / "bad.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": "b",
                    "dataset": {"name": "cifar10", "root": str(tmp_path / "none"), **dataset},
                }
            )
        )
        assert main(["partition", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0] and str(path) in err[0], err


def test_cache_key_holds_the_constants_not_the_augmentation(tmp_path):
    from fedrcl_flwr.data.cache.keys import entry_key

    cfg = config_from_dict(_cfg(root=str(tmp_path)), "x")
    base = entry_key(cfg.dataset, 0)
    const = {"mean": CIFAR10_MEAN, "std": CIFAR10_STD}
    keys = {
        entry_key(config_from_dict(_cfg(root=str(tmp_path), **kw), "x").dataset, 0)
        for kw in (
            {"normalize": False},
            {"normalize": const},
            {"normalize": {**const, "std": [0.2, 0.2, 0.2]}},
        )
    }
    assert base not in keys and len(keys) == 3
    same = {
        entry_key(config_from_dict(_cfg(root=str(tmp_path), **kw), "x").dataset, 0)
        for kw in ({"pad_fill": "black"}, {"flip": False}, {"crop_pad": 0}, {"rotation": 10})
    }
    assert same == {base}


def test_paper_yamls_pad_black_with_the_authors_constants():
    from pathlib import Path

    from fedrcl_flwr.config import load_config

    root = Path(__file__).resolve().parents[2] / "experiments" / "fedrcl"
    theirs = {
        "cifar10": (CIFAR10_MEAN, CIFAR10_STD),
        "cifar100": ([0.5071, 0.4867, 0.4408], [0.2675, 0.2565, 0.2761]),
        "tinyimagenet": ([0.4802, 0.4481, 0.3975], [0.2770, 0.2691, 0.2821]),
    }
    files = sorted(root.glob("table[12345ACD]*.yaml"))
    assert len(files) == 49
    for f in files:
        d = load_config(f).dataset
        assert d.pad_fill == "black" and d.rotation == 10, f
        assert (d.normalize["mean"], d.normalize["std"]) == theirs[d.name], f
        assert d.crop_pad in (None, 4) and d.flip in (None, True), f
