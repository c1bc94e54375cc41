"""The dataset cache (fedrcl_flwr/data/cache/): keyed entries, built once, memory-mapped,
atomic under races, corrupt entries rebuilt, prepared entries only opened, `cache ls|clear`.
The real-run proof that no Flower process builds the data is in tests/e2e/test_cli_run.py."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import write_saved_dataset_dict

from fedrcl_flwr.cli import main
from fedrcl_flwr.data.cache import store
from fedrcl_flwr.data.cache.keys import entry_key, entry_settings
from fedrcl_flwr.data.cache.manage import list_entries
from fedrcl_flwr.data.datasets import DatasetError
from fedrcl_flwr.run import runtime

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cfg(tiny, tmp_path):
    c = tiny()
    c.dataset.cache_dir = str(tmp_path / "cache")
    return c


def _arrays(bundle):
    return {
        k: np.asarray(getattr(bundle, s).images if k.endswith("x") else getattr(bundle, s).labels)
        for s in ("train", "test")
        for k in (f"{s}_x", f"{s}_y")
    }


def _forbid_generator(monkeypatch):
    import fedrcl_flwr.data.sources.synthetic as synthetic

    def refuse(*a, **kw):
        raise AssertionError("the synthetic generator was called")

    monkeypatch.setattr(synthetic, "make_synthetic", refuse)


def test_key_follows_the_arrays_not_the_augmentation(cfg):
    base = entry_key(cfg.dataset, cfg.seed)
    assert entry_key(cfg.dataset, cfg.seed + 1) != base
    for field, value in [("image_size", 8), ("val_fraction", 0.1), ("normalize", False)]:
        d = dataclasses.replace(cfg.dataset, **{field: value})
        assert entry_key(d, cfg.seed) != base, field
    d = dataclasses.replace(
        cfg.dataset, synthetic=dataclasses.replace(cfg.dataset.synthetic, num_train=801)
    )
    assert entry_key(d, cfg.seed) != base
    for field, value in [
        ("augment", False),
        ("rotation", 10.0),
        ("crop_pad", 3),
        ("flip", False),
        ("verify_md5", False),
    ]:
        d = dataclasses.replace(cfg.dataset, **{field: value})
        assert entry_key(d, cfg.seed) == base, field


def test_npz_source_change_is_a_new_entry(tmp_path):
    from fedrcl_flwr.config import DatasetConfig

    f = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(
        f,
        x_train=rng.integers(0, 255, (10, 8, 8, 3), dtype=np.uint8),
        y_train=np.arange(10) % 2,
        x_test=np.zeros((4, 8, 8, 3), np.uint8),
        y_test=np.arange(4) % 2,
    )
    d = DatasetConfig(name="npz", path=str(f))
    before = entry_key(d, 0)
    np.savez(
        f,
        x_train=np.zeros((11, 8, 8, 3), np.uint8),
        y_train=np.arange(11) % 2,
        x_test=np.zeros((4, 8, 8, 3), np.uint8),
        y_test=np.arange(4) % 2,
    )
    assert entry_key(d, 0) != before


def test_second_load_maps_the_entry_and_never_generates(cfg, monkeypatch):
    first, entry = store.load(cfg.dataset, cfg.seed)
    _forbid_generator(monkeypatch)
    again, entry2 = store.load(cfg.dataset, cfg.seed)
    assert entry2 == entry
    a, b = _arrays(first), _arrays(again)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert again.num_classes == first.num_classes == 4
    # the pixels are the file's pages (mapped read-only), shared by every process
    maps = Path("/proc/self/maps").read_text()
    assert str(entry / "train_x.npy") in maps
    # augmentation comes from the config, not from the entry
    assert again.train.augment is not None and again.test.augment is None


def test_matches_a_fresh_build_without_the_cache(cfg):
    from fedrcl_flwr.data.datasets import load_dataset

    d = cfg.dataset
    fresh = load_dataset(d.name, synthetic=dataclasses.asdict(d.synthetic), seed=cfg.seed)
    cached, _ = store.load(d, cfg.seed)
    a, b = _arrays(fresh), _arrays(cached)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert np.allclose(fresh.train.mean, cached.train.mean)
    assert fresh.train.augment == cached.train.augment


@pytest.mark.parametrize("damage", ["truncate", "meta", "missing"])
def test_corrupt_entry_is_rebuilt_never_used(cfg, damage):
    first, entry = store.load(cfg.dataset, cfg.seed)
    ref = {k: v.copy() for k, v in _arrays(first).items()}  # before the damage
    del first
    if damage == "truncate":
        f = entry / "train_x.npy"
        f.write_bytes(f.read_bytes()[:-100])
    elif damage == "meta":
        raw = bytearray((entry / "meta.json").read_bytes())
        raw[10] ^= 0xFF
        (entry / "meta.json").write_bytes(bytes(raw))
    else:
        (entry / "test_y.npy").unlink()
    notes = []
    rebuilt, entry2 = store.load(cfg.dataset, cfg.seed, note=notes.append)
    assert entry2 == entry and len(notes) == 1 and "rebuilding" in notes[0]
    got = _arrays(rebuilt)
    assert all(np.array_equal(ref[k], got[k]) for k in ref)
    assert [r["status"] for r in list_entries(entry.parent)] == ["ok"]


def test_prepared_entry_is_only_opened(cfg, tmp_path, monkeypatch):
    """A process of a run (use_prepared_dataset) opens the CLI's entry and never builds;
    a missing entry is one DatasetError naming the host and the path."""
    import socket

    entry = runtime.prepare_dataset(cfg)
    _forbid_generator(monkeypatch)
    runtime.WORKER.clear()
    runtime.use_prepared_dataset(cfg, str(entry))
    try:
        assert len(runtime.load_bundle(cfg).train) == 800
        runtime.WORKER.clear()
        runtime.use_prepared_dataset(cfg, str(tmp_path / "elsewhere" / entry.name))
        with pytest.raises(DatasetError) as ei:
            runtime.load_bundle(cfg)
        msg = str(ei.value)
        assert socket.gethostname() in msg and "elsewhere" in msg
        assert "shared filesystem" in msg
    finally:
        runtime.WORKER.clear()


RACE = """
import sys
from fedrcl_flwr.config import DatasetConfig, SyntheticConfig
from fedrcl_flwr.data.cache import store
d = DatasetConfig(cache_dir=sys.argv[1], synthetic=SyntheticConfig(
    num_train=3000, num_test=500, num_classes=4, image_size=16))
