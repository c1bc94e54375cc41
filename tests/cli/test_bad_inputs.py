"""In process (no Flower process starts): every bad input is one line naming it,
exit code 2, nothing written; data, YAML, checkpoints and paths are read safely."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import TINY

from fedrcl_flwr.cli import main
from fedrcl_flwr.config import ConfigError, config_from_dict, load_config, read_yaml
from fedrcl_flwr.data.datasets import DatasetError, load_dataset
from fedrcl_flwr.errors import CheckpointError
from fedrcl_flwr.launch.processes import OutputLock
from fedrcl_flwr.run.checkpoint import load_checkpoint, save_checkpoint
from fedrcl_flwr.run.progress import format_round_line
from fedrcl_flwr.run.run_files import LOCK_FILE
from fedrcl_flwr.runner import toml_string

ROOT = Path(__file__).resolve().parents[2]


def _yaml(tmp_path, data=None, text=None, name="exp.yaml") -> str:
    p = tmp_path / name
    if text is not None:
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
    else:
        p.write_text(yaml.safe_dump(data if data is not None else TINY))
    return str(p)


def _cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_exit2(rc, err):
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedrcl-flwr: error:"), err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------- YAML (Bad 7, Weak YAML)


@pytest.mark.parametrize(
    "text,key,lines",
    [
        ("name: a\nseed: 1\nname: b\n", "name", "1 and 3"),
        ("federation:\n  rounds: 5\nfederation:\n  num_clients: 4\n", "federation", "1 and 3"),
        ("client:\n  lr: 0.1\n  momentum: 0.5\n  lr: 0.2\n", "lr", "2 and 4"),
        ("client:\n  params:\n    mu: 0.1\n    mu: 0.2\n", "mu", "3 and 4"),
        ("evaluation: {ema: 0.9, ema: 0.5}\n", "ema", "1 and 1"),
    ],
)
def test_duplicate_yaml_keys_are_an_error_naming_key_and_lines(tmp_path, capsys, text, key, lines):
    path = _yaml(tmp_path, text=text)
    line = _one_line_exit2(*_cli(capsys, "run", path, "--out", str(tmp_path / "o"))[::2])
    assert f"key '{key}' appears twice" in line and f"lines {lines}" in line and path in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "spelling,value",
    [
        ("1e-3", 1e-3),
        ("1E-3", 1e-3),
        (".5", 0.5),
        ("5.", 5.0),
        ("2.5e+1", 25.0),
        ("3e0", 3.0),
        ("0.25", 0.25),
    ],
)
def test_yaml_floats_as_people_write_them(tmp_path, spelling, value):
    data = dict(TINY, client=dict(TINY["client"], weight_decay="X"))
    text = yaml.safe_dump(data).replace("weight_decay: X", f"weight_decay: {spelling}")
    path = _yaml(tmp_path, text=text)
    assert load_config(path).client.weight_decay == pytest.approx(value)
    assert load_config(
        _yaml(tmp_path), [f"client.weight_decay={spelling}"]
    ).client.weight_decay == pytest.approx(value)


@pytest.mark.parametrize(
    "override",
    [
        "client.lr=.inf",
        "client.lr=-.inf",
        "client.lr=.nan",
        "partition.alpha=.inf",
        "federation.round_timeout_s=.inf",
        "client.grad_clip=.nan",
        "evaluation.ema=.nan",
    ],
)
def test_non_finite_floats_are_refused(tmp_path, capsys, override):
    line = _one_line_exit2(
        *_cli(capsys, "run", _yaml(tmp_path), "--set", override, "--out", str(tmp_path / "o"))[::2]
    )
    assert override.split("=")[0] in line and "finite" in line


@pytest.mark.parametrize(
    "raw",
    [
        b"name: caf\xe9\n",  # latin-1
        b"\xff\xfen\x00a\x00m\x00e\x00",  # UTF-16
        b"seed: 0\nname: \x80\x81\n",
    ],
)
def test_non_utf8_yaml_is_one_line(tmp_path, capsys, raw):
    path = _yaml(tmp_path, text=raw)
    line = _one_line_exit2(*_cli(capsys, "run", path)[::2])
    assert "UTF-8" in line and path in line


def _bomb(levels: int) -> str:
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        rows.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize(
    "text,what",
    [
        (_bomb(9), "nodes"),
        (_bomb(6), "nodes"),
        ("name: " + "x" * (1 << 20) + "\n", "too large"),
        (
            "client:\n  params:\n    big: &b ["
            + ", ".join(["1"] * 400)
            + "]\n    more: ["
            + ", ".join(["*b"] * 300)
            + "]\n",
            "nodes",
        ),
    ],
)
def test_yaml_bombs_are_bounded(tmp_path, capsys, text, what):
    t0 = time.time()
    line = _one_line_exit2(*_cli(capsys, "run", _yaml(tmp_path, text=text))[::2])
    assert what in line
    assert time.time() - t0 < 60  # refused, not expanded


def test_anchors_and_merge_keys_still_work(tmp_path):
    text = yaml.safe_dump(TINY).replace("client:", "client: &c", 1)
    data = read_yaml(_yaml(tmp_path, text=text + "x: *c\n"))
    assert data["x"] == data["client"]


# ------------------------------------------------------------------- paths and names


@pytest.mark.parametrize(
    "sets",
    [
        ["name=.."],
        ["name=."],
        ["name=a/b"],
        ["output.dir="],
        ["output.dir=' '"],
    ],
)
def test_names_that_escape_their_directory_are_refused(tmp_path, capsys, monkeypatch, sets):
    monkeypatch.chdir(tmp_path)
    data = dict(TINY, output={"dir": "runs/{name}"})
    argv = ["run", _yaml(tmp_path, data)]
    for s in sets:
        argv += ["--set", s]
    line = _one_line_exit2(*_cli(capsys, *argv)[::2])
    assert "'name'" in line or "'output.dir'" in line
    assert sorted(os.listdir(tmp_path)) == ["exp.yaml"]


@pytest.mark.parametrize("out", ["o{x}", "o{", "}o", "{name}-{0}", "o{name!r}"])
def test_braces_in_output_dir_are_literal(tmp_path, out):
    cfg = load_config(_yaml(tmp_path), [f"output.dir={tmp_path / out}"])
    assert cfg.output_dir() == tmp_path / out.replace("{name}", "tiny")


@pytest.mark.parametrize(
    "path",
    [
        '/tmp/a"b',
        "/tmp/a'b",
        "/tmp/a\\b",
        "/tmp/a b\tc",
        "/tmp/ünï cödé/é",
        '/tmp/x" y=1 "',
        "/tmp/a\nb",
        "/tmp/a\x7fb",
    ],
)
def test_paths_reach_flowers_run_config_unchanged(path):
    assert tomllib.loads(f"k = {toml_string(path)}\n")["k"] == path


def test_output_path_that_is_a_file_or_under_one(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    for out, what in [
        (f, "is a file"),
        (f / "sub", "under the file"),
        (f / "a" / "b", "under the file"),
    ]:
        line = _one_line_exit2(*_cli(capsys, "run", _yaml(tmp_path), "--out", str(out))[::2])
        assert what in line and str(out) in line
    assert f.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_output_path_not_writable(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        line = _one_line_exit2(*_cli(capsys, "run", _yaml(tmp_path), "--out", str(ro / "run"))[::2])
        assert "not writable" in line
    finally:
        ro.chmod(0o700)


# ----------------------------------------------------------- resources (input checks)


@pytest.mark.parametrize(
    "sets,word",
    [
        (["simulation.num_cpus=4096"], "num_cpus"),
        (
            [
                "simulation.num_supernodes=20000",
                "federation.num_clients=30000",
                "dataset.synthetic.num_train=60000",
            ],
            "SuperNodes",
        ),
        (["simulation.num_supernodes=5"], "num_supernodes"),
        (["simulation.init_num_cpus=1", "simulation.num_cpus=2"], "num_cpus"),
    ],
)
def test_resource_checks_are_input_errors(tmp_path, capsys, sets, word):
    argv = ["run", _yaml(tmp_path), "--out", str(tmp_path / "o")]
    for s in sets:
        argv += ["--set", s]
    line = _one_line_exit2(*_cli(capsys, *argv)[::2])
    assert word in line and argv[1] in line  # names the file
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize(
    "sets",
    [
        ["simulation.num_gpus=1"],
        ["simulation.num_gpus=0.25"],
        ["client.device=cuda"],
        ["simulation.init_num_gpus=1"],
    ],
)
def test_gpu_requests_without_cuda_are_input_errors(tmp_path, capsys, sets):
    argv = ["run", _yaml(tmp_path), "--out", str(tmp_path / "o")]
    for s in sets:
        argv += ["--set", s]
    line = _one_line_exit2(*_cli(capsys, *argv)[::2])
    assert "CUDA" in line and argv[1] in line  # names the file
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------ synthetic data checked early (Bad 5)


@pytest.mark.parametrize(
    "sets",
    [
        [
            "federation.num_clients=100",
            "partition.scheme=dirichlet",
            "partition.alpha=0.01",
            "partition.balanced=false",
            "partition.min_size=4",
        ],
        [
            "partition.scheme=domain",
            "dataset.synthetic.num_domains=2",
            "partition.domains_per_client=3",
        ],
        ["federation.num_clients=30", "partition.scheme=shards", "partition.shards_per_client=200"],
    ],
)
def test_impossible_synthetic_split_stops_before_flower(tmp_path, capsys, sets):
    argv = ["run", _yaml(tmp_path), "--out", str(tmp_path / "o")]
    for s in sets:
        argv += ["--set", s]
    rc, _, err = _cli(capsys, *argv)
    _one_line_exit2(rc, err)
    assert not (tmp_path / "o").exists()
    # the same verdict as `fedrcl-flwr partition`
    rc2, _, err2 = _cli(capsys, "partition", argv[1], *argv[4:])
    assert rc2 == 2


# ------------------------------------------------------------- output directory (Bad 3)


def test_output_dir_held_by_a_live_run_is_refused_naming_its_pid(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from fedrcl_flwr.launch.processes import OutputLock; l = OutputLock(Path(sys.argv[1])); "
            "l.acquire(); print('ok', flush=True); time.sleep(120)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        line = _one_line_exit2(*_cli(capsys, "run", _yaml(tmp_path), "--out", str(out))[::2])
        assert f"PID {holder.pid}" in line and "in use" in line
        assert sorted(os.listdir(out)) == [LOCK_FILE]
        with pytest.raises(ConfigError, match=f"PID {holder.pid}"):
            OutputLock(out).acquire()
    finally:
        holder.kill()
        holder.wait()
    assert OutputLock.holder(out) is None  # the lock died with its holder (SIGKILL)
    lock = OutputLock(out)
    lock.acquire()
    lock.release()


def test_a_completed_run_removes_its_lock_file_and_the_lock_still_excludes(tmp_path, monkeypatch):
    """The lock file stayed behind after a finished run. ``release(remove=True)``
    unlinks it while still holding the lock; a newcomer that opened the old file just
    before (and so locks a file no longer at the path) notices and locks the new one, so
    two runs can never both hold the directory."""
    import fcntl

    out = tmp_path / "o"
    out.mkdir()
    first = OutputLock(out)
    first.acquire()
    assert (out / LOCK_FILE).exists()
    first.release(remove=True)
    assert not (out / LOCK_FILE).exists() and OutputLock.holder(out) is None
    # the race: B opens the file, A (the holder) removes it and releases, B locks it
    a = OutputLock(out)
    a.acquire()
    real_open = os.open
    opened = []

    def open_then_holder_finishes(path, flags, *mode):
        fd = real_open(path, flags, *mode)
        if not opened:
            opened.append(fd)
            a.release(remove=True)  # between B's open and B's flock
        return fd

    monkeypatch.setattr(os, "open", open_then_holder_finishes)
    b = OutputLock(out)
    b.acquire()  # retried on the new file
    monkeypatch.setattr(os, "open", real_open)
    assert os.fstat(b.fd).st_ino == os.stat(out / LOCK_FILE).st_ino
    with pytest.raises(ConfigError, match="in use"):
        OutputLock(out).acquire()  # a third run is refused: B holds the file at the path
    fd = os.open(out / LOCK_FILE, os.O_RDONLY)
    with pytest.raises(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    b.release()
    assert (out / LOCK_FILE).exists()  # without remove (a failed run): the file stays


@pytest.mark.parametrize("left", ["summary.json", "metrics.jsonl", "checkpoint.pt", "model.pt"])
def test_finished_dir_is_not_overwritten_silently(tmp_path, capsys, left):
    out = tmp_path / "o"
    out.mkdir()
    (out / left).write_text("old")
    line = _one_line_exit2(*_cli(capsys, "run", _yaml(tmp_path), "--out", str(out))[::2])
    assert left in line and "--overwrite" in line and "--resume" in line
    assert (out / left).read_text() == "old"
    # --overwrite clears only a run directory the tool created: refused here
    line = _one_line_exit2(
        *_cli(capsys, "run", _yaml(tmp_path), "--out", str(out), "--overwrite")[::2]
    )
    assert "not created by fedrcl-flwr" in line and (out / left).read_text() == "old"
    # in one it created, --overwrite is accepted past that check (stopped here by a later
    # input check)
    from fedrcl_flwr.run.results import write_marker

    write_marker(out, "run")
    rc, _, err = _cli(
        capsys,
        "run",
        _yaml(tmp_path),
        "--out",
        str(out),
        "--overwrite",
        "--set",
        "simulation.num_cpus=4096",
    )
    assert rc == 2 and "num_cpus" in err and (out / left).read_text() == "old"


# ------------------------------------------------------------------ npz data (Bad 8 etc.)


def _npz(tmp_path, **arrays):
    rng = np.random.default_rng(0)
    base = {
        "x_train": rng.integers(0, 256, (20, 8, 8, 3), dtype=np.uint8),
        "y_train": np.arange(20) % 2,
        "x_test": rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8),
        "y_test": np.arange(6) % 2,
    }
    base.update(arrays)
    p = tmp_path / "d.npz"
    np.savez(p, **base)
    return p


def _f(v, shape=(20, 8, 8, 3)):
    x = np.full(shape, 0.5, np.float32)
    x.flat[7] = v
    return x


@pytest.mark.parametrize(
    "arrays,words",
    [
        ({"x_train": _f(1.5)}, ["x_train", "[0, 1]"]),
        ({"x_train": _f(-0.1)}, ["x_train", "[0, 1]"]),
        ({"x_train": _f(255.0)}, ["x_train", "[0, 1]"]),
        ({"x_train": _f(np.nan)}, ["x_train", "NaN/Inf"]),
        ({"x_test": _f(np.inf, (6, 8, 8, 3))}, ["x_test", "NaN/Inf"]),
        ({"x_train": np.full((20, 8, 8, 3), 300, np.int32)}, ["x_train", "[0, 255]"]),
        ({"x_train": np.array([["a"] * 4] * 20)}, ["x_train", "type"]),
        ({"x_train": np.zeros((20, 3, 16, 3), np.uint8)}, ["x_train", "ambiguous"]),
        ({"y_train": np.arange(20) % 2 + 0.5}, ["y_train", "fractional"]),
        (
            {"y_train": np.where(np.arange(20) == 3, np.nan, np.arange(20) % 2)},
            ["y_train", "NaN/Inf"],
        ),
        ({"y_train": np.array(["cat", "dog"] * 10)}, ["y_train", "type"]),
        ({"y_train": np.arange(20) % 2 - 1}, ["y_train", "negative"]),
        ({"y_test": np.full(6, 5)}, ["test classes", "[5]"]),
        (
            {"x_test": np.zeros((0, 8, 8, 3), np.uint8), "y_test": np.zeros(0, np.int64)},
            ["no test images"],
        ),
    ],
)
def test_npz_bad_contents_are_one_clear_error(tmp_path, arrays, words):
    p = _npz(tmp_path, **arrays)
    with pytest.raises(DatasetError) as ei:
        load_dataset("npz", path=str(p))
    msg = str(ei.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_npz_object_arrays_are_refused_without_unpickling(tmp_path):
    p = tmp_path / "d.npz"
    obj = np.empty(20, dtype=object)
    obj[:] = [{"a": i} for i in range(20)]
    np.savez(p, x_train=obj, y_train=np.arange(20) % 2, x_test=obj[:6], y_test=np.arange(6) % 2)
    with pytest.raises(DatasetError, match="x_train.*without pickle"):
        load_dataset("npz", path=str(p))


@pytest.mark.parametrize(
    "x,expect",
    [
        (np.full((20, 4, 4, 3), 0.5, np.float64), 128),  # rint(127.5) = 128
        (np.full((20, 4, 4, 3), 1.0, np.float32), 255),
        (np.full((20, 4, 4, 3), 0.2, np.float32), 51),
        (np.full((20, 3, 4, 4), 7, np.int16), 7),  # channels-first, ints in [0, 255]
        (np.full((20, 4, 4), 1.0, np.float16), 255),  # grayscale
    ],
)
def test_documented_pixel_conversions(tmp_path, x, expect):
    b = load_dataset("npz", path=str(_npz(tmp_path, x_train=x, x_test=x[:6])), normalize=False)
    assert int(b.train.images.min()) == int(b.train.images.max()) == expect
    assert tuple(b.train.images.shape[2:]) == (4, 4)


def test_float_labels_that_are_whole_numbers_are_accepted(tmp_path):
    b = load_dataset("npz", path=str(_npz(tmp_path, y_train=(np.arange(20) % 2) * 1.0)))
    assert b.train_labels.dtype == np.int64 and set(b.train_labels.tolist()) == {0, 1}


def test_unreadable_image_in_a_folder_is_named(tmp_path):
    from PIL import Image

    for c in ("cat", "dog"):
        (tmp_path / "img" / c).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (8, 8), (i * 10, 0, 0)).save(tmp_path / "img" / c / f"{i}.png")
    bad = tmp_path / "img" / "dog" / "3.png"
    bad.write_bytes(b"not a png at all")
    with pytest.raises(DatasetError, match=r"3\.png: not a readable image"):
        load_dataset("imagefolder", root=str(tmp_path / "img"), image_size=8)
    bad.write_bytes(bad.read_bytes()[:0])
    with pytest.raises(DatasetError, match=r"3\.png"):
        load_dataset("imagefolder", root=str(tmp_path / "img"), image_size=8)


@pytest.mark.parametrize(
    "synthetic",
    [
        {"num_train": 10**9, "num_test": 10, "image_size": 32},
        {"num_train": 1000, "num_test": 10, "image_size": 65536, "channels": 3},
    ],
)
def test_data_too_large_for_memory_says_how_large(synthetic):
    with pytest.raises(DatasetError, match=r"GiB in memory .* available"):
        load_dataset("synthetic", synthetic=synthetic)


def test_npz_too_large_is_found_from_its_headers(tmp_path):
    p = tmp_path / "huge.npz"
    with zipfile.ZipFile(p, "w") as zf:
        for k, shape in [
            ("x_train", (10**7, 256, 256, 3)),
            ("y_train", (10**7,)),
            ("x_test", (1, 256, 256, 3)),
            ("y_test", (1,)),
        ]:
            buf = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                buf,
                {"descr": "|u1" if k[0] == "x" else "<i8", "fortran_order": False, "shape": shape},
            )
            zf.writestr(k + ".npy", buf.getvalue())  # a header only: nothing to load
    with pytest.raises(DatasetError, match=r"huge\.npz needs about \d+\.\d GiB"):
        load_dataset("npz", path=str(p))


# ------------------------------------------------------------- checkpoints (Bad 9, resume)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch " + str(Path(os.environ["EVIL_MARK"])),))


def test_crafted_checkpoint_does_not_run_code(tmp_path, monkeypatch):
    mark = tmp_path / "pwned"
    monkeypatch.setenv("EVIL_MARK", str(mark))
    torch.save({"round": 1, "strategy": {"weights": []}, "x": _Evil()}, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path)
    assert not mark.exists()


def test_checkpoint_round_trips_through_weights_only(tmp_path):
    state = {
        "round": 3,
        "ema": 0.5,
        "wall_time_s": 1.0,
        "strategy": {
            "weights": [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, np.int64)],
            "buffers": {"m": [np.full((2, 3), 0.25), None]},
            "exchange": {"bank": {3: (2, np.ones((2, 4)), np.arange(2))}},
        },
    }
    save_checkpoint(tmp_path, state)
    raw = torch.load(tmp_path / "checkpoint.pt", weights_only=True)  # loads as plain data
    assert raw["round"] == 3
    back = load_checkpoint(tmp_path)
    np.testing.assert_array_equal(back["strategy"]["weights"][0], state["strategy"]["weights"][0])
    assert back["strategy"]["weights"][1].dtype == np.int64
    assert back["strategy"]["exchange"]["bank"][3][1].shape == (2, 4)
    np.testing.assert_array_equal(back["strategy"]["buffers"]["m"][0], np.full((2, 3), 0.25))
    assert back["strategy"]["buffers"]["m"][1] is None


@pytest.fixture
def resumable(tmp_path):
    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config import dump_config

    cfg = config_from_dict(dict(TINY, output={"dir": str(tmp_path / "run"), "checkpoint_every": 1}))
    run = tmp_path / "run"
    run_inprocess(cfg, run, stop_after=1)
    dump_config(cfg, run / "config.yaml")
    return run


@pytest.mark.parametrize(
    "change,word",
    [
        (["model.name=cnn4"], "model.name"),
        (["dataset.synthetic.num_classes=3"], "dataset.synthetic.num_classes"),
        (["dataset.synthetic.image_size=24"], "dataset.synthetic.image_size"),
        (["server.strategy=fedavgm"], "server.strategy"),
        ("truncate", "not a readable checkpoint"),
        ("garbage", "not a readable checkpoint"),
        ("pickle", "not a readable checkpoint"),
    ],
)
def test_resume_incompatibility_is_found_before_anything_changes(resumable, capsys, change, word):
    ck = resumable / "checkpoint.pt"
    if change == "truncate":
        ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])
    elif change == "garbage":
        ck.write_bytes(b"\x00" * 100)
    elif change == "pickle":
        ck.write_bytes(pickle.dumps({"round": 1, "strategy": {}}))
    before = {p.name: p.read_bytes() for p in resumable.iterdir() if p.is_file()}
    argv = ["run", "--resume", str(resumable)]
    for s in change if isinstance(change, list) else []:
        argv += ["--set", s]
    line = _one_line_exit2(*_cli(capsys, *argv)[::2])
    assert word in line and str(resumable) in line
    after = {p.name: p.read_bytes() for p in resumable.iterdir() if p.is_file()}
    assert after == before  # config.yaml, metrics, checkpoint untouched


# ------------------------------------------------------------------ all clients failed (Bad 4)


def test_run_where_no_client_ever_trained_fails_with_the_first_client_error(tmp_path):
    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.run.results import read_metrics
    from strategies.round_records import AllClientsFailed

    cfg = config_from_dict(
        dict(
            TINY,
            client=dict(TINY["client"], method="faulty", params={"mode": "raise"}),
            federation=dict(TINY["federation"], rounds=2, max_consecutive_failed_rounds=5),
            output={"dir": str(tmp_path / "run")},
        )
    )
    with pytest.raises(AllClientsFailed) as ei:
        run_inprocess(cfg, tmp_path / "run")
    msg = str(ei.value)
    assert msg.startswith("no client trained in any of the 2 rounds")
    assert "first client error: injected failure on partition" in msg
    recs = read_metrics(tmp_path / "run")
    assert [r["round"] for r in recs] == [1, 2]  # the failed last round is recorded too
    assert all(r["round_failed"] for r in recs)
    assert recs[1]["failure_reason"].startswith("every client failed (first error: injected")
    assert not (tmp_path / "run" / "summary.json").exists()
    assert "ROUND FAILED (model unchanged): every client failed" in format_round_line(recs[0], 2)


@pytest.mark.parametrize(
    "failure,line",
    [
        (
            Exception(
                type(
                    "Error",
                    (),
                    {
                        "reason": "<class 'flwr.clientapp.client_app."
                        "ClientAppException'>:<'\nException ClientAppException "
                        "occurred. Message: KeyError: 'levels'\n'>"
                    },
                )()
            ),
            "KeyError: 'levels'",
        ),
        (
            Exception(
                type(
                    "Error",
                    (),
                    {
                        "reason": "<class 'x'>:<'\nException "
                        "ClientAppException occurred. Message: RuntimeError: "
                        "boom'>"
                    },
                )()
            ),
            "RuntimeError: boom",
        ),
        (ValueError("plain failure"), "plain failure"),
    ],
)
def test_client_error_line(failure, line):
    from strategies.screening import client_error_line

    assert client_error_line(failure) == line


def test_name_errors_mod_keeps_the_type():
    from fedrcl_flwr.app.client_app import name_errors

    def boom(message, context):
        raise KeyError("levels")

    with pytest.raises(RuntimeError, match=r"^KeyError: 'levels'$"):
        name_errors(None, None, boom)


def test_progress_line_marks_a_round_where_every_client_failed():
    assert "ROUND FAILED (model unchanged): every client failed" in format_round_line(
        {"round": 1, "num_clients": 0, "failures": 2}, 3
    )
    assert "ROUND FAILED" not in format_round_line({"round": 1, "num_clients": 1, "failures": 2}, 3)


# --------------------------------------------------------------- partition --plot, internals


@pytest.mark.parametrize(
    "plot,word",
    [
        ("split.xyz", "unknown image type"),
        ("split", "unknown image type"),
        ("nodir/split.png", "does not exist"),
        (".", "unknown image type"),
    ],
)
def test_partition_plot_bad_targets(tmp_path, capsys, monkeypatch, plot, word):
    monkeypatch.chdir(tmp_path)
    line = _one_line_exit2(*_cli(capsys, "partition", _yaml(tmp_path), "--plot", plot)[::2])
    assert word in line


def test_partition_plot_into_a_directory(tmp_path, capsys):
    (tmp_path / "d.png").mkdir()
    line = _one_line_exit2(
        *_cli(capsys, "partition", _yaml(tmp_path), "--plot", str(tmp_path / "d.png"))[::2]
    )
    assert "is a directory" in line


def test_internal_error_is_one_line_and_a_traceback_with_verbose(tmp_path, capsys, monkeypatch):
    import fedrcl_flwr.run.runtime as rt

    def broken(cfg):
        raise ZeroDivisionError("internal bug")

    monkeypatch.setattr(rt, "client_partitions", broken)
    rc, _, err = _cli(capsys, "partition", _yaml(tmp_path))
    assert rc == 1 and "Traceback" not in err
    assert err.strip().splitlines() == [
        "fedrcl-flwr: internal error: ZeroDivisionError: internal bug (run again with "
        "--verbose for the traceback)"
    ]
    with pytest.raises(ZeroDivisionError):
        main(["--verbose", "partition", _yaml(tmp_path)])
