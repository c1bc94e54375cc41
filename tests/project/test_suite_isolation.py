"""The suite judges only the processes it started (on a machine where someone
else runs Flower/Ray, the leftover-process check flagged their processes)."""

import subprocess
import sys
import tempfile

from helpers import leftover_procs, run_marker


def test_leftover_check_sees_our_runs_and_never_anyone_elses():
    marker = run_marker()
    # a run started by this session makes its home under the session's TMPDIR ...
    home = tempfile.mkdtemp(prefix="fedrcl-flwr-home-")  # as runner.LocalSuperLink does
    assert home.startswith(marker)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    # ... another user's run on the same machine names a home elsewhere
    foreign = subprocess.Popen([*sleeper, "/tmp/fedrcl-flwr-home-someone-else"])
    ours = subprocess.Popen([*sleeper, home + "/x"])  # as a Ray agent of ours would
    try:
        left = leftover_procs(grace=0)
        assert ours.pid in left and foreign.pid not in left, left
    finally:
        for p in (foreign, ours):
            p.kill()
            p.wait()
    assert ours.pid not in leftover_procs(grace=5)
