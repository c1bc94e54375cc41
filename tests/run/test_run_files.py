"""Every file the tool writes in a run directory is made new or appended to, never written
through a link planted under its name (``fedrcl_flwr/run/run_files.py``: ``new_file``,
``append_file``): a symbolic link or a hard link at a temporary name is replaced, at an
appended file refused with one line; the file it points to is never changed."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from fedrcl_flwr.run.run_files import RunFileError, append_file, new_file


def _user_file(tmp_path: Path) -> Path:
    target = tmp_path / "users-file.txt"
    target.write_text("the user's data\n")
    return target


def test_writes_through_the_tools_temporary_names_replace_a_planted_link(tmp_path):
    """``summary.json.tmp``, ``config.yaml.tmp``, ``checkpoint.pt.tmp``: a symbolic or hard
    link planted there is replaced by the new file; the linked file keeps its bytes."""
    from helpers import tiny_config

    from fedrcl_flwr.config import dump_config
    from fedrcl_flwr.run.checkpoint import save_checkpoint
    from fedrcl_flwr.run.results import atomic_write_text

    run = tmp_path / "run"
    run.mkdir()
    target = _user_file(tmp_path)
    (run / "summary.json.tmp").symlink_to(target)
    os.link(target, run / "config.yaml.tmp")
    (run / "checkpoint.pt.tmp").symlink_to(target)
    atomic_write_text(run / "summary.json", "{}\n")
    dump_config(tiny_config(tmp_path), run / "config.yaml")
    save_checkpoint(run, {"round": 1})
    assert target.read_text() == "the user's data\n"
    assert (run / "summary.json").read_text() == "{}\n"
    assert "tiny" in (run / "config.yaml").read_text()
    assert not any(p.name.endswith(".tmp") for p in run.iterdir())


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_an_appended_file_that_is_a_link_or_a_fifo_is_refused_at_once(tmp_path, kind):
    """``metrics.jsonl``, ``flower.log`` and a sweep's run logs are appended to: a link
    or a FIFO there is one line (``RunFileError``), never written, never waited on."""
    target = _user_file(tmp_path)
    path = tmp_path / "metrics.jsonl"
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "hardlink":
        os.link(target, path)
    else:
        os.mkfifo(path)
    outcome: list = []

    def append():
        try:
            with append_file(path) as fh:
                fh.write("x\n")
            outcome.append("written")
        except OSError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=append, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), f"an append to a {kind} blocked"
    assert len(outcome) == 1 and isinstance(outcome[0], OSError), outcome
    assert "\n" not in str(outcome[0]) and "metrics.jsonl" in str(outcome[0])
    if kind != "fifo":
        assert isinstance(outcome[0], RunFileError)
    assert target.read_text() == "the user's data\n"


def test_new_and_appended_files_are_written(tmp_path):
    with new_file(tmp_path / "a.tmp", "w") as fh:
        fh.write("one\n")
    with append_file(tmp_path / "a.tmp") as fh:
        fh.write("two\n")
    assert (tmp_path / "a.tmp").read_text() == "one\ntwo\n"
