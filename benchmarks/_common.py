"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_of_run_processes(marker: bytes = b"fedrcl-flwr-home-") -> int:
    """Total resident memory (bytes) of every process started for a CLI run (their
    environment names the run's private FLWR_HOME) plus the CLI itself."""
    total = 0
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if marker not in (d / "environ").read_bytes():
                continue
            for line in (d / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def run_cli_measuring(args: list[str], poll_s: float = 0.5) -> tuple[int, float, int]:
    """Run ``fedrcl-flwr`` with ``args``; return (exit code, wall seconds, peak RSS)."""
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_of_run_processes())
            time.sleep(poll_s)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "fedrcl_flwr.cli", "run", *args],
                         cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - t0
    done.set()
    t.join()
    if res.returncode != 0:
        print(res.stdout[-2000:], res.stderr[-3000:], file=sys.stderr)
    return res.returncode, wall, peak[0]
