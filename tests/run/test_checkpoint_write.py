"""A checkpoint (or ``model.pt``) that the file system cannot take is named, and leaves
no ``.tmp``: torch's own file writer answers a failed write with a ``RuntimeError``
("file write failed") and leaves its partial file; the project serialises in memory and
writes the bytes itself, so the file system's error is the run's one line."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# in a child process: its file size limit (RLIMIT_FSIZE, 64 KiB; SIGXFSZ ignored, so a
# write past it fails with EFBIG) stands in for a full disk
CHILD = textwrap.dedent(
    """
    import os, resource, signal, sys
    import numpy as np
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    from fedrcl_flwr.run.checkpoint import save_checkpoint
    from fedrcl_flwr.run.results import RunRecorder
    from fedrcl_flwr.run.run_files import RunFileError
    out = sys.argv[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
    big = {"round": 1, "strategy": {"weights": [np.ones(1 << 16, np.float32)]}}
    for what, write in (
        ("checkpoint.pt", lambda: save_checkpoint(out, big)),
        ("model.pt", lambda: RunRecorder(out, method="m", strategy="s", rounds=1).finish(
            {"w": __import__("torch").ones(1 << 16)})),
    ):
        try:
            write()
            print("WROTE", what)
        except RunFileError as exc:
            print("NAMED", what, str(exc).startswith(f"cannot write {out}/{what}: "))
        except Exception as exc:
            print("OTHER", what, type(exc).__name__)
    print("LEFT", sorted(p for p in os.listdir(out) if ".tmp" in p))
    """
)


def test_a_checkpoint_that_does_not_fit_is_named_and_leaves_no_tmp(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    res = subprocess.run(  # not in the checkout: the child imports what the tests import
        [sys.executable, "-c", CHILD, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    lines = res.stdout.splitlines()
    assert "NAMED checkpoint.pt True" in lines, res.stdout + res.stderr[-2000:]
    assert "NAMED model.pt True" in lines, res.stdout + res.stderr[-2000:]
    assert "LEFT []" in lines, res.stdout
