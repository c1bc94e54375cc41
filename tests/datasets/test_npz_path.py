"""``dataset.name: npz`` with a ``dataset.path`` that is no regular file: refused in one
line naming ``dataset.path`` and what it is, before the dataset cache fingerprints it
(a folder such as ``/`` would be walked file by file) and before ``np.load`` opens it (a
FIFO would block the run forever); a name too long is said so, not an internal error."""

import os
import subprocess
import sys

import yaml

from fedrcl_flwr.cli import main


def _experiment(tmp_path, path) -> str:
    exp = tmp_path / "exp.yaml"
    data = {
        "name": "npz",
        "dataset": {"name": "npz", "path": str(path), "cache_dir": str(tmp_path / "cache")},
        "partition": {"scheme": "iid"},
        "federation": {"num_clients": 2, "clients_per_round": 2, "rounds": 1},
    }
    exp.write_text(yaml.safe_dump(data))
    return str(exp)


def test_a_folder_is_refused_without_walking_it(tmp_path, capsys, monkeypatch):
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "f.txt").write_text("x")

    def no_walk(*a, **k):
        raise AssertionError("walked the folder")

    monkeypatch.setattr(os, "walk", no_walk)
    assert main(["partition", _experiment(tmp_path, tree)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"fedrcl-flwr: error: dataset.path {str(tree)!r}: a directory, not an .npz file of arrays"
    )


def test_a_name_too_long_is_said_so(tmp_path, capsys):
    long = tmp_path / ("y" * 4000 + ".npz")
    assert main(["partition", _experiment(tmp_path, long)]) == 2
    err = capsys.readouterr().err.strip()
    assert "dataset.path" in err and "cannot be looked up (a file name too long)" in err, err
    assert "\n" not in err and len(err) < 300


def test_a_fifo_is_refused_without_opening_it(tmp_path):
    """In a child process with a time limit: opened, the FIFO would wait for a writer."""
    fifo = tmp_path / "d.npz"
    os.mkfifo(fifo)
    code = "import sys; from fedrcl_flwr.cli import main; sys.exit(main(sys.argv[1:]))"
    res = subprocess.run(  # not in the checkout: the child imports what the tests import
        [sys.executable, "-c", code, "partition", _experiment(tmp_path, fifo)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().endswith(f"{str(fifo)!r}: a FIFO, not an .npz file of arrays")
