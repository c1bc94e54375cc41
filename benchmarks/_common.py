"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pss_bytes(proc_dir: Path) -> int:
    """Proportional set size of one process: private pages plus its share of pages it
    shares with others (torch's libraries mapped by every Ray worker, Ray's object store),
    so that a sum over processes counts shared memory once. Falls back to VmRSS."""
    try:
        for line in (proc_dir / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    for line in (proc_dir / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def memory_of_run_processes(cli_pid: int, marker: bytes = b"fedrcl-flwr-home-") -> int:
    """Total memory (bytes, PSS) of every process started for a CLI run (their environment
    names the run's private FLWR_HOME) plus the CLI process itself."""
    total = 0
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if d.name != str(cli_pid) and marker not in (d / "environ").read_bytes():
                continue
            total += _pss_bytes(d)
        except OSError:
            continue
    return total


def run_cli_measuring(args: list[str], poll_s: float = 0.5) -> tuple[int, float, int]:
    """Run ``fedrcl-flwr`` with ``args``; return (exit code, wall seconds, peak memory in bytes)."""
    peak = [0]
    done = threading.Event()

    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "fedrcl_flwr.cli", "run", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], memory_of_run_processes(proc.pid))
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
