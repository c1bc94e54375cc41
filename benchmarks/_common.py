"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_of_run_processes(cli_pid: int, marker: bytes = b"fedrcl-flwr-home-") -> int:
    """Total resident memory (bytes) of every process started for a CLI run (their
    environment names the run's private FLWR_HOME) plus the CLI process itself."""
    total = 0
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if d.name != str(cli_pid) and marker not in (d / "environ").read_bytes():
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

    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "fedrcl_flwr.cli", "run", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_of_run_processes(proc.pid))
            time.sleep(poll_s)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    wall = time.time() - t0
    done.set()
    t.join()
    if proc.returncode != 0:
        print(out[-2000:], err[-3000:], file=sys.stderr)
    return proc.returncode, wall, peak[0]