b, entry = store.load(d, 0)
print(entry.name, int(b.train.images.sum()))
"""


def test_two_processes_racing_for_one_entry(tmp_path):
    root = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(root)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-800:] for o in outs]
    results = {o[0].strip() for o in outs}
    assert len(results) == 1  # same entry, same pixels
    assert [p.name for p in root.iterdir()] == [results.pop().split()[0]]  # no leftovers


def test_cache_ls_and_clear(cfg, tmp_path, capsys):
    _, entry = store.load(cfg.dataset, cfg.seed)
    other = dataclasses.replace(cfg.dataset, image_size=8)
    _, entry2 = store.load(other, cfg.seed)
    (entry.parent / f".tmp-{entry.name}-stale_1").mkdir()  # a build that was killed
    (entry2 / "meta.sha256").write_text("0\n")
    root = str(entry.parent)
    assert main(["cache", "ls", "--cache-dir", root]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and entry.name[:12] in out and entry2.name[:12] in out
    assert "synthetic" in out and "corrupt" in out and out.count(" ok") == 1
    assert main(["cache", "clear", entry2.name[:8], "--cache-dir", root]) == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert entry.exists() and not entry2.exists()
    assert main(["cache", "clear", "--cache-dir", root]) == 0
    assert list(Path(root).iterdir()) == []
    # bad input: one line, exit 2
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["cache", "ls", "--cache-dir", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a directory" in err[0]


def test_unwritable_cache_dir_is_an_input_error(tmp_path, capsys):
    import yaml

    f = tmp_path / "file"
    f.write_text("x")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "dataset": {
                    "name": "synthetic",
                    "cache_dir": str(f / "sub"),
                    "synthetic": {
                        "num_train": 400,
                        "num_test": 100,
                        "num_classes": 4,
                        "image_size": 16,
                    },
                },
                "federation": {
                    "num_clients": 4,
                    "rounds": 1,
                    "participation": None,
                    "clients_per_round": 2,
                },
            }
        )
    )
    rc = main(["run", str(exp), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "dataset.cache_dir" in err[0] and str(exp) in err[0]
    assert not (tmp_path / "o").exists()


def test_seed_is_in_the_key_only_where_it_draws_the_arrays(tmp_path):
    """An npz (or torchvision files) gives the same arrays for every seed: one
    entry for a 3-seed study, not three; the seed still keys what it draws (synthetic
    images, the val_fraction hold-out, an image folder's held-out test split)."""
    from fedrcl_flwr.config import DatasetConfig

    f = tmp_path / "d.npz"
    x = np.random.default_rng(0).integers(0, 255, (20, 8, 8), dtype=np.uint8)
    np.savez(f, x_train=x, y_train=np.arange(20) % 2, x_test=x[:6], y_test=np.arange(6) % 2)
    d = DatasetConfig(name="npz", path=str(f), cache_dir=str(tmp_path / "cache"))
    assert len({entry_key(d, s) for s in (0, 1, 2)}) == 1
    for s in (0, 1, 2):
        store.load(d, s)
    assert len(list_entries(tmp_path / "cache")) == 1
    held = dataclasses.replace(d, val_fraction=0.25)
    assert entry_key(held, 0) != entry_key(held, 1)
    assert entry_key(DatasetConfig(), 0) != entry_key(DatasetConfig(), 1)
    tree = tmp_path / "folder"
    for cls in ("a", "b"):
        (tree / cls).mkdir(parents=True)
    flat = DatasetConfig(name="imagefolder", root=str(tree))
    assert entry_key(flat, 0) != entry_key(flat, 1)  # seeded test split
    for split in ("train", "test"):
        (tree / split).mkdir()
    assert entry_key(flat, 0) == entry_key(flat, 1)


def _settings(**differs):
    """The key settings every dataset shares, as the cache wrote them at format 3."""
    base = {
        "format": 3,
        "seed": None,
        "root": None,
        "path": None,
        "image_size": None,
        "normalize": True,
        "val_fraction": 0.0,
        "domains": [],
        "test_fraction": 0.2,
        "synthetic": None,
        "sources": [],
    }
    return {**base, **differs}


def test_entry_keys_are_those_users_caches_hold(tmp_path):
    """An entry's key is the SHA-256 of its settings' JSON (sorted keys): these settings,
    hence these keys, name the entries users already hold (a change here silently
    rebuilds every cache). Pinned for a generated dataset, an npz, an hf_disk (its columns)
    and a torchvision dataset (its folder's files)."""
    import hashlib
    import json
    import os

    from fedrcl_flwr.config import DatasetConfig

    def key_of(settings):
        text = json.dumps(settings, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    synth = DatasetConfig()
    want = _settings(
        name="synthetic",
        seed=0,
        synthetic=dataclasses.asdict(synth.synthetic),
    )
    assert entry_settings(synth, 0) == want
    assert entry_key(synth, 0) == "72fcce1e86c244deeb5903890d111005"

    f = tmp_path / "d.npz"
    f.write_bytes(b"12345")
    os.utime(f, ns=(10**18, 10**18))
    npz = DatasetConfig(name="npz", path=str(f), root=str(tmp_path / "r"))
    want = _settings(name="npz", path=str(f.resolve()), sources=[[str(f.resolve()), 5, 10**18]])
    assert entry_settings(npz, 7) == want and entry_key(npz, 7) == key_of(want)

    # hf_disk: the saved folder's files, relative to it, in the order of a sorted walk
    saved = tmp_path / "hf"
    write_saved_dataset_dict(saved)
    hf = DatasetConfig(name="hf_disk", path=str(saved), image_column="img", label_column=None)
    want = _settings(
        name="hf_disk",
        path=str(saved.resolve()),
        columns=["img", None],
        sources=[
            ["dataset_dict.json", 29, 10**18],
            *[
                [f"{split}/{name}", size, 10**18]
                for split in ("test", "train")
                for name, size in (
                    ("data-00000-of-00001.arrow", 5),
                    ("dataset_info.json", 79),
                    ("state.json", 76),
                )
            ],
        ],
    )
    assert entry_settings(hf, 7) == want and entry_key(hf, 7) == key_of(want)

    batches = tmp_path / "r" / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    (batches / "data_batch_1").write_bytes(b"xy")
    os.utime(batches / "data_batch_1", ns=(10**18, 10**18))
    cifar = DatasetConfig(name="cifar10", root=str(tmp_path / "r"), image_size=16)
    want = _settings(
        name="cifar10",
        root=str((tmp_path / "r").resolve()),
        image_size=16,
        sources=[["data_batch_1", 2, 10**18]],
    )
    assert entry_settings(cifar, 3) == want and entry_key(cifar, 3) == key_of(want)
