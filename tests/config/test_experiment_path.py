"""An experiment path that is not a regular file is named as what it is (a FIFO, a
directory), never "not found", and never opened (a FIFO would block the reader)."""

from __future__ import annotations

import os

import pytest

from fedrcl_flwr.cli import main


@pytest.mark.parametrize("command", ["run", "sweep", "partition"])
@pytest.mark.parametrize("kind", ["FIFO", "directory"])
def test_a_special_experiment_path_is_named(tmp_path, capsys, command, kind):
    path = tmp_path / "exp.yaml"
    if kind == "FIFO":
        os.mkfifo(path)
    else:
        path.mkdir()
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"fedrcl-flwr: error: {path}: not an experiment file (a {kind}); give a YAML file"


def test_a_missing_experiment_is_still_not_found(tmp_path, capsys):
    assert main(["run", str(tmp_path / "none.yaml")]) == 2
    assert "experiment file not found" in capsys.readouterr().err
